//! Data-parallel training across ranks, recorded per rank.
//!
//! Each rank is one process with one device. Every step, each rank trains on its own rows of the
//! global batch ([`DataParallel::shard`]), and [`DataParallel::average_gradients`] replaces its
//! gradients with their average over the ranks: each rank divides its gradient by the world size,
//! a [`Collective`] sums the results, and every rank steps its own optimizer on the same sums.
//! The recorder sees both sides of the sum, so `repro diff` can tell a collective that added in
//! a different order from ranks that computed different contributions:
//!
//! - `NAME.grad.local`: this rank's gradient divided by the world size (what it contributes);
//! - `NAME.grad`: the sum over the ranks, recorded as the collective's result
//!   (`TensorRecord::collective` is `all_reduce_sum`, its input `NAME.grad.local`).
//!
//! The collective on GPUs is NCCL ([`nccl`], with the `nccl` feature). CPU ranks use
//! [`FileCollective`], a stand-in that exchanges tensors through files and adds them in rank
//! order: it lets tests drive the rank processes, the per-rank traces and the replica checks on
//! machines without GPUs, and is not meant for real training.

mod file;
#[cfg(feature = "nccl")]
pub mod nccl;

pub use file::FileCollective;

use crate::record::{RecordError, StepRecorder};
use crate::trace::Distributed;
use candle_core::backprop::GradStore;
use candle_core::{Device, Tensor, Var};
use std::path::Path;

/// The name of the collective a data-parallel step records its gradient sums under.
pub const ALL_REDUCE_SUM: &str = "all_reduce_sum";

/// Suffix of a rank's own contribution to a gradient sum: `NAME.grad.local`.
pub const LOCAL_SUFFIX: &str = ".local";

/// Sums tensors across the ranks of a run. Every rank calls it with tensors of the same shapes
/// in the same order, and every rank gets the same sums back.
pub trait Collective {
    /// This process's rank, from 0.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn world_size(&self) -> usize;
    /// The elementwise sum of `tensor` over all ranks.
    fn all_reduce_sum(&mut self, tensor: &Tensor) -> Result<Tensor, RecordError>;
    /// What the trace header says of this rank and the backend.
    fn describe(&self) -> Distributed;
}

/// Joins the ranks of a run on `device`: NCCL for a CUDA device, the file stand-in for the CPU.
/// `rendezvous` is a directory every rank can reach, empty when the run starts; the ranks meet
/// there (NCCL's unique id, or the stand-in's files).
pub fn join(
    device: &Device,
    rendezvous: &Path,
    rank: usize,
    world_size: usize,
) -> Result<Box<dyn Collective>, RecordError> {
    if rank >= world_size {
        return Err(RecordError::Unsupported(format!("rank {rank} is not below the world size {world_size}")));
    }
    match device {
        Device::Cpu => Ok(Box::new(FileCollective::join(rendezvous, rank, world_size)?)),
        #[cfg(feature = "nccl")]
        Device::Cuda(_) => Ok(Box::new(nccl::NcclCollective::join(device, rendezvous, rank, world_size)?)),
        _ => Err(RecordError::Unsupported(format!(
            "data-parallel training on {device:?} needs NCCL: build repro with `make cuda` (the `nccl` feature)"
        ))),
    }
}

/// One rank's side of data-parallel training: its share of each batch, and gradients averaged
/// over the ranks.
pub struct DataParallel {
    collective: Box<dyn Collective>,
}

impl DataParallel {
    /// Data parallelism over `collective`'s ranks.
    pub fn new(collective: Box<dyn Collective>) -> Self {
        DataParallel { collective }
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.collective.rank()
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.collective.world_size()
    }

    /// What the trace header says of this rank.
    pub fn describe(&self) -> Distributed {
        self.collective.describe()
    }

    /// Checks that a global batch of `batch` rows splits evenly over the ranks.
    pub fn check_batch(&self, batch: usize) -> Result<(), RecordError> {
        let n = self.world_size();
        if batch == 0 || !batch.is_multiple_of(n) {
            return Err(RecordError::Unsupported(format!(
                "the batch ({batch}) must be a positive multiple of the number of ranks ({n}): each rank trains on an equal share"
            )));
        }
        Ok(())
    }

    /// This rank's rows of a global batch (dimension 0): rows `rank * b .. (rank + 1) * b`,
    /// where `b` is the batch divided by the world size.
    pub fn shard(&self, batch: &Tensor) -> Result<Tensor, RecordError> {
        let rows = batch.dim(0)?;
        self.check_batch(rows)?;
        let share = rows / self.world_size();
        Ok(batch.narrow(0, self.rank() * share, share)?)
    }

