//! How a recorder records, besides where, what run and on which device: the capture policy,
//! whether an existing trace may be replaced, the rank's place in a data-parallel run, and a
//! planted fault. Data, so that a caller builds it once and every constructor path is one.

use super::perturb::Perturbation;
use crate::trace::{CapturePolicy, Distributed};

/// `Recorder::create`'s options. `RecordOptions::default()` records with the default capture
/// policy into a new or empty directory, on one device, with no fault planted.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RecordOptions {
    /// Which steps store full values, and which tensors are small enough to store inline.
    pub capture: CapturePolicy,
    /// Replace a trace already in the directory (the CLI's `--force`) rather than refuse.
    pub replace: bool,
    /// This stream's place in a data-parallel run, written to the header; `None` on one device.
    pub rank: Option<Distributed>,
    /// A fault to plant (see `Perturbation`): workloads read it with `Recorder::perturbation`.
    pub perturbation: Option<Perturbation>,
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
}
