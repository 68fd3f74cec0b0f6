//! The CUDA side of repro's ops: kernels from `kernels/repro.cu`, compiled once per process
//! with NVRTC and launched on candle's stream, so they order correctly with candle's own work.

use super::Reductions;
use crate::hash::{finish_tree, ChainingValue, CHUNK_LEN};
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView, DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::{CudaDevice, WrapErr};
use candle_core::{CudaStorage, DType, Error, Layout, Result, Storage, Tensor};
use std::sync::OnceLock;

const SOURCE: &str = include_str!("../../kernels/repro.cu");
const MODULE: &str = "repro";

/// The kernels' PTX, compiled once per process.
fn ptx() -> Result<&'static str> {
    static PTX: OnceLock<std::result::Result<String, String>> = OnceLock::new();
    let ptx = PTX.get_or_init(|| {
        candle_core::cuda_backend::cudarc::nvrtc::compile_ptx(SOURCE)
            .map(|ptx| ptx.to_src())
            .map_err(|e| format!("compiling kernels/repro.cu with NVRTC failed: {e}"))
    });
    ptx.as_deref().map_err(|e| Error::Msg(e.clone()))
}

fn grid(n: u64, block: u32) -> LaunchConfig {
    let blocks = n.div_ceil(block as u64).clamp(1, 65_535 * 8) as u32;
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (block, 1, 1), shared_mem_bytes: 0 }
}

fn f32_view<'a>(storage: &'a CudaStorage, layout: &Layout, op: &str) -> Result<(CudaView<'a, f32>, u64)> {
    let (start, end) =
        layout.contiguous_offsets().ok_or_else(|| Error::Msg(format!("{op} needs a contiguous input")))?;
    Ok((storage.as_cuda_slice::<f32>()?.slice(start..end), (end - start) as u64))
}

/// The sum of a contiguous F32 tensor as a one-element device buffer.
pub fn sum_f32(storage: &CudaStorage, layout: &Layout, mode: Reductions) -> Result<CudaStorage> {
    let dev = storage.device().clone();
    let (x, n) = f32_view(storage, layout, "sum")?;
    let out = match mode {
        Reductions::Atomic => {
            let mut out = dev.alloc_zeros::<f32>(1)?;
            let f = dev.get_or_load_custom_func("sum_f32_atomic", MODULE, ptx()?)?;
            let mut b = f.builder();
            b.arg(&x);
            b.arg(&n);
            b.arg(&mut out);
            unsafe { b.launch(grid(n, 256)) }.w()?;
            out
        }
        _ => {
            // Two passes with a block count fixed by n: the same tree for the same length.
            let blocks = n.div_ceil(4096).clamp(1, 1024);
            let mut partials = dev.alloc_zeros::<f32>(blocks as usize)?;
            let f = dev.get_or_load_custom_func("sum_f32_ordered", MODULE, ptx()?)?;
            let cfg = LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
            let mut b = f.builder();
            b.arg(&x);
            b.arg(&n);
            b.arg(&mut partials);
            unsafe { b.launch(cfg) }.w()?;
            let mut out = dev.alloc_zeros::<f32>(1)?;
            let one = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
            let mut b = f.builder();
            b.arg(&partials);
            b.arg(&blocks);
            b.arg(&mut out);
            unsafe { b.launch(one) }.w()?;
            out
        }
    };
    Ok(CudaStorage::wrap_cuda_slice(out, dev))
}

/// A one-element F32 tensor broadcast to `n` elements, as a new device buffer.
pub fn expand_f32(storage: &CudaStorage, layout: &Layout, n: usize) -> Result<CudaStorage> {
    let dev = storage.device().clone();
    let (value, len) = f32_view(storage, layout, "expand")?;
    if len != 1 {
        return Err(Error::Msg(format!("expand needs one element, got {len}")));
    }
    let mut out = unsafe { dev.alloc::<f32>(n) }?;
    let n = n as u64;
    let f = dev.get_or_load_custom_func("expand_f32", MODULE, ptx()?)?;
    let mut b = f.builder();
    b.arg(&value);
    b.arg(&n);
    b.arg(&mut out);
    unsafe { b.launch(grid(n, 256)) }.w()?;
    Ok(CudaStorage::wrap_cuda_slice(out, dev))
}

