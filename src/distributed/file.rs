//! The file stand-in for a collective, for CPU ranks: each rank writes its tensor to a shared
//! directory, waits for every other rank's, and adds them in rank order, `((r0 + r1) + r2) ...`.
//! Tests use it to drive rank processes without GPUs; real runs use NCCL.

use super::Collective;
use crate::record::RecordError;
use crate::trace::Distributed;
use candle_core::{DType, Tensor};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Sums tensors across ranks through files in a directory every rank can reach.
pub struct FileCollective {
    dir: PathBuf,
    rank: usize,
    world_size: usize,
    /// Collectives called so far: names the files of the next one.
    calls: u64,
    /// How long to wait for another rank's contribution before giving up on it.
    timeout: Duration,
}

impl FileCollective {
    /// Rank `rank` of `world_size`, meeting the others in `dir` (which must exist), waiting at
    /// most `timeout` for each contribution of theirs.
    pub fn join(dir: &Path, rank: usize, world_size: usize, timeout: Duration) -> Result<Self, RecordError> {
        if !dir.is_dir() {
            return Err(RecordError::Unsupported(format!("rendezvous directory {} does not exist", dir.display())));
        }
        Ok(FileCollective { dir: dir.to_path_buf(), rank, world_size, calls: 0, timeout })
    }

    fn file(&self, call: u64, rank: usize) -> PathBuf {
        self.dir.join(format!("sum-{call:08}.rank-{rank}"))
    }

    fn io_error(&self, what: &str, path: &Path, e: std::io::Error) -> RecordError {
        RecordError::Collective(format!("rank {}: {what} {}: {e}", self.rank, path.display()))
    }

    /// Waits for rank `from`'s contribution to `call` and reads it.
    fn read_peer(&self, call: u64, from: usize, len: usize) -> Result<Vec<f32>, RecordError> {
        let path = self.file(call, from);
        let started = Instant::now();
        let mut pause = Duration::from_micros(200);
        let bytes = loop {
            match std::fs::read(&path) {
                Ok(bytes) => break bytes,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    if started.elapsed() > self.timeout {
                        return Err(RecordError::Collective(format!(
                            "rank {} waited {} s for rank {from}'s part of sum #{call}: did rank {from} stop?",
                            self.rank,
                            self.timeout.as_secs()
                        )));
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(10));
                }
                Err(e) => return Err(self.io_error("cannot read", &path, e)),
            }
        };
        if bytes.len() != len * 4 {
            return Err(RecordError::Collective(format!(
                "rank {from} contributed {} bytes to sum #{call}, rank {} expected {}: the ranks are not running the same model",
                bytes.len(),
                self.rank,
                len * 4
            )));
        }
        Ok(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    }
}

impl Collective for FileCollective {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn all_reduce_sum(&mut self, tensor: &Tensor) -> Result<Tensor, RecordError> {
        if tensor.dtype() != DType::F32 {
            return Err(RecordError::Unsupported(format!(
                "the file stand-in sums f32 tensors, not {:?}",
                tensor.dtype()
            )));
        }
        let mine: Vec<f32> = tensor.flatten_all()?.to_vec1()?;
        let call = self.calls;
        // Written whole under a temporary name, then renamed: a peer never reads half a file.
        let path = self.file(call, self.rank);
        let tmp = self.dir.join(format!("sum-{call:08}.rank-{}.tmp", self.rank));
        let bytes: Vec<u8> = mine.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(&tmp, bytes).map_err(|e| self.io_error("cannot write", &tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| self.io_error("cannot rename", &tmp, e))?;
        let mut sum = if self.rank == 0 { mine.clone() } else { self.read_peer(call, 0, mine.len())? };
        for from in 1..self.world_size {
            let part = if from == self.rank { mine.clone() } else { self.read_peer(call, from, mine.len())? };
            sum.iter_mut().zip(part).for_each(|(s, p)| *s += p);
        }
        // Every rank has written this call's file, so every rank is done reading the previous
        // call's: this rank's file of it can go.
        if call > 0 {
            let old = self.file(call - 1, self.rank);
            std::fs::remove_file(&old).map_err(|e| self.io_error("cannot remove", &old, e))?;
        }
        self.calls += 1;
        Ok(Tensor::from_vec(sum, tensor.shape(), tensor.device())?)
    }

    fn describe(&self) -> Distributed {
        Distributed {
            rank: self.rank as u64,
            world_size: self.world_size as u64,
            backend: "file".into(),
            backend_version: String::new(),
        }
    }
}
