//! Data-parallel runs (format 1.3): a directory holding one trace per rank, `rank-0`,
//! `rank-1`, ..., each an ordinary trace whose header says its rank and the world size. This
//! module finds a run's rank streams and checks that they belong together.

use crate::error::TraceError;
use crate::format::{is_ranked_run, rank_dir, RECORDS_FILE};
use crate::reader::TraceReader;
use std::path::{Path, PathBuf};

/// The rank streams of the data-parallel run in `path`, in rank order, or `None` when `path` is
/// not one (a single trace, or nothing: opening it says which). Every rank from 0 to the world
/// size that rank 0's header gives must be there, each header naming its own rank and the same
/// world size and run configuration; otherwise the error names the stream at fault.
pub fn rank_streams(path: &Path) -> Result<Option<Vec<PathBuf>>, TraceError> {
    if !is_ranked_run(path) {
        return Ok(None);
    }
    let first = TraceReader::open(rank_dir(path, 0))?;
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
    for rank in 0..world {
        let dir = rank_dir(path, rank);
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
        if header.run != first.header().run {
            return Err(wrong(&dir, "its run configuration differs from rank 0's: not the same run".into()));
        }
        streams.push(dir);
    }
    Ok(Some(streams))
}
