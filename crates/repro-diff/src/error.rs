//! Errors from comparing traces.

use crate::traces::FieldDifference;
use repro_trace::TraceError;
use std::path::PathBuf;

/// A failure to compare traces: unreadable input, or a comparison that cannot be made.
#[derive(thiserror::Error)]
pub enum DiffError {
    /// A trace could not be read.
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// The traces cannot be compared as asked; the message says why and what to do.
    #[error("{0}")]
    Usage(String),
    /// A gate's baseline was written for other run settings than the run gated against it.
    #[error(
        "{} was written for another configuration ({}); leave out the options that differ (the baseline's settings are the gate's defaults) or rewrite it with `repro baseline write`",
        baseline.display(),
        describe_fields(fields)
    )]
    BaselineMismatch {
        /// The baseline file.
        baseline: PathBuf,
        /// The settings that differ (baseline's value first).
        fields: Vec<FieldDifference>,
    },
    /// A gate's baseline was written by a run of other settings than the recorded run gated
    /// against it (a program's run: its own arguments and `RunConfig` set them).
    #[error(
        "{} was written by a run of other settings ({}): run the program with the arguments that wrote the baseline, or rewrite it with `repro baseline write -- CMD`",
        baseline.display(),
        describe_fields(fields)
    )]
    RunSettingsDiffer {
        /// The baseline file.
        baseline: PathBuf,
        /// The settings that differ (baseline's value first).
        fields: Vec<FieldDifference>,
    },
}

/// Shown as its message: a program whose `main` returns this error (or a `Box<dyn Error>`
/// holding it) prints what went wrong, not the variant's fields.
impl std::fmt::Debug for DiffError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

/// `steps 50 vs 1000, seed 0 vs 1`: settings with the value on each side.
fn describe_fields(fields: &[FieldDifference]) -> String {
    let described: Vec<String> = fields
        .iter()
        .map(|f| {
            let (a, b) = f.values();
            format!("{} {a} vs {b}", f.field)
        })
        .collect();
    described.join(", ")
}
