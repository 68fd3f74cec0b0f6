//! The BLAKE3 device functions of `kernels/repro.cu`, compiled for the host (see `build.rs`), so
//! that the GPU hash can be checked against `repro_trace::hash` on a machine without a GPU.
//!
//! Test-only: no other crate depends on this one, and the `repro` binary never links it.

/// A BLAKE3 chaining value as the kernels compute it: eight little-endian words.
pub type Words = [u32; 8];

extern "C" {
    fn repro_host_chunk_cv(p: *const u8, len: u32, index: u64, out: *mut u32);
    fn repro_host_parent_cv(left: *const u32, right: *const u32, out: *mut u32);
}

/// The kernels' chaining value of chunk number `index` (at most 1024 bytes).
pub fn chunk_cv(chunk: &[u8], index: u64) -> Words {
    assert!(chunk.len() <= 1024, "a BLAKE3 chunk holds at most 1024 bytes");
    let mut out = [0u32; 8];
    // SAFETY: `chunk` is valid for `chunk.len()` bytes and `out` for the 8 words written.
    unsafe { repro_host_chunk_cv(chunk.as_ptr(), chunk.len() as u32, index, out.as_mut_ptr()) };
    out
}

/// The kernels' non-root parent of two chaining values.
pub fn parent_cv(left: &Words, right: &Words) -> Words {
    let mut out = [0u32; 8];
    // SAFETY: each pointer is valid for the 8 words the C function reads or writes.
    unsafe { repro_host_parent_cv(left.as_ptr(), right.as_ptr(), out.as_mut_ptr()) };
    out
}

/// The chaining value as the 32 bytes `repro_trace::hash` works with.
pub fn to_bytes(words: &Words) -> [u8; 32] {
    let mut out = [0u8; 32];
    for (i, x) in words.iter().enumerate() {
        out[4 * i..4 * i + 4].copy_from_slice(&x.to_le_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use repro_trace::hash::{chunk_chaining_value, finish_tree, ChainingValue, CHUNK_LEN};

    /// The device kernels' BLAKE3 code must agree with the blake3 crate chunk by chunk and
    /// parent by parent, and finishing on the host from the device's level gives BLAKE3's hash.
    #[test]
    fn kernel_blake3_matches_reference() {
        for len in [1025usize, 1088, 2047, 2048, 3 * 1024 + 63, 9 * 1024 + 64, 100_000] {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 7 + (i >> 8)) as u8).collect();
            let mut words: Vec<Words> = Vec::new();
            for (i, chunk) in bytes.chunks(CHUNK_LEN).enumerate() {
                let cv = chunk_cv(chunk, i as u64);
                assert_eq!(to_bytes(&cv), chunk_chaining_value(chunk, i as u64), "len {len}, chunk {i}");
                words.push(cv);
            }
            // One parent level the way the device merges it, then the host finishes.
            let parents: Vec<ChainingValue> = words
                .chunks(2)
                .map(|p| if p.len() == 1 { to_bytes(&p[0]) } else { to_bytes(&parent_cv(&p[0], &p[1])) })
                .collect();
            let root = if parents.len() >= 2 {
                finish_tree(parents)
            } else {
                finish_tree(words.iter().map(to_bytes).collect())
            };
            assert_eq!(root, *blake3::hash(&bytes).as_bytes(), "len {len}");
        }
    }
}
