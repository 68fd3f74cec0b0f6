//! The CUDA side of repro's ops: kernels from `kernels/`, compiled once per process
//! with NVRTC and launched on candle's stream of the calling thread, so they order correctly with
//! the work that thread launched. candle's `Device::new_cuda` uses CUDA's per-thread default
//! stream: work launched from another thread would not be ordered with it, so the recorder
//! launches only from the thread that trains (see `DeviceBatch`).

use super::buffer_pool::{size_class, Buffer, BufferPool};
use super::device_hash::{fits, Plan, Slot, View, Want};
use super::Reductions;
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{
    CudaEvent, CudaFunction, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, LaunchConfig, PinnedHostSlice,
    PushKernelArg,
};
use candle_core::cuda_backend::{CudaDevice, DeviceId, WrapErr};
use candle_core::{CudaStorage, DType, Device, Error, Layout, Result, Storage, Tensor};
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

/// The kernels of one module, in this order (kernels/common.cuh says why).
const SOURCE: &str = concat!(
    include_str!("../../kernels/common.cuh"),
    include_str!("../../kernels/hash.cu"),
    include_str!("../../kernels/hash_kernels.cu"),
    include_str!("../../kernels/reduce.cu"),
    include_str!("../../kernels/matmul_f32.cu"),
);
const MODULE: &str = "repro";

/// The kernels' PTX, compiled once per process.
fn ptx() -> Result<&'static str> {
    static PTX: OnceLock<std::result::Result<String, String>> = OnceLock::new();
    let ptx = PTX.get_or_init(|| {
        candle_core::cuda_backend::cudarc::nvrtc::compile_ptx(SOURCE)
            .map(|ptx| ptx.to_src())
            .map_err(|e| format!("compiling the kernels of kernels/ with NVRTC failed: {e}"))
    });
    ptx.as_deref().map_err(|e| Error::Msg(e.clone()))
}

const TENSOR_CORE_SOURCE: &str = include_str!("../../kernels/matmul_bf16.cu");
const TENSOR_CORE_MODULE: &str = "repro_tensor_core";

/// The tensor-core kernels' PTX (kernels/matmul_bf16.cu), compiled once per process for
/// compute_80: a module of their own, so that GPUs older than that still load the others.
fn tensor_core_ptx() -> Result<&'static str> {
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

/// The BLAKE3 data hash of a CUDA tensor's canonical bytes (a batch of one; see `DeviceBatch`).
pub fn data_hash(tensor: &Tensor) -> Result<[u8; 32]> {
    let Device::Cuda(dev) = tensor.device() else {
        return Err(Error::Msg("data_hash needs a CUDA tensor".into()));
    };
    let mut batch = DeviceBatch::new(dev.clone());
    batch.push(tensor, true, false)?;
    Ok(match batch.resolve()?.remove(0) {
        Resolved::DataHash(h) => h,
        Resolved::Bytes(bytes) => *blake3::hash(&bytes).as_bytes(),
    })
}

/// What a queued tensor resolves to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolved {
    /// The tensor's canonical bytes.
    Bytes(Vec<u8>),
    /// BLAKE3 of the tensor's canonical bytes, computed on the device.
    DataHash([u8; 32]),
}

/// Compiles and loads the hashing kernels on `dev`, and makes its memory pool keep what candle
/// frees (`keep_freed_memory`): what a `DeviceBatch` would otherwise do at its first flush.
pub fn prepare(dev: &CudaDevice) -> Result<()> {
    keep_freed_memory(dev)?;
    HashKernels::of(dev).map(|_| ())
}

/// One step's device-side recording work. Tensors are queued as they are recorded and read
/// when the batch is flushed: every view is hashed (or copied, where the host keeps values) by
/// the batched kernels of `device_hash`, a handful of launches per flush whatever the number of
/// tensors, and all results reach the host in one copy per flush when the batch resolves.
///
/// Only the thread that trains should make CUDA calls: the driver serializes a context's calls
/// from several threads, and each call another thread makes while training launches kernels
/// costs the training thread a wait for the driver's lock (about a context switch each). So
/// the host's share of a flush, planning it, can run on any thread (`plan`, which makes no
/// driver call), and the launches, the copies and the waits run on the training thread.
///
/// A queued tensor is kept alive and read through its strides, without a copy, when the batch
/// is flushed; a tensor that will change in place before that (a variable an optimizer will
/// update, `Var::set`) is queued with `snapshot`, which copies it on the device at once.
pub struct DeviceBatch {
    dev: CudaDevice,
    /// Queued since the last plan: each tensor and what the host wants of it.
    pending: Vec<(Tensor, Want)>,
    /// Planned, in order, and not launched yet: each plan with the tensors it reads.
    planned: Vec<Planned>,
    /// Flushed: the kernels' output buffers, the slots of their tensors, and the page-locked
    /// buffers their tables were uploaded from (reusable once the step's copy has landed). The
    /// tensors themselves are let go once the kernels are queued: candle frees device memory
    /// in the order of the calling thread's stream (`cuMemFreeAsync`), the stream the kernels
    /// were launched on, so nothing can reuse it before they have run.
    flushed: Vec<Flushed>,
}

