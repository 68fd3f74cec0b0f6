//! Errors of the studies.

use crate::record::RecordError;
use crate::trace::TraceError;
use std::path::{Path, PathBuf};

/// Why a study could not run or resume.
#[derive(thiserror::Error)]
pub enum StudyError {
    /// The workload's settings are refused.
    #[error(transparent)]
    Workload(#[from] crate::workloads::WorkloadError),
    /// Reading or writing a study file failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A study file is damaged.
    #[error("{}: {reason}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The directory holds a study with other settings.
    #[error(
        "{} holds a study with other settings ({differences}); pass --restart to delete its runs and start over, or choose another --out",
        dir.display()
    )]
    OtherStudy {
        /// The study directory.
        dir: PathBuf,
        /// What differs.
        differences: String,
    },
    /// The directory holds other files.
    #[error("{} is not a study directory (it has files but no study.json); choose an empty or new --out", dir.display())]
    NotAStudy {
        /// The directory.
        dir: PathBuf,
    },
    /// Training failed.
    #[error(transparent)]
    Record(#[from] RecordError),
    /// Reading a recorded trace failed.
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// The settings cannot be run.
    #[error("{0}")]
    Invalid(String),
}

/// Shown as its message: a program whose `main` returns this error (or a `Box<dyn Error>`
/// holding it) prints what went wrong, not the variant's fields.
impl std::fmt::Debug for StudyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

impl StudyError {
    /// An adapter for `map_err` on I/O results about `path`.
    pub fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StudyError + '_ {
        move |source| StudyError::Io { path: path.to_path_buf(), source }
    }
}
