//! Compiling and loading repro's kernels: the files of `kernels/`, compiled once per process
//! with NVRTC, and launched on candle's stream of the calling thread, so they order correctly
//! with the work that thread launched.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaView, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::WrapErr;
use candle_core::{CudaStorage, Error, Layout, Result, Storage, Tensor};
use std::sync::OnceLock;

/// The kernels of one module, in this order (kernels/common.cuh says why).
pub(crate) const SOURCE: &str = concat!(
    include_str!("../../kernels/common.cuh"),
    include_str!("../../kernels/hash.cu"),
    include_str!("../../kernels/hash_kernels.cu"),
    include_str!("../../kernels/reduce.cu"),
    include_str!("../../kernels/matmul_f32.cu"),
);

pub(crate) const MODULE: &str = "repro";

/// The kernels' PTX, compiled once per process.
pub(crate) fn ptx() -> Result<&'static str> {
    static PTX: OnceLock<std::result::Result<String, String>> = OnceLock::new();
    let ptx = PTX.get_or_init(|| {
        candle_core::cuda_backend::cudarc::nvrtc::compile_ptx(SOURCE)
            .map(|ptx| ptx.to_src())
            .map_err(|e| format!("compiling the kernels of kernels/ with NVRTC failed: {e}"))
    });
    ptx.as_deref().map_err(|e| Error::Msg(e.clone()))
}

const TENSOR_CORE_SOURCE: &str = include_str!("../../kernels/matmul_bf16.cu");

pub(crate) const TENSOR_CORE_MODULE: &str = "repro_tensor_core";

/// The tensor-core kernels' PTX (kernels/matmul_bf16.cu), compiled once per process for
/// compute_80: a module of their own, so that GPUs older than that still load the others.
pub(crate) fn tensor_core_ptx() -> Result<&'static str> {
    static PTX: OnceLock<std::result::Result<String, String>> = OnceLock::new();
    let ptx = PTX.get_or_init(|| {
        let options =
            candle_core::cuda_backend::cudarc::nvrtc::CompileOptions { arch: Some("compute_80"), ..Default::default() };
        candle_core::cuda_backend::cudarc::nvrtc::compile_ptx_with_opts(TENSOR_CORE_SOURCE, options)
            .map(|ptx| ptx.to_src())
            .map_err(|e| format!("compiling kernels/matmul_bf16.cu with NVRTC failed: {e}"))
    });
    ptx.as_deref().map_err(|e| Error::Msg(e.clone()))
}

const HOPPER_SOURCE: &str = include_str!("../../kernels/matmul_bf16_hopper.cu");

pub(crate) const HOPPER_MODULE: &str = "repro_tensor_core_hopper";

/// The Hopper product's PTX (kernels/matmul_bf16_hopper.cu: wgmma and TMA), compiled once per
/// process for compute_90a, and loaded only on GPUs of compute capability 9.0.
pub(crate) fn hopper_ptx() -> Result<&'static str> {
    static PTX: OnceLock<std::result::Result<String, String>> = OnceLock::new();
    let ptx = PTX.get_or_init(|| {
        let options = candle_core::cuda_backend::cudarc::nvrtc::CompileOptions {
            arch: Some("compute_90a"),
            ..Default::default()
        };
        candle_core::cuda_backend::cudarc::nvrtc::compile_ptx_with_opts(HOPPER_SOURCE, options)
            .map(|ptx| ptx.to_src())
            .map_err(|e| format!("compiling kernels/matmul_bf16_hopper.cu with NVRTC failed: {e}"))
    });
    ptx.as_deref().map_err(|e| Error::Msg(e.clone()))
}

pub(crate) fn grid(n: u64, block: u32) -> LaunchConfig {
    let blocks = n.div_ceil(block as u64).clamp(1, 65_535 * 8) as u32;
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (block, 1, 1), shared_mem_bytes: 0 }
}

pub(crate) fn f32_view<'a>(storage: &'a CudaStorage, layout: &Layout, op: &str) -> Result<(CudaView<'a, f32>, u64)> {
    let (start, end) =
        layout.contiguous_offsets().ok_or_else(|| Error::Msg(format!("{op} needs a contiguous input")))?;
    Ok((storage.as_cuda_slice::<f32>()?.slice(start..end), (end - start) as u64))
}

/// Reads every byte of a contiguous F32 tensor once on the device (no output): the yardstick
/// for memory read bandwidth. The tensor's byte length must be a multiple of 16.
pub fn read_all(tensor: &Tensor) -> Result<()> {
    let (storage, layout) = tensor.storage_and_layout();
    let Storage::Cuda(cuda) = &*storage else {
        return Err(Error::Msg("read_all needs a CUDA tensor".into()));
    };
    let (x, n) = f32_view(cuda, layout, "read_all")?;
    if n % 4 != 0 || layout.start_offset() % 4 != 0 {
        return Err(Error::Msg("read_all needs a 16-byte aligned view of a multiple of 4 floats".into()));
    }
    let dev = cuda.device().clone();
    let mut sink = dev.alloc_zeros::<u32>(1)?;
    let words = n / 4;
    let f = dev.get_or_load_custom_func("read_words", MODULE, ptx()?)?;
    let mut b = f.builder();
    b.arg(&x);
    b.arg(&words);
    b.arg(&mut sink);
    // A few waves of blocks over all SMs; each thread strides through the buffer.
    let cfg = LaunchConfig { grid_dim: (4096, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    unsafe { b.launch(cfg) }.w()?;
    Ok(())
}