/// A plan for some of a batch's tensors, made on the host.
struct Planned {
    plan: Plan,
    /// The tensors whose addresses the plan holds, alive until its kernels are queued.
    tensors: Vec<(Tensor, Want)>,
}

/// One flush's device work, launched.
struct Flushed {
    /// Its one device allocation, whose first `out_len` bytes are the results.
    arena: CudaSlice<u8>,
    out_len: usize,
    /// Where each view's result is among them.
    slots: Vec<Slot>,
    /// The page-locked buffer its table was uploaded from.
    table: Pinned<u64>,
    /// The values of its `Slot::Direct` slots (by slot index), read back when it was launched.
    direct: Vec<(usize, Vec<u8>)>,
}

impl DeviceBatch {
    /// An empty batch on `dev`.
    pub fn new(dev: CudaDevice) -> Self {
        // The recorder waits for each step's results; keep that wait from emptying the pool.
        let _ = keep_freed_memory(&dev);
        DeviceBatch { dev, pending: Vec::new(), planned: Vec::new(), flushed: Vec::new() }
    }

    /// The device the batch belongs to.
    pub fn device(&self) -> &CudaDevice {
        &self.dev
    }

    /// Queues a CUDA tensor: its data hash when `hash`, otherwise its bytes; copied now when
    /// `snapshot`. Returns the ticket of its result in `resolve`.
    pub fn push(&mut self, tensor: &Tensor, hash: bool, snapshot: bool) -> Result<usize> {
        // `copy` makes new storage that the tensor's later in-place update cannot reach.
        let tensor = if snapshot {
            tensor.copy().map_err(|e| e.context("copying a tensor that changes in place before it is hashed"))?
        } else {
            tensor.clone()
        };
        let ticket = self.tickets();
        self.pending.push((tensor, if hash { Want::Hash } else { Want::Bytes }));
        Ok(ticket)
    }

    /// Tickets handed out so far: results flushed and tensors queued.
    pub fn tickets(&self) -> usize {
        self.flushed_results() + self.planned.iter().map(|p| p.plan.slots.len()).sum::<usize>() + self.pending.len()
    }

    /// Results of the flushes so far.
    fn flushed_results(&self) -> usize {
        self.flushed.iter().map(|f| f.slots.len()).sum()
    }

    /// Plans the reads of everything queued, on the host: no driver call, so any thread may
    /// (the recorder's worker does, for a captured graph). What an earlier call planned and
    /// nothing has launched yet is planned again with it, so the lot is launched in one flush.
    /// Views the kernels cannot read as they are (too many dimensions) need a contiguous copy,
    /// a launch: when one is queued, nothing is planned here and `flush` plans it.
    pub fn plan(&mut self) -> Result<()> {
        if self.pending.is_empty() || self.pending.iter().any(|(t, _)| !fits(t.layout().dims(), t.layout().stride())) {
            return Ok(());
        }
        let mut tensors: Vec<(Tensor, Want)> =
            std::mem::take(&mut self.planned).into_iter().flat_map(|planned| planned.tensors).collect();
        tensors.append(&mut self.pending);
        let plan = plan_of(&tensors, &self.dev)?;
        self.planned.push(Planned { plan, tensors });
        Ok(())
    }

    /// Launches the kernels over everything queued or planned since the last flush, on the
    /// calling thread's stream: they read the tensors before anything launched later on it can
    /// change them.
    pub fn flush(&mut self) -> Result<()> {
        if !self.pending.is_empty() {
            // Views with more dimensions than the kernels take are made contiguous first.
            let mut tensors = Vec::with_capacity(self.pending.len());
            for (tensor, want) in std::mem::take(&mut self.pending) {
                let layout = tensor.layout();
                let tensor = if fits(layout.dims(), layout.stride()) {
                    tensor
                } else {
                    let copied = tensor.contiguous();
                    copied.map_err(|e| e.context("copying a view of too many dimensions to hash it"))?
                };
                tensors.push((tensor, want));
            }
            let plan = plan_of(&tensors, &self.dev)?;
            self.planned.push(Planned { plan, tensors });
        }
        for Planned { plan, tensors } in std::mem::take(&mut self.planned) {
            let bytes: u64 = tensors.iter().map(|(t, _)| (t.elem_count() * t.dtype().size_in_bytes()) as u64).sum();
            let what = format!("hashing {} tensors ({})", tensors.len(), size(bytes as usize));
            let mut flushed = self.launch(plan).map_err(|e| e.context(what))?;
            // Values read straight from their tensors are read now, as the kernels read the
            // others: a flush comes before what changes them (an optimizer's in-place update).
            let stream = self.dev.cuda_stream();
            for (i, slot) in flushed.slots.iter().enumerate() {
                if *slot == Slot::Direct {
                    flushed.direct.push((i, read_values(&tensors[i].0, &stream)?));
                }
            }
            if !flushed.direct.is_empty() {
                // A copy into pageable memory returns once it has landed; this makes sure of it
                // before anything reads the values.
                stream.synchronize().w()?;
            }
            self.flushed.push(flushed);
            // The other tensors are let go here; see `flushed`.
            drop(tensors);
        }
        Ok(())
    }

