//! The recorder's device side: a step's tensors hashed on the GPU (or copied, where the host
//! keeps values) by the batched kernels of `kernels/hash.cu`, a handful of launches per flush
//! whatever the number of tensors, and the results brought to the host in one copy per flush.
//! candle's `Device::new_cuda` uses CUDA's per-thread default stream: work launched from another
//! thread would not be ordered with it, so the recorder launches only from the thread that
//! trains (see `DeviceBatch`).

use super::plan::{fits, Plan, Slot, View, Want, BLOCK_LEVELS};
use super::queue::{in_ticket_order, Launched, Planned, Queue, Resolved};
use crate::cuda::buffer_pool::{size_class, Buffer, BufferPool, ScratchPool};
use crate::cuda::keep_freed_memory;
use crate::cuda::kernels::{grid, ptx, MODULE};
use crate::cuda::pinned::{take_pinned, Pinned};
use crate::record::payload_stream::{Kept, PayloadStream};
use candle_core::cuda_backend::cudarc::driver::{
    CudaEvent, CudaFunction, CudaSlice, CudaStream, CudaViewMut, DevicePtr, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::{CudaDevice, DeviceId, WrapErr};
use candle_core::{DType, Device, Error, Result, Storage, Tensor};
use std::sync::Arc;

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

/// The BLAKE3 data hash of a CUDA tensor's canonical bytes (a batch of one; see `DeviceBatch`).
pub fn data_hash(tensor: &Tensor) -> Result<[u8; 32]> {
    let Device::Cuda(dev) = tensor.device() else {
        return Err(Error::Msg("data_hash needs a CUDA tensor".into()));
    };
    let mut batch = DeviceBatch::new(dev.clone());
    batch.push(tensor, true, false)?;
    match batch.resolve()?.remove(0) {
        Resolved::DataHash(h) => Ok(h),
        Resolved::Bytes(bytes) => Ok(*blake3::hash(&bytes).as_bytes()),
        Resolved::InFile(_) => Err(Error::Msg("a batch without a payload stream gave a value to one".into())),
    }
}

/// Compiles and loads the hashing kernels on `dev`, and makes its memory pool keep what candle
/// frees (`keep_freed_memory`): what a `DeviceBatch` would otherwise do at its first flush.
pub fn prepare(dev: &CudaDevice) -> Result<()> {
    keep_freed_memory(dev)?;
    HashKernels::of(dev).map(|_| ())
}

/// One step's device-side recording work. Tensors are queued as they are recorded and read
/// when the batch is flushed: every view is hashed (or copied, where the host keeps values) by
/// the batched kernels of `plan`, a handful of launches per flush whatever the number of
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
    /// The tensors queued (each with what the host wants of it), planned and flushed. A flush
    /// keeps the kernels' output buffers, the slots of their tensors, and the page-locked
    /// buffers their tables were uploaded from (reusable once the step's copy has landed). The
    /// tensors themselves are let go once the kernels are queued: candle frees device memory
    /// in the order of the calling thread's stream (`cuMemFreeAsync`), the stream the kernels
    /// were launched on, so nothing can reuse it before they have run.
    queue: Queue<Queued, Flushed>,
    /// Where the passes that no longer read the tensors run (see `beside`); none: on the calling
    /// thread's stream with the others.
    beside: Option<std::sync::Arc<CudaStream>>,
    /// Where values read back straight from their tensors go (see `streaming_to`).
    payload: Option<std::sync::Arc<PayloadStream>>,
    /// Whether the next flushes run their chunk pass on the `beside` stream (see
    /// `set_chunks_beside`), and the event behind the last one run there.
    chunks_beside: bool,
    chunks_read: Option<CudaEvent>,
}

/// Bytes of device memory that another program's allocator owns (a PyTorch tensor's storage,
/// through `python/cuda-hash`): hashed in place and never freed here. The owner keeps them alive
/// and unchanged until the batch has resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForeignBytes {
    dims: [usize; 1],
    address: u64,
}

impl ForeignBytes {
    /// `len` bytes at device address `address`, in the batch's device's context.
    ///
    /// # Safety
    /// The memory must be readable by the device and stay allocated, and unwritten, until the
    /// batch that hashes it has flushed it (work queued on the flushing thread's stream after the
    /// flush runs after the kernels that read it; see `DeviceBatch::beside`).
    pub unsafe fn new(address: u64, len: usize) -> Self {
        ForeignBytes { dims: [len], address }
    }
}

