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
mod launcher;
#[cfg(feature = "nccl")]
pub mod nccl;
mod tcp;

pub use file::FileCollective;
pub use launcher::{LaunchedRank, RunSettings, RENDEZVOUS_TIMEOUT};
pub use tcp::TcpCollective;

use crate::record::{RecordError, StepRecorder};
use crate::trace::{Distributed, Phase, RunConfig, TensorKind};
use candle_core::backprop::GradStore;
use candle_core::{Device, Tensor, Var};
use std::path::Path;

/// The name of the collective a data-parallel step records its gradient sums under.
pub use crate::trace::format::ALL_REDUCE_SUM;

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
/// A rank waits at most `timeout` for the others, at the meeting and at each sum.
pub fn join(
    device: &Device,
    rendezvous: &Path,
    rank: usize,
    world_size: usize,
    timeout: std::time::Duration,
) -> Result<Box<dyn Collective>, RecordError> {
    if rank >= world_size {
        return Err(RecordError::Unsupported(format!("rank {rank} is not below the world size {world_size}")));
    }
    match device {
        Device::Cpu => Ok(Box::new(FileCollective::join(rendezvous, rank, world_size, timeout)?)),
        #[cfg(feature = "nccl")]
        Device::Cuda(_) => Ok(Box::new(nccl::NcclCollective::join(device, rendezvous, rank, world_size, timeout)?)),
        _ => Err(RecordError::Unsupported(format!(
            "data-parallel training on {device:?} needs NCCL: build repro with `make cuda` (the `nccl` feature)"
        ))),
    }
}

/// Joins the ranks of a run started by the cluster's launcher (`place`) on `device`: they meet
/// over TCP at the launcher's `MASTER_ADDR:MASTER_PORT` (or through files in
/// `REPRO_RENDEZVOUS_DIR`), where every rank must bring the same `settings`; then NCCL sums on CUDA devices (rank 0 shares its unique id at the meeting), and
/// the TCP stand-in on the CPU.
pub fn join_launched(
    device: &Device,
    place: &LaunchedRank,
    settings: &RunSettings,
) -> Result<Box<dyn Collective>, RecordError> {
    if let Some(dir) = &place.rendezvous_dir {
        launcher::meet_in_dir(dir, place, settings)?;
        return join(device, dir, place.rank, place.world_size, place.timeout);
    }
    match device {
        Device::Cpu => Ok(Box::new(TcpCollective::new(tcp::meet(place, settings, || Ok(Vec::new()))?))),
        #[cfg(feature = "nccl")]
        Device::Cuda(_) => {
            let meeting = tcp::meet(place, settings, nccl::new_id)?;
            Ok(Box::new(nccl::NcclCollective::with_id(device, place.rank, place.world_size, &meeting.shared)?))
        }
        _ => Err(RecordError::Unsupported(format!(
            "data-parallel training on {device:?} needs NCCL: build repro with `make cuda` (the `nccl` feature)"
        ))),
    }
}

/// The settings every rank of a run must share, by name: `run`'s workload, steps and parameters,
/// the trace format, and `extra` (what else must agree: a capture policy, say).
pub fn run_settings(run: &RunConfig, extra: &[(&str, String)]) -> RunSettings {
    let mut settings = RunSettings::new();
    settings.insert("workload".into(), run.workload.clone());
    settings.insert("steps".into(), run.steps.map_or("unknown".into(), |s| s.to_string()));
    settings.extend(run.params.iter().map(|(k, v)| (k.clone(), v.clone())));
    settings.insert("trace_format".into(), crate::trace::format::CURRENT_FORMAT.to_string());
    settings.extend(extra.iter().map(|(k, v)| (k.to_string(), v.clone())));
    settings
}

/// This process's side of a run its cluster's launcher started (torchrun, srun, mpirun:
/// [`LaunchedRank`]), or `None` when no launcher's variables are set: for a training loop of
/// your own, with no repro-specific launcher. The ranks meet as [`join_launched`] says, each
/// bringing `run`'s settings.
pub fn join_from_env(device: &Device, run: &RunConfig) -> Result<Option<DataParallel>, RecordError> {
    let Some(place) = LaunchedRank::from_env()? else { return Ok(None) };
    Ok(Some(DataParallel::new(join_launched(device, &place, &run_settings(run, &[]))?)))
}

