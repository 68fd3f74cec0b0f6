//! How a recorder records, besides where, what run and on which device: the capture policy,
//! whether an existing trace may be replaced, the rank's place in a data-parallel run, a
//! planted fault, which steps are recorded, a progress hook and an online comparison with a
//! reference run. Data, so that a caller builds it once and every constructor path is one.

use super::online::OnlineComparison;
use super::perturb::Perturbation;
use crate::trace::{CapturePolicy, Distributed, StepCheck};

/// Says, at the start of each step, whether that step is recorded.
pub type StepSelector = Box<dyn FnMut(u64) -> bool>;

/// A progress display's hook, called after every recorded step.
pub type StepCallback = Box<dyn FnMut(&StepProgress)>;

/// What a finished step tells a progress display.
#[derive(Debug, Clone, Copy)]
pub struct StepProgress {
    /// The step just recorded.
    pub step: u64,
    /// Steps the run intends to record, if known.
    pub total_steps: Option<u64>,
    /// Bytes of full values this step stored (0 on hashes-only steps).
    pub payload_bytes: u64,
    /// Steps of the run whose full values the capture policy stores, if the length is known.
    pub full_steps: Option<u64>,
}

/// `Recorder::create`'s options. `RecordOptions::default()` records every step with the
/// default capture policy into a new or empty directory, on one device, with no fault planted,
/// no hook and no comparison.
#[derive(Default)]
pub struct RecordOptions {
    /// Which steps store full values, and which tensors are small enough to store inline.
    pub capture: CapturePolicy,
    /// Replace a trace already in the directory (the CLI's `--force`) rather than refuse.
    pub replace: bool,
    /// This stream's place in a data-parallel run, written to the header; `None` on one device.
    pub rank: Option<Distributed>,
    /// A fault to plant (see `Perturbation`): workloads read it with `Recorder::perturbation`.
    pub perturbation: Option<Perturbation>,
    /// Which steps are recorded (see `recording_only`); every step when `None`.
    pub select_steps: Option<StepSelector>,
    /// Told after every recorded step (see `on_step`).
    pub on_step: Option<StepCallback>,
    /// Compares every step with a reference run as it is recorded (see `comparing_with`).
    pub compare: Option<OnlineComparison>,
}

impl std::fmt::Debug for RecordOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordOptions")
            .field("capture", &self.capture)
            .field("replace", &self.replace)
            .field("rank", &self.rank)
            .field("perturbation", &self.perturbation)
            .field("select_steps", &self.select_steps.is_some())
            .field("on_step", &self.on_step.is_some())
            .field("compare", &self.compare.is_some())
            .finish()
    }
}

impl RecordOptions {
    /// The default options with `capture`.
    pub fn capture(capture: CapturePolicy) -> Self {
        RecordOptions { capture, ..RecordOptions::default() }
    }

    /// These options, replacing an existing trace when `replace` is true.
    pub fn replacing(self, replace: bool) -> Self {
        RecordOptions { replace, ..self }
    }

    /// These options, recording only the steps `which` selects; the others train as if
    /// unrecorded (nothing of theirs is read, hashed or written, and the trace skips their
    /// numbers). `which` is asked once per step, in order, when the step begins: a long run can
    /// keep every hundredth step (`|step| step % 100 == 0`), and `repro overhead` times
    /// recorded and plain stretches of one run this way.
    pub fn recording_only(self, which: impl FnMut(u64) -> bool + 'static) -> Self {
        RecordOptions { select_steps: Some(Box::new(which)), ..self }
    }

    /// These options, calling `f` after every recorded step, for a progress display.
    pub fn on_step(self, f: impl FnMut(&StepProgress) + 'static) -> Self {
        RecordOptions { on_step: Some(Box::new(f)), ..self }
    }

    /// These options, comparing every step, as it is recorded, with a reference run through
    /// `check`. On the first divergence the step before it and the diverging step are written
    /// with full values; with `stop_at_divergence`, `StepRecorder::finish` then returns
    /// `RecordError::Diverged`.
    pub fn comparing_with(self, check: Box<dyn StepCheck>, stop_at_divergence: bool) -> Self {
        RecordOptions { compare: Some(OnlineComparison::new(check, stop_at_divergence)), ..self }
    }
}