/// Threads per block of the chunk pass (`CHUNK_THREADS` in kernels/hash_kernels.cu, whose
/// shared memory is sized for it).
const CHUNK_THREADS: u32 = 128;

/// Threads per block of a parent launch (`hash_parents` in kernels/hash_kernels.cu needs one per
/// pair of the 2^`BLOCK_LEVELS` nodes a block merges).
const PARENT_BLOCK_THREADS: u32 = 1 << (BLOCK_LEVELS - 1);

/// Views smaller than this are read as they are, however they are laid out.
const SLOW_VIEW_MIN: usize = 1 << 20;

/// `tensor`'s elements in the same order, its broadcast dimensions kept as views and the rest
/// copied contiguous: a `[16, 896, 151936]` broadcast of a transposed weight costs one copy of
/// the weight, not sixteen, and then reads row by row.
fn relaid(tensor: &Tensor) -> Result<Tensor> {
    let layout = tensor.layout();
    let mut base = tensor.clone();
    for (dim, (&size, &stride)) in layout.dims().iter().zip(layout.stride()).enumerate() {
        if stride == 0 && size > 1 {
            base = base.narrow(dim, 0, 1)?;
        }
    }
    base.contiguous()?.broadcast_as(layout.dims())
}

/// What a batch reads: a candle tensor (kept alive by the batch) or foreign memory.
enum Queued {
    Tensor(Tensor),
    Foreign(ForeignBytes),
}

impl Queued {
    /// Whether the kernels can read it as it is.
    fn fits(&self) -> bool {
        match self {
            Queued::Tensor(t) => fits(t.layout().dims(), t.layout().stride()),
            Queued::Foreign(_) => true,
        }
    }

    /// Whether the kernels would read it slowly: a large view whose innermost dimension is
    /// strided (a transposed matrix, the weight a `Linear` multiplies by), which neighbouring
    /// threads read a row apart, a whole memory sector for each element. Copied row by row
    /// first (`relaid`), it reads at full speed.
    fn reads_slowly(&self) -> bool {
        let Queued::Tensor(t) = self else { return false };
        let layout = t.layout();
        let innermost = layout.dims().iter().zip(layout.stride()).rev().find(|(&d, _)| d != 1);
        matches!(innermost, Some((_, &stride)) if stride > 1) && self.byte_len() >= SLOW_VIEW_MIN
    }

    fn byte_len(&self) -> usize {
        match self {
            Queued::Tensor(t) => t.elem_count() * t.dtype().size_in_bytes(),
            Queued::Foreign(f) => f.dims[0],
        }
    }

    /// The kernels' view of it.
    fn view(&self, stream: &CudaStream) -> Result<View<'_>> {
        match self {
            Queued::Tensor(t) => view_of(t, stream),
            Queued::Foreign(f) => Ok(View { address: f.address, elem_size: 1, dims: &f.dims, strides: &[1] }),
        }
    }
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
    direct: Vec<(usize, Kept)>,
}

impl Launched for Flushed {
    fn results(&self) -> usize {
        self.slots.len()
    }
}

impl DeviceBatch {
    /// An empty batch on `dev`.
    pub fn new(dev: CudaDevice) -> Self {
        // The recorder waits for each step's results; keep that wait from emptying the pool.
        let _ = keep_freed_memory(&dev);
        DeviceBatch {
            dev,
            queue: Queue::default(),
            beside: None,
            payload: None,
            chunks_beside: false,
            chunks_read: None,
        }
    }

    /// The batch, handing each value it reads back straight from its tensor (`Slot::Direct`:
    /// the large values the host keeps) to `payload` as soon as it has landed, so the value goes
    /// to disk while the batch reads the next; its result is then where it went in the file.
    pub fn streaming_to(self, payload: Option<std::sync::Arc<PayloadStream>>) -> Self {
        DeviceBatch { payload, ..self }
    }

