//! Fuzzes the record file: the bytes become `records.rpr` of a trace directory, which is then
//! read to the end, every tensor's values checked and the trace diffed against itself.
//!
//! The first input byte picks how the rest is used. Raw mode writes the bytes as they are, so
//! the preamble and the CRC-framed container are fuzzed. Framed mode writes a valid preamble and
//! frames each chunk of the input (split at 0xFF 0xFE) with a correct CRC, so mutations reach
//! the msgpack decoder and the semantic checks behind the checksums.
#![no_main]

use libfuzzer_sys::fuzz_target;
use repro_trace::format::{CURRENT_FORMAT, MAGIC, RECORDS_FILE};
use repro_trace::frame::write_frame;
use std::sync::OnceLock;

fn scratch() -> &'static tempfile::TempDir {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("a scratch directory"))
}

fn records_bytes(data: &[u8]) -> Vec<u8> {
    let Some((&mode, rest)) = data.split_first() else { return Vec::new() };
    if mode & 1 == 0 {
        return rest.to_vec();
    }
    let mut out = Vec::with_capacity(rest.len() + 64);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&CURRENT_FORMAT.major.to_le_bytes());
    out.extend_from_slice(&CURRENT_FORMAT.minor.to_le_bytes());
    let mut start = 0;
    let mut i = 0;
    while i + 1 < rest.len() {
        if rest[i] == 0xFF && rest[i + 1] == 0xFE {
            write_frame(&mut out, &rest[start..i]).expect("writing to a vector");
            start = i + 2;
            i += 2;
        } else {
            i += 1;
        }
    }
    write_frame(&mut out, &rest[start..]).expect("writing to a vector");
    out
}

fuzz_target!(|data: &[u8]| {
    let dir = scratch().path();
    std::fs::write(dir.join(RECORDS_FILE), records_bytes(data)).expect("writing the scratch trace");
    repro_fuzz_read_all(dir);
});

/// Reads everything a user's `repro diff` / `inspect --verify` would read. Errors are fine;
/// panics, hangs and unbounded allocations are what the fuzzer looks for.
fn repro_fuzz_read_all(dir: &std::path::Path) {
    let _ = repro_trace::verify(dir);
    if let (Ok(mut a), Ok(mut b)) = (repro_trace::TraceReader::open(dir), repro_trace::TraceReader::open(dir)) {
        let _ = repro_diff::diff_traces(&mut a, &mut b);
    }
}
