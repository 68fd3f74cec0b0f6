//! The hashing device functions of `kernels/hash.cu`, compiled for the host (see `build.rs`),
//! so that the batched GPU hash can be checked against BLAKE3 on a machine without a GPU. Each
//! function runs one kernel pass over the tables of a plan (`repro::record::device::plan`), with
//! host addresses in place of device addresses.
//!
//! Test-only: only test builds depend on this crate; the `repro` binary never links it.

extern "C" {
    fn repro_host_hash_chunks(views: *const u64, prefix: *const u64, n: u64, cvs: *mut u32);
    fn repro_host_hash_parents(rows: *const u64, prefix: *const u64, n: u64, nodes: *mut u32);
    fn repro_host_hash_roots(roots: *const u64, n: u64, nodes: *const u32, hashes: *mut u32);
    fn repro_host_copy_views(views: *const u64, prefix: *const u64, out_at: *const u64, n: u64, out: *mut u8);
    fn repro_host_xxh3_leaves(pieces: *const u64, prefix: *const u64, n: u64);
}

/// Work items of a pass: the last entry of its prefix table, after checking the table's size.
fn items(prefix: &[u64], rows: usize, row_words: usize) -> u64 {
    assert_eq!(rows, row_words * (prefix.len() - 1), "one table row per prefix entry");
    *prefix.last().expect("a prefix table starts with 0")
}

/// The chunk pass: chaining value of every chunk of every view (`VIEW_WORDS` words each in
/// `views`) into `cvs`, 8 words per chunk. The views' addresses must be valid host memory.
pub fn hash_chunks(views: &[u64], prefix: &[u64], cvs: &mut [u32]) {
    let chunks = items(prefix, views.len(), 21);
    assert!(cvs.len() as u64 >= 8 * chunks, "room for every chunk's chaining value");
    // SAFETY: the tables are as long as the checks above require; the views' addresses point
    // into memory the caller keeps alive, as the function's contract says.
    unsafe { repro_host_hash_chunks(views.as_ptr(), prefix.as_ptr(), prefix.len() as u64 - 1, cvs.as_mut_ptr()) }
}

/// One parent launch: rows of (first input, inputs, first output, levels) over `nodes`, one to
/// `BLOCK_LEVELS` (8) levels a row.
pub fn hash_parents(rows: &[u64], prefix: &[u64], nodes: &mut [u32]) {
    items(prefix, rows.len(), 4);
    for row in rows.chunks(4) {
        assert!((1..=8).contains(&row[3]), "one to BLOCK_LEVELS levels a launch");
        let end = (row[2] + row[1].div_ceil(1 << row[3])).max(row[0] + row[1]);
        assert!(nodes.len() as u64 >= 8 * end, "the level's nodes lie inside the node buffer");
    }
    // SAFETY: every node a row reads or writes lies inside `nodes` (checked above).
    unsafe { repro_host_hash_parents(rows.as_ptr(), prefix.as_ptr(), prefix.len() as u64 - 1, nodes.as_mut_ptr()) }
}

/// The roots: view k's hash from the two nodes at `roots[k]`, as 8 words into `hashes`.
pub fn hash_roots(roots: &[u64], nodes: &[u32], hashes: &mut [u32]) {
    assert!(roots.iter().all(|&r| nodes.len() as u64 >= 8 * (r + 2)), "each root's two nodes exist");
    assert!(hashes.len() >= 8 * roots.len(), "room for every hash");
    // SAFETY: bounds checked above.
    unsafe { repro_host_hash_roots(roots.as_ptr(), roots.len() as u64, nodes.as_ptr(), hashes.as_mut_ptr()) }
}

/// The copy pass: every element of every view, row-major, at byte `out_at[k]` of `out`.
pub fn copy_views(views: &[u64], prefix: &[u64], out_at: &[u64], out: &mut [u8]) {
    items(prefix, views.len(), 21);
    assert_eq!(out_at.len(), prefix.len() - 1, "one output offset per view");
    for (k, at) in out_at.iter().enumerate() {
        let bytes = (prefix[k + 1] - prefix[k]) * views[21 * k + 1];
        assert!(out.len() as u64 >= at + bytes, "view {k}'s bytes fit the output");
    }
    // SAFETY: the tables are consistent and every write lies inside `out` (checked above); the
    // views' addresses point into memory the caller keeps alive.
    unsafe {
        repro_host_copy_views(
            views.as_ptr(),
            prefix.as_ptr(),
            out_at.as_ptr(),
            prefix.len() as u64 - 1,
            out.as_mut_ptr(),
        )
    }
}

/// The leaf pass of the data hash xxh3-1k: each piece's leaves, the XXH3-64 of each of its
/// 1 KiB chunks (the last zero-padded), as the device functions compute them one thread a chunk.
pub fn xxh3_leaves(pieces: &[&[u8]]) -> Vec<Vec<u64>> {
    let mut leaves: Vec<Vec<u64>> = pieces.iter().map(|p| vec![0u64; p.len().div_ceil(1024)]).collect();
    let mut table = Vec::with_capacity(3 * pieces.len());
    let mut prefix = vec![0u64];
    for (piece, out) in pieces.iter().zip(&mut leaves) {
        table.extend([piece.as_ptr() as u64, piece.len() as u64, out.as_mut_ptr() as u64]);
        prefix.push(prefix.last().unwrap() + out.len() as u64);
    }
    // SAFETY: every piece is `len` readable bytes, and its leaves' buffer holds one u64 per chunk;
    // both outlive the call.
    unsafe { repro_host_xxh3_leaves(table.as_ptr(), prefix.as_ptr(), pieces.len() as u64) };
    leaves
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_device_leaves_are_xxh3_of_each_padded_chunk_at_any_alignment() {
        let memory: Vec<u8> = (0..70_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        let mut pieces: Vec<&[u8]> = Vec::new();
        for offset in [0usize, 1, 2, 4, 8, 16] {
            for len in [0usize, 1, 3, 8, 63, 64, 65, 1023, 1024, 1025, 2048, 5000, 65_536] {
                pieces.push(&memory[offset..offset + len]);
            }
        }
        pieces.push(&[0u8; 1024]);
        pieces.push(&[0xffu8; 3000]);
        let leaves = xxh3_leaves(&pieces);
        for (piece, leaves) in pieces.iter().zip(leaves) {
            let expected: Vec<u64> = piece
                .chunks(1024)
                .map(|chunk| {
                    let mut padded = chunk.to_vec();
                    padded.resize(1024, 0);
                    xxhash_rust::xxh3::xxh3_64(&padded)
                })
                .collect();
            assert_eq!(leaves, expected, "{} bytes at {:p}", piece.len(), piece.as_ptr());
        }
    }
}