    /// An empty batch on `dev` whose flushes keep only the passes that read the tensors (the
    /// chunk pass and the copy of kept bytes) on the calling thread's stream, and run the tree's
    /// upper levels, the roots and the copies back on `stream` behind them. What the program
    /// queues on its stream after a flush then waits for the flush's reads of its memory, not for
    /// the whole hash: a flush per module of a PyTorch model costs its chunk pass alone. The next
    /// flush's chunk pass waits on the device for the last one's tree (see `TreeScratch`).
    pub fn beside(dev: CudaDevice, stream: std::sync::Arc<CudaStream>) -> Self {
        DeviceBatch { beside: Some(stream), ..DeviceBatch::new(dev) }
    }

    /// Makes the flushes that follow run their chunk pass on the `beside` stream too, behind
    /// what the calling thread's stream has queued (the copy of kept bytes still reads on the
    /// calling stream). Only for hashed memory that the owner writes again only behind the
    /// chunk pass (`take_chunks_read`), never the program's: the leaves of `xxh3-1k`, which the
    /// hashing library computes into memory of its own. The program's stream then waits for
    /// none of the hash. Without a `beside` stream the setting changes nothing.
    pub fn set_chunks_beside(&mut self, on: bool) {
        self.chunks_beside = on;
    }

    /// The event behind the last chunk pass run beside (`set_chunks_beside`) since this was
    /// last called, if any: what writes that memory again waits for it.
    pub fn take_chunks_read(&mut self) -> Option<CudaEvent> {
        self.chunks_read.take()
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
        Ok(self.queue.push(Queued::Tensor(tensor), if hash { Want::Hash } else { Want::Bytes }))
    }

    /// Queues foreign device memory: its data hash when `hash`, otherwise its bytes. Returns
    /// the ticket of its result in `resolve`.
    pub fn push_foreign(&mut self, bytes: ForeignBytes, hash: bool) -> usize {
        self.queue.push(Queued::Foreign(bytes), if hash { Want::Hash } else { Want::Bytes })
    }

    /// Tickets handed out so far: results flushed and tensors queued.
    pub fn tickets(&self) -> usize {
        self.queue.tickets()
    }

    /// Plans the reads of everything queued, on the host: no driver call, so any thread may
    /// (the recorder's worker does, for a captured graph). What an earlier call planned and
    /// nothing has launched yet is planned again with it, so the lot is launched in one flush.
    /// Views the kernels cannot read as they are (too many dimensions) need a contiguous copy,
    /// a launch: when one is queued, nothing is planned here and `flush` plans it.
    pub fn plan(&mut self) -> Result<()> {
        let pending = self.queue.pending();
        if pending.is_empty() || pending.iter().any(|(queued, _)| !queued.fits() || queued.reads_slowly()) {
            return Ok(());
        }
        let tensors = self.queue.take_unlaunched();
        let plan = plan_of(&tensors, &self.dev)?;
        self.queue.add_plan(plan, tensors);
        Ok(())
    }

    /// Launches the kernels over everything queued or planned since the last flush, on the
    /// calling thread's stream: they read the tensors before anything launched later on it can
    /// change them.
    pub fn flush(&mut self) -> Result<()> {
        if !self.queue.pending().is_empty() {
            // Views with more dimensions than the kernels take are made contiguous first.
            let mut tensors = Vec::with_capacity(self.queue.pending().len());
            for (queued, want) in self.queue.take_pending() {
                let queued = match queued {
                    Queued::Tensor(tensor) if !fits(tensor.layout().dims(), tensor.layout().stride()) => {
                        let copied = tensor.contiguous();
                        Queued::Tensor(
                            copied.map_err(|e| e.context("copying a view of too many dimensions to hash it"))?,
                        )
                    }
                    queued if queued.reads_slowly() => {
                        let Queued::Tensor(tensor) = &queued else { unreachable!("only tensors read slowly") };
                        let relaid = relaid(tensor);
                        Queued::Tensor(
                            relaid.map_err(|e| e.context("copying a transposed view row by row to hash it"))?,
                        )
                    }
                    queued => queued,
                };
                tensors.push((queued, want));
            }
            let plan = plan_of(&tensors, &self.dev)?;
            self.queue.add_plan(plan, tensors);
        }
        for Planned { plan, reads: tensors } in self.queue.take_planned() {
            let bytes: usize = tensors.iter().map(|(queued, _)| queued.byte_len()).sum();
            let what = format!("hashing {} tensors ({})", tensors.len(), size(bytes));
            let (mut flushed, chunks_read) = self.launch(plan).map_err(|e| e.context(what))?;
            if chunks_read.is_some() {
                self.chunks_read = chunks_read;
            }
            // Values read straight from their tensors are read now, as the kernels read the
            // others: a flush comes before what changes them (an optimizer's in-place update).
            let stream = self.dev.cuda_stream();
            for (i, slot) in flushed.slots.iter().enumerate() {
                if *slot == Slot::Direct {
                    // Landed once `read_values` returns (see there): handed over at once.
                    let bytes = read_values(&tensors[i].0, &self.dev, &stream)?;
                    let kept = match &self.payload {
                        Some(payload) => payload.take(bytes),
                        None => Kept::Bytes(bytes),
                    };
                    flushed.direct.push((i, kept));
                }
            }
            if !flushed.direct.is_empty() {
                // A copy into pageable memory returns once it has landed; this makes sure of it
                // before anything reads the values.
                stream.synchronize().w()?;
            }
            self.queue.add_flushed(flushed);
            // The other tensors are let go here; see `queue`.
            drop(tensors);
        }
        Ok(())
    }

