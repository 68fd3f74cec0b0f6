//! repro's GPU hashing for CUDA memory another program owns, through a C ABI (the library's
//! `cuda` feature). The PyTorch recorder (`python/repro/torch/cuda_hash.py`) loads it with ctypes to hash CUDA
//! tensors where they are, with no copy to the host: the same batched BLAKE3 kernels and
//! canonical data hash as `repro record --device cuda:N`. Built by `make cuda` (this crate with
//! its `cuda` feature) beside the binary, at `target/cuda/release/librepro_cuda_hash.so`;
//! without the feature (the workspace's CPU build) the library has none of it. It uses the recorder's
//! device side only through `repro::record::gpu_hashing`.
//!
//! ```c
//! void *repro_cuda_hasher_new(int32_t ordinal);                        // NULL on error
//! void *repro_cuda_hasher_new_kind(int32_t ordinal, uint32_t data_hash); // 0 blake3, 1 xxh3-1k
//! int64_t repro_cuda_hasher_push_many(void *h, const uint64_t *addresses, const uint64_t *lens,
//!                                     const uint8_t *keep_bytes, uint64_t n);
//!                                                     // the first one's ticket; -1 on error
//! int64_t repro_cuda_hasher_push_now(void *h, uint64_t address, uint64_t len);
//!                                                     // xxh3-1k only: its ticket; -1 on error
//! int32_t repro_cuda_hasher_flush(void *h);                    // 0, or -1 on error
//! void *repro_cuda_hasher_start_read(void *h, uint64_t *n);    // a read, NULL on error
//! int32_t repro_cuda_read_finish(void *read, uint8_t *hashes, uint64_t n,
//!                                uint8_t *bytes, uint64_t bytes_len);  // 0, or -1 on error
//! void repro_cuda_hasher_free(void *h);
//! const char *repro_cuda_last_error(void);   // the calling thread's last error, or NULL
//! ```
//!
//! `push_many` queues `n` pieces of memory, each `lens[i]` bytes at device address
//! `addresses[i]` of GPU `ordinal`'s primary context (where PyTorch allocates), and returns the
//! first one's ticket; tickets count 0, 1, 2, ... since the last `start_read`. With
//! `keep_bytes[i]` non-zero, that piece's bytes themselves come back too. `flush` launches the kernels over what is
//! queued, without waiting. `start_read` flushes and queues the copy of every result to the host
//! behind the kernels, without waiting, and sets `n` to the number of tickets; the hasher starts
//! over at ticket 0. `read_finish` waits for that copy (not for anything queued later, so the
//! program can go on with its next step meanwhile) and writes the `n` data hashes (32
//! bytes each, ticket order) to `hashes`, and the bytes of the tickets pushed with `keep_bytes`,
//! one after another in ticket order, to `bytes` (`bytes_len` their total length). It frees the
//! read, whether it succeeds or not.
//!
//! The passes that read the memory run on the calling thread's per-thread default stream, which
//! CUDA orders with its legacy default stream (PyTorch's stream unless the program chose
//! another) both ways: they read the memory after the work queued there before `flush`, and work
//! queued there after `flush` (an in-place update, or new tensors in freed memory) waits for
//! them. So memory only needs to stay allocated and unchanged until `flush`. The rest of each
//! hash (the tree above the chunks, the roots, the copies back) runs on a stream of the
//! hasher's own, beside the program's work (`DeviceBatch::beside`). A program on another stream
//! synchronizes it before `flush` and finishes the read before going on. All calls on one
//! hasher, and on its reads, come from one thread.
//!
//! A hasher made by `repro_cuda_hasher_new` computes the data hash `blake3`; one made by
//! `repro_cuda_hasher_new_kind` with 1 computes `xxh3-1k` (docs/trace-format.md, section 5.5):
//! each flush first runs the leaf pass over the memory to hash, on the calling thread's stream,
//! into leaf memory the hasher owns. The leaves are hashed with BLAKE3 as any memory is, once
//! for many flushes: by the next flush that reads the program's memory itself (bytes to keep),
//! or by `start_read`; a flush in order with nothing but leaves runs the leaf
//! pass alone. After those BLAKE3 passes the next leaves are written into the same memory.
//! Only the leaf pass reads the program's memory then: the chunk pass over the leaves runs on
//! the hasher's own stream with the tree, so the program's stream waits for the leaf pass alone.
//! `push_now` (`xxh3-1k` only) queues one piece as `push_many` does, but runs its leaf pass at
//! once, on the calling thread's stream: the memory is read before anything the program queues
//! there next (an in-place update of a module's output), and may change right after the call;
//! its leaves are hashed at the next flush. It spares copying memory the program is about to
//! change.

