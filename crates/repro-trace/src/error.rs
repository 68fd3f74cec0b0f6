//! Errors reading or writing a trace. Every variant names the file it is about.

use crate::format::FormatVersion;
use std::io;
use std::path::PathBuf;

/// A failure to read or write a trace.
#[derive(thiserror::Error)]
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
        "{path} uses trace format {found}, but this repro (format {supported}) reads only 1.x and 2.x; {}",
        if found.major > supported.major { "upgrade repro to read it" } else { "read it with the older repro that wrote it" }
    )]
    UnsupportedFormat {
        /// The record file.
        path: PathBuf,
        /// The trace's format version.
        found: FormatVersion,
        /// The newest version this build writes.
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
    #[error(
        "{path} already holds a trace; choose another directory, or replace it (`--force` on the command line, \
         `RecordOptions::replace` in the library)"
    )]
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
    /// Two traces whose tensors are hashed with different data hashes (format 2.0): their
    /// hashes never agree, so comparing them would call every tensor different.
    #[error(
        "{} hashes its tensors with {a_kind} and {} with {b_kind}: hashes of different data hashes never agree, \
         so the traces cannot be compared; record both with the same data hash (`repro record --data-hash`, \
         REPRO_DATA_HASH for a PyTorch program)",
        a.display(),
        b.display()
    )]
    DataHashesDiffer {
        /// The first trace's directory.
        a: PathBuf,
        /// Its data hash.
        a_kind: crate::hash::DataHash,
        /// The second trace's directory.
        b: PathBuf,
        /// Its data hash.
        b_kind: crate::hash::DataHash,
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

/// Shown as its message: a program whose `main` returns this error (or a `Box<dyn Error>`
/// holding it) prints what went wrong, not the variant's fields.
impl std::fmt::Debug for TraceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

impl TraceError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> TraceError {
        let path = path.into();
        move |source| TraceError::Io { path, source }
    }
}

#[cfg(test)]
mod debug_tests {
    use super::*;

    #[test]
    fn debug_shows_the_message_so_a_main_returning_the_error_prints_it() {
        let e = TraceError::AlreadyExists { path: "runs/a".into() };
        assert_eq!(format!("{e:?}"), e.to_string());
        assert!(e.to_string().contains("RecordOptions::replace"), "names the library's way, not only the flag");
        let boxed: Box<dyn std::error::Error> = Box::new(e);
        assert!(format!("{boxed:?}").starts_with("runs/a already holds a trace"), "{boxed:?}");
    }
}
