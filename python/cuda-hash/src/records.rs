//! A step's hashed records packed natively for the Python trace writer
//! (`TraceWriter.write_laid_out` in python/repro/writer.py). A record that holds a data hash and
//! no bytes packs as its encoding before the hash, the hash (a msgpack string of 64 hex
//! digits), and its encoding after; the hash is the canonical tensor hash, BLAKE3 of the
//! record's prefix (docs/trace-format.md, section 5: the domain, dtype and shape) and its data
//! hash. The writer keeps each record's prefix and encodings from step to step while the layout
//! stays, and packs the few records that hold bytes itself (`overrides`); this computes every
//! other hash and writes every record in one call.
//!
//! ```c
//! int64_t repro_pack_hashed_records(const uint8_t *prefixes, const uint64_t *prefix_ends,
//!                                   const uint8_t *pieces, const uint64_t *piece_ends,
//!                                   const uint8_t *data_hashes, uint64_t n,
//!                                   const uint8_t *overrides, const uint64_t *override_ends,
//!                                   const uint64_t *override_at, uint64_t k,
//!                                   uint8_t *out, uint64_t out_len);  // bytes written, or -1
//! ```
//!
//! Record `i`'s prefix is `prefixes[prefix_ends[i-1]..prefix_ends[i]]` (from 0 for the first),
//! its encoding before the hash `pieces[piece_ends[2i-1]..piece_ends[2i]]` and after it
//! `pieces[piece_ends[2i]..piece_ends[2i+1]]`, its data hash the 32 bytes at `data_hashes + 32i`.
//! Override `j` is record `override_at[j]` (rising) packed whole: the bytes
//! `overrides[override_ends[j-1]..override_ends[j]]`, its prefix, pieces and data hash unread.
//! The records go to `out` one after another; if they do not fit in `out_len` bytes, or the
//! arguments disagree, -1 is returned.

/// A msgpack string of 64 bytes: its header, before the hex digest.
const STR64_HEADER: [u8; 2] = [0xd9, 0x40];

/// Checks that `ends` rise from 0 to no further than `len`, and returns them as ranges.
fn ranges(ends: &[u64], len: usize) -> Option<Vec<std::ops::Range<usize>>> {
    let mut start = 0usize;
    let mut out = Vec::with_capacity(ends.len());
    for &end in ends {
        let end = usize::try_from(end).ok()?;
        if end < start || end > len {
            return None;
        }
        out.push(start..end);
        start = end;
    }
    Some(out)
}

/// A step's records as `repro_pack_hashed_records` takes them.
struct Records<'a> {
    prefixes: &'a [u8],
    prefix_ends: &'a [u64],
    pieces: &'a [u8],
    piece_ends: &'a [u64],
    data_hashes: &'a [u8],
    overrides: &'a [u8],
    override_ends: &'a [u64],
    override_at: &'a [u64],
}

/// Packs the records into `out` (see the module's documentation); their length, or None where
/// they do not fit or the arguments disagree.
fn pack(r: &Records<'_>, out: &mut [u8]) -> Option<usize> {
    let n = r.prefix_ends.len();
    if r.piece_ends.len() != 2 * n || r.data_hashes.len() != 32 * n || r.override_at.len() != r.override_ends.len() {
        return None;
    }
    let prefix_at = ranges(r.prefix_ends, r.prefixes.len())?;
    let piece_at = ranges(r.piece_ends, r.pieces.len())?;
    let override_bytes = ranges(r.override_ends, r.overrides.len())?;
    if r.override_at.windows(2).any(|w| w[0] >= w[1]) || r.override_at.last().is_some_and(|&i| i >= n as u64) {
        return None;
    }
    let mut overrides = r.override_at.iter().zip(override_bytes).peekable();
    let mut at = 0;
    let mut put = |bytes: &[u8]| -> Option<()> {
        out.get_mut(at..at + bytes.len())?.copy_from_slice(bytes);
        at += bytes.len();
        Some(())
    };
    for (i, inner) in r.data_hashes.chunks_exact(32).enumerate() {
        if let Some((_, bytes)) = overrides.next_if(|(&j, _)| j == i as u64) {
            put(&r.overrides[bytes])?;
            continue;
        }
        let mut hasher = blake3::Hasher::new();
        hasher.update(&r.prefixes[prefix_at[i].clone()]);
        hasher.update(inner);
        put(&r.pieces[piece_at[2 * i].clone()])?;
        put(&STR64_HEADER)?;
        put(hasher.finalize().to_hex().as_bytes())?;
        put(&r.pieces[piece_at[2 * i + 1].clone()])?;
    }
    Some(at)
}

