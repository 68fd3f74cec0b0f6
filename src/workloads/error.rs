//! Errors in a workload's settings: a check that refuses them before anything trains, or a
//! trace header's settings that are not a built-in workload's.

use crate::record::RecordError;

/// Settings a built-in workload cannot train with.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// A setting, or a combination of them, that the workload refuses: the message says which
    /// option to change.
    #[error("{0}")]
    Invalid(String),
    /// A trace's `run.workload` that names no built-in workload.
    #[error("`{0}` is not a built-in workload (expected one of {names})", names = super::WorkloadKind::names().join(", "))]
    UnknownWorkload(String),
    /// A trace's setting that the workload does not have.
    #[error(
        "setting `{key}` = `{value}` is not a setting of {workload} (a trace of a newer repro, or not made by repro)"
    )]
    UnknownSetting {
        /// The workload read.
        workload: String,
        /// The setting's key.
        key: String,
        /// Its value.
        value: String,
    },
    /// A trace's setting whose value does not parse.
    #[error("setting `{key}` = `{value}` of {workload} is not valid: {reason}")]
    BadSetting {
        /// The workload read.
        workload: String,
        /// The setting's key.
        key: String,
        /// Its value.
        value: String,
        /// Why it does not parse.
        reason: String,
    },
    /// Checking the settings needed a recording (a classifier's tensor names), and it failed.
    #[error(transparent)]
    Record(#[from] RecordError),
}

/// A settings error met while recording is a request repro cannot carry out.
impl From<WorkloadError> for RecordError {
    fn from(e: WorkloadError) -> Self {
        match e {
            WorkloadError::Record(inner) => inner,
            other => RecordError::Unsupported(other.to_string()),
        }
    }
}

impl From<candle_core::Error> for WorkloadError {
    fn from(e: candle_core::Error) -> Self {
        WorkloadError::Record(e.into())
    }
}
