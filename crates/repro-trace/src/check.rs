//! The hook through which a recorder compares each step with a reference run while recording
//! (`repro record --against`). The comparison itself lives in `diff`; this trait keeps the
//! recorder independent of it.

use crate::error::TraceError;
use crate::writer::StepTensor;
use std::sync::{Arc, Mutex};

/// What a check found about one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepVerdict {
    /// Every tensor matches the reference.
    Same,
    /// Some tensor differs from the reference.
    Diverged,
}

/// Compares steps, as they are recorded, with a reference.
pub trait StepCheck {
    /// Checks step `step`, given its tensors (values are present for inline tensors and for
    /// tensors whose payload is kept).
    fn check_step(&mut self, step: u64, tensors: &[StepTensor]) -> Result<StepVerdict, TraceError>;
}

/// Lets the caller keep a handle on a check it gives to a recorder, to read its findings after.
impl<T: StepCheck> StepCheck for Arc<Mutex<T>> {
    fn check_step(&mut self, step: u64, tensors: &[StepTensor]) -> Result<StepVerdict, TraceError> {
        self.lock().expect("step check lock").check_step(step, tensors)
    }
}