/// Packs `n` records (see the module's documentation); the bytes written, or -1.
///
/// # Safety
/// Each pointer is valid for the lengths the module's documentation gives: `prefix_ends` and
/// `piece_ends` hold `n` and `2n` words, `override_ends` and `override_at` `k`, `data_hashes`
/// `32n` bytes, `prefixes`, `pieces` and `overrides` as many bytes as their last end says (0
/// without ends), `out` `out_len` writable bytes (any may be NULL when its length is 0).
#[no_mangle]
pub unsafe extern "C" fn repro_pack_hashed_records(
    prefixes: *const u8,
    prefix_ends: *const u64,
    pieces: *const u8,
    piece_ends: *const u64,
    data_hashes: *const u8,
    n: u64,
    overrides: *const u8,
    override_ends: *const u64,
    override_at: *const u64,
    k: u64,
    out: *mut u8,
    out_len: u64,
) -> i64 {
    let (Ok(n), Ok(k)) = (usize::try_from(n), usize::try_from(k)) else { return -1 };
    // SAFETY: the caller's promises above, for each slice made here.
    unsafe fn slice<'a, T>(p: *const T, len: usize) -> &'a [T] {
        if len == 0 {
            &[]
        } else {
            unsafe { std::slice::from_raw_parts(p, len) }
        }
    }
    let last = |ends: &[u64]| ends.last().map_or(0, |&e| e as usize);
    let (prefix_ends, piece_ends) = unsafe { (slice(prefix_ends, n), slice(piece_ends, 2 * n)) };
    let (override_ends, override_at) = unsafe { (slice(override_ends, k), slice(override_at, k)) };
    let records = unsafe {
        Records {
            prefixes: slice(prefixes, last(prefix_ends)),
            prefix_ends,
            pieces: slice(pieces, last(piece_ends)),
            piece_ends,
            data_hashes: slice(data_hashes, 32 * n),
            overrides: slice(overrides, last(override_ends)),
            override_ends,
            override_at,
        }
    };
    let out = if out_len == 0 { &mut [][..] } else { unsafe { std::slice::from_raw_parts_mut(out, out_len as usize) } };
    match pack(&records, out) {
        Some(written) => written as i64,
        None => -1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(prefix: &[u8], inner: &[u8]) -> String {
        let mut h = blake3::Hasher::new();
        h.update(prefix);
        h.update(inner);
        h.finalize().to_hex().to_string()
    }

    fn records<'a>(data_hashes: &'a [u8], overrides: &'a [u8], ends: &'a [u64], at: &'a [u64]) -> Records<'a> {
        Records {
            prefixes: b"p0p1longp2",
            prefix_ends: &[2, 8, 10],
            pieces: b"<a>[b]{c}(d)",
            piece_ends: &[3, 3, 6, 9, 9, 12],
            data_hashes,
            overrides,
            override_ends: ends,
            override_at: at,
        }
    }

    #[test]
    fn each_record_is_its_pieces_around_the_hex_blake3_of_prefix_and_data_hash_or_its_override() {
        let data_hashes: Vec<u8> = (0..96).collect();
        let mut out = vec![0; 12 + 3 * 66];
        let written = pack(&records(&data_hashes, b"", &[], &[]), &mut out).expect("packed");
        let mut expected = b"<a>\xd9\x40".to_vec();
        expected.extend(hex(b"p0", &data_hashes[..32]).as_bytes());
        expected.extend(b"[b]\xd9\x40");
        expected.extend(hex(b"p1long", &data_hashes[32..64]).as_bytes());
        expected.extend(b"{c}\xd9\x40");
        expected.extend(hex(b"p2", &data_hashes[64..]).as_bytes());
        expected.extend(b"(d)");
        assert_eq!(&out[..written], &expected[..]);
        // The second record packed whole by the caller: its pieces and hash unread.
        let written = pack(&records(&data_hashes, b"WHOLE", &[5], &[1]), &mut out).expect("packed");
        let mut expected = b"<a>\xd9\x40".to_vec();
        expected.extend(hex(b"p0", &data_hashes[..32]).as_bytes());
        expected.extend(b"WHOLE\xd9\x40");
        expected.extend(hex(b"p2", &data_hashes[64..]).as_bytes());
        expected.extend(b"(d)");
        assert_eq!(&out[..written], &expected[..]);
    }

    #[test]
    fn arguments_that_disagree_or_do_not_fit_write_nothing_past_the_output() {
        let data_hashes = [7u8; 96];
        let mut out = vec![0; 12 + 3 * 66];
        let fits = out.len();
        assert_eq!(pack(&records(&data_hashes, b"", &[], &[]), &mut out[..fits - 1]), None);
        assert_eq!(pack(&records(&data_hashes[..95], b"", &[], &[]), &mut out), None);
        // Overrides out of order, past the last record, or ends past their bytes.
        assert_eq!(pack(&records(&data_hashes, b"xy", &[1, 2], &[2, 1]), &mut out), None);
        assert_eq!(pack(&records(&data_hashes, b"x", &[1], &[3]), &mut out), None);
        assert_eq!(pack(&records(&data_hashes, b"x", &[2], &[0]), &mut out), None);
        assert_eq!(pack(&records(&data_hashes, b"", &[], &[]), &mut out), Some(fits));
    }
}
