//! Errors while recording a run.

use crate::trace::TraceError;

/// A failure while recording.
#[derive(thiserror::Error)]
pub enum RecordError {
    /// Writing the trace failed.
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// candle failed while computing or reading a tensor.
    #[error("tensor computation failed: {}", without_backtrace(.0))]
    Candle(#[from] candle_core::Error),
    /// A GPU call of the recorder's own failed: what it was doing, and at which step.
    #[error("recording step {step} on the GPU failed: {}", without_backtrace(.source))]
    Device {
        /// The step being recorded.
        step: u64,
        /// candle's error, with what the recorder was doing as its context.
        source: candle_core::Error,
    },
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

/// Shown as its message: a program whose `main` returns this error (or a `Box<dyn Error>`
/// holding it) prints what went wrong, not the variant's fields.
impl std::fmt::Debug for RecordError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

/// candle's message on one line, without the backtrace it attaches when `RUST_BACKTRACE` is
/// set (users need the cause, not our call stack), each context before what it wraps.
fn without_backtrace(e: &candle_core::Error) -> String {
    match e {
        candle_core::Error::WithBacktrace { inner, .. } => without_backtrace(inner),
        candle_core::Error::Context { inner, context } => format!("{context}: {}", without_backtrace(inner)),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_error_names_the_step_and_each_context_on_one_line() {
        let cause = candle_core::Error::Msg("DriverError(CUDA_ERROR_OUT_OF_MEMORY)".into());
        let source = cause.context("allocating 96 MiB").context("hashing 312 tensors (3.0 GiB)").bt();
        let message = RecordError::Device { step: 7, source }.to_string();
        assert_eq!(
            message,
            "recording step 7 on the GPU failed: hashing 312 tensors (3.0 GiB): allocating 96 MiB: \
             DriverError(CUDA_ERROR_OUT_OF_MEMORY)"
        );
    }
}
