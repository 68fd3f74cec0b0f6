//! Data-parallel runs (format 1.3): a directory holding one trace per rank, `rank-0`,
//! `rank-1`, ..., each an ordinary trace whose header says its rank and the world size. This
//! module finds a run's rank streams and checks that they belong together.

use crate::error::TraceError;
use crate::format::{is_ranked_run, rank_dir, ranks_in, run_dirs, RECORDS_FILE};
use crate::reader::TraceReader;
use crate::schema::Header;
use std::path::{Path, PathBuf};

/// What in a rank's header disagrees with rank 0's, if anything. The ranks of one run share
/// the format version, the run configuration, the capture policy, the data hash and the
/// collectives' backend (and its version); the environment (device, host, process) is each
/// rank's own.
fn disagreement(rank0: &Header, other: &Header) -> Option<&'static str> {
    let backend = |h: &Header| h.distributed.as_ref().map(|d| (d.backend.clone(), d.backend_version.clone()));
    if other.format != rank0.format {
        Some("format version")
    } else if other.run != rank0.run {
        Some("run configuration")
    } else if other.capture != rank0.capture {
        Some("capture policy")
    } else if other.data_hash != rank0.data_hash {
        Some("data hash")
    } else if backend(other) != backend(rank0) {
        Some("collective backend")
    } else {
        None
    }
}

/// The rank streams of the data-parallel run in `path`, in rank order, or `None` when `path` is
/// not one (a single trace, or nothing: opening it says which). Every rank from 0 to the world
/// size that rank 0's header gives must be there, each header naming its own rank and the same
/// world size and run configuration; otherwise the error names the stream at fault.
pub fn rank_streams(path: &Path) -> Result<Option<Vec<PathBuf>>, TraceError> {
    if !is_ranked_run(path) {
        return Ok(None);
    }
    let located = locate_ranks(path)?;
    let locate = |rank: u64| located.get(&rank).cloned().unwrap_or_else(|| rank_dir(path, rank));
    let first = TraceReader::open(locate(0))?;
    let wrong = |dir: &Path, reason: String| TraceError::Corrupt {
        path: dir.join(RECORDS_FILE),
        location: "header".into(),
        reason,
    };
    let Some(world) = first.header().distributed.as_ref().map(|d| d.world_size) else {
        return Err(wrong(
            &rank_dir(path, 0),
            "a `rank-0` stream whose header names no rank: not part of a data-parallel run".into(),
        ));
    };
    let mut streams = Vec::new();
    // One rule for a run in one directory and one split over several: a rank beyond the world
    // size is refused, never ignored (it is another run's, or rank 0's header is wrong).
    let every: std::collections::BTreeMap<u64, PathBuf> = match located.is_empty() {
        true => ranks_in(path).into_iter().collect(),
        false => located.clone(),
    };
    if let Some((&extra, dir)) = every.range(world..).next() {
        return Err(wrong(dir, format!("it is rank {extra}, beyond the world size {world} that rank 0 gives")));
    }
    for rank in 0..world {
        if !located.is_empty() && !located.contains_key(&rank) {
            let places: Vec<String> = run_dirs(path).iter().map(|d| d.display().to_string()).collect();
            return Err(TraceError::NotATrace {
                path: path.to_path_buf(),
                reason: format!("rank {rank} of its {world} ranks is in none of {}", places.join(", ")),
            });
        }
        let dir = locate(rank);
        if !dir.join(RECORDS_FILE).is_file() {
            return Err(TraceError::NotATrace {
                path: path.to_path_buf(),
                reason: format!(
                    "rank {rank} of its {world} ranks has no stream (no {})",
                    dir.join(RECORDS_FILE).display()
                ),
            });
        }
        let reader = TraceReader::open(&dir)?;
        let header = reader.header();
        match &header.distributed {
            Some(d) if d.rank == rank && d.world_size == world => {}
            Some(d) => {
                return Err(wrong(
                    &dir,
                    format!("it is rank {} of {}, where rank {rank} of {world} belongs", d.rank, d.world_size),
                ))
            }
            None => return Err(wrong(&dir, format!("it names no rank, where rank {rank} of {world} belongs"))),
        }
        if let Some(what) = disagreement(first.header(), header) {
            return Err(wrong(&dir, format!("its {what} differs from rank 0's: not the same run")));
        }
        streams.push(dir);
    }
    Ok(Some(streams))
}

/// Where each rank's trace is, when the run's path joins several directories (`node0/run:
/// node1/run`): every rank in exactly one of them. For one directory, the map is empty (ranks are
/// its `rank-N`).
fn locate_ranks(path: &Path) -> Result<std::collections::BTreeMap<u64, PathBuf>, TraceError> {
    let mut located = std::collections::BTreeMap::new();
    let dirs = run_dirs(path);
    if dirs.len() < 2 {
        return Ok(located);
    }
    for dir in &dirs {
        for (rank, stream) in ranks_in(dir) {
            if let Some(earlier) = located.insert(rank, stream.clone()) {
                return Err(TraceError::NotATrace {
                    path: path.to_path_buf(),
                    reason: format!("rank {rank} is in two places, {} and {}", earlier.display(), stream.display()),
                });
            }
        }
    }
    if !located.contains_key(&0) {
        return Err(TraceError::NotATrace {
            path: path.to_path_buf(),
            reason: "none of its directories holds rank 0".into(),
        });
    }
    Ok(located)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{CapturePolicy, Distributed, FullCapture};

    fn rank_header(rank: u64, backend: &str) -> Header {
        Header {
            format: crate::CURRENT_FORMAT,
            producer: "test".into(),
            run: Default::default(),
            environment: Default::default(),
            capture: CapturePolicy::default(),
            distributed: Some(Distributed {
                rank,
                world_size: 2,
                backend: backend.into(),
                backend_version: "2.28".into(),
            }),
            data_hash: Default::default(),
        }
    }

    #[test]
    fn ranks_agree_on_version_run_capture_data_hash_and_backend_but_not_environment() {
        let rank0 = rank_header(0, "nccl");
        let mut same = rank_header(1, "nccl");
        same.environment.device = "cuda:1".into();
        same.environment.device_name = "other".into();
        assert_eq!(disagreement(&rank0, &same), None, "each rank's environment is its own");
        let mut capture = rank_header(1, "nccl");
        capture.capture.full = FullCapture::All;
        assert_eq!(disagreement(&rank0, &capture), Some("capture policy"));
        assert_eq!(disagreement(&rank0, &rank_header(1, "file")), Some("collective backend"));
        let mut version = rank_header(1, "nccl");
        version.distributed.as_mut().unwrap().backend_version = "2.27".into();
        assert_eq!(disagreement(&rank0, &version), Some("collective backend"));
        let mut run = rank_header(1, "nccl");
        run.run.workload = "other".into();
        assert_eq!(disagreement(&rank0, &run), Some("run configuration"));
        let mut format = rank_header(1, "nccl");
        format.format.minor = 2;
        assert_eq!(disagreement(&rank0, &format), Some("format version"));
        let mut data_hash = rank_header(1, "nccl");
        data_hash.data_hash = crate::DataHash::Xxh3Chunks;
        assert_eq!(disagreement(&rank0, &data_hash), Some("data hash"));
    }
}