    /// Uploads a plan's table and launches its kernels on the calling thread's stream (with the
    /// chunk pass beside, that pass and the tree on the `beside` stream). Returns the flush, and
    /// the event behind its chunk pass where that ran beside.
    fn launch(&self, plan: Plan) -> Result<(Flushed, Option<CudaEvent>)> {
        let calling = self.dev.cuda_stream();
        let stream = calling.clone();
        let chunk_stream = match (&self.beside, self.chunks_beside) {
            (Some(beside), true) => beside.clone(),
            _ => stream.clone(),
        };
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
        // Each region starts 32-byte aligned: the kernels store chaining values 16 bytes at once.
        let out_bytes = plan.out_len.max(1).next_multiple_of(32);
        let table_bytes = (8 * staged.len()).next_multiple_of(32);
        let arena_len = size_class(out_bytes + table_bytes).next_multiple_of(8);
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
        let kernels = HashKernels::of(&self.dev)?;
        let tree_stream = self.beside.clone().unwrap_or_else(|| stream.clone());
        // The tree's chaining values are needed only while the kernels run (see `TreeScratch`).
        let scratch_key = (self.dev.id(), std::thread::current().id(), Arc::as_ptr(&tree_stream) as usize);
        let scratch_len = size_class(32 * plan.nodes as usize);
        let mut scratch = TREE_SCRATCH
            .take(&scratch_key, scratch_len, || {
                // SAFETY: the kernels write every chaining value they read.
                unsafe { self.dev.alloc::<u8>(scratch_len) }.map(|nodes| TreeScratch { nodes, read: None })
            })
            .map_err(|e| e.context(format!("allocating {} of GPU memory for its tree", size(scratch_len))))?;
        if let Some(read) = &scratch.read {
            // The last tree on `tree_stream` read these nodes: written again only behind it.
            chunk_stream.wait(read).w()?;
        }
        let chunks_read = {
            // SAFETY: allocations are aligned, and the scratch holds whole u32 words.
            let mut nodes = unsafe { scratch.nodes.transmute_mut::<u32>(scratch_len / 4) }.expect("the tree's scratch");
            let streams = Streams { reads: &stream, chunks: &chunk_stream, tree: &tree_stream };
            self.launch_kernels(&plan, &kernels, streams, &table, &mut nodes, &mut out)
                .map_err(|e| e.context("launching its kernels"))?
        };
        // Behind the tree wherever it ran beside the calling stream: the next flush's chunk pass
        // may run on the calling stream after this one's chunk pass and tree both ran beside (without
        // this event that chunk pass would write the nodes while this tree still reads
        // them).
        if !std::ptr::eq(&*tree_stream, &*calling) {
            match &scratch.read {
                Some(read) => read.record(&tree_stream).w()?,
                None => scratch.read = Some(tree_stream.record_event(None).w()?),
            }
        }
        TREE_SCRATCH.give_back(scratch_key, scratch);
        Ok((
            Flushed { arena, out_len: plan.out_len, slots: plan.slots, table: staged, direct: Vec::new() },
            chunks_read,
        ))
    }

