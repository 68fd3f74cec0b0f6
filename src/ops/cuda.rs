//! The CUDA side of repro's ops: kernels from `kernels/repro.cu`, compiled once per process
//! with NVRTC and launched on candle's stream, so they order correctly with candle's own work.

use super::Reductions;
use crate::hash::{finish_tree, ChainingValue, CHUNK_LEN};
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView, DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::{CudaDevice, WrapErr};
use candle_core::{CudaStorage, DType, Error, Layout, Result, Storage, Tensor};
use std::sync::OnceLock;

/// Runs `$body` with `$t` bound to the Rust element type of `$dtype` (the dtypes traces hold);
/// evaluates `$other` for any other dtype.
macro_rules! for_dtype {
    ($dtype:expr, $t:ident => $body:expr, $other:pat => $fallback:expr) => {
        match $dtype {
            DType::U8 => {
                type $t = u8;
                $body
            }
            DType::U32 => {
                type $t = u32;
                $body
            }
            DType::I16 => {
                type $t = i16;
                $body
            }
            DType::I32 => {
                type $t = i32;
                $body
            }
            DType::I64 => {
                type $t = i64;
                $body
            }
            DType::F16 => {
                type $t = half::f16;
                $body
            }
            DType::BF16 => {
                type $t = half::bf16;
                $body
            }
            DType::F32 => {
                type $t = f32;
                $body
            }
            DType::F64 => {
                type $t = f64;
                $body
            }
            $other => $fallback,
        }
    };
}

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
fn sum_f32(storage: &CudaStorage, layout: &Layout, mode: Reductions) -> Result<CudaStorage> {
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

/// Threads the column-sum kernels aim for: segments of rows are sized so that
/// `segments * cols` is about this many (and a segment never has fewer than 8 rows).
const ROW_SUM_THREADS: u64 = 1 << 16;

/// Rows per segment of the column sums of a `[rows, cols]` matrix: a function of the shape
/// only, so the ordered sum's tree is the same in every run.
fn segment_rows(rows: u64, cols: u64) -> u64 {
    let segments = (ROW_SUM_THREADS / cols.max(1)).clamp(1, rows.div_ceil(8).max(1));
    rows.div_ceil(segments).max(1)
}

/// Column sums of a contiguous F32 `[rows, cols]` matrix, as a new `[cols]` device buffer.
pub fn sum_rows_f32(
    storage: &CudaStorage,
    layout: &Layout,
    rows: usize,
    cols: usize,
    mode: Reductions,
) -> Result<CudaStorage> {
    if cols == 1 {
        // One column: the whole-tensor sum kernels, which spread one sum over the whole GPU.
        return sum_f32(storage, layout, mode);
    }
    let dev = storage.device().clone();
    let (x, _) = f32_view(storage, layout, "sum_rows")?;
    let (rows, cols) = (rows as u64, cols as u64);
    let seg_rows = segment_rows(rows, cols);
    let segments = rows.div_ceil(seg_rows);
    let mut out = dev.alloc_zeros::<f32>(cols as usize)?;
    match mode {
        Reductions::Atomic => {
            let f = dev.get_or_load_custom_func("sum_rows_f32_atomic", MODULE, ptx()?)?;
            let mut b = f.builder();
            b.arg(&x);
            b.arg(&rows);
            b.arg(&cols);
            b.arg(&seg_rows);
            b.arg(&mut out);
            unsafe { b.launch(grid(segments * cols, 256)) }.w()?;
        }
        _ => {
            let f = dev.get_or_load_custom_func("sum_rows_f32_segments", MODULE, ptx()?)?;
            let mut partials = dev.alloc_zeros::<f32>((segments * cols) as usize)?;
            let mut b = f.builder();
            b.arg(&x);
            b.arg(&rows);
            b.arg(&cols);
            b.arg(&seg_rows);
            b.arg(&mut partials);
            unsafe { b.launch(grid(segments * cols, 256)) }.w()?;
            // The partials' column sums, each column's segments added in order by one thread.
            let mut b = f.builder();
            b.arg(&partials);
            b.arg(&segments);
            b.arg(&cols);
            b.arg(&segments);
            b.arg(&mut out);
            unsafe { b.launch(grid(cols, 256)) }.w()?;
        }
    }
    Ok(CudaStorage::wrap_cuda_slice(out, dev))
}

/// A contiguous F32 vector repeated as the `rows` rows of a new device matrix.
pub fn expand_rows_f32(storage: &CudaStorage, layout: &Layout, rows: usize) -> Result<CudaStorage> {
    let dev = storage.device().clone();
    let (value, cols) = f32_view(storage, layout, "expand_rows")?;
    let rows = rows as u64;
    let mut out = unsafe { dev.alloc::<f32>((rows * cols) as usize) }?;
    let f = dev.get_or_load_custom_func("expand_rows_f32", MODULE, ptx()?)?;
    let mut b = f.builder();
    b.arg(&value);
    b.arg(&rows);
    b.arg(&cols);
    b.arg(&mut out);
    unsafe { b.launch(grid(rows * cols, 256)) }.w()?;
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
    let bytes = |size: usize| ((end - start) * size) as u64;
    for_dtype!(tensor.dtype(), T => hash_view(&dev, &cuda.as_cuda_slice::<T>()?.slice(start..end), bytes(std::mem::size_of::<T>())), _ => Ok(None))
}

fn hash_view<T: DeviceRepr>(dev: &CudaDevice, data: &CudaView<'_, T>, bytes: u64) -> Result<Option<[u8; 32]>> {
    if bytes <= CHUNK_LEN as u64 {
        return Ok(None);
    }
    let (level, nodes) = tree_level(dev, data, bytes)?;
    let words = dev.clone_dtoh(&level.slice(0..8 * nodes as usize))?;
    Ok(Some(finish_tree(words_to_chaining_values(&words))))
}

/// Runs the BLAKE3 kernels over `bytes` (more than one chunk) bytes of `data`, down to a tree
/// level of at most `HOST_MERGE_NODES` chaining values; returns the level and its node count.
fn tree_level<T: DeviceRepr>(dev: &CudaDevice, data: &CudaView<'_, T>, bytes: u64) -> Result<(CudaSlice<u32>, u64)> {
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
    Ok((level, nodes))
}

fn words_to_chaining_values(words: &[u32]) -> Vec<ChainingValue> {
    words
        .chunks_exact(8)
        .map(|w| {
            let mut cv = [0u8; 32];
            for (i, x) in w.iter().enumerate() {
                cv[4 * i..4 * i + 4].copy_from_slice(&x.to_le_bytes());
            }
            cv
        })
        .collect()
}

/// What a queued tensor resolves to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolved {
    /// The tensor's canonical bytes.
    Bytes(Vec<u8>),
    /// BLAKE3 of the tensor's canonical bytes, computed on the device.
    DataHash([u8; 32]),
}