/// Tree levels are merged on the device until at most this many nodes remain.
const HOST_MERGE_NODES: u64 = 64;

/// BLAKE3 of a contiguous CUDA tensor's element bytes, computed on the device: only the last
/// few tree nodes (at most 2 KiB) reach the host. `None` when the tensor is not on a CUDA
/// device, is not contiguous, or fits in one BLAKE3 chunk (then hashing on the host is cheaper).
pub fn data_hash(tensor: &Tensor) -> Result<Option<[u8; 32]>> {
    let (storage, layout) = tensor.storage_and_layout();
    let Storage::Cuda(cuda) = &*storage else {
        return Ok(None);
    };
    let Some((start, end)) = layout.contiguous_offsets() else {
        return Ok(None);
    };
    let dev = cuda.device().clone();
    macro_rules! hash_as {
        ($t:ty) => {
            hash_view(
                &dev,
                &cuda.as_cuda_slice::<$t>()?.slice(start..end),
                ((end - start) * std::mem::size_of::<$t>()) as u64,
            )
        };
    }
    match tensor.dtype() {
        DType::U8 => hash_as!(u8),
        DType::U32 => hash_as!(u32),
        DType::I16 => hash_as!(i16),
        DType::I32 => hash_as!(i32),
        DType::I64 => hash_as!(i64),
        DType::F16 => hash_as!(half::f16),
        DType::BF16 => hash_as!(half::bf16),
        DType::F32 => hash_as!(f32),
        DType::F64 => hash_as!(f64),
        _ => Ok(None),
    }
}

fn hash_view<T: DeviceRepr>(dev: &CudaDevice, data: &CudaView<'_, T>, bytes: u64) -> Result<Option<[u8; 32]>> {
    if bytes <= CHUNK_LEN as u64 {
        return Ok(None);
    }
    let mut nodes = bytes.div_ceil(CHUNK_LEN as u64);
    let mut level: CudaSlice<u32> = unsafe { dev.alloc::<u32>(8 * nodes as usize) }?;
    {
        let f = dev.get_or_load_custom_func("blake3_chunks", MODULE, ptx()?)?;
        let mut b = f.builder();
        b.arg(data);
        b.arg(&bytes);
        b.arg(&mut level);
        unsafe { b.launch(grid(nodes, 128)) }.w()?;
    }
    let parents = dev.get_or_load_custom_func("blake3_parents", MODULE, ptx()?)?;
    while nodes > HOST_MERGE_NODES {
        let next_nodes = nodes.div_ceil(2);
        let mut next: CudaSlice<u32> = unsafe { dev.alloc::<u32>(8 * next_nodes as usize) }?;
        let mut b = parents.builder();
        b.arg(&level);
        b.arg(&nodes);
        b.arg(&mut next);
        unsafe { b.launch(grid(next_nodes, 128)) }.w()?;
        level = next;
        nodes = next_nodes;
    }
    let words = dev.clone_dtoh(&level.slice(0..8 * nodes as usize))?;
    let cvs: Vec<ChainingValue> = words
        .chunks_exact(8)
        .map(|w| {
            let mut cv = [0u8; 32];
            for (i, x) in w.iter().enumerate() {
                cv[4 * i..4 * i + 4].copy_from_slice(&x.to_le_bytes());
            }
            cv
        })
        .collect();
    Ok(Some(finish_tree(cvs)))
}

/// Reads every byte of a contiguous F32 tensor once on the device (no output): the yardstick
/// for memory read bandwidth. The tensor's byte length must be a multiple of 16.
pub fn read_all(tensor: &Tensor) -> Result<()> {
    let (storage, layout) = tensor.storage_and_layout();
    let Storage::Cuda(cuda) = &*storage else {
        return Err(Error::Msg("read_all needs a CUDA tensor".into()));
    };
    let (x, n) = f32_view(cuda, layout, "read_all")?;
    if n % 4 != 0 {
        return Err(Error::Msg("read_all needs a multiple of 4 floats".into()));
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
