//! Errors while recording a run.

use crate::trace::TraceError;

/// A failure while recording.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// Writing the trace failed.
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// candle failed while computing or reading a tensor.
    #[error("tensor computation failed: {}", without_backtrace(.0))]
    Candle(#[from] candle_core::Error),
    /// A request repro cannot carry out (bad device, dtype, perturbation, config).
    #[error("{0}")]
    Unsupported(String),
    /// A collective across the ranks of a data-parallel run failed (a rank stopped, or the
    /// ranks disagree on what they sum).
    #[error("collective failed: {0}")]
    Collective(String),
    /// Online comparison found this step different from the reference run, and was asked to
    /// stop there.
    #[error("step {step} diverged from the reference run")]
    Diverged {
        /// The diverging step.
        step: u64,
    },
}

/// candle's message without the backtrace it attaches when `RUST_BACKTRACE` is set: users
/// need the cause, not our call stack.
fn without_backtrace(e: &candle_core::Error) -> String {
    match e {
        candle_core::Error::WithBacktrace { inner, .. } => without_backtrace(inner),
        other => other.to_string(),
    }
}