    /// Uploads a plan's table and launches its kernels on the calling thread's stream.
    fn launch(&self, plan: Plan) -> Result<Flushed> {
        let stream = self.dev.cuda_stream();
        // cudarc keeps the errors of calls that cannot return one (a free, when a buffer is
        // dropped) for the next call to find: name it as such rather than as this launch's.
        stream.context().check_err().w().map_err(|e| {
            e.context("a CUDA call that could not report its error (freeing memory, say) failed before this one")
        })?;
        let table_len = plan.table.len().max(1);
        let mut staged = take_pinned(&PINNED_TABLES, &self.dev, table_len).map_err(|e| {
            e.context(format!("allocating {} of page-locked memory for its table", size(8 * table_len)))
        })?;
        staged.as_mut_slice()[..plan.table.len()].copy_from_slice(&plan.table);
        // One device buffer per flush, from a pool (an allocation costs the driver an
        // allocation, two events and their release): the output first (what the host copies
        // back), then the table. Both live until the step's results land, two steps later.
        let out_bytes = plan.out_len.max(1).next_multiple_of(8);
        let table_bytes = 8 * staged.len();
        let arena_len = out_bytes + table_bytes;
        // SAFETY: the table is written by the copy below, and the kernels write every output.
        let mut arena = DEVICE_ARENAS
            .take(&self.dev.id(), arena_len, || unsafe { self.dev.alloc::<u8>(arena_len) })
            .map_err(|e| e.context(format!("allocating {} of GPU memory for its results", size(arena_len))))?;
        let (mut out, mut table) = arena.split_at_mut(out_bytes);
        // SAFETY: the region is 8-byte aligned (allocations are, and so is its offset) and holds
        // whole elements.
        let mut table = unsafe { table.transmute_mut::<u64>(staged.len()) }.expect("the table's region");
        // SAFETY: the staged buffer is page-locked and stays alive (in `Flushed`) until the
        // step's copy back, queued after this one on the same stream, has landed.
        unsafe { staged.upload(&mut table, &stream) }.map_err(|e| e.context("uploading its table"))?;
        // The tree's chaining values (32 bytes per KiB hashed) are needed only while the kernels
        // run: scratch of this thread, whose next flush reuses it behind these kernels on the
        // same stream, rather than memory held until the results land (three steps' worth).
        let scratch_key = (self.dev.id(), std::thread::current().id());
        let scratch_len = size_class(32 * plan.nodes as usize);
        // SAFETY: the kernels write every chaining value they read.
        let mut scratch = NODE_SCRATCH
            .take(&scratch_key, scratch_len, || unsafe { self.dev.alloc::<u8>(scratch_len) })
            .map_err(|e| e.context(format!("allocating {} of GPU memory for its tree", size(scratch_len))))?;
        let kernels = HashKernels::of(&self.dev)?;
        {
            // SAFETY: allocations are aligned, and the scratch holds whole u32 words.
            let mut nodes = unsafe { scratch.transmute_mut::<u32>(scratch_len / 4) }.expect("the tree's scratch");
            self.launch_kernels(&plan, &kernels, &stream, &table, &mut nodes, &mut out)
                .map_err(|e| e.context("launching its kernels"))?;
        }
        NODE_SCRATCH.give_back(scratch_key, scratch);
        Ok(Flushed { arena, out_len: plan.out_len, slots: plan.slots, table: staged, direct: Vec::new() })
    }

    /// Launches a plan's kernels, its table uploaded.
    fn launch_kernels(
        &self,
        plan: &Plan,
        kernels: &HashKernels,
        stream: &CudaStream,
        table: &CudaViewMut<'_, u64>,
        nodes: &mut CudaViewMut<'_, u32>,
        out: &mut CudaViewMut<'_, u8>,
    ) -> Result<()> {
        let words = |r: &std::ops::Range<usize>| table.slice(r.clone());
        if let Some(chunks) = &plan.chunks {
            let (views, prefix) = (words(&chunks.views), words(&chunks.prefix));
            let mut b = stream.launch_builder(&kernels.chunks);
            b.arg(&views).arg(&prefix).arg(&chunks.count).arg(&mut *nodes);
            unsafe { b.launch(grid(chunks.items, 128)) }.w()?;
            for level in &plan.levels {
                let (rows, prefix) = (words(&level.rows), words(&level.prefix));
                let mut b = stream.launch_builder(&kernels.parents);
                b.arg(&rows).arg(&prefix).arg(&level.views).arg(&mut *nodes);
                unsafe { b.launch(grid(level.outputs, 128)) }.w()?;
            }
            let (roots, count) = (words(&plan.roots), plan.roots.len() as u64);
            let nodes = nodes.slice(..);
            let mut b = stream.launch_builder(&kernels.roots);
            b.arg(&roots).arg(&count).arg(&nodes).arg(&mut *out);
            unsafe { b.launch(grid(count, 128)) }.w()?;
        }
        if let Some(copy) = &plan.copy {
            let (views, prefix, out_at) = (words(&copy.views), words(&copy.prefix), words(&plan.copy_out));
            let mut b = stream.launch_builder(&kernels.copy);
            b.arg(&views).arg(&prefix).arg(&out_at).arg(&copy.count).arg(&mut *out);
            unsafe { b.launch(grid(copy.items, 256)) }.w()?;
        }
        Ok(())
    }

