//! Errors from comparing traces.

use crate::trace::TraceError;

/// A failure to compare traces: unreadable input, or a comparison that cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum DiffError {
    /// A trace could not be read.
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// The traces cannot be compared as asked; the message says why and what to do.
    #[error("{0}")]
    Usage(String),
}