use candle_core::cuda_backend::cudarc::driver::CudaEvent;
use candle_core::cuda_backend::cudarc::driver::CudaStream;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, DevicePtr};
use candle_core::cuda_backend::CudaDevice;
use candle_core::cuda_backend::WrapErr;
use candle_core::{Device, Result};
use repro::hash::DataHash;
use repro::record::gpu_hashing::{
    launch_leaves, launch_leaves_of, leaf_count, DeviceBatch, ForeignBytes, LeafPiece, PendingRead, Resolved,
};
use std::cell::RefCell;
use std::ffi::{c_char, c_void, CString};
use std::sync::Arc;

/// A hasher: one device, the batch queued since the last `start_read`, which of its tickets
/// keep their bytes, and the stream its hashes finish on (`DeviceBatch::beside`).
struct Hasher {
    batch: DeviceBatch,
    keeps_bytes: Vec<bool>,
    /// The data hash it computes.
    data_hash: DataHash,
    /// `xxh3-1k`: the pieces whose leaves the next flush computes first, and the memory their
    /// leaves live in.
    leaf_pieces: Vec<LeafPiece>,
    leaf_memory: LeafMemory,
    /// Whether the batch holds pieces of the program's memory not read yet (its own, under
    /// `blake3`; the bytes kept, under `xxh3-1k`): the next flush reads them. Under `xxh3-1k` a
    /// flush in order that has none leaves the leaves for a later one (see `flush`).
    program_memory_queued: bool,
    beside: Arc<CudaStream>,
}

impl Hasher {
    /// Starts a new batch, returning the one queued so far and which of its tickets keep bytes.
    fn take_batch(&mut self) -> (DeviceBatch, Vec<bool>) {
        let fresh = DeviceBatch::beside(self.batch.device().clone(), self.beside.clone());
        (std::mem::replace(&mut self.batch, fresh), std::mem::take(&mut self.keeps_bytes))
    }

    /// Launches the leaf pass over the pieces queued since the last flush (`xxh3-1k`), behind
    /// the reads of the leaf memory's last flush where they ran on the hasher's own stream.
    fn launch_leaves(&mut self) -> Result<()> {
        if self.leaf_pieces.is_empty() {
            return Ok(());
        }
        let pieces = std::mem::take(&mut self.leaf_pieces);
        if let Some(read) = self.leaf_memory.read_beside.take() {
            self.batch.device().cuda_stream().wait(&read).w()?;
        }
        // SAFETY: the pieces' memory is the caller's, as `push_many` requires; their leaves lie
        // in blocks of `leaf_memory` that the last flush's reads are done with (above, or in
        // stream order) and that nothing else uses until this flush has read them.
        unsafe { launch_leaves(self.batch.device(), &pieces) }
    }

    /// After a flush that read the leaves (its passes queued): their blocks serve the next
    /// flush's leaves, written on the calling thread's stream behind these reads, or, when its
    /// chunk pass read them on the hasher's own stream, behind `chunks_read` (the event behind
    /// that pass there).
    fn leaves_read(&mut self, chunks_read: Option<CudaEvent>) -> Result<()> {
        let memory = &mut self.leaf_memory;
        if memory.used.is_empty() {
            return Ok(());
        }
        memory.free.append(&mut memory.used);
        memory.at = 0;
        if chunks_read.is_some() {
            memory.read_beside = chunks_read;
        }
        Ok(())
    }
}

/// Device memory for the leaves of the pieces of one flush (`xxh3-1k`): blocks handed out in
/// order, and reused by the next flush once its passes are queued (`Hasher::leaves_read`).
struct LeafMemory {
    /// Blocks the pieces queued since the last flush have their leaves in, the last one filling.
    used: Vec<CudaSlice<u8>>,
    /// Bytes of the last block handed out.
    at: usize,
    /// Blocks for the next flush's leaves.
    free: Vec<CudaSlice<u8>>,
    /// After the reads of `free`'s blocks on the hasher's own stream (a chunk pass there).
    read_beside: Option<CudaEvent>,
}