    /// Takes over `other`'s work (launched here, on the calling thread's stream, if it was only
    /// planned), after what this batch has flushed and before what it still queues. Returns
    /// `other`'s results' tickets here: they begin at the first ticket of this batch's queued
    /// tensors, whose tickets move up by as many.
    pub fn absorb(&mut self, mut other: DeviceBatch) -> Result<std::ops::Range<usize>> {
        other.flush()?;
        let (first, added) = (self.flushed_results(), other.flushed_results());
        self.flushed.append(&mut other.flushed);
        Ok(first..first + added)
    }

    /// Flushes, then queues the copy of every output to page-locked host memory behind the
    /// kernels, on the calling thread's stream, without waiting: `PendingRead::wait` waits for
    /// this step's work only, so the host can queue the next steps meanwhile. The device
    /// buffers go back to their pool once the copy has landed (`LandedRead::results`).
    pub fn start_read(mut self) -> Result<PendingRead> {
        self.flush()?;
        let bytes: usize = self.flushed.iter().map(|f| f.out_len).sum();
        self.copy_back().map_err(|e| e.context(format!("copying {} of results back to the host", size(bytes))))
    }

    /// `start_read` once everything is flushed.
    fn copy_back(self) -> Result<PendingRead> {
        let stream = self.dev.cuda_stream();
        let mut copies = Vec::with_capacity(self.flushed.len());
        for Flushed { arena, out_len, slots, table, direct } in self.flushed {
            let out = arena.slice(..out_len.max(1));
            let mut host = take_pinned(&PINNED_RESULTS, &self.dev, out.len())?;
            // SAFETY: `host` is page-locked and stays alive (in the `PendingCopy`) until the
            // copy has landed (`PendingRead::wait`).
            unsafe { host.download(&out, &stream) }?;
            copies.push(PendingCopy { host, slots, table, arena, direct });
        }
        // Our own event: a page-locked buffer's own event is recorded only when cudarc manages
        // synchronization between several streams, and candle runs one per thread.
        let landed = stream.record_event(None).w()?;
        Ok(PendingRead { ordinal: self.dev.id(), copies, landed })
    }

    /// Flushes, copies every output to the host, and returns the results in ticket order.
    pub fn resolve(self) -> Result<Vec<Resolved>> {
        Ok(self.start_read()?.wait()?.results())
    }
}

/// A tensor's row-major bytes, copied from its own device memory into pageable host memory (a
/// strided view is made contiguous on the device first, one tensor at a time), on `stream`
/// after the work queued there: the thread waits for the device to get there.
fn read_values(tensor: &Tensor, stream: &std::sync::Arc<CudaStream>) -> Result<Vec<u8>> {
    use candle_core::cuda_backend::cudarc::driver::result;
    let contiguous = if tensor.is_contiguous() { tensor.clone() } else { tensor.contiguous()? };
    let mut bytes = vec![0u8; contiguous.elem_count() * contiguous.dtype().size_in_bytes()];
    let address = view_of(&contiguous, stream)?.address;
    // SAFETY: `bytes` holds exactly the view's bytes, which start at `address` (contiguous), and
    // stays alive and unread until the copy has landed (it returns once it has, for pageable
    // memory, and the caller synchronizes the stream before reading).
    unsafe { result::memcpy_dtoh_async(&mut bytes, address, stream.cu_stream()) }
        .w()
        .map_err(|e| e.context(format!("copying {} of values back to the host", size(bytes.len()))))?;
    Ok(bytes)
}

/// A size in bytes as people read it (`96.0 MiB`).
fn size(bytes: usize) -> String {
    crate::report::bytes(bytes as u64)
}

/// The plan of a batch of tensors that all fit the kernels: their addresses, read on the host.
fn plan_of(tensors: &[(Tensor, Want)], dev: &CudaDevice) -> Result<Plan> {
    let stream = dev.cuda_stream();
    let views = tensors.iter().map(|(t, want)| Ok((view_of(t, &stream)?, *want))).collect::<Result<Vec<_>>>()?;
    Ok(Plan::new(&views).expect("every view fits the kernels"))
}

/// The batched hashing kernels of one device, looked up once per device and process rather
/// than by name at every launch.
#[derive(Clone)]
struct HashKernels {
    chunks: CudaFunction,
    parents: CudaFunction,
    roots: CudaFunction,
    copy: CudaFunction,
}

impl HashKernels {
    fn of(dev: &CudaDevice) -> Result<HashKernels> {
        static LOADED: std::sync::Mutex<Vec<(candle_core::cuda_backend::DeviceId, HashKernels)>> =
            std::sync::Mutex::new(Vec::new());
        let mut loaded = LOADED.lock().map_err(|_| Error::Msg("hash kernel cache poisoned".into()))?;
        if let Some((_, kernels)) = loaded.iter().find(|(id, _)| *id == dev.id()) {
            return Ok(kernels.clone());
        }
        let load = |name: &str| -> Result<CudaFunction> {
            Ok(dev.get_or_load_custom_func(name, MODULE, ptx()?)?.into_cuda_function())
        };
        let kernels = HashKernels {
            chunks: load("hash_chunks")?,
            parents: load("hash_parents")?,
            roots: load("hash_roots")?,
            copy: load("copy_views")?,
        };
        loaded.push((dev.id(), kernels.clone()));
        Ok(kernels)
    }
}