    /// Launches a plan's kernels, its table uploaded on `streams.reads`: the copy of kept bytes
    /// there, the chunk pass on `streams.chunks` behind it, the tree's upper levels and roots on
    /// `streams.tree` behind the chunk pass. Returns the event behind a chunk pass run on a
    /// stream other than `streams.reads`.
    fn launch_kernels(
        &self,
        plan: &Plan,
        kernels: &HashKernels,
        streams: Streams<'_>,
        table: &CudaViewMut<'_, u64>,
        nodes: &mut CudaViewMut<'_, u32>,
        out: &mut CudaViewMut<'_, u8>,
    ) -> Result<Option<CudaEvent>> {
        let Streams { reads: stream, chunks: chunk_stream, tree: tree_stream } = streams;
        let words = |r: &std::ops::Range<usize>| table.slice(r.clone());
        if let Some(copy) = &plan.copy {
            let (views, prefix, out_at) = (words(&copy.views), words(&copy.prefix), words(&plan.copy_out));
            let mut b = stream.launch_builder(&kernels.copy);
            b.arg(&views).arg(&prefix).arg(&out_at).arg(&copy.count).arg(&mut *out);
            unsafe { b.launch(grid(copy.items, 256)) }.w()?;
        }
        let mut chunks_read = None;
        if let Some(chunks) = &plan.chunks {
            let beside = !std::ptr::eq(stream, chunk_stream);
            if beside {
                // Behind the table's upload and what the calling stream queued (the leaf pass).
                chunk_stream.join(stream).w()?;
            }
            let (views, prefix) = (words(&chunks.views), words(&chunks.prefix));
            let mut b = chunk_stream.launch_builder(&kernels.chunks);
            b.arg(&views).arg(&prefix).arg(&chunks.count).arg(&mut *nodes);
            unsafe { b.launch(grid(chunks.items, CHUNK_THREADS)) }.w()?;
            if beside {
                chunks_read = Some(chunk_stream.record_event(None).w()?);
            }
        }
        if !std::ptr::eq(chunk_stream, tree_stream) {
            // Behind everything that reads the tensors (and the table's upload).
            tree_stream.join(chunk_stream).w()?;
        }
        if plan.chunks.is_some() {
            for level in &plan.levels {
                let (rows, prefix) = (words(&level.rows), words(&level.prefix));
                // A block per output node (at most 65,535 blocks, each looping over outputs).
                let blocks = level.outputs.min(u16::MAX as u64) as u32;
                let config = LaunchConfig {
                    grid_dim: (blocks, 1, 1),
                    block_dim: (PARENT_BLOCK_THREADS, 1, 1),
                    shared_mem_bytes: 0,
                };
                let mut b = tree_stream.launch_builder(&kernels.parents);
                b.arg(&rows).arg(&prefix).arg(&level.views).arg(&mut *nodes);
                unsafe { b.launch(config) }.w()?;
            }
            let (roots, count) = (words(&plan.roots), plan.roots.len() as u64);
            let nodes = nodes.slice(..);
            let mut b = tree_stream.launch_builder(&kernels.roots);
            b.arg(&roots).arg(&count).arg(&nodes).arg(&mut *out);
            unsafe { b.launch(grid(count, 128)) }.w()?;
        }
        Ok(chunks_read)
    }

    /// Takes over `other`'s work (launched here, on the calling thread's stream, if it was only
    /// planned), after what this batch has flushed and before what it still queues. Returns
    /// `other`'s results' tickets here: they begin at the first ticket of this batch's queued
    /// tensors, whose tickets move up by as many.
    pub fn absorb(&mut self, mut other: DeviceBatch) -> Result<std::ops::Range<usize>> {
        other.flush()?;
        Ok(self.queue.absorb(other.queue))
    }

    /// Flushes, then queues the copy of every output to page-locked host memory behind the
    /// kernels, on the calling thread's stream, without waiting: `PendingRead::wait` waits for
    /// this step's work only, so the host can queue the next steps meanwhile. The device
    /// buffers go back to their pool once the copy has landed (`LandedRead::results`).
    pub fn start_read(mut self) -> Result<PendingRead> {
        self.flush()?;
        let bytes: usize = self.queue.flushed().iter().map(|f| f.out_len).sum();
        self.copy_back().map_err(|e| e.context(format!("copying {} of results back to the host", size(bytes))))
    }