/// Bytes of a leaf block: the leaves of 512 MiB of memory, more than a flush of module outputs
/// reads (`MAX_QUEUED_BYTES` in python/repro/torch/flushes.py, 256 MiB). A larger flush (a
/// model's gradients) takes more blocks.
const LEAF_BLOCK: usize = 4 << 20;

impl Drop for LeafMemory {
    fn drop(&mut self) {
        // Freed in stream order behind reads on the calling stream; those beside it are waited for.
        if let Some(read) = &self.read_beside {
            let _ = read.synchronize();
        }
    }
}

impl LeafMemory {
    /// The address of room for `bytes` of leaves, 16-byte aligned (the BLAKE3 chunk pass reads
    /// whole aligned chunks fastest).
    fn reserve(&mut self, dev: &CudaDevice, bytes: usize) -> Result<u64> {
        let at = self.at.next_multiple_of(16);
        let fits = self.used.last().is_some_and(|block| at + bytes <= block.len());
        if !fits {
            let reused = self.free.iter().position(|b| b.len() >= bytes).map(|i| self.free.swap_remove(i));
            let block = match reused {
                Some(block) => block,
                // SAFETY: the leaf pass writes every leaf before anything reads it.
                None => unsafe { dev.alloc::<u8>(LEAF_BLOCK.max(bytes)) }?,
            };
            self.used.push(block);
            self.at = 0;
            return self.reserve(dev, bytes);
        }
        let block = self.used.last().expect("a block");
        let stream = dev.cuda_stream();
        let base = block.device_ptr(&stream).0;
        self.at = at + bytes;
        Ok(base + at as u64)
    }
}

thread_local! {
    static LAST_ERROR: RefCell<Option<CString>> = const { RefCell::new(None) };
}

/// Keeps `message` as the calling thread's last error.
fn set_error(message: String) {
    let message = CString::new(message.replace('\0', " ")).expect("no NUL left");
    LAST_ERROR.with(|e| *e.borrow_mut() = Some(message));
}

/// The calling thread's last error, valid until its next failing call; NULL if none.
#[no_mangle]
pub extern "C" fn repro_cuda_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ref().map_or(std::ptr::null(), |m| m.as_ptr()))
}

fn new_hasher(ordinal: i32, data_hash: DataHash) -> Result<Hasher> {
    let ordinal = usize::try_from(ordinal).map_err(|_| candle_core::Error::Msg(format!("no GPU {ordinal}")))?;
    let Device::Cuda(dev) = Device::new_cuda(ordinal)? else { unreachable!("new_cuda gives a CUDA device") };
    repro::record::gpu_hashing::prepare(&dev)?;
    // The batches order their streams themselves (`DeviceBatch`: each stream joins the one
    // whose work it follows, and a buffer goes back to its pool only once its results have
    // landed), so cudarc's own tracking, events recorded and waited on for every buffer a
    // launch takes, would only add driver calls to every flush.
    // SAFETY: see above; the hasher's buffers are made after this call.
    unsafe { dev.cuda_stream().context().disable_event_tracking() };
    // Non-blocking: it is not ordered with PyTorch's legacy default stream, only with the
    // flushing thread's stream through the events `DeviceBatch::beside` records.
    let beside = dev.cuda_stream().context().new_stream().w()?;
    Ok(Hasher {
        batch: DeviceBatch::beside(dev, beside.clone()),
        keeps_bytes: Vec::new(),
        data_hash,
        leaf_pieces: Vec::new(),
        leaf_memory: LeafMemory { used: Vec::new(), at: 0, free: Vec::new(), read_beside: None },
        program_memory_queued: false,
        beside,
    })
}

/// A hasher of the data hash `blake3` on GPU `ordinal`, or NULL (see `repro_cuda_last_error`).
#[no_mangle]
pub extern "C" fn repro_cuda_hasher_new(ordinal: i32) -> *mut c_void {
    repro_cuda_hasher_new_kind(ordinal, 0)
}

/// A hasher on GPU `ordinal` of the data hash `data_hash` (0: `blake3`, 1: `xxh3-1k`), or NULL
/// (see `repro_cuda_last_error`).
#[no_mangle]
pub extern "C" fn repro_cuda_hasher_new_kind(ordinal: i32, data_hash: u32) -> *mut c_void {
    let kind = match data_hash {
        0 => DataHash::Blake3,
        1 => DataHash::Xxh3Chunks,
        other => {
            set_error(format!("repro_cuda_hasher_new_kind: no data hash {other} (0: blake3, 1: xxh3-1k)"));
            return std::ptr::null_mut();
        }
    };
    match new_hasher(ordinal, kind) {
        Ok(hasher) => Box::into_raw(Box::new(hasher)).cast(),
        Err(e) => {
            set_error(format!("cannot start hashing on cuda:{ordinal}: {e}"));
            std::ptr::null_mut()
        }
    }
}

