//! The trace format's version, file names (a data-parallel run's rank directories included) and
//! limits: the constants a reader checks before it trusts anything else. The normative description is `docs/trace-format.md`.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::{Path, PathBuf};

/// A format version. Readers accept any minor version of their own major version (minor
/// versions only add optional fields) and refuse other majors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct FormatVersion {
    /// Incompatible changes bump this.
    pub major: u16,
    /// Backwards-compatible additions bump this.
    pub minor: u16,
}

/// The version this build writes.
///
/// Changelog:
/// - 1.0: first version: framed msgpack records (header, steps, footer), safetensors payloads,
///   canonical hash `repro.tensor.v1`.
/// - 1.1: tensor records may carry `phase` and `inputs` (per-op recording, root cause); tensor
///   kind `input`; readers take unknown tensor kinds as `other`.
/// - 1.2: tensor records may carry `node` (position in an automatically captured graph); step
///   records may carry `no_gradient` (parameters that received no gradient).
/// - 1.3: `collective` (data-parallel runs). 1.4: `source` (a captured node's scope's place).
/// - 1.5: `view`: a captured node that reads an earlier tensor's memory, hashed by that relation
///   (`crate::view`).
/// - 1.6: `source` on any tensor record, not only a captured node's (a hand-recorded op's line).
/// - 1.7: `shard`: one rank's block of a tensor sharded across the ranks (`crate::shard`).
/// - 1.8: `reduce_scatter`: a shard that is this rank's block of a sum across the ranks (FSDP's
///   gradients), with each rank's whole contribution as its input.
/// - 1.9: tensor kind `buffer`: a module's registered buffer (BatchNorm's running statistics),
///   before and after each step. A file that declares an older version carries none; a 2.0
///   file, a later version, may.
/// - 2.0: `data_hash` in the header: `xxh3-1k` hashes each tensor's 1 KiB chunks with XXH3-64
///   and their digests with BLAKE3 (`crate::hash::DataHash`). Only such traces are written as
///   2.0 (`FormatVersion::written_for`): a 1.x reader would check their hashes as BLAKE3's.
/// - 1.10 and 2.1: tensor kinds `optimizer_state` (an optimizer's state after each step) and
///   `rng_state` (a generator's state at each step's start). A 1.9 or 2.0 file carries neither.
pub const CURRENT_FORMAT: FormatVersion = FormatVersion { major: 1, minor: 10 };

/// The version a trace of the data hash `xxh3-1k` is written in.
pub const XXH3_FORMAT: FormatVersion = FormatVersion { major: 2, minor: 1 };

impl FormatVersion {
    /// Whether this build can read a trace written in `self`: majors 1 and 2.
    pub fn is_readable(self) -> bool {
        self.major == CURRENT_FORMAT.major || self.major == XXH3_FORMAT.major
    }

    /// The version a trace whose tensors are hashed with `data_hash` is written in: 1.9 for
    /// BLAKE3 (what every 1.x reader reads), 2.0 otherwise.
    pub fn written_for(data_hash: crate::hash::DataHash) -> FormatVersion {
        if data_hash.is_blake3() {
            CURRENT_FORMAT
        } else {
            XXH3_FORMAT
        }
    }
}

impl fmt::Display for FormatVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// Magic bytes at the start of the record file.
pub const MAGIC: &[u8; 8] = b"RPRTRACE";

/// Size of the record file's preamble: magic, then major and minor as u16 little-endian.
pub const PREAMBLE_LEN: usize = 12;

/// The record file inside a trace directory.
pub const RECORDS_FILE: &str = "records.rpr";

/// The directory of rank `rank`'s trace inside a data-parallel run (format 1.3): `rank-R`.
pub fn rank_dir(run: &Path, rank: u64) -> PathBuf {
    run.join(format!("rank-{rank}"))
}

/// Whether `path` looks like a data-parallel run: a directory with no record file of its own and
/// a `rank-0` trace, or several directories joined with `:` (`node0/run:node1/run`, a run whose
/// ranks each node wrote to its own disk), which hold rank traces between them.
pub fn is_ranked_run(path: &Path) -> bool {
    match run_dirs(path).as_slice() {
        [one] => one.is_dir() && !one.join(RECORDS_FILE).exists() && rank_dir(one, 0).join(RECORDS_FILE).is_file(),
        parts => {
            parts.iter().all(|d| d.is_dir() && !d.join(RECORDS_FILE).exists())
                && parts.iter().any(|d| !ranks_in(d).is_empty())
        }
    }
}