/// A gradient to average over the ranks: `NAME.grad`, the recorded tensors it was computed from,
/// and its value.
pub struct Gradient<'a> {
    /// `NAME.grad`.
    pub name: &'a str,
    /// Names of recorded tensors of the step it was computed from (may be empty).
    pub inputs: &'a [&'a str],
    /// This rank's gradient.
    pub value: &'a Tensor,
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
        let rows = self.share(batch.dim(0)?)?;
        Ok(batch.narrow(0, rows.start, rows.len())?)
    }

    /// The rows of a global batch of `rows` that this rank trains on (see `shard`), for a
    /// batch still on the host.
    pub fn share(&self, rows: usize) -> Result<std::ops::Range<usize>, RecordError> {
        self.check_batch(rows)?;
        let share = rows / self.world_size();
        Ok(self.rank() * share..(self.rank() + 1) * share)
    }

    /// Averages gradients over the ranks: records this rank's share of each as `NAME.grad.local`
    /// (computed from the gradient's `inputs`), sums all shares across ranks in one collective
    /// call (flattened into one buffer, as data-parallel frameworks bucket them), records each
    /// sum as `NAME.grad`, and returns the sums in order. Every rank passes the same gradients,
    /// with the same shapes, in the same order.
    pub fn average(&mut self, s: &mut StepRecorder, grads: &[Gradient<'_>]) -> Result<Vec<Tensor>, RecordError> {
        let scale = 1.0 / self.world_size() as f64;
        let same_dtype = grads.windows(2).all(|w| w[0].value.dtype() == w[1].value.dtype());
        // One bucket when the dtypes allow: the gradients flattened side by side, scaled by one
        // launch (the same operation on every element as scaling each), and summed by one
        // collective call.
        let bucket = if grads.is_empty() || !same_dtype {
            None
        } else {
            let flat = grads.iter().map(|g| g.value.flatten_all()).collect::<candle_core::Result<Vec<_>>>()?;
            Some(Tensor::cat(&flat, 0)?.affine(scale, 0.0)?)
        };
        let shares = match &bucket {
            Some(bucket) => unbucket(bucket, grads)?,
            None => grads.iter().map(|g| g.value.affine(scale, 0.0)).collect::<candle_core::Result<_>>()?,
        };
        let locals = record_shares(s, grads, &shares)?;
        let sums = match &bucket {
            Some(bucket) => unbucket(&self.collective.all_reduce_sum(bucket)?, grads)?,
            None => shares.iter().map(|t| self.collective.all_reduce_sum(t)).collect::<Result<_, _>>()?,
        };
        for ((g, local), sum) in grads.iter().zip(&locals).zip(&sums) {
            s.record_collective(g.name, ALL_REDUCE_SUM, local, sum)?;
        }
        // The optimizer's step comes next: the step's graph must be read before it.
        s.wait_for_background()?;
        Ok(sums)
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
        let mut names = Vec::new();
        let mut values = Vec::new();
        let params: Vec<&(String, Var)> = params.iter().filter(|(_, v)| v.dtype().is_float()).collect();
        for (name, var) in &params {
            values.push(match grads.get(var.as_tensor()) {
                Some(grad) => grad.clone(),
                None => {
                    missing.push(name.clone());
                    var.as_tensor().zeros_like()?
                }
            });
            names.push(format!("{name}.grad"));
        }
        let gradients: Vec<Gradient> =
            names.iter().zip(&values).map(|(name, value)| Gradient { name, inputs: &[], value }).collect();
        for ((_, var), sum) in params.iter().zip(self.average(s, &gradients)?) {
            grads.insert(var.as_tensor(), sum);
        }
        s.note_no_gradient(missing.iter().cloned());
        Ok(missing)
    }
}

/// Records this rank's share of each gradient as `NAME.grad.local`, computed from the
/// gradient's `inputs`; returns those names.
/// Ranks as people read them: ascending runs of consecutive ranks as ranges (`1-3, 7`), at most
/// `MAX_RANK_RANGES` of them, then how many ranks are left unnamed; so a message about the ranks
/// of a run of 65,536 stays a line.
pub(crate) fn rank_list(ranks: impl IntoIterator<Item = usize>) -> String {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for r in ranks {
        match runs.last_mut() {
            Some((_, end)) if *end + 1 == r => *end = r,
            _ => runs.push((r, r)),
        }
    }
    let shown: Vec<String> = runs
        .iter()
        .take(MAX_RANK_RANGES)
        .map(|&(a, b)| if a == b { a.to_string() } else { format!("{a}-{b}") })
        .collect();
    let unnamed: usize = runs.iter().skip(MAX_RANK_RANGES).map(|(a, b)| b - a + 1).sum();
    match unnamed {
        0 => shown.join(", "),
        n => format!("{} and {n} more", shown.join(", ")),
    }
}