/// The hasher behind a handle, or an error for NULL.
///
/// # Safety
/// `hasher` is NULL or comes from `repro_cuda_hasher_new` and is not freed.
unsafe fn hasher_of<'a>(hasher: *mut c_void, call: &str) -> Option<&'a mut Hasher> {
    let hasher = unsafe { hasher.cast::<Hasher>().as_mut() };
    if hasher.is_none() {
        set_error(format!("{call}: no hasher (NULL)"));
    }
    hasher
}

/// 0 for `Ok`; -1 for an error, kept for `repro_cuda_last_error`.
fn status(result: Result<()>, what: &str) -> i32 {
    match result {
        Ok(()) => 0,
        Err(e) => {
            set_error(format!("{what}: {e}"));
            -1
        }
    }
}

/// Queues `n` pieces of device memory, in order, each for its data hash and, with its
/// `keep_bytes`, its bytes; returns the first one's ticket, or -1.
///
/// # Safety
/// `hasher` comes from `repro_cuda_hasher_new`; each piece's memory stays allocated and unchanged
/// until the next `repro_cuda_hasher_flush` or `repro_cuda_hasher_start_read` (see the module's documentation for the streams this
/// assumes); the three arrays hold `n` elements each (any may be NULL when `n` is 0).
#[no_mangle]
pub unsafe extern "C" fn repro_cuda_hasher_push_many(
    hasher: *mut c_void,
    addresses: *const u64,
    lens: *const u64,
    keep_bytes: *const u8,
    n: u64,
) -> i64 {
    let Some(hasher) = (unsafe { hasher_of(hasher, "repro_cuda_hasher_push_many") }) else { return -1 };
    let first = hasher.batch.tickets() as i64;
    if n == 0 {
        return first;
    }
    if addresses.is_null() || lens.is_null() || keep_bytes.is_null() {
        set_error("repro_cuda_hasher_push_many: an array is NULL".into());
        return -1;
    }
    let n = n as usize;
    // SAFETY: the caller's promise above.
    let (addresses, lens, keeps) = unsafe {
        (
            std::slice::from_raw_parts(addresses, n),
            std::slice::from_raw_parts(lens, n),
            std::slice::from_raw_parts(keep_bytes, n),
        )
    };
    for ((&address, &len), &keep) in addresses.iter().zip(lens).zip(keeps) {
        hasher.keeps_bytes.push(keep != 0);
        if keep == 0 && hasher.data_hash == DataHash::Xxh3Chunks {
            // Its leaves, computed at the next flush, are what the batch hashes with BLAKE3.
            let bytes = 8 * leaf_count(len) as usize;
            let leaves = match hasher.leaf_memory.reserve(hasher.batch.device(), bytes) {
                Ok(leaves) => leaves,
                Err(e) => {
                    set_error(format!("repro_cuda_hasher_push_many: room for the leaves of {len} bytes: {e}"));
                    return -1;
                }
            };
            hasher.leaf_pieces.push(LeafPiece { address, len, leaves });
            // SAFETY: the leaves are the hasher's, not written again until this flush has read them.
            hasher.batch.push_foreign(unsafe { ForeignBytes::new(leaves, bytes) }, true);
            continue;
        }
        // SAFETY: the caller's promise above.
        let bytes = unsafe { ForeignBytes::new(address, len as usize) };
        hasher.batch.push_foreign(bytes, keep == 0);
        hasher.program_memory_queued = true;
    }
    first
}

/// Queues one piece of memory for its data hash, its leaves computed at once (see the module's
/// documentation); returns its ticket, or -1.
///
/// # Safety
/// `hasher` comes from `repro_cuda_hasher_new_kind` with `xxh3-1k`; the `len` bytes at device
/// address `address` are allocated and unchanged until the work queued on the calling thread's
/// stream before this call has run (nothing later needs them).
#[no_mangle]
pub unsafe extern "C" fn repro_cuda_hasher_push_now(hasher: *mut c_void, address: u64, len: u64) -> i64 {
    let Some(hasher) = (unsafe { hasher_of(hasher, "repro_cuda_hasher_push_now") }) else { return -1 };
    match push_now(hasher, address, len) {
        Ok(ticket) => ticket,
        Err(e) => {
            set_error(format!("repro_cuda_hasher_push_now: {e}"));
            -1
        }
    }
}