/// One flush's results on their way to the host.
struct PendingCopy {
    /// Page-locked, so alive until the copy has landed (`PendingRead::wait`).
    host: Pinned<u8>,
    slots: Vec<Slot>,
    /// Where the flush's table was uploaded from; free for reuse once the copy has landed.
    table: Pinned<u64>,
    /// The device buffer the results are copied from; free for reuse once the copy has landed.
    arena: CudaSlice<u8>,
    /// The values of its `Slot::Direct` slots, by slot index.
    direct: Vec<(usize, Vec<u8>)>,
}

/// A step's device results, copying to the host (see `DeviceBatch::start_read`).
pub struct PendingRead {
    ordinal: candle_core::cuda_backend::DeviceId,
    copies: Vec<PendingCopy>,
    /// Recorded on the stream behind the copies.
    landed: CudaEvent,
}

impl PendingRead {
    /// Waits for the copies (that is, for the step's work, not for anything queued after it).
    /// A driver call: make it on the thread that trains (see `DeviceBatch`).
    pub fn wait(self) -> Result<LandedRead> {
        self.landed.synchronize().w().map_err(|e| e.context("waiting for the step's hashing and copies on the GPU"))?;
        Ok(LandedRead { ordinal: self.ordinal, copies: self.copies })
    }
}

/// A step's device results, on the host: read on any thread, with no driver call. Its buffers
/// go back to their pools, read or not (dropped on the writer's thread, they would be freed
/// where no CUDA context is current; see `buffer_pool`).
pub struct LandedRead {
    ordinal: candle_core::cuda_backend::DeviceId,
    copies: Vec<PendingCopy>,
}

impl LandedRead {
    /// The results in ticket order.
    pub fn results(mut self) -> Vec<Resolved> {
        let mut results = Vec::new();
        for copy in &mut self.copies {
            let host = copy.host.as_slice();
            let mut direct = std::mem::take(&mut copy.direct).into_iter();
            results.extend(copy.slots.iter().enumerate().map(|(i, slot)| match slot {
                Slot::Hash(r) => Resolved::DataHash(host[r.clone()].try_into().expect("32 bytes")),
                Slot::Bytes(r) => Resolved::Bytes(host[r.clone()].to_vec()),
                Slot::Direct => {
                    let (at, bytes) = direct.next().expect("a value for every direct slot");
                    debug_assert_eq!(at, i);
                    Resolved::Bytes(bytes)
                }
            }));
        }
        self.give_back();
        results
    }

    fn give_back(&mut self) {
        for copy in self.copies.drain(..) {
            PINNED_RESULTS.give_back(self.ordinal, copy.host);
            PINNED_TABLES.give_back(self.ordinal, copy.table);
            DEVICE_ARENAS.give_back(self.ordinal, copy.arena);
        }
    }
}

impl Drop for LandedRead {
    fn drop(&mut self) {
        self.give_back();
    }
}

/// A page-locked host buffer with its address, read and written without the driver calls
/// (an event's wait, and the event's record after each copy) that cudarc's accessors make,
/// since the recorder orders its copies itself, with `PendingRead`'s event.
struct Pinned<T> {
    buffer: PinnedHostSlice<T>,
    address: *mut T,
}

// SAFETY: the address points into `buffer`, which is `Send`, and is used only through `&self`
// (reads) and `&mut self` (writes and copies), as the buffer would be.
unsafe impl<T: Send> Send for Pinned<T> {}

impl<
        T: candle_core::cuda_backend::cudarc::driver::DeviceRepr
            + candle_core::cuda_backend::cudarc::driver::ValidAsZeroBits,
    > Pinned<T>
{
    fn new(mut buffer: PinnedHostSlice<T>) -> Result<Self> {
        // Synchronizes the buffer's event, which nothing has recorded: returns at once.
        let address = buffer.as_mut_ptr().w()?;
        Ok(Pinned { buffer, address })
    }

    /// The elements; valid once every copy into the buffer has landed.
    fn as_slice(&self) -> &[T] {
        // SAFETY: the buffer holds `len` elements at `address` for as long as it lives.
        unsafe { std::slice::from_raw_parts(self.address, self.buffer.len()) }
    }

    fn as_mut_slice(&mut self) -> &mut [T] {
        // SAFETY: as in `as_slice`, borrowed mutably.
        unsafe { std::slice::from_raw_parts_mut(self.address, self.buffer.len()) }
    }

    /// Queues the copy of the buffer to `dst` (as long as the buffer) on `stream`.
    ///
    /// # Safety
    /// The buffer must stay alive and unchanged until the copy has run.
    unsafe fn upload(&self, dst: &mut CudaViewMut<'_, T>, stream: &CudaStream) -> Result<()> {
        use candle_core::cuda_backend::cudarc::driver::{result, DevicePtrMut};
        let (address, _sync) = dst.device_ptr_mut(stream);
        unsafe { result::memcpy_htod_async(address, self.as_slice(), stream.cu_stream()) }.w()
    }

    /// Queues the copy of `src` (as long as the buffer) into the buffer on `stream`.
    ///
    /// # Safety
    /// The buffer must stay alive, and unread, until the copy has landed.
    unsafe fn download(&mut self, src: &CudaView<'_, T>, stream: &CudaStream) -> Result<()> {
        use candle_core::cuda_backend::cudarc::driver::result;
        let (address, _sync) = src.device_ptr(stream);
        let stream = stream.cu_stream();
        unsafe { result::memcpy_dtoh_async(self.as_mut_slice(), address, stream) }.w()
    }
}