/// The directories a run's path names: itself, or, when nothing exists at it and it joins
/// several paths with `:` (the platform's path-list separator), each of them.
pub fn run_dirs(path: &Path) -> Vec<PathBuf> {
    if path.exists() {
        return vec![path.to_path_buf()];
    }
    let parts: Vec<PathBuf> = std::env::split_paths(path.as_os_str()).collect();
    if parts.len() > 1 {
        parts
    } else {
        vec![path.to_path_buf()]
    }
}

/// The rank traces directly inside `dir`, `(rank, directory)` in rank order: the `rank-N`
/// directories that hold a record file.
pub fn ranks_in(dir: &Path) -> Vec<(u64, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut ranks: Vec<(u64, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name();
            let rank: u64 = name.to_str()?.strip_prefix("rank-")?.parse().ok()?;
            (e.path().join(RECORDS_FILE).is_file() && rank_dir(dir, rank) == e.path()).then(|| (rank, e.path()))
        })
        .collect();
    ranks.sort();
    ranks
}

/// The run-metadata file: the only part of a trace that differs between identical runs.
pub const RUN_META_FILE: &str = "run-meta.json";

/// Where a rank's recorder marks its progress while it runs (section 10.1); removed when the
/// trace is finished.
pub const PROGRESS_FILE: &str = "progress.json";

/// The directory (inside a trace) that holds safetensors payloads.
pub const TENSORS_DIR: &str = "tensors";

/// Largest record (frame payload) a reader accepts, in bytes.
pub const MAX_RECORD_BYTES: u32 = 16 * 1024 * 1024;

/// Longest `source` location (format 1.4) a reader accepts, in bytes.
pub const MAX_SOURCE_BYTES: usize = 4096;

/// Deepest msgpack nesting a reader accepts.
pub const MAX_NESTING: usize = 32;

/// Largest tensor rank a reader accepts.
pub const MAX_RANK: usize = 16;

/// The one collective of format 1.3: the elementwise sum over all ranks (section 10).
pub const ALL_REDUCE_SUM: &str = "all_reduce_sum";

/// The one value of format 1.8's `reduce_scatter`: the record is this rank's block of the
/// elementwise sum over all ranks of its input (section 10.2).
pub const REDUCE_SCATTER_SUM: &str = "sum";

/// The payload file name for a step: `tensors/step-00000042.safetensors`.
pub fn payload_name(step: u64) -> String {
    format!("{TENSORS_DIR}/step-{step:08}.safetensors")
}

/// Parses a payload name back to its step, accepting only names `payload_name` makes, so a
/// record can never point outside its trace directory.
pub fn parse_payload_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix(TENSORS_DIR)?.strip_prefix("/step-")?.strip_suffix(".safetensors")?;
    if digits.len() < 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let step: u64 = digits.parse().ok()?;
    (payload_name(step) == name).then_some(step)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_names_round_trip_and_refuse_escapes() {
        assert_eq!(parse_payload_name(&payload_name(42)), Some(42));
        assert_eq!(parse_payload_name(&payload_name(123_456_789_012)), Some(123_456_789_012));
        for bad in [
            "tensors/../step-00000001.safetensors",
            "/etc/passwd",
            "tensors/step-1.safetensors",
            "tensors/step-000000001.safetensors",
            "tensors/step-0000000a.safetensors",
            "tensors/step-00000001.safetensors/..",
        ] {
            assert_eq!(parse_payload_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn newer_major_is_unreadable() {
        assert!(CURRENT_FORMAT.is_readable());
        assert!(FormatVersion { major: 1, minor: 9 }.is_readable());
        assert!(XXH3_FORMAT.is_readable() && FormatVersion { major: 2, minor: 1 }.is_readable());
        assert!(!FormatVersion { major: 3, minor: 0 }.is_readable());
        assert!(!FormatVersion { major: 0, minor: 9 }.is_readable());
        assert_eq!(FormatVersion::written_for(crate::hash::DataHash::Blake3), CURRENT_FORMAT);
        assert_eq!(FormatVersion::written_for(crate::hash::DataHash::Xxh3Chunks), XXH3_FORMAT);
    }
}
