//! The leaf pass of the data hash `xxh3-1k` on a GPU (docs/trace-format.md, section 5.5): the
//! XXH3-64 of every 1 KiB chunk of pieces of device memory, each piece's leaves written where
//! the caller says, in one launch (`xxh3_leaves` in kernels/hash_kernels.cu). BLAKE3 over the
//! leaves, which `DeviceBatch` computes as it does over any memory, is then the data hash.

use crate::cuda::kernels::{grid, ptx, MODULE};
use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
use candle_core::cuda_backend::{CudaDevice, WrapErr};
use candle_core::Result;

/// Bytes each leaf stands for.
pub const LEAF_CHUNK: u64 = 1024;

/// Threads per block of the leaf pass: four a chunk, so 64 chunks a block.
const LEAF_THREADS: u32 = 256;
/// Threads of the leaf pass per chunk (`leaves_of_pieces` in kernels/hash_kernels.cu).
const LANES_PER_CHUNK: u64 = 4;

/// A piece of device memory for the leaf pass: `len` bytes at `address`, whose leaves (u64
/// each, little-endian, in chunk order) go to `leaves`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeafPiece {
    /// The piece's first byte.
    pub address: u64,
    /// Its length in bytes.
    pub len: u64,
    /// Where its `leaf_count(len)` leaves are written.
    pub leaves: u64,
}

/// The leaves of `len` bytes: one per chunk, the last one padded.
pub fn leaf_count(len: u64) -> u64 {
    len.div_ceil(LEAF_CHUNK)
}

/// Launches the leaf pass over `pieces` on the calling thread's stream of `dev`: it reads the
/// pieces after the work queued there before, and work queued there after it finds the leaves
/// written.
///
/// # Safety
/// Each piece's `len` bytes at `address` are device memory `dev` can read, allocated and
/// unchanged until the pass has run; each `leaves` holds `leaf_count(len)` writable u64s that
/// nothing else uses meanwhile, 8-byte aligned.
pub unsafe fn launch_leaves(dev: &CudaDevice, pieces: &[LeafPiece]) -> Result<()> {
    let mut table = Vec::with_capacity(4 * pieces.len() + 1);
    let mut prefix = Vec::with_capacity(pieces.len() + 1);
    prefix.push(0u64);
    for p in pieces {
        table.extend([p.address, p.len, p.leaves]);
        prefix.push(prefix.last().expect("starts with 0") + leaf_count(p.len));
    }
    let items = *prefix.last().expect("starts with 0");
    if items == 0 {
        return Ok(());
    }
    let n = pieces.len() as u64;
    table.extend(prefix);
    let stream = dev.cuda_stream();
    // Freed in stream order, behind the pass (cudarc frees on the stream it allocated on).
    let uploaded = stream.clone_htod(&table).w()?;
    let split = 3 * pieces.len();
    let (rows, prefix) = (uploaded.slice(..split), uploaded.slice(split..));
    let f = dev.get_or_load_custom_func("xxh3_leaves", MODULE, ptx()?)?;
    let mut b = f.builder();
    b.arg(&rows);
    b.arg(&prefix);
    b.arg(&n);
    // SAFETY: the table describes memory as the caller promises; the kernel reads the table's
    // 4n + 1 words and writes only the pieces' leaves.
    unsafe { b.launch(grid(items * LANES_PER_CHUNK, LEAF_THREADS)) }.w()?;
    Ok(())
}

/// Launches the leaf pass over one piece on the calling thread's stream of `dev`, its
/// description passed by value: one launch and no upload, so that memory the program is about to
/// change in place can be read where it is (the leaves then wait for a flush to be hashed).
///
/// # Safety
/// As for [`launch_leaves`], for `piece`.
pub unsafe fn launch_leaves_of(dev: &CudaDevice, piece: LeafPiece) -> Result<()> {
    let items = leaf_count(piece.len);
    if items == 0 {
        return Ok(());
    }
    let f = dev.get_or_load_custom_func("xxh3_leaves_of", MODULE, ptx()?)?;
    let mut b = f.builder();
    b.arg(&piece.address);
    b.arg(&piece.len);
    b.arg(&piece.leaves);
    // SAFETY: the kernel reads the piece and writes its leaves, as the caller promises they may.
    unsafe { b.launch(grid(items * LANES_PER_CHUNK, LEAF_THREADS)) }.w()?;
    Ok(())
}