/// Page-locked buffers the results are copied into (not write-combined: the host reads them).
static PINNED_RESULTS: BufferPool<DeviceId, Pinned<u8>> = BufferPool::new(16, usize::MAX);
/// Page-locked buffers the kernels' tables are uploaded from: a copy from pageable memory can
/// wait for the GPU to drain, one from page-locked memory never does.
static PINNED_TABLES: BufferPool<DeviceId, Pinned<u64>> = BufferPool::new(16, usize::MAX);
/// Device buffers for the flushes' results, tables and chaining values. A flush over large
/// tensors needs a large tree (32 bytes of chaining values per KiB hashed): an arena above the
/// bound is kept while steps reuse its exact size, and freed by the first `take` that needs
/// another (see `buffer_pool`: never on the writer thread, which gives it back).
static DEVICE_ARENAS: BufferPool<DeviceId, CudaSlice<u8>> = BufferPool::new(usize::MAX, 64 << 20);

/// The hashing trees' scratch, by device and thread: one thread's flushes run on its own stream
/// (candle's per-thread default stream), so a flush reuses the scratch of the one before it
/// with no wait, and no other thread's flush can take it while those kernels may still run.
static NODE_SCRATCH: BufferPool<(DeviceId, std::thread::ThreadId), CudaSlice<u8>> = BufferPool::new(8, usize::MAX);

/// A page-locked buffer of `len` elements from `pool`, or a new one.
fn take_pinned<T>(pool: &BufferPool<DeviceId, Pinned<T>>, dev: &CudaDevice, len: usize) -> Result<Pinned<T>>
where
    T: candle_core::cuda_backend::cudarc::driver::DeviceRepr
        + candle_core::cuda_backend::cudarc::driver::ValidAsZeroBits,
{
    // SAFETY: every element is written (by a copy, or by the host) before anything reads it.
    pool.take(&dev.id(), len, || {
        Pinned::new(unsafe { dev.cuda_stream().context().alloc_pinned_with_flags::<T>(len, 0) }.w()?)
    })
}

impl<T> Buffer for Pinned<T> {
    fn len(&self) -> usize {
        self.buffer.len()
    }
    fn bytes(&self) -> usize {
        self.buffer.num_bytes()
    }
}

impl Buffer for CudaSlice<u8> {
    fn len(&self) -> usize {
        CudaSlice::len(self)
    }
    fn bytes(&self) -> usize {
        CudaSlice::len(self)
    }
}

/// Makes CUDA's stream-ordered pool of `dev` keep the memory that candle frees, instead of
/// handing it back to the driver. candle allocates every tensor with `cuMemAllocAsync` from
/// the device's default pool, whose release threshold is 0: at every synchronization (a
/// `to_scalar`, an event wait) the pool returns all freed memory, and the next step maps it
/// again, which costs more than a small model's step. With the threshold at its maximum the
/// pool keeps what a step freed for the next one, as PyTorch's caching allocator does; the
/// process's reserved memory then stays at its peak. Once per device and process;
/// `REPRO_CUDA_POOL=release` leaves the pool as CUDA sets it.
pub fn keep_freed_memory(dev: &CudaDevice) -> Result<()> {
    use candle_core::cuda_backend::cudarc::driver::sys;
    static DONE: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());
    // Called for every step's batch: the devices already seen return before anything else.
    let ctx = dev.cuda_stream().context().clone();
    let mut done = DONE.lock().map_err(|_| Error::Msg("memory pool registry poisoned".into()))?;
    if done.contains(&ctx.ordinal()) {
        return Ok(());
    }
    if !ctx.has_async_alloc() || std::env::var("REPRO_CUDA_POOL").is_ok_and(|v| v == "release") {
        done.push(ctx.ordinal());
        return Ok(());
    }
    ctx.bind_to_thread().w()?;
    let mut pool = std::ptr::null_mut();
    let mut threshold = u64::MAX;
    // SAFETY: the pool handle comes from the driver for this context's device and is only
    // passed back to it; the attribute's value is a u64, as CU_MEMPOOL_ATTR_RELEASE_THRESHOLD takes.
    unsafe {
        sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()).result().w()?;
        sys::cuMemPoolSetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold as *mut u64).cast(),
        )
        .result()
        .w()?;
    }
    done.push(ctx.ordinal());
    Ok(())
}