    /// `start_read` once everything is flushed.
    fn copy_back(mut self) -> Result<PendingRead> {
        let stream = match &self.beside {
            // Behind the trees (already queued there) and the copies of kept bytes.
            Some(beside) => {
                beside.join(&self.dev.cuda_stream()).w()?;
                beside.clone()
            }
            None => self.dev.cuda_stream(),
        };
        let flushed = self.queue.take_flushed();
        let mut copies = Vec::with_capacity(flushed.len());
        for Flushed { arena, out_len, slots, table, direct } in flushed {
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

/// Values of at least this many bytes are read back through page-locked pieces.
const STAGED_READ_MIN: usize = 16 << 20;
/// Bytes of each page-locked piece of a staged read.
const STAGED_PIECE: usize = 16 << 20;

/// A queued view's row-major bytes, copied from its own device memory into host memory (a
/// strided tensor is made contiguous on the device first, one tensor at a time), on `stream`
/// after the work queued there; returns once they have landed. Large values come through two
/// page-locked pieces in turn: while the device copies one piece, the host moves the one
/// before into place, where a copy into pageable memory would do both one after the other.
fn read_values(queued: &Queued, dev: &CudaDevice, stream: &std::sync::Arc<CudaStream>) -> Result<Vec<u8>> {
    use candle_core::cuda_backend::cudarc::driver::result;
    let contiguous = match queued {
        Queued::Tensor(t) if !t.is_contiguous() => Queued::Tensor(t.contiguous()?),
        Queued::Tensor(t) => Queued::Tensor(t.clone()),
        Queued::Foreign(bytes) => Queued::Foreign(*bytes),
    };
    let len = contiguous.byte_len();
    let address = contiguous.view(stream)?.address;
    let failed = |e: Error| e.context(format!("copying {} of values back to the host", size(len)));
    if len < STAGED_READ_MIN {
        let mut bytes = vec![0u8; len];
        // SAFETY: `bytes` holds exactly the view's bytes, which start at `address` (contiguous),
        // and stays alive and unread until the copy has landed (it returns once it has, for
        // pageable memory, and the caller synchronizes the stream before reading).
        unsafe { result::memcpy_dtoh_async(&mut bytes, address, stream.cu_stream()) }.w().map_err(failed)?;
        return Ok(bytes);
    }
    let mut bytes = Vec::with_capacity(len);
    let mut pieces = [take_pinned(&PINNED_VALUES, dev, STAGED_PIECE)?, take_pinned(&PINNED_VALUES, dev, STAGED_PIECE)?];
    // The piece each buffer holds, with the event of its copy: drained in order, piece k - 2
    // before piece k is copied into the same buffer.
    let mut in_flight: [Option<(CudaEvent, usize)>; 2] = [None, None];
    let drain = |piece: &Pinned<u8>, in_flight: &mut Option<(CudaEvent, usize)>, bytes: &mut Vec<u8>| -> Result<()> {
        if let Some((event, n)) = in_flight.take() {
            event.synchronize().w()?;
            bytes.extend_from_slice(&piece.as_slice()[..n]);
        }
        Ok(())
    };
    let mut copy_all = || -> Result<()> {
        for (k, start) in (0..len).step_by(STAGED_PIECE).enumerate() {
            let slot = k % 2;
            drain(&pieces[slot], &mut in_flight[slot], &mut bytes)?;
            let n = STAGED_PIECE.min(len - start);
            let piece = &mut pieces[slot].as_mut_slice()[..n];
            // SAFETY: the piece is page-locked and drained (its last copy landed and was read);
            // the device range lies within the contiguous view.
            unsafe { result::memcpy_dtoh_async(piece, address + start as u64, stream.cu_stream()) }.w()?;
            in_flight[slot] = Some((stream.record_event(None).w()?, n));
        }
        let second_to_last = len.div_ceil(STAGED_PIECE) % 2; // its buffer, drained first
        for slot in [second_to_last, 1 - second_to_last] {
            drain(&pieces[slot], &mut in_flight[slot], &mut bytes)?;
        }
        Ok(())
    };
    if let Err(e) = copy_all() {
        // No copy may still be writing into a piece when it is freed.
        let _ = stream.synchronize();
        return Err(failed(e));
    }
    debug_assert_eq!(bytes.len(), len);
    for piece in pieces {
        PINNED_VALUES.give_back(dev.id(), piece);
    }
    Ok(bytes)
}

/// A size in bytes as people read it (`96.0 MiB`).
fn size(bytes: usize) -> String {
    crate::trace::bytes(bytes as u64)
}

/// The plan of a batch of tensors that all fit the kernels: their addresses, read on the host.
fn plan_of(tensors: &[(Queued, Want)], dev: &CudaDevice) -> Result<Plan> {
    let stream = dev.cuda_stream();
    let views = tensors.iter().map(|(q, want)| Ok((q.view(&stream)?, *want))).collect::<Result<Vec<_>>>()?;
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
    direct: Vec<(usize, Kept)>,
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
            results.extend(in_ticket_order(&copy.slots, copy.host.as_slice(), std::mem::take(&mut copy.direct)));
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

/// Page-locked buffers the results are copied into (not write-combined: the host reads them).
static PINNED_RESULTS: BufferPool<DeviceId, Pinned<u8>> = BufferPool::new(1024, usize::MAX);

/// Page-locked pieces that large values are read back through (`read_values`).
static PINNED_VALUES: BufferPool<DeviceId, Pinned<u8>> = BufferPool::new(4, usize::MAX);

/// Page-locked buffers the kernels' tables are uploaded from: a copy from pageable memory can
/// wait for the GPU to drain, one from page-locked memory never does.
static PINNED_TABLES: BufferPool<DeviceId, Pinned<u64>> = BufferPool::new(1024, usize::MAX);

/// Device buffers for the flushes' results (hashes, and the small values the host keeps) and
/// tables, held until the step's results land; the trees' chaining values are `TREE_SCRATCH`'s.
/// An arena above the bound is kept while steps reuse its exact size, and freed by the first
/// `take` that needs another (see `buffer_pool`: never on the writer thread, which gives it back).
static DEVICE_ARENAS: BufferPool<DeviceId, CudaSlice<u8>> = BufferPool::new(usize::MAX, 64 << 20);

/// The streams a flush's kernels run on (`DeviceBatch::launch_kernels`): the one that reads the
/// tensors (and uploads the table), the chunk pass's, and the tree's.
#[derive(Clone, Copy)]
struct Streams<'a> {
    reads: &'a CudaStream,
    chunks: &'a CudaStream,
    tree: &'a CudaStream,
}

/// A tree's chaining values (32 bytes per KiB hashed), needed only while a flush's kernels run:
/// each thread's stream keeps one scratch, as large as its largest flush has needed, that its
/// next flush reuses, rather than a tree per flush held until the step's results land (two steps
/// of them: some 260 MB a step for resnet50 at batch 64). A flush runs its chunk pass on the
/// calling thread's stream (candle's per-thread default stream), so no other thread's flush can
/// take the scratch while those kernels may still run; where the tree's upper levels run on a
/// stream of their own (`DeviceBatch::beside`), `read` is an event behind them, which the next
/// chunk pass waits for on the device before it writes the nodes again (by then the tree has
/// nearly always passed it).
struct TreeScratch {
    nodes: CudaSlice<u8>,
    read: Option<CudaEvent>,
}

impl Drop for TreeScratch {
    fn drop(&mut self) {
        // Freed on the stream it was allocated on, behind the tree that last read it.
        if let Some(read) = &self.read {
            let _ = self.nodes.stream().wait(read);
        }
    }
}

impl Buffer for TreeScratch {
    fn len(&self) -> usize {
        self.nodes.len()
    }

    fn bytes(&self) -> usize {
        self.nodes.len()
    }
}

/// The trees' scratch, one for each device, thread whose stream runs the chunk pass, and stream
/// the tree's upper levels run on (its address), as large as its largest flush has needed.
static TREE_SCRATCH: ScratchPool<(DeviceId, std::thread::ThreadId, usize), TreeScratch> = ScratchPool::new();

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