fn push_now(hasher: &mut Hasher, address: u64, len: u64) -> Result<i64> {
    if hasher.data_hash != DataHash::Xxh3Chunks {
        return Err(candle_core::Error::Msg(format!(
            "a hasher of {} reads memory only when it flushes; reading at once needs xxh3-1k",
            hasher.data_hash
        )));
    }
    let ticket = hasher.batch.tickets() as i64;
    let bytes = 8 * leaf_count(len) as usize;
    let leaves = hasher.leaf_memory.reserve(hasher.batch.device(), bytes)?;
    if let Some(read) = hasher.leaf_memory.read_beside.take() {
        hasher.batch.device().cuda_stream().wait(&read).w()?;
    }
    // SAFETY: the memory is the caller's, read now in order with its stream; the leaves lie in
    // blocks the last flush's reads are done with (in stream order, or behind the wait above).
    unsafe { launch_leaves_of(hasher.batch.device(), LeafPiece { address, len, leaves }) }?;
    hasher.keeps_bytes.push(false);
    // SAFETY: the leaves are the hasher's, not written again until the next flush has read them.
    hasher.batch.push_foreign(unsafe { ForeignBytes::new(leaves, bytes) }, true);
    Ok(ticket)
}

/// Flushes what is queued, reading it on the calling thread's stream. Under `xxh3-1k`, a flush
/// whose batch holds only leaves runs the leaf pass alone: that pass is all that reads the
/// program's memory, and the leaves wait in the hasher's memory for one BLAKE3 pass over many
/// flushes' leaves (the next flush that reads the program's memory, or `start_read`), one chunk
/// pass and one tree a step instead of one a flush, at the price of keeping a step's leaves
/// (1/128 of the bytes it hashes).
fn flush(hasher: &mut Hasher) -> Result<()> {
    hasher.launch_leaves()?;
    if hasher.data_hash == DataHash::Xxh3Chunks && !hasher.program_memory_queued {
        return Ok(());
    }
    hasher.program_memory_queued = false;
    // Under xxh3-1k the chunk pass reads the leaves alone (the leaf pass has read the program's
    // memory, in order with its stream): it runs on the hasher's own stream, with the tree.
    hasher.batch.set_chunks_beside(hasher.data_hash == DataHash::Xxh3Chunks);
    hasher.batch.flush()?;
    let chunks_read = hasher.batch.take_chunks_read();
    hasher.leaves_read(chunks_read)
}

/// Launches the hashing of everything queued, without waiting. Returns 0, or -1.
///
/// # Safety
/// `hasher` comes from `repro_cuda_hasher_new`.
#[no_mangle]
pub unsafe extern "C" fn repro_cuda_hasher_flush(hasher: *mut c_void) -> i32 {
    let Some(hasher) = (unsafe { hasher_of(hasher, "repro_cuda_hasher_flush") }) else { return -1 };
    status(flush(hasher), "hashing on the GPU failed")
}

/// A step's results on their way to the host, which of its tickets keep their bytes, and the
/// data hash they are of.
struct Read {
    pending: PendingRead,
    keeps_bytes: Vec<bool>,
    data_hash: DataHash,
}

/// Flushes and starts copying the results back; the hasher starts over. Sets `n` to the number
/// of tickets. Returns a read for `repro_cuda_read_finish`, or NULL.
///
/// # Safety
/// `hasher` comes from `repro_cuda_hasher_new`; `n` points to a writable u64.
#[no_mangle]
pub unsafe extern "C" fn repro_cuda_hasher_start_read(hasher: *mut c_void, n: *mut u64) -> *mut c_void {
    let Some(hasher) = (unsafe { hasher_of(hasher, "repro_cuda_hasher_start_read") }) else {
        return std::ptr::null_mut();
    };
    if let Err(e) = hasher.launch_leaves() {
        set_error(format!("hashing on the GPU failed: {e}"));
        return std::ptr::null_mut();
    }
    let (mut batch, keeps_bytes) = hasher.take_batch();
    hasher.program_memory_queued = false;
    // SAFETY: the caller's promise above.
    unsafe { *n = keeps_bytes.len() as u64 };
    // What is still queued is read in order with the program's stream (under xxh3-1k, its
    // leaves; their chunk pass on the hasher's own stream, as `flush` runs it).
    let data_hash = hasher.data_hash;
    let leaves = data_hash == DataHash::Xxh3Chunks;
    batch.set_chunks_beside(leaves);
    // Under xxh3-1k its chunk pass read the leaves on the hasher's own stream: the next leaves
    // are written behind an event recorded there.
    let pending = batch.start_read().and_then(|pending| {
        let chunks_read = if leaves { Some(hasher.beside.record_event(None).w()?) } else { None };
        hasher.leaves_read(chunks_read).map(|()| pending)
    });
    match pending {
        Ok(pending) => Box::into_raw(Box::new(Read { pending, keeps_bytes, data_hash })).cast(),
        Err(e) => {
            set_error(format!("hashing on the GPU failed: {e}"));
            std::ptr::null_mut()
        }
    }
}