/// The most device memory that tensors and the recorder's buffers (everything allocated from
/// the device's stream-ordered pool, which candle uses) have held at once since the last call,
/// and starts the next such span. One driver call per attribute: call it on the thread that
/// trains, with the device drained.
pub fn take_peak_memory(dev: &CudaDevice) -> Result<u64> {
    use candle_core::cuda_backend::cudarc::driver::sys;
    let ctx = dev.cuda_stream().context().clone();
    ctx.bind_to_thread().w()?;
    let mut pool = std::ptr::null_mut();
    let mut peak = 0u64;
    let mut reset = 0u64;
    // SAFETY: the pool handle comes from the driver for this context's device; both attributes
    // are u64s, and USED_MEM_HIGH may only be set to 0 (which restarts it from what is in use).
    unsafe {
        sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()).result().w()?;
        let high = sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH;
        sys::cuMemPoolGetAttribute(pool, high, (&mut peak as *mut u64).cast()).result().w()?;
        sys::cuMemPoolSetAttribute(pool, high, (&mut reset as *mut u64).cast()).result().w()?;
    }
    Ok(peak)
}

/// The kernels' view of a CUDA tensor: the device address of its first element, its element
/// size, dims and strides (borrowed from its layout).
fn view_of<'t>(tensor: &'t Tensor, stream: &CudaStream) -> Result<View<'t>> {
    let address = {
        let (storage, layout) = tensor.storage_and_layout();
        let Storage::Cuda(cuda) = &*storage else {
            return Err(Error::Msg("DeviceBatch needs CUDA tensors".into()));
        };
        let base = for_dtype!(
            tensor.dtype(),
            T => cuda.as_cuda_slice::<T>()?.device_ptr(stream).0,
            other => return Err(Error::Msg(format!("cannot hash {other:?} on the device")))
        );
        base + (layout.start_offset() * tensor.dtype().size_in_bytes()) as u64
    };
    let layout = tensor.layout();
    Ok(View {
        address,
        elem_size: tensor.dtype().size_in_bytes() as u64,
        dims: layout.dims(),
        strides: layout.stride(),
    })
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