enum Queued {
    /// A copy of a tensor's bytes, taken when it was queued: the tensor itself may be
    /// overwritten in place later in the step (`Var::set` does that to parameters).
    Bytes(CudaSlice<u8>),
    /// A tensor without elements.
    Empty,
    /// The last tree level of a tensor hashed on the device.
    Tree { level: CudaSlice<u32>, nodes: u64 },
}

/// One step's device-side recording work: tensors to copy and tensors to hash, gathered into
/// one buffer and brought to the host with a single copy (one synchronization per step, not
/// one per tensor).
pub struct DeviceBatch {
    dev: CudaDevice,
    queued: Vec<Queued>,
}

impl DeviceBatch {
    /// An empty batch on `dev`.
    pub fn new(dev: CudaDevice) -> Self {
        DeviceBatch { dev, queued: Vec::new() }
    }

    /// The device the batch belongs to.
    pub fn device(&self) -> &CudaDevice {
        &self.dev
    }

    /// Queues a CUDA tensor. With `hash` (and more than one BLAKE3 chunk of data), its data
    /// hash is computed on the device; otherwise its bytes are copied. Returns the ticket of
    /// its result in `resolve`.
    pub fn push(&mut self, tensor: &Tensor, hash: bool) -> Result<usize> {
        let tensor = if tensor.is_contiguous() { tensor.clone() } else { tensor.contiguous()? };
        let len = tensor.elem_count() * tensor.dtype().size_in_bytes();
        let queued = if hash && len > CHUNK_LEN {
            let (storage, layout) = tensor.storage_and_layout();
            let Storage::Cuda(cuda) = &*storage else {
                return Err(Error::Msg("DeviceBatch needs CUDA tensors".into()));
            };
            let (start, end) = layout.contiguous_offsets().expect("made contiguous above");
            let (level, nodes) = for_dtype!(
                tensor.dtype(),
                T => tree_level(&self.dev, &cuda.as_cuda_slice::<T>()?.slice(start..end), len as u64)?,
                other => return Err(Error::Msg(format!("cannot hash {other:?} on the device")))
            );
            Queued::Tree { level, nodes }
        } else if len == 0 {
            Queued::Empty
        } else {
            Queued::Bytes(self.copy_bytes(&tensor, len)?)
        };
        self.queued.push(queued);
        Ok(self.queued.len() - 1)
    }

