//! Reading payload values in bounded memory.
//!
//! Payload files are memory-mapped. Pages of a mapping that have been read stay in the process's
//! resident memory until the mapping goes, so comparing two 2 GiB tensors once held 4 GiB.
//! Here values are read a window at a time: each window is paged in with one call before it is
//! read (faulting pages one by one is slower than comparing them) and dropped from the mapping
//! after, so resident memory stays at a window per tensor however large the tensors are.
//! The file's pages stay in the kernel's page cache; reading a window again is cheap.

use crate::hash::{DataHash, DataHasher};
use memmap2::Mmap;
use std::ops::Range;

/// Bytes of each tensor paged in at once. A multiple of every element size.
pub const WINDOW_BYTES: usize = 32 << 20;

/// Where a tensor's bytes lie in a mapped payload file.
#[derive(Clone, Copy)]
pub(crate) struct Pages<'a> {
    map: &'a Mmap,
    /// Offset of the tensor's first byte in the mapping.
    offset: usize,
}

impl std::fmt::Debug for Pages<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pages {{ offset: {} }}", self.offset)
    }
}

impl<'a> Pages<'a> {
    pub(crate) fn new(map: &'a Mmap, offset: usize) -> Self {
        Pages { map, offset }
    }

    /// Pages in `range` (of the tensor's bytes) in one call. Best effort: where the kernel is
    /// older than Linux 5.14, the pages fault in as they are read.
    fn load(&self, range: &Range<usize>) {
        #[cfg(target_os = "linux")]
        let _ = self.map.advise_range(memmap2::Advice::PopulateRead, self.offset + range.start, range.len());
    }

    /// Drops `range` (of the tensor's bytes) from the process's resident memory.
    fn release(&self, range: &Range<usize>) {
        #[cfg(target_os = "linux")]
        // SAFETY: the mapping is read-only and backed by a file, and nothing writes through it,
        // so it holds no private copies: dropping its pages only makes a later read fault them
        // in again from the file, with the same contents. (memmap2 marks DONTNEED unchecked
        // because on anonymous or written private mappings it discards data.)
        let _ = unsafe {
            self.map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, self.offset + range.start, range.len())
        };
    }
}

/// Calls `visit(start, windows)` for consecutive byte ranges of equal-length `tensors`, in order,
/// with `windows[i]` the range's bytes of `tensors[i]`. Mapped bytes are paged in before and
/// dropped after each call. `window_bytes` must be a multiple of the element sizes involved.
pub(crate) fn for_each_window(
    tensors: &[(&[u8], Option<Pages<'_>>)],
    window_bytes: usize,
    mut visit: impl FnMut(usize, &[&[u8]]),
) {
    let len = tensors.first().map_or(0, |(bytes, _)| bytes.len());
    assert!(tensors.iter().all(|(bytes, _)| bytes.len() == len), "windows need tensors of equal byte length");
    assert!(window_bytes > 0, "a window holds at least one byte");
    let mut start = 0;
    while start < len {
        let range = start..len.min(start + window_bytes);
        for (_, pages) in tensors {
            if let Some(p) = pages {
                p.load(&range);
            }
        }
        let windows: Vec<&[u8]> = tensors.iter().map(|(bytes, _)| &bytes[range.clone()]).collect();
        visit(range.start, &windows);
        for (_, pages) in tensors {
            if let Some(p) = pages {
                p.release(&range);
            }
        }
        start = range.end;
    }
}

/// The data hash `kind` of `bytes`, read window by window (the same hash as one pass over them).
pub(crate) fn data_hash_windowed(kind: DataHash, bytes: &[u8], pages: Option<Pages<'_>>) -> [u8; 32] {
    let mut hasher = DataHasher::new(kind);
    for_each_window(&[(bytes, pages)], WINDOW_BYTES, |_, w| hasher.update(w[0]));
    hasher.finalize()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn mapped(bytes: &[u8]) -> (tempfile::NamedTempFile, Mmap) {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        file.write_all(bytes).unwrap();
        file.flush().unwrap();
        // SAFETY: the test's own file, not changed while mapped.
        let map = unsafe { Mmap::map(file.as_file()) }.unwrap();
        (file, map)
    }

    #[test]
    fn windows_cover_every_byte_once_in_order() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        let (_file, map) = mapped(&data);
        let other: Vec<u8> = data.iter().map(|b| b ^ 0x5a).collect();
        let mut seen = (Vec::new(), Vec::new(), Vec::new());
        for_each_window(&[(&map[..], Some(Pages::new(&map, 0))), (&other, None)], 4096, |start, w| {
            seen.0.push(start);
            seen.1.extend_from_slice(w[0]);
            seen.2.extend_from_slice(w[1]);
        });
        assert_eq!(seen.0, vec![0, 4096, 8192], "three windows, the last one short");
        assert_eq!(seen.1, data);
        assert_eq!(seen.2, other);
    }

    #[test]
    fn the_windowed_hash_is_the_one_pass_hash() {
        // Above the parallel threshold and across windows, with a short last window.
        let data: Vec<u8> = (0..(3 * WINDOW_BYTES / 2 + 77)).map(|i| (i * 7 % 256) as u8).collect();
        let (_file, map) = mapped(&data);
        for kind in DataHash::ALL {
            let expected = kind.of(&data);
            assert_eq!(data_hash_windowed(kind, &map, Some(Pages::new(&map, 0))), expected, "{kind}");
            assert_eq!(data_hash_windowed(kind, &data, None), expected, "{kind}");
        }
        assert_eq!(DataHash::Blake3.of(&data), *blake3::hash(&data).as_bytes());
    }
}
