//! Errors reading or writing a trace. Every variant names the file it is about.

use crate::format::FormatVersion;
use std::io;
use std::path::PathBuf;

/// A failure to read or write a trace.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The operating system refused a read or write.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: io::Error,
    },
    /// The path exists but holds no repro trace.
    #[error("{path} is not a repro trace: {reason}")]
    NotATrace {
        /// The trace directory or record file.
        path: PathBuf,
        /// What was missing or wrong.
        reason: String,
    },
    /// The trace's major format version is not this build's.
    #[error(
        "{path} uses trace format {found}, but this repro (format {supported}) reads only {}.x; {}",
        supported.major,
        if found.major > supported.major { "upgrade repro to read it" } else { "read it with the older repro that wrote it" }
    )]
    UnsupportedFormat {
        /// The record file.
        path: PathBuf,
        /// The trace's format version.
        found: FormatVersion,
        /// The version this build writes.
        supported: FormatVersion,
    },
    /// A file of the trace is damaged.
    #[error("{path} is corrupt at {location}: {reason}")]
    Corrupt {
        /// The damaged file.
        path: PathBuf,
        /// Where: a byte offset, a step, a tensor.
        location: String,
        /// What check failed.
        reason: String,
    },
    /// Recording into a directory that already holds a trace.
    #[error("{path} already holds a trace; choose another directory, or remove it (`--force` replaces it)")]
    AlreadyExists {
        /// The trace directory.
        path: PathBuf,
    },
    /// The directory holds files but no trace: repro never writes among, or deletes, files it
    /// did not write.
    #[error("{path} is not empty and holds no trace: record into a new or empty directory")]
    NotEmpty {
        /// The directory.
        path: PathBuf,
    },
    /// The caller asked the writer for something the format cannot hold.
    #[error("cannot record into {path}: {reason}")]
    InvalidRecord {
        /// The trace directory.
        path: PathBuf,
        /// What was wrong with the request.
        reason: String,
    },
}

impl TraceError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> TraceError {
        let path = path.into();
        move |source| TraceError::Io { path, source }
    }
}
