//! Gradient probes: an identity op whose backward pass hands the gradient flowing through it
//! to the recorder. candle keeps its autograd graph private, so this is how a training loop
//! sees gradients at points of its choosing, not only at the parameters.

use candle_core::backend::{BackendDevice, BackendStorage};
use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape, Tensor};
use std::sync::{Arc, Mutex};

/// Gradients captured by probes during one backward pass, in the order it reached them.
#[derive(Clone, Default)]
pub(crate) struct ProbedGradients(Arc<Mutex<Vec<(String, Tensor)>>>);

impl ProbedGradients {
    /// Takes the captured gradients, leaving none.
    pub(crate) fn take(&self) -> Vec<(String, Tensor)> {
        std::mem::take(&mut *self.0.lock().expect("probe lock"))
    }
}

pub(crate) struct Probe {
    name: String,
    sink: ProbedGradients,
}

impl Probe {
    pub(crate) fn new(name: &str, sink: ProbedGradients) -> Self {
        Probe { name: name.to_string(), sink }
    }
}

/// A contiguous copy of the input: custom ops must return fresh storage.
fn copy<S>(storage: &S, layout: &Layout) -> Result<(S, Shape)>
where
    S: BackendStorage,
    S::Device: BackendDevice<Storage = S>,
{
    let shape = layout.shape().clone();
    // SAFETY: every element of the new buffer is written by the strided copy below.
    let mut out = unsafe { storage.device().alloc_uninit(&shape, storage.dtype())? };
    storage.copy_strided_src(&mut out, 0, layout)?;
    Ok((out, shape))
}

impl CustomOp1 for Probe {
    fn name(&self) -> &'static str {
        "repro-probe"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        copy(storage, layout)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        storage: &candle_core::CudaStorage,
        layout: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        copy(storage, layout)
    }

    fn bwd(&self, _arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        self.sink.0.lock().expect("probe lock").push((self.name.clone(), grad_res.clone()));
        Ok(Some(grad_res.clone()))
    }
}