fn finish(read: Read, hashes: &mut [u8], bytes: &mut [u8]) -> Result<()> {
    let tickets = read.keeps_bytes.len();
    let asked = hashes.len() / 32;
    if asked != tickets {
        return Err(candle_core::Error::Msg(format!("asked for {asked} hashes, but the read holds {tickets}")));
    }
    let results = read.pending.wait()?.results();
    let mut kept = 0;
    for ((result, slot), keep) in results.into_iter().zip(hashes.chunks_exact_mut(32)).zip(read.keeps_bytes) {
        let hash = match result {
            Resolved::DataHash(hash) => hash,
            // Bytes asked for, and views under one BLAKE3 chunk, come back whole: hashed here
            // (an `xxh3-1k` ticket's own bytes when they were kept, its leaves otherwise).
            Resolved::Bytes(values) => {
                if keep {
                    let Some(into) = bytes.get_mut(kept..kept + values.len()) else {
                        return Err(candle_core::Error::Msg(format!(
                            "the buffer for kept bytes holds {}, fewer than the tickets' bytes",
                            bytes.len()
                        )));
                    };
                    into.copy_from_slice(&values);
                    kept += values.len();
                }
                match (read.data_hash, keep) {
                    (DataHash::Xxh3Chunks, false) => *blake3::hash(&values).as_bytes(),
                    (kind, _) => kind.of(&values),
                }
            }
            Resolved::InFile(_) => {
                return Err(candle_core::Error::Msg("this read streams no values to a payload file".into()))
            }
        };
        slot.copy_from_slice(&hash);
    }
    if kept != bytes.len() {
        return Err(candle_core::Error::Msg(format!("kept {kept} bytes, but the buffer holds {}", bytes.len())));
    }
    Ok(())
}

/// Waits for a read and writes its `n` data hashes (32 bytes each, ticket order) to `hashes`
/// and the bytes of tickets pushed with `keep_bytes` (ticket order, `bytes_len` in all) to
/// `bytes`. Returns 0, or -1 (see `repro_cuda_last_error`). Frees the read either way.
///
/// # Safety
/// `read` comes from `repro_cuda_hasher_start_read` and is not used afterwards; `hashes` holds
/// `32 * n` writable bytes and `bytes` `bytes_len` (either may be NULL when its length is 0).
#[no_mangle]
pub unsafe extern "C" fn repro_cuda_read_finish(
    read: *mut c_void,
    hashes: *mut u8,
    n: u64,
    bytes: *mut u8,
    bytes_len: u64,
) -> i32 {
    if read.is_null() {
        set_error("repro_cuda_read_finish: no read (NULL)".into());
        return -1;
    }
    // SAFETY: the caller's promises above.
    let read = unsafe { Box::from_raw(read.cast::<Read>()) };
    let hashes = if n == 0 { &mut [][..] } else { unsafe { std::slice::from_raw_parts_mut(hashes, 32 * n as usize) } };
    let bytes =
        if bytes_len == 0 { &mut [][..] } else { unsafe { std::slice::from_raw_parts_mut(bytes, bytes_len as usize) } };
    status(finish(*read, hashes, bytes), "hashing on the GPU failed")
}

/// Frees a hasher (NULL is allowed); what it had queued is dropped unhashed.
///
/// # Safety
/// `hasher` comes from `repro_cuda_hasher_new` and is not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn repro_cuda_hasher_free(hasher: *mut c_void) {
    if !hasher.is_null() {
        drop(unsafe { Box::from_raw(hasher.cast::<Hasher>()) });
    }
}