    /// A device copy of a contiguous tensor's `len` bytes, ordered on the stream before
    /// anything that later overwrites the tensor.
    fn copy_bytes(&self, tensor: &Tensor, len: usize) -> Result<CudaSlice<u8>> {
        let mut copy: CudaSlice<u8> = unsafe { self.dev.alloc::<u8>(len) }?;
        let (storage, layout) = tensor.storage_and_layout();
        let Storage::Cuda(cuda) = &*storage else { return Err(Error::Msg("DeviceBatch needs CUDA tensors".into())) };
        let (start, end) = layout.contiguous_offsets().expect("queued contiguous");
        for_dtype!(
            tensor.dtype(),
            T => {
                let view = cuda.as_cuda_slice::<T>()?.slice(start..end);
                let src = unsafe { view.transmute::<u8>(len) }.expect("view holds its bytes");
                self.dev.memcpy_dtod(&src, &mut copy)?
            },
            other => return Err(Error::Msg(format!("cannot copy {other:?} from the device")))
        );
        Ok(copy)
    }

    /// Gathers everything queued into one device buffer, copies it to the host once, and
    /// returns the results in ticket order.
    pub fn resolve(self) -> Result<Vec<Resolved>> {
        let sizes: Vec<usize> = self
            .queued
            .iter()
            .map(|q| match q {
                Queued::Bytes(copy) => copy.len(),
                Queued::Empty => 0,
                Queued::Tree { nodes, .. } => 32 * *nodes as usize,
            })
            .collect();
        let total: usize = sizes.iter().sum();
        if total == 0 {
            return Ok(sizes.iter().map(|_| Resolved::Bytes(Vec::new())).collect());
        }
        let mut staging: CudaSlice<u8> = unsafe { self.dev.alloc::<u8>(total) }?;
        let mut offset = 0;
        for (q, &size) in self.queued.iter().zip(&sizes) {
            if size > 0 {
                let mut dst = staging.slice_mut(offset..offset + size);
                match q {
                    Queued::Tree { level, .. } => {
                        let src = unsafe { level.transmute::<u8>(size) }.expect("level holds its nodes");
                        self.dev.memcpy_dtod(&src, &mut dst)?;
                    }
                    Queued::Bytes(copy) => self.dev.memcpy_dtod(copy, &mut dst)?,
                    Queued::Empty => {}
                }
            }
            offset += size;
        }
        let host = self.dev.clone_dtoh(&staging)?;
        let mut out = Vec::with_capacity(sizes.len());
        let mut offset = 0;
        for (q, size) in self.queued.iter().zip(sizes) {
            let part = &host[offset..offset + size];
            offset += size;
            out.push(match q {
                Queued::Bytes(_) | Queued::Empty => Resolved::Bytes(part.to_vec()),
                Queued::Tree { .. } => {
                    let words: Vec<u32> =
                        part.chunks_exact(4).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes"))).collect();
                    Resolved::DataHash(finish_tree(words_to_chaining_values(&words)))
                }
            });
        }
        Ok(out)
    }
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
