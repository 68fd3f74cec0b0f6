//! What a workload trains with: the device, the recorder its steps go into, and, when it is one
//! rank of a data-parallel run, the handle that sums gradients with the other ranks. Every
//! workload's `run` takes one.

use crate::distributed::DataParallel;
use crate::record::Recorder;
use candle_core::Device;

/// A workload's device, recorder and data-parallel handle.
pub struct Training<'a> {
    /// Where the model trains.
    pub device: &'a Device,
    /// Where its steps are recorded (`Recorder::discard()` records nothing).
    pub recorder: &'a mut Recorder,
    /// This rank's side of data-parallel training, when the run has several ranks.
    pub data_parallel: Option<&'a mut DataParallel>,
}

impl<'a> Training<'a> {
    /// Training on one device, recorded into `recorder`.
    pub fn on(device: &'a Device, recorder: &'a mut Recorder) -> Self {
        Training { device, recorder, data_parallel: None }
    }

    /// The same, as one rank of data-parallel training when `data_parallel` is given.
    pub fn as_rank(self, data_parallel: Option<&'a mut DataParallel>) -> Self {
        Training { data_parallel, ..self }
    }
}