    /// Averages one gradient over the ranks: records this rank's share of it as
    /// `NAME.grad.local` (computed from `inputs`), sums the shares across ranks, records the sum
    /// as `NAME.grad`, and returns it. `grad_name` is `NAME.grad`.
    pub fn average_gradient(
        &mut self,
        s: &mut StepRecorder,
        grad_name: &str,
        inputs: &[&str],
        grad: &Tensor,
    ) -> Result<Tensor, RecordError> {
        let local_name = format!("{grad_name}{LOCAL_SUFFIX}");
        let share = grad.affine(1.0 / self.world_size() as f64, 0.0)?;
        s.record_as(
            &local_name,
            crate::trace::TensorKind::Gradient,
            Some(crate::trace::Phase::Backward),
            inputs,
            &share,
        )?;
        let sum = self.collective.all_reduce_sum(&share)?;
        s.record_collective(grad_name, ALL_REDUCE_SUM, &local_name, &sum)?;
        Ok(sum)
    }

    /// Averages the gradient of every floating-point parameter in `params` (in their order,
    /// the same on every rank) and puts the averages into `grads`, for the optimizer. Returns
    /// the parameters that received no gradient, which the trace notes; a rank whose parameter
    /// lacks a gradient still takes part with zeros, so the ranks' calls stay matched.
    pub fn average_gradients(
        &mut self,
        s: &mut StepRecorder,
        params: &[(String, Var)],
        grads: &mut GradStore,
    ) -> Result<Vec<String>, RecordError> {
        let mut missing = Vec::new();
        for (name, var) in params.iter().filter(|(_, v)| v.dtype().is_float()) {
            let grad = match grads.get(var.as_tensor()) {
                Some(grad) => grad.clone(),
                None => {
                    missing.push(name.clone());
                    var.as_tensor().zeros_like()?
                }
            };
            let sum = self.average_gradient(s, &format!("{name}.grad"), &[], &grad)?;
            grads.insert(var.as_tensor(), sum);
        }
        s.note_no_gradient(missing.iter().cloned());
        Ok(missing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;

    #[test]
    fn a_batch_is_split_in_equal_row_blocks_and_an_uneven_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let batch = Tensor::arange(0u32, 12, &Device::Cpu).unwrap().reshape((6, 2)).unwrap();
        let rows: Vec<Vec<u32>> = (0..3)
            .map(|rank| {
                let dp = DataParallel::new(Box::new(FileCollective::join(dir.path(), rank, 3).unwrap()));
                dp.shard(&batch).unwrap().flatten_all().unwrap().to_vec1().unwrap()
            })
            .collect();
        assert_eq!(rows, vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![8, 9, 10, 11]]);
        let dp = DataParallel::new(Box::new(FileCollective::join(dir.path(), 0, 4).unwrap()));
        let err = dp.shard(&batch).unwrap_err().to_string();
        assert!(err.contains("batch (6)") && err.contains("ranks (4)"), "{err}");
    }

    #[test]
    fn averaged_gradients_are_the_same_on_every_rank_and_record_both_sides_of_the_sum() {
        let dir = tempfile::tempdir().unwrap();
        let runs: Vec<_> = (0..2)
            .map(|rank| {
                let path = dir.path().to_path_buf();
                thread::spawn(move || {
                    let mut dp = DataParallel::new(Box::new(FileCollective::join(&path, rank, 2).unwrap()));
                    let trace = tempfile::tempdir().unwrap();
                    let run = crate::trace::RunConfig { workload: "t".into(), ..Default::default() };
                    let mut rec =
                        crate::record::Recorder::create(trace.path(), run, &Device::Cpu, Default::default()).unwrap();
                    let var = Var::new(&[1f32, 2.0], &Device::Cpu).unwrap();
                    let loss = (var.as_tensor() * (rank as f64 + 1.0)).unwrap().sum_all().unwrap();
                    let mut grads = loss.backward().unwrap();
                    let mut s = rec.step(0);
                    dp.average_gradients(&mut s, &[("w".to_string(), var.clone())], &mut grads).unwrap();
                    s.finish().unwrap();
                    rec.finish().unwrap();
                    let sum: Vec<f32> = grads.get(var.as_tensor()).unwrap().to_vec1().unwrap();
                    let mut reader = crate::trace::TraceReader::open(trace.path()).unwrap();
                    let step = reader.next_step().unwrap().unwrap();
                    let names: Vec<_> = step.tensors.iter().map(|t| (t.name.clone(), t.collective.clone())).collect();
                    (sum, names)
                })
            })
            .collect();
        for run in runs {
            let (sum, names) = run.join().unwrap();
            // Rank 0's gradient is 1, rank 1's is 2; each contributes half: 0.5 + 1 = 1.5.
            assert_eq!(sum, vec![1.5, 1.5]);
            assert_eq!(
                names,
                vec![("w.grad.local".to_string(), None), ("w.grad".to_string(), Some(ALL_REDUCE_SUM.to_string()))]
            );
        }
    }
}