/// The batch-invariant matrix product (`matmul_f32_fixed_*` in kernels/matmul_f32.cu) into a new
/// contiguous `[batch, m, n]` device buffer.
pub(crate) fn matmul_f32_fixed(
    a: &CudaStorage,
    a_layout: &Layout,
    b: &CudaStorage,
    b_layout: &Layout,
    shape: &super::MatmulPlan,
) -> Result<CudaStorage> {
    let dev = a.device().clone();
    let a = a.as_cuda_slice::<f32>()?.slice(a_layout.start_offset()..);
    let b = b.as_cuda_slice::<f32>()?.slice(b_layout.start_offset()..);
    // Every element is written by the kernel.
    let mut out = unsafe { dev.alloc::<f32>(shape.batch * shape.m * shape.n) }?;
    // The largest tiles that still give about every SM (132 on an H100) a block. The tile size
    // changes which thread computes an element, never the order of its sum.
    let tiles_of = |tile: usize| shape.m.div_ceil(tile) * shape.n.div_ceil(tile) * shape.batch;
    let (tile, name) = if tiles_of(128) >= 128 {
        (128, "matmul_f32_fixed_128")
    } else if tiles_of(64) >= 128 {
        (64, "matmul_f32_fixed_64")
    } else {
        (32, "matmul_f32_fixed_32")
    };
    let f = dev.get_or_load_custom_func(name, MODULE, ptx()?)?;
    let tiles = |x: usize| x.div_ceil(tile) as u32;
    let cfg = LaunchConfig {
        grid_dim: (tiles(shape.n), tiles(shape.m), shape.batch as u32),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let dims = [shape.m, shape.n, shape.k].map(|d| d as u64);
    let [a_z, a_m, a_k] = shape.a_strides.map(|s| s as u64);
    let [b_z, b_k, b_n] = shape.b_strides.map(|s| s as u64);
    let mut l = f.builder();
    l.arg(&a);
    l.arg(&b);
    l.arg(&mut out);
    for d in &dims {
        l.arg(d);
    }
    for s in [&a_z, &a_m, &a_k, &b_z, &b_k, &b_n] {
        l.arg(s);
    }
    unsafe { l.launch(cfg) }.w()?;
    Ok(CudaStorage::wrap_cuda_slice(out, dev))
}

/// Tiles of the tensor-core kernels (kernels/matmul_bf16.cu): 128 x 128 outputs a block of
/// 256 threads.
const TC_TILE: usize = 128;

/// The tensor-core kernels: name, and shared memory (3 slices in flight x both operands' 128
/// rows x (slice depth + 8 padding) x 2 bytes). The first is the one products use; the other
/// tiles K otherwise, and must give the same bits (gpu-check).
pub const TENSOR_CORE_VARIANTS: [(&str, usize); 2] =
    [("matmul_bf16_fixed", 3 * 256 * 72 * 2), ("matmul_bf16_fixed_k32", 3 * 256 * 40 * 2)];

/// `a @ wt` for 2-d bf16 `a` `[M, K]` and `wt` `[K, N]` with K contiguous in both (a linear
/// layer's transposed weight), by tensor-core kernel `variant` of `TENSOR_CORE_VARIANTS`: for
/// gpu-check's comparison of the variants' bits.
pub fn matmul_bf16_variant(a: &Tensor, wt: &Tensor, variant: usize) -> Result<Tensor> {
    let (m, k) = a.dims2()?;
    let (_, n) = wt.dims2()?;
    let plan = super::MatmulPlan {
        batch: 1,
        m,
        n,
        k,
        a_strides: [0, a.stride()[0], a.stride()[1]],
        b_strides: [0, wt.stride()[0], wt.stride()[1]],
    };
    let (sa, la) = a.storage_and_layout();
    let (sb, lb) = wt.storage_and_layout();
    let (Storage::Cuda(sa), Storage::Cuda(sb)) = (&*sa, &*sb) else {
        return Err(Error::Msg("matmul_bf16_variant needs CUDA tensors".into()));
    };
    let out = matmul_bf16_fixed(sa, la, sb, lb, &plan, variant)?;
    Ok(Tensor::from_storage(Storage::Cuda(out), (m, n), candle_core::op::BackpropOp::none(), false))
}

/// The batch-invariant bf16 product on tensor cores (`matmul_bf16_fixed`) into a new
/// contiguous `[batch, m, n]` device buffer. Both operands must have K contiguous (a_k and
/// b_k of 1), K a multiple of 8, and every row 16-byte aligned: `ops::invariant::matmul`
/// prepares them so. `variant` indexes `TENSOR_CORE_VARIANTS` (0 for products).
pub(crate) fn matmul_bf16_fixed(
    a: &CudaStorage,
    a_layout: &Layout,
    b: &CudaStorage,
    b_layout: &Layout,
    shape: &super::MatmulPlan,
    variant: usize,
) -> Result<CudaStorage> {
    let (kernel, shared_bytes) = TENSOR_CORE_VARIANTS[variant];
    let [a_z, a_m, a_k] = shape.a_strides;
    let [b_z, b_k, b_n] = shape.b_strides;
    let aligned = |x: usize| x % 8 == 0;
    if a_k != 1
        || b_k != 1
        || !aligned(shape.k)
        || ![a_z, a_m, b_z, b_n, a_layout.start_offset(), b_layout.start_offset()].into_iter().all(aligned)
    {
        return Err(Error::Msg(format!(
            "the tensor-core matmul needs K contiguous, a multiple of 8, and 16-byte aligned rows; got K {} and strides {:?}, {:?}",
            shape.k, shape.a_strides, shape.b_strides
        )));
    }
    let dev = a.device().clone();
    let a = a.as_cuda_slice::<half::bf16>()?.slice(a_layout.start_offset()..);
    let b = b.as_cuda_slice::<half::bf16>()?.slice(b_layout.start_offset()..);
    // Every element is written by the kernel.
    let mut out = unsafe { dev.alloc::<half::bf16>(shape.batch * shape.m * shape.n) }?;
    let func = dev.get_or_load_custom_func(kernel, TENSOR_CORE_MODULE, tensor_core_ptx()?)?;
    let stream = dev.cuda_stream();
    let func = func.into_cuda_function();
    func.set_attribute(
        candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        shared_bytes as i32,
    )
    .w()?;
    let tiles = |x: usize| x.div_ceil(TC_TILE) as u32;
    let cfg = LaunchConfig {
        grid_dim: (tiles(shape.n), tiles(shape.m), shape.batch as u32),
        block_dim: (256, 1, 1),
        shared_mem_bytes: shared_bytes as u32,
    };
    let args = [shape.m, shape.n, shape.k, a_z, a_m, b_z, b_n].map(|d| d as u64);
    let mut l = stream.launch_builder(&func);
    l.arg(&a);
    l.arg(&b);
    l.arg(&mut out);
    for d in &args {
        l.arg(d);
    }
    unsafe { l.launch(cfg) }.w()?;
    Ok(CudaStorage::wrap_cuda_slice(out, dev))
}

/// Row sums of a contiguous F32 `[rows, cols]` matrix, each row by one warp in an order fixed
/// by its columns (`sum_last_f32_fixed`), as a new `[rows]` device buffer.
pub fn sum_last_f32_fixed(storage: &CudaStorage, layout: &Layout, rows: usize, cols: usize) -> Result<CudaStorage> {
    let dev = storage.device().clone();
    let (x, _) = f32_view(storage, layout, "sum_last")?;
    let mut out = dev.alloc_zeros::<f32>(rows)?;
    let f = dev.get_or_load_custom_func("sum_last_f32_fixed", MODULE, ptx()?)?;
    let (rows, cols) = (rows as u64, cols as u64);
    let mut b = f.builder();
    b.arg(&x);
    b.arg(&rows);
    b.arg(&cols);
    b.arg(&mut out);
    // One warp (32 threads) a row.
    unsafe { b.launch(grid(rows * 32, 256)) }.w()?;
    Ok(CudaStorage::wrap_cuda_slice(out, dev))
}