/// How many runs of ranks a message names before it counts the rest.
const MAX_RANK_RANGES: usize = 16;

fn record_shares(s: &mut StepRecorder, grads: &[Gradient<'_>], shares: &[Tensor]) -> Result<Vec<String>, RecordError> {
    let mut locals = Vec::with_capacity(grads.len());
    for (g, share) in grads.iter().zip(shares) {
        let local = format!("{}{LOCAL_SUFFIX}", g.name);
        s.record_as(&local, TensorKind::Gradient, Some(Phase::Backward), g.inputs, share)?;
        locals.push(local);
    }
    Ok(locals)
}

/// The gradients' places in a bucket of them flattened side by side, shaped as the gradients.
fn unbucket(bucket: &Tensor, grads: &[Gradient<'_>]) -> Result<Vec<Tensor>, RecordError> {
    let mut at = 0;
    let mut parts = Vec::with_capacity(grads.len());
    for g in grads {
        let n = g.value.elem_count();
        parts.push(bucket.narrow(0, at, n)?.reshape(g.value.shape())?);
        at += n;
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    #[test]
    fn ranks_are_named_as_ranges_and_a_long_list_is_cut_to_a_line() {
        assert_eq!(super::rank_list([1, 2, 3, 7, 9, 10]), "1-3, 7, 9-10");
        assert_eq!(super::rank_list(1..65536), "1-65535");
        let every_other = super::rank_list((0..65536).step_by(2));
        assert!(every_other.len() < 200 && every_other.ends_with("and 32752 more"), "{every_other}");
        assert_eq!(super::rank_list([]), "");
    }

    use super::*;
    use std::thread;

    #[test]
    fn a_batch_is_split_in_equal_row_blocks_and_an_uneven_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let batch = Tensor::arange(0u32, 12, &Device::Cpu).unwrap().reshape((6, 2)).unwrap();
        let rows: Vec<Vec<u32>> = (0..3)
            .map(|rank| {
                let dp =
                    DataParallel::new(Box::new(FileCollective::join(dir.path(), rank, 3, RENDEZVOUS_TIMEOUT).unwrap()));
                dp.shard(&batch).unwrap().flatten_all().unwrap().to_vec1().unwrap()
            })
            .collect();
        assert_eq!(rows, vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![8, 9, 10, 11]]);
        let dp = DataParallel::new(Box::new(FileCollective::join(dir.path(), 0, 4, RENDEZVOUS_TIMEOUT).unwrap()));
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
                    let mut dp =
                        DataParallel::new(Box::new(FileCollective::join(&path, rank, 2, RENDEZVOUS_TIMEOUT).unwrap()));
                    let trace = tempfile::tempdir().unwrap();
                    let run = crate::trace::RunConfig { workload: "t".into(), ..Default::default() };
                    let mut rec =
                        crate::record::Recorder::create(trace.path(), run, &Device::Cpu, Default::default()).unwrap();
                    let var = Var::new(&[1f32, 2.0], &Device::Cpu).unwrap();
                    let matrix = Var::new(&[[1f32, 2.0], [3.0, 4.0]], &Device::Cpu).unwrap();
                    let scale = rank as f64 + 1.0;
                    let loss = ((var.as_tensor() * scale).unwrap().sum_all().unwrap()
                        + (matrix.as_tensor() * (10.0 * scale)).unwrap().sum_all().unwrap())
                    .unwrap();
                    let mut grads = loss.backward().unwrap();
                    let mut s = rec.step(0);
                    let params = [("m".to_string(), matrix.clone()), ("w".to_string(), var.clone())];
                    dp.average_gradients(&mut s, &params, &mut grads).unwrap();
                    s.finish().unwrap();
                    rec.finish().unwrap();
                    let sum: Vec<f32> = grads.get(var.as_tensor()).unwrap().to_vec1().unwrap();
                    // Summed in one bucket, split back into each parameter's shape.
                    let m: Vec<Vec<f32>> = grads.get(matrix.as_tensor()).unwrap().to_vec2().unwrap();
                    assert_eq!(m, vec![vec![15.0, 15.0], vec![15.0, 15.0]]);
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
            let sum = Some(ALL_REDUCE_SUM.to_string());
            let expected = [("m.grad.local", None), ("w.grad.local", None), ("m.grad", sum.clone()), ("w.grad", sum)];
            assert_eq!(names, expected.map(|(n, c)| (n.to_string(), c)).to_vec());
        }
    }
}
