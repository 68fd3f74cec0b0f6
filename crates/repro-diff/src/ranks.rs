//! Data-parallel runs: whether the ranks stayed replicas, and the diff of two runs whatever
//! their world sizes.
//!
//! - Replicas: after every step, every rank must hold the same parameters and have stepped on
//!   the same gradient sums. [`check_replicas`] finds the first step and tensor where a rank
//!   holds other bits than rank 0.
//! - Two runs of one world size are compared rank by rank; the rank whose stream diverges
//!   first (by step, then by place in the step) is the one reported. When that is a gradient
//!   sum whose every share is identical in both runs, the collective itself added in another
//!   order.
//! - Sharded tensors (an FSDP parameter: each rank records its block, format 1.7) are no
//!   replicas: at every step their blocks must tile the whole instead (`crate::shards`). Runs
//!   that shard differently (other world sizes, FSDP against DDP) compare whole tensors
//!   assembled from the blocks, where every rank stored their values.
//! - Runs of different world sizes compute their batch, graph and loss from different shares
//!   of the batch, so only the replicated state is compared: parameters and the summed
//!   gradients. At the first gradient that differs, each run's sum is checked against its
//!   ranks' shares added in rank order: when the sums are exact, the gap comes from the batch
//!   split (partial sums over shares of the batch, then one addition), not from the collective.

use crate::metrics::compare;
use crate::shards::{layout_of, sharded_tensors, Assembler, Layout};
use crate::traces::{diff_assembling, diff_traces_with, DiffOptions, TraceDiff};
use repro_trace::dtype::DType;
use repro_trace::shard::{place, tiling_gap, Block};
use repro_trace::{
    rank_streams, read_progress, Completeness, Progress, ProgressPoint, StepRecord, TensorKind, TraceError, TraceReader,
};
use serde::Serialize;
use std::path::{Path, PathBuf};

/// Whether the ranks of one data-parallel run held the same replicated state at every step.
#[derive(Debug, Clone, Serialize)]
pub struct ReplicaReport {
    /// The run directory.
    pub run: String,
    /// Number of ranks.
    pub world_size: u64,
    /// Steps that every rank recorded, and so were checked.
    pub steps_checked: u64,
    /// (step, rank, tensor) hashes compared with rank 0's.
    pub tensors_checked: u64,
    /// (step, tensor) pairs of a sharded tensor whose ranks' blocks were checked to tile it.
    pub shards_checked: u64,
    /// The first tensor a rank holds other bits of than rank 0, if any.
    pub drift: Option<ReplicaDrift>,
    /// Ranks whose stream is unfinished (no footer, cut short, or stopped early) or holds fewer
    /// steps than the longest rank's: a run is whole only when every rank is.
    pub unfinished: Vec<UnfinishedRank>,
    /// Unfinished ranks that waited in a collective others never reached, and those others.
    pub stall: Option<Stall>,
}

impl ReplicaReport {
    /// True when every rank finished, with as many steps as every other, and the ranks held
    /// identical replicated state at every step.
    pub fn passed(&self) -> bool {
        self.drift.is_none() && self.unfinished.is_empty()
    }
}

/// A rank that did not finish the run with the others.
#[derive(Debug, Clone, Serialize)]
pub struct UnfinishedRank {
    /// The rank.
    pub rank: u64,
    /// Steps its stream holds.
    pub steps: u64,
    /// Steps the longest rank's stream holds.
    pub steps_of_longest: u64,
    /// Why its stream is unfinished, when it is (otherwise it finished with fewer steps).
    pub reason: Option<String>,
    /// Where its recorder last was, for an unfinished stream with a progress mark: the mark, or
    /// where its records say it was when they contradict the mark (`stale_mark`).
    pub last_seen: Option<Progress>,
    /// A progress mark behind the rank's own records (it marks a step the stream holds as not
    /// yet done): the records win, since a step is written only once it is over.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stale_mark: Option<Progress>,
}

/// Ranks stopped while some waited in a collective that others never reached: the ones that
/// never arrived held the run up (hung, or died without a trace of it).
#[derive(Debug, Clone, Serialize)]
pub struct Stall {
    /// Where the waiting ranks were: the step and its collective.
    pub waited_in: Progress,
    /// The ranks waiting there.
    pub waiting: Vec<u64>,
    /// The unfinished ranks that never reached it, each with its last mark (`None`: it left none).
    pub behind: Vec<(u64, Option<Progress>)>,
}

/// The stall among a run's unfinished ranks, if one waited in a collective that another
/// unfinished rank never reached (see [`Stall`]).
pub fn stall(unfinished: &[UnfinishedRank]) -> Option<Stall> {
    let furthest =
        unfinished.iter().filter_map(|u| u.last_seen.as_ref()).reduce(|a, b| if b.is_past(a) { b } else { a })?;
    if furthest.at != ProgressPoint::Collective {
        return None;
    }
    let there = |p: &Option<Progress>| p.as_ref().is_some_and(|p| p.step == furthest.step && p.at == furthest.at);
    let waiting: Vec<u64> = unfinished.iter().filter(|u| there(&u.last_seen)).map(|u| u.rank).collect();
    let behind: Vec<(u64, Option<Progress>)> =
        unfinished.iter().filter(|u| !there(&u.last_seen)).map(|u| (u.rank, u.last_seen.clone())).collect();
    let waited_in = Progress { tensors: Vec::new(), ..furthest.clone() };
    (!behind.is_empty()).then_some(Stall { waited_in, waiting, behind })
}

/// Where replicas first stopped being replicas.
#[derive(Debug, Clone, Serialize)]
pub struct ReplicaDrift {
    /// The step.
    pub step: u64,
    /// The tensor, as rank 0 recorded it.
    pub tensor: String,
    /// What it is.
    pub kind: TensorKind,
    /// The ranks whose bits differ from rank 0's (or which lack the tensor); empty for a
    /// sharded tensor, whose `shards` says what is wrong.
    pub ranks: Vec<u64>,
    /// For a sharded tensor (format 1.7): why its ranks' blocks do not tile it.
    pub shards: Option<String>,
}

/// Whether a tensor is state every replica must hold identically: a parameter, or the result of
/// a collective; never a shard, which is each rank's own block, nor a buffer, which each rank
/// may update from its own rows (BatchNorm's running statistics).
fn replicated(t: &repro_trace::TensorRecord) -> bool {
    t.shard.is_none() && (t.kind == TensorKind::Weight || t.collective.is_some())
}

/// Checks the ranks of the data-parallel run in `run` (its rank streams `streams`) step by step
/// against rank 0: parameters before and after each update, and every collective's result.
pub fn check_replicas(run: &Path, streams: &[PathBuf]) -> Result<ReplicaReport, TraceError> {
    let mut readers = streams.iter().map(TraceReader::open).collect::<Result<Vec<_>, _>>()?;
    for other in &readers[1..] {
        readers[0].comparable_with(other)?;
    }
    let mut report = ReplicaReport {
        run: run.display().to_string(),
        world_size: streams.len() as u64,
        steps_checked: 0,
        tensors_checked: 0,
        shards_checked: 0,
        drift: None,
        unfinished: Vec::new(),
        stall: None,
    };
    // Steps read from each rank's stream, and the last one's number.
    let mut read = vec![0u64; readers.len()];
    let mut last = vec![None; readers.len()];
    // Each rank's shard layout at the last step checked: a step that keeps it tiles as well.
    let mut tiled: Option<Vec<_>> = None;
    'steps: loop {
        let mut steps = Vec::with_capacity(readers.len());
        for ((reader, read), last) in readers.iter_mut().zip(&mut read).zip(&mut last) {
            match reader.next_step()? {
                Some(step) => {
                    *read += 1;
                    *last = Some(step.step);
                    steps.push(step);
                }
                None => break 'steps,
            }
        }
        let first = &steps[0];
        if let Some(other) = steps.iter().find(|s| s.step != first.step) {
            return Err(TraceError::Corrupt {
                path: run.to_path_buf(),
                location: format!("step {}", first.step),
                reason: format!("rank 0 recorded step {} where another rank recorded step {}", first.step, other.step),
            });
        }
        report.steps_checked += 1;
        let layout: Vec<_> = steps.iter().map(layout_of).collect();
        if layout.iter().any(|l| !l.is_empty()) {
            if tiled.as_ref() != Some(&layout) {
                let all: Vec<&StepRecord> = steps.iter().collect();
                if let Some(Err(gap)) = sharded_tensors(&all).into_iter().find(Result::is_err) {
                    let (tensor, kind, shards) = (gap.tensor, gap.kind, Some(gap.reason));
                    report.drift = Some(ReplicaDrift { step: first.step, tensor, kind, ranks: Vec::new(), shards });
                    break 'steps;
                }
                tiled = Some(layout);
            }
            report.shards_checked += first.tensors.iter().filter(|t| t.shard.is_some()).count() as u64;
        }
        for tensor in first.tensors.iter().filter(|t| replicated(t)) {
            let mut ranks = Vec::new();
            for (rank, step) in steps.iter().enumerate().skip(1) {
                report.tensors_checked += 1;
                let same = step.tensors.iter().any(|t| t.name == tensor.name && t.hash == tensor.hash);
                if !same {
                    ranks.push(rank as u64);
                }
            }
            if !ranks.is_empty() {
                let (tensor, kind) = (tensor.name.clone(), tensor.kind);
                report.drift = Some(ReplicaDrift { step: first.step, tensor, kind, ranks, shards: None });
                break 'steps;
            }
        }
    }
    report.unfinished = unfinished_ranks(&mut readers, streams, read, last)?;
    report.stall = stall(&report.unfinished);
    Ok(report)
}

/// The ranks whose streams are unfinished or shorter than the longest, given the steps already
/// read from each (the rest of every stream is read here, to count it), with the progress mark
/// of each unfinished one.
fn unfinished_ranks(
    readers: &mut [TraceReader],
    streams: &[PathBuf],
    mut steps: Vec<u64>,
    mut last: Vec<Option<u64>>,
) -> Result<Vec<UnfinishedRank>, TraceError> {
    for ((reader, steps), last) in readers.iter_mut().zip(&mut steps).zip(&mut last) {
        while let Some(step) = reader.next_step()? {
            *steps += 1;
            *last = Some(step.step);
        }
    }
    let longest = steps.iter().copied().max().unwrap_or(0);
    let mut unfinished = Vec::new();
    for (rank, ((reader, steps), stream)) in readers.iter().zip(steps).zip(streams).enumerate() {
        let reason = match reader.completeness() {
            Some(Completeness::Incomplete(why)) => Some(why.clone()),
            _ => None,
        };
        if reason.is_some() || steps < longest {
            let mut last_seen = if reason.is_some() { read_progress(stream)? } else { None };
            // A mark behind the stream's last step (written once it was over) is stale.
            let written = last[rank].map(|step| Progress {
                step,
                at: ProgressPoint::Done,
                collective: None,
                tensors: Vec::new(),
            });
            let mut stale_mark = None;
            if let (Some(mark), Some(written)) = (&last_seen, &written) {
                if written.is_past(mark) {
                    stale_mark = last_seen.replace(written.clone());
                }
            }
            unfinished.push(UnfinishedRank {
                rank: rank as u64,
                steps,
                steps_of_longest: longest,
                reason,
                last_seen,
                stale_mark,
            });
        }
    }
    Ok(unfinished)
}

/// The comparison of two runs, each on one device or data-parallel.
#[derive(Debug, Clone, Serialize)]
pub struct RunDiff {
    /// The streams compared: the only ones for single-device runs, else the rank reported (see
    /// `rank`), or rank 0 of each when the world sizes differ. Every figure in it is that
    /// rank's; `all_ranks` sums them over the ranks.
    pub diff: TraceDiff,
    /// With equal world sizes above 1: the counts summed over every rank pair compared.
    pub all_ranks: Option<RankTotals>,
    /// A's number of ranks (1: one device).
    pub world_size_a: u64,
    /// B's number of ranks.
    pub world_size_b: u64,
    /// With equal world sizes above 1: the rank whose streams `diff` compares, the one that
    /// diverged first (rank 0 when none did).
    pub rank: Option<u64>,
    /// Replica checks of the data-parallel runs among A and B.
    pub replicas: Vec<ReplicaReport>,
    /// Why a gradient sum differs, when data parallelism explains it.
    pub cause: Option<DataParallelCause>,
    /// When A and B shard tensors differently: the whole tensors compared, assembled from each
    /// run's shards.
    pub shards: Option<ShardComparison>,
}

/// How runs that shard tensors differently (format 1.7) were compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ShardComparison {
    /// (step, tensor) wholes assembled from every rank's shard, in A and B together.
    pub assembled: u64,
    /// Sharded records left out: not every rank stored their values (counted in the diff's
    /// `not_compared`).
    pub left_out: u64,
}

/// Counts summed over the rank pairs of two data-parallel runs of one world size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RankTotals {
    /// Rank pairs compared (the world size).
    pub ranks: u64,
    /// Tensors compared, over all ranks and steps.
    pub tensors_compared: u64,
    /// Tensors that differ, over all ranks and steps.
    pub tensors_diverged: u64,
}

impl RunDiff {
    /// True when the runs agree bit for bit, and every data-parallel run finished on every rank
    /// and kept its replicas.
    pub fn is_identical(&self) -> bool {
        self.verdict().is_same()
    }

    /// True when nothing compared differs, and the runs are not identical only because a trace
    /// or a rank did not finish.
    pub fn is_incomplete(&self) -> bool {
        self.verdict() == crate::Verdict::Incomplete
    }
}

/// What data parallelism did to the first gradient that differs.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum DataParallelCause {
    /// Same world size: every rank's share of the gradient is identical in both runs, and the
    /// sums differ. The collective added the shares in another order (its algorithm, protocol
    /// or channels).
    CollectiveOrder {
        /// The step.
        step: u64,
        /// The summed gradient.
        tensor: String,
    },
    /// Different world sizes, and each data-parallel run's sum equals its ranks' shares added
    /// in rank order, bit for bit: the collective added no rounding of its own order, and the
    /// runs differ by how the batch was split (a partial gradient per share, then their sum).
    BatchSplit {
        /// The step.
        step: u64,
        /// The gradient.
        tensor: String,
    },
    /// Different world sizes, each data-parallel run's sum equals its ranks' shares added in
    /// rank order, but the runs' losses at that step (every loss record of every rank, added)
    /// disagree beyond rounding while the parameters agree: the ranks computed their examples
    /// otherwise than one device did (random draws made per rank, such as dropout masks, or
    /// other rows), which a batch split alone does not do.
    ForwardDiffers {
        /// The step.
        step: u64,
        /// The gradient.
        tensor: String,
        /// A's losses at the step, added over its records and ranks.
        #[serde(serialize_with = "crate::json_float::serialize")]
        loss_a: f64,
        /// B's.
        #[serde(serialize_with = "crate::json_float::serialize")]
        loss_b: f64,
    },
    /// Different world sizes, and some run's sum differs from its shares added in rank order:
    /// the collective's own order is part of the gap.
    CollectiveRounding {
        /// The step.
        step: u64,
        /// The gradient.
        tensor: String,
        /// The run whose sum is not the rank-order sum.
        run: String,
        /// Its largest distance from the rank-order sum, in units in the last place.
        max_ulp: u64,
    },
    /// Different world sizes, but the ranks' shares were not stored at that step (only hashes),
    /// so the two explanations cannot be told apart; record with `--capture all`.
    Undetermined {
        /// The step.
        step: u64,
        /// The gradient.
        tensor: String,
        /// Whether the runs record the ranks' shares of the sum at all (a collective or
        /// reduce-scatter record with its share as input): false for a run that records its
        /// gradients without them (FSDP traces before format 1.8), where no capture policy can tell.
        shares_recorded: bool,
    },
}

/// Compares the runs `a` and `b`, each a trace or a data-parallel run directory.
pub fn diff_runs(a: &Path, b: &Path, options: &DiffOptions) -> Result<RunDiff, TraceError> {
    let (ranks_a, ranks_b) = (rank_streams(a)?, rank_streams(b)?);
    let mut replicas = Vec::new();
    for (run, ranks) in [(a, &ranks_a), (b, &ranks_b)] {
        if let Some(ranks) = ranks {
            replicas.push(check_replicas(run, ranks)?);
        }
    }
    let streams_a = ranks_a.clone().unwrap_or_else(|| vec![a.to_path_buf()]);
    let streams_b = ranks_b.clone().unwrap_or_else(|| vec![b.to_path_buf()]);
    let (world_a, world_b) = (streams_a.len() as u64, streams_b.len() as u64);
    let same_sharding = first_layout(&streams_a[0])? == first_layout(&streams_b[0])?;
    if world_a == world_b && same_sharding {
        let (diff, rank, cause, totals) = diff_rank_by_rank(&streams_a, &streams_b, options)?;
        let rank = (world_a > 1).then_some(rank);
        let all_ranks = (world_a > 1).then_some(totals);
        let (world_size_a, world_size_b) = (world_a, world_b);
        return Ok(RunDiff { diff, all_ranks, world_size_a, world_size_b, rank, replicas, cause, shards: None });
    }
    let options = DiffOptions { replicated_state_only: true, ..options.clone() };
    let (mut shards_a, mut shards_b) = (Assembler::open(&streams_a)?, Assembler::open(&streams_b)?);
    let diff = diff_assembling(
        &mut TraceReader::open(&streams_a[0])?,
        Some(&mut shards_a),
        &mut TraceReader::open(&streams_b[0])?,
        Some(&mut shards_b),
        &options,
    )?;
    // The comparison gives each assembler its count of what was left out of both runs.
    let (assembled, left_out) = (shards_a.assembled + shards_b.assembled, shards_a.left_out);
    let shards = (!same_sharding).then_some(ShardComparison { assembled, left_out });
    let cause = match &diff.first_divergence {
        Some(d) if d.kind == TensorKind::Gradient => {
            Some(split_cause(d.step, &d.tensor, &[(a, &streams_a), (b, &streams_b)])?)
        }
        _ => None,
    };
    let (world_size_a, world_size_b) = (world_a, world_b);
    Ok(RunDiff { diff, all_ranks: None, world_size_a, world_size_b, rank: None, replicas, cause, shards })
}

/// The shard layout of the first step of the trace `dir` (empty when it shards nothing).
fn first_layout(dir: &Path) -> Result<Layout, TraceError> {
    Ok(TraceReader::open(dir)?.next_step()?.map(|s| layout_of(&s)).unwrap_or_default())
}

/// Diffs rank `r` of A with rank `r` of B for every rank; returns the diff of the rank that
/// diverged first, that rank, whether the collective is the cause, and the counts summed over
/// all ranks.
fn diff_rank_by_rank(
    streams_a: &[PathBuf],
    streams_b: &[PathBuf],
    options: &DiffOptions,
) -> Result<(TraceDiff, u64, Option<DataParallelCause>, RankTotals), TraceError> {
    if let ([a], [b]) = (streams_a, streams_b) {
        // One stream each: nothing to choose between, and no sums to blame.
        let diff = diff_traces_with(&mut TraceReader::open(a)?, &mut TraceReader::open(b)?, options)?;
        let totals =
            RankTotals { ranks: 1, tensors_compared: diff.tensors_compared, tensors_diverged: diff.tensors_diverged };
        return Ok((diff, 0, None, totals));
    }
    let mut best: Option<(TraceDiff, u64, Place)> = None;
    let (mut compared, mut diverged) = (0, 0);
    for (rank, (a, b)) in streams_a.iter().zip(streams_b).enumerate() {
        let diff = diff_traces_with(&mut TraceReader::open(a)?, &mut TraceReader::open(b)?, options)?;
        compared += diff.tensors_compared;
        diverged += diff.tensors_diverged;
        // A rank whose streams disagree in structure or did not finish comes after every
        // rank that diverged in value, and before every rank that agrees.
        let place = match &diff.first_divergence {
            Some(d) => place_in_step(a, d.step, &d.tensor)?,
            None if !diff.is_identical() => Place { at: (u64::MAX, 0), collective: false },
            None => Place { at: (u64::MAX, usize::MAX), collective: false },
        };
        if best.as_ref().is_none_or(|(_, _, best)| place.at < best.at) {
            best = Some((diff, rank as u64, place));
        }
    }
    let (diff, rank, place) = best.expect("at least one rank");
    let totals = RankTotals { ranks: streams_a.len() as u64, tensors_compared: compared, tensors_diverged: diverged };
    // No rank diverged before this place, and a sum's shares come before it in every rank's
    // stream: if it is a sum, every rank's share is identical.
    let cause = match &diff.first_divergence {
        Some(d) if place.collective => {
            Some(DataParallelCause::CollectiveOrder { step: d.step, tensor: d.tensor.clone() })
        }
        _ => None,
    };
    Ok((diff, rank, cause, totals))
}

/// Where a tensor stands in its step: (step, index among the step's records), and whether it is
/// a collective's result.
struct Place {
    at: (u64, usize),
    collective: bool,
}

/// Reads `dir` up to `step`.
fn read_step(dir: &Path, step: u64) -> Result<(TraceReader, Option<StepRecord>), TraceError> {
    let mut reader = TraceReader::open(dir)?;
    while let Some(record) = reader.next_step()? {
        if record.step == step {
            return Ok((reader, Some(record)));
        }
    }
    Ok((reader, None))
}

/// Where `tensor` stands among the records of `step` in the trace `dir`.
fn place_in_step(dir: &Path, step: u64, tensor: &str) -> Result<Place, TraceError> {
    let (_, record) = read_step(dir, step)?;
    let found = record.as_ref().and_then(|r| r.tensors.iter().enumerate().find(|(_, t)| t.name == tensor));
    Ok(match found {
        Some((index, t)) => Place { at: (step, index), collective: t.summed_from().is_some() },
        None => Place { at: (step, usize::MAX), collective: false },
    })
}

/// Tells a batch split from the collective's rounding at the first gradient that differs
/// between runs of different world sizes.
fn split_cause(step: u64, tensor: &str, runs: &[(&Path, &Vec<PathBuf>)]) -> Result<DataParallelCause, TraceError> {
    for (run, streams) in runs.iter().filter(|(_, s)| s.len() > 1) {
        match rank_order_distance(streams, step, tensor)? {
            None => {
                let shares_recorded = shares_recorded(streams, step, tensor)?;
                return Ok(DataParallelCause::Undetermined { step, tensor: tensor.to_string(), shares_recorded });
            }
            Some(0) => {}
            Some(max_ulp) => {
                return Ok(DataParallelCause::CollectiveRounding {
                    step,
                    tensor: tensor.to_string(),
                    run: run.display().to_string(),
                    max_ulp,
                })
            }
        }
    }
    let tensor = tensor.to_string();
    let [(_, streams_a), (_, streams_b)] = runs else { return Ok(DataParallelCause::BatchSplit { step, tensor }) };
    let (Some(loss_a), Some(loss_b)) = (loss_total(streams_a, step)?, loss_total(streams_b, step)?) else {
        return Ok(DataParallelCause::BatchSplit { step, tensor });
    };
    // A loss is a mean over a rank's rows (the ranks' gradients then averaged) or a sum (then
    // added): either way, one device's losses agree with the ranks', within rounding, when each
    // rank computed its rows as one device did.
    let (world_a, world_b) = (streams_a.len() as f64, streams_b.len() as f64);
    let agree = |x: f64, y: f64| (x - y).abs() <= LOSS_ROUNDING * x.abs().max(y.abs());
    if agree(loss_a / world_a, loss_b / world_b) || agree(loss_a, loss_b) {
        Ok(DataParallelCause::BatchSplit { step, tensor })
    } else {
        Ok(DataParallelCause::ForwardDiffers { step, tensor, loss_a, loss_b })
    }
}

/// How far apart (relative) two runs' losses at a step may be and still come from the same
/// examples computed the same way, added in other orders and groups: 2^-12, far above the
/// rounding of a sum of f32 losses over fewer than 2^11 groups, far below what other random
/// draws or other rows move a loss by.
const LOSS_ROUNDING: f64 = 1.0 / 4096.0;

/// The losses a run recorded at `step`: every scalar f32 record of kind loss whose value is
/// stored, on every rank, added in f64; `None` when some rank recorded none or stored none.
fn loss_total(streams: &[PathBuf], step: u64) -> Result<Option<f64>, TraceError> {
    let mut total = 0.0;
    for dir in streams {
        let (mut reader, Some(record)) = read_step(dir, step)? else { return Ok(None) };
        let mut found = false;
        for t in record.tensors.iter().filter(|t| t.kind == TensorKind::Loss && t.dtype == DType::F32) {
            if t.shape.iter().product::<u64>() != 1 {
                continue;
            }
            let Some(values) = reader.values(&record, t)? else { return Ok(None) };
            let bytes: [u8; 4] = values.bytes[..4].try_into().expect("one f32");
            total += f32::from_le_bytes(bytes) as f64;
            found = true;
        }
        if !found {
            return Ok(None);
        }
    }
    Ok(Some(total))
}

/// Whether rank 0 records `tensor` at `step` as a sum across the ranks (whole or a block of it)
/// with its share as input.
fn shares_recorded(streams: &[PathBuf], step: u64, tensor: &str) -> Result<bool, TraceError> {
    let (_, Some(record)) = read_step(&streams[0], step)? else { return Ok(false) };
    let sum = record.tensors.iter().find(|t| t.name == tensor && t.summed_from().is_some());
    Ok(sum.and_then(|s| s.summed_from()).is_some_and(|share| record.tensors.iter().any(|t| t.name == share)))
}

/// The largest ULP distance between the recorded sum `tensor` at `step` (rank 0's, or, for a
/// reduce-scatter, the whole assembled from every rank's block) and the ranks' shares of it
/// added in rank order in f32; `None` when some values were not stored, the blocks do not cover
/// the whole, or the tensor is not an f32 sum.
fn rank_order_distance(streams: &[PathBuf], step: u64, tensor: &str) -> Result<Option<u64>, TraceError> {
    let mut total: Option<Vec<f32>> = None;
    let mut recorded: Option<Vec<u8>> = None;
    let mut blocks: Vec<Block> = Vec::new();
    let mut whole_shape: Option<Vec<u64>> = None;
    for (rank, dir) in streams.iter().enumerate() {
        let (mut reader, Some(record)) = read_step(dir, step)? else { return Ok(None) };
        let Some(sum) = record.tensors.iter().find(|t| t.name == tensor && t.summed_from().is_some()) else {
            return Ok(None);
        };
        let Some(share) = sum.summed_from().and_then(|n| record.tensors.iter().find(|t| t.name == n)) else {
            return Ok(None);
        };
        if share.dtype != DType::F32 || sum.dtype != DType::F32 {
            return Ok(None);
        }
        let Some(values) = reader.values(&record, share)? else { return Ok(None) };
        let share: Vec<f32> =
            values.bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        match &mut total {
            None => total = Some(share),
            Some(total) if total.len() == share.len() => total.iter_mut().zip(share).for_each(|(t, s)| *t += s),
            Some(_) => return Ok(None),
        }
        match &sum.shard {
            // A block of the sum: placed into the whole, which every rank's blocks must cover.
            Some(shard) => {
                let Some(values) = reader.values(&record, sum)? else { return Ok(None) };
                let whole_len = shard.whole.iter().product::<u64>() as usize * 4;
                let whole = recorded.get_or_insert_with(|| vec![0; whole_len]);
                if whole.len() != whole_len {
                    return Ok(None);
                }
                let block = Block { rank: rank as u64, offset: shard.offset.clone(), shape: sum.shape.clone() };
                place(whole, &shard.whole, 4, &block, &values.bytes);
                blocks.push(block);
                whole_shape = Some(shard.whole.clone());
            }
            None if rank == 0 => {
                let Some(values) = reader.values(&record, sum)? else { return Ok(None) };
                recorded = Some(values.bytes.to_vec());
            }
            None => {}
        }
    }
    let (Some(total), Some(recorded)) = (total, recorded) else { return Ok(None) };
    let expected: Vec<u8> = total.iter().flat_map(|v| v.to_le_bytes()).collect();
    let untiled = whole_shape.is_some_and(|whole| tiling_gap(&whole, &blocks).is_some());
    if expected.len() != recorded.len() || untiled {
        return Ok(None);
    }
    Ok(Some(compare(DType::F32, &recorded, &expected).max_ulp))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unfinished(rank: u64, seen: Option<(u64, ProgressPoint)>) -> UnfinishedRank {
        let last_seen = seen.map(|(step, at)| Progress {
            step,
            at,
            collective: (at == ProgressPoint::Collective).then(|| "all_reduce_sum".to_string()),
            tensors: vec!["w.grad".into()],
        });
        UnfinishedRank { rank, steps: 2, steps_of_longest: 2, reason: Some("cut".into()), last_seen, stale_mark: None }
    }

    #[test]
    fn a_stall_names_the_ranks_that_never_reached_the_collective_the_others_waited_in() {
        use ProgressPoint::*;
        let ranks = [
            unfinished(0, Some((2, Collective))),
            unfinished(1, Some((1, Done))),
            unfinished(2, None),
            unfinished(3, Some((2, Collective))),
        ];
        let found = stall(&ranks).unwrap();
        assert_eq!((found.waited_in.step, found.waited_in.at), (2, Collective));
        assert_eq!(found.waiting, [0, 3]);
        assert_eq!(found.behind.iter().map(|(r, _)| *r).collect::<Vec<_>>(), [1, 2]);
        assert!(found.behind[1].1.is_none());
        // A rank computing step 2 has not reached step 2's collective either.
        let found = stall(&[unfinished(0, Some((2, Computing))), unfinished(1, Some((2, Collective)))]).unwrap();
        assert_eq!((found.waiting.as_slice(), found.behind[0].0), ([1].as_slice(), 0));
        // No stall: every rank waits, or the furthest is not at a collective, or no marks.
        assert!(stall(&[unfinished(0, Some((2, Collective))), unfinished(1, Some((2, Collective)))]).is_none());
        assert!(stall(&[unfinished(0, Some((3, Computing))), unfinished(1, Some((2, Collective)))]).is_none());
        assert!(stall(&[unfinished(0, None), unfinished(1, None)]).is_none());
    }

    /// Issue 66, item 9: a mark behind its rank's own records (a step the stream holds, marked as
    /// not yet done) loses to the records, and blames no rank for a collective it got past.
    #[test]
    fn a_progress_mark_behind_its_records_is_stale_and_blames_no_one() {
        let dir = tempfile::tempdir().unwrap();
        // Rank 0 holds step 0 and waits in step 1's all-reduce; rank 1 holds steps 0 to 2, but its
        // mark still says it waits in step 0's. Both were stopped (no footer).
        let marks = [
            r#"{"step": 1, "at": "collective", "collective": "all_reduce_sum"}"#,
            r#"{"step": 0, "at": "collective", "collective": "all_reduce_sum"}"#,
        ];
        for (rank, (steps, mark)) in [1u64, 3].into_iter().zip(marks).enumerate() {
            let stream_dir = dir.path().join(format!("rank-{rank}"));
            let mut w = TraceWriter::create(&stream_dir, &rank_header(rank as u64, 2, 3), false).unwrap();
            for step in 0..steps {
                let bytes = 1.0f32.to_le_bytes();
                let record = TensorRecord::of_bytes("w", TensorKind::Weight, DType::F32, vec![1], &bytes);
                w.write_step(step, vec![StepTensor { record, payload: None }]).unwrap();
            }
            drop(w);
            std::fs::write(stream_dir.join(repro_trace::format::PROGRESS_FILE), mark).unwrap();
        }
        let streams = repro_trace::rank_streams(dir.path()).unwrap().unwrap();
        let report = check_replicas(dir.path(), &streams).unwrap();
        let rank1 = report.unfinished.iter().find(|u| u.rank == 1).unwrap();
        let seen = rank1.last_seen.as_ref().unwrap();
        assert_eq!((seen.step, seen.at), (2, ProgressPoint::Done), "{report:?}");
        assert_eq!(rank1.stale_mark.as_ref().map(|m| (m.step, m.at)), Some((0, ProgressPoint::Collective)));
        // Rank 1's records put it past the collective rank 0 waits in: it is not the one behind.
        assert!(report.stall.is_none(), "{report:?}");
        let rank0 = report.unfinished.iter().find(|u| u.rank == 0).unwrap();
        assert!(rank0.stale_mark.is_none() && rank0.last_seen.as_ref().unwrap().step == 1);
    }
    use repro_trace::{
        CapturePolicy, Distributed, Header, Phase, RunConfig, StepTensor, TensorRecord, TraceWriter, CURRENT_FORMAT,
    };

    /// `x` moved up by `ulps` units in the last place.
    fn up(x: f32, ulps: u32) -> f32 {
        f32::from_bits(x.to_bits() + ulps)
    }

    /// One tensor of a synthetic step: name, kind, values, and the input it is the sum of.
    struct T(&'static str, TensorKind, Vec<f32>, Option<&'static str>);

    /// Writes a trace of `steps` into `dir`, as rank `rank` of `world` (or a single device when
    /// `world` is 1), every value stored inline.
    fn stream(dir: &Path, rank: u64, world: u64, steps: Vec<Vec<T>>) {
        let declared = steps.len() as u64;
        stream_declaring(dir, rank, world, declared, steps)
    }

    /// The header of rank `rank` of `world` (a single device when `world` is 1), of `steps` steps.
    fn rank_header(rank: u64, world: u64, steps: u64) -> Header {
        Header {
            format: CURRENT_FORMAT,
            producer: "test".into(),
            run: RunConfig { workload: "synthetic".into(), steps: Some(steps), params: Default::default() },
            environment: Default::default(),
            capture: CapturePolicy::default(),
            distributed: (world > 1).then(|| Distributed {
                rank,
                world_size: world,
                backend: "file".into(),
                backend_version: String::new(),
            }),
            data_hash: Default::default(),
        }
    }

    /// `stream`, whose header declares `declared` steps (a rank that finished early).
    fn stream_declaring(dir: &Path, rank: u64, world: u64, declared: u64, steps: Vec<Vec<T>>) {
        let mut w = TraceWriter::create(dir, &rank_header(rank, world, declared), false).unwrap();
        for (step, tensors) in steps.into_iter().enumerate() {
            let records = tensors
                .into_iter()
                .map(|T(name, kind, values, sum_of)| {
                    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                    let shape = vec![values.len() as u64];
                    let record = TensorRecord {
                        phase: Some(Phase::Backward),
                        inputs: sum_of.iter().map(|s| s.to_string()).collect(),
                        collective: sum_of.map(|_| repro_trace::format::ALL_REDUCE_SUM.to_string()),
                        inline: Some(bytes.clone()),
                        ..TensorRecord::of_bytes(name, kind, DType::F32, shape, &bytes)
                    };
                    StepTensor { record, payload: None }
                })
                .collect();
            w.write_step(step as u64, records).unwrap();
        }
        w.finish().unwrap();
    }

    /// A 2-rank run in `dir`: per rank, the weight, its share of the gradient and the sum.
    fn two_ranks(dir: &Path, shares: [f32; 2], sum: f32, updated: [f32; 2]) -> PathBuf {
        for rank in 0..2 {
            let step = vec![
                T("w", TensorKind::Weight, vec![1.0], None),
                T("w.grad.local", TensorKind::Gradient, vec![shares[rank]], None),
                T("w.grad", TensorKind::Gradient, vec![sum], Some("w.grad.local")),
                T("w.updated", TensorKind::Weight, vec![updated[rank]], None),
            ];
            stream(&dir.join(format!("rank-{rank}")), rank as u64, 2, vec![step]);
        }
        dir.to_path_buf()
    }

    /// An FSDP-style run in `dir`: `world` ranks, each holding its rows of the 4 x 2 weight `w`
    /// (values 0 to 7) and of its gradient (values / 8, with `nudge` ULPs added to element
    /// `nudge_at`), as shards, with values stored when `stored`; `offsets` moves rank 1's block.
    /// (A world of one records shards of its whole when `world` is 0.)
    fn sharded_run(dir: &Path, world: u64, stored: bool, rank1_at: Option<u64>, nudge: (usize, u32)) -> PathBuf {
        let (world, sharded) = (world.max(1), world != 1);
        let w: Vec<f32> = (0..8).map(|v| v as f32).collect();
        let mut g: Vec<f32> = w.iter().map(|v| v / 8.0 + 1.0).collect();
        g[nudge.0] = up(g[nudge.0], nudge.1);
        let rows = 4 / world;
        for rank in 0..world {
            let first = if rank == 1 { rank1_at.unwrap_or(rows) } else { rank * rows };
            let block = |all: &[f32]| all[(first * 2) as usize..((first + rows) * 2) as usize].to_vec();
            let stream_dir = if world > 1 { dir.join(format!("rank-{rank}")) } else { dir.to_path_buf() };
            let mut writer = TraceWriter::create(&stream_dir, &rank_header(rank, world, 1), false).unwrap();
            // And the one-row `b`, whole on rank 0, an empty shard on the others.
            let b: Vec<f32> = if rank == 0 { vec![0.5] } else { Vec::new() };
            let (b_rows, b_first) = (b.len() as u64, rank.min(1));
            let records = [
                ("w", TensorKind::Weight, block(&w), [rows, 2, 4, first]),
                ("w.grad", TensorKind::Gradient, block(&g), [rows, 2, 4, first]),
                ("b", TensorKind::Weight, b, [b_rows, 1, 1, b_first]),
            ]
            .into_iter()
            .map(|(name, kind, values, [rows, cols, whole, first])| {
                let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                let shape = vec![rows, cols];
                let shard = sharded.then(|| repro_trace::ShardOf { whole: vec![whole, cols], offset: vec![first, 0] });
                let inline = stored.then(|| bytes.clone());
                let record =
                    TensorRecord { shard, inline, ..TensorRecord::of_bytes(name, kind, DType::F32, shape, &bytes) };
                StepTensor { record, payload: None }
            })
            .collect();
            writer.write_step(0, records).unwrap();
            writer.finish().unwrap();
        }
        dir.to_path_buf()
    }

    /// An FSDP run of 2 ranks in `dir` whose gradient `w.grad` is reduced and scattered (format
    /// 1.8): each rank records its rows of the weight `w` (4 values, all 1), its whole share of
    /// the gradient (`shares[rank]`, `w.grad.local`) and its rows of the sum (`sum`, rows 0-1 on
    /// rank 0 and 2-3 on rank 1), every value stored; and one graph node, the same on each rank.
    fn reduce_scatter_run(dir: &Path, shares: [[f32; 4]; 2], sum: [f32; 4]) -> PathBuf {
        for rank in 0..2u64 {
            let rows = (rank * 2) as usize..(rank * 2 + 2) as usize;
            let shard = Some(repro_trace::ShardOf { whole: vec![4], offset: vec![rank * 2] });
            let record = |name: &str, kind, values: &[f32], shard: Option<repro_trace::ShardOf>| {
                let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                let shape = vec![values.len() as u64];
                let record = TensorRecord {
                    shard,
                    inline: Some(bytes.clone()),
                    ..TensorRecord::of_bytes(name, kind, DType::F32, shape, &bytes)
                };
                StepTensor { record, payload: None }
            };
            let mut sum_block = record("w.grad", TensorKind::Gradient, &sum[rows.clone()], shard.clone());
            sum_block.record.inputs = vec!["w.grad.local".into()];
            sum_block.record.reduce_scatter = Some(repro_trace::format::REDUCE_SCATTER_SUM.into());
            // A graph captured automatically, as repro_torch's (one identical node).
            let mut node = record("h", TensorKind::OpOutput, &[0.5], None);
            node.record.node = Some(0);
            let records = vec![
                record("w", TensorKind::Weight, &[1.0; 2], shard),
                node,
                record("w.grad.local", TensorKind::Gradient, &shares[rank as usize], None),
                sum_block,
            ];
            let mut writer =
                TraceWriter::create(&dir.join(format!("rank-{rank}")), &rank_header(rank, 2, 1), false).unwrap();
            writer.write_step(0, records).unwrap();
            writer.finish().unwrap();
        }
        dir.to_path_buf()
    }

    #[test]
    fn a_reduce_scatter_is_checked_against_its_ranks_shares_like_a_whole_sum() {
        let dir = tempfile::tempdir().unwrap();
        let shares = [[0.25, 0.5, 1.0, 0.125], [0.5, 0.25, 0.5, 0.375]];
        let exact: [f32; 4] = std::array::from_fn(|i| shares[0][i] + shares[1][i]);
        // One device whose gradient is 1 ULP from the sum at element 2 (on rank 1's rows).
        let single = dir.path().join("single");
        let mut one_device = exact;
        one_device[2] = up(one_device[2], 1);
        stream(
            &single,
            0,
            1,
            vec![vec![
                T("w", TensorKind::Weight, vec![1.0; 4], None),
                T("w.grad", TensorKind::Gradient, one_device.to_vec(), None),
            ]],
        );
        let fsdp = reduce_scatter_run(&dir.path().join("fsdp"), shares, exact);
        let diff = diff_runs(&single, &fsdp, &DiffOptions::default()).unwrap();
        assert_eq!(diff.diff.first_divergence.as_ref().unwrap().tensor, "w.grad");
        assert!(matches!(diff.cause, Some(DataParallelCause::BatchSplit { step: 0, .. })), "{:?}", diff.cause);
        // Rank 1's block 2 ULP from its rank-order sum (element 3, another than A's).
        let mut rounded = exact;
        rounded[3] = up(rounded[3], 2);
        let skewed = reduce_scatter_run(&dir.path().join("skewed"), shares, rounded);
        let diff = diff_runs(&single, &skewed, &DiffOptions::default()).unwrap();
        assert!(
            matches!(diff.cause, Some(DataParallelCause::CollectiveRounding { max_ulp: 2, .. })),
            "{:?}",
            diff.cause
        );
        // Same world size, the same shares and another sum: the collective's order.
        let diff = diff_runs(&fsdp, &skewed, &DiffOptions::default()).unwrap();
        assert_eq!(diff.rank, Some(1), "rank 1's block differs");
        let rule = diff.diff.root_cause.as_ref().map(|r| (r.cause.tensor.as_str(), r.rule));
        assert_eq!(rule, Some(("w.grad", crate::root_cause::CauseRule::Collective)), "the op-level rule too");
        assert!(
            matches!(diff.cause, Some(DataParallelCause::CollectiveOrder { step: 0, ref tensor }) if tensor == "w.grad"),
            "{:?}",
            diff.cause
        );
    }

    #[test]
    fn shards_are_checked_to_tile_their_whole_instead_of_against_rank_0() {
        let dir = tempfile::tempdir().unwrap();
        let run = sharded_run(&dir.path().join("fsdp"), 2, false, None, (0, 0));
        let report = check_replicas(&run, &rank_streams(&run).unwrap().unwrap()).unwrap();
        assert!(report.passed(), "{report:?}");
        assert_eq!((report.tensors_checked, report.shards_checked), (0, 3), "shards are no replicas");
        // Rank 1's block moved up a row: rows 1 and 2 where rows 2 and 3 belong.
        let skewed = sharded_run(&dir.path().join("skewed"), 2, false, Some(1), (0, 0));
        let report = check_replicas(&skewed, &rank_streams(&skewed).unwrap().unwrap()).unwrap();
        let drift = report.drift.unwrap();
        assert_eq!((drift.step, drift.tensor.as_str()), (0, "w"));
        let why = drift.shards.unwrap();
        assert!(why.contains("do not tile") && why.contains("overlap"), "{why}");
    }

    #[test]
    fn runs_sharded_differently_compare_whole_tensors_where_values_were_stored() {
        let dir = tempfile::tempdir().unwrap();
        let single = sharded_run(&dir.path().join("single"), 1, true, None, (0, 0));
        let fsdp = sharded_run(&dir.path().join("fsdp"), 2, true, None, (0, 0));
        let diff = diff_runs(&single, &fsdp, &DiffOptions::default()).unwrap();
        assert!(diff.is_identical(), "{diff:?}");
        assert_eq!(diff.shards, Some(ShardComparison { assembled: 3, left_out: 0 }));
        assert_eq!(diff.diff.tensors_compared, 3);
        // One ULP in rank 1's rows of the gradient: found in the whole, at its element.
        let nudged = sharded_run(&dir.path().join("nudged"), 2, true, None, (5, 1));
        let diff = diff_runs(&single, &nudged, &DiffOptions::default()).unwrap();
        let first = diff.diff.first_divergence.clone().unwrap();
        assert_eq!((first.tensor.as_str(), first.metrics.unwrap().max_ulp), ("w.grad", 1), "{first:?}");
        // Four ranks against two: both assembled.
        let four = sharded_run(&dir.path().join("four"), 4, true, None, (0, 0));
        let diff = diff_runs(&four, &fsdp, &DiffOptions::default()).unwrap();
        assert!(diff.is_identical() && diff.shards.unwrap().assembled == 6, "{diff:?}");
        // Same world size, same sharding: shard by shard, rank by rank.
        let again = sharded_run(&dir.path().join("again"), 2, false, None, (0, 0));
        let diff = diff_runs(&fsdp, &again, &DiffOptions::default()).unwrap();
        assert!(diff.is_identical() && diff.shards.is_none() && diff.rank == Some(0), "{diff:?}");
        // Hashes only: nothing to assemble, left out and said so.
        let diff = diff_runs(&single, &again, &DiffOptions::default()).unwrap();
        assert_eq!(diff.shards, Some(ShardComparison { assembled: 0, left_out: 2 }));
        // (`b` is whole on rank 0, which holds all of it: compared by its hash.)
        assert_eq!((diff.diff.tensors_compared, diff.diff.not_compared), (1, 2));
        assert!(diff.diff.warnings.iter().any(|w| w.contains("2 sharded tensor record(s) were not compared")));
        // FSDP on one rank holds each whole as its one shard: compared by hash, nothing left out.
        let alone = sharded_run(&dir.path().join("alone"), 0, false, None, (0, 0));
        let hashes = sharded_run(&dir.path().join("hashes"), 1, false, None, (0, 0));
        let diff = diff_runs(&alone, &hashes, &DiffOptions::default()).unwrap();
        assert!(diff.is_identical() && diff.diff.tensors_compared == 3 && diff.diff.not_compared == 0, "{diff:?}");
    }

    #[test]
    fn a_rank_holding_other_parameters_is_named_with_the_step_and_tensor() {
        let dir = tempfile::tempdir().unwrap();
        let run = two_ranks(dir.path(), [0.25, 0.5], 0.75, [0.5, up(0.5, 1)]);
        let ranks = rank_streams(&run).unwrap().unwrap();
        let report = check_replicas(&run, &ranks).unwrap();
        let drift = report.drift.unwrap();
        assert_eq!((drift.step, drift.tensor.as_str(), drift.ranks), (0, "w.updated", vec![1]));
        // The weight, the sum, then the drifting update: three checks against rank 0.
        assert_eq!(report.tensors_checked, 3);
    }

    /// A 2-rank run of `steps[rank]` identical steps on each rank.
    fn ranks_of_steps(dir: &Path, steps: [usize; 2]) -> PathBuf {
        for (rank, steps) in steps.into_iter().enumerate() {
            let step = || {
                vec![
                    T("w", TensorKind::Weight, vec![1.0], None),
                    T("w.grad.local", TensorKind::Gradient, vec![0.25], None),
                    T("w.grad", TensorKind::Gradient, vec![0.5], Some("w.grad.local")),
                ]
            };
            let declared = 3;
            stream_declaring(
                &dir.join(format!("rank-{rank}")),
                rank as u64,
                2,
                declared,
                (0..steps).map(|_| step()).collect(),
            );
        }
        dir.to_path_buf()
    }

    #[test]
    fn a_rank_with_fewer_steps_leaves_the_run_unfinished_and_never_identical() {
        let dir = tempfile::tempdir().unwrap();
        let whole = ranks_of_steps(&dir.path().join("whole"), [3, 3]);
        let short = ranks_of_steps(&dir.path().join("short"), [3, 2]);
        let report = check_replicas(&short, &rank_streams(&short).unwrap().unwrap()).unwrap();
        assert!(report.drift.is_none(), "the steps both ranks hold agree");
        let [u] = report.unfinished.as_slice() else { panic!("{:?}", report.unfinished) };
        assert_eq!((u.rank, u.steps, u.steps_of_longest, u.reason.as_deref()), (1, 2, 3, None));
        assert!(!report.passed());
        let diff = diff_runs(&whole, &short, &DiffOptions::default()).unwrap();
        assert!(!diff.is_identical());
        assert_eq!(diff.rank, Some(1), "the rank whose streams do not match is the one shown");
        // Both runs short the same way: every rank pair agrees, and the run is still not whole.
        let also_short = ranks_of_steps(&dir.path().join("also-short"), [3, 2]);
        let diff = diff_runs(&short, &also_short, &DiffOptions::default()).unwrap();
        assert!(diff.diff.is_identical() && !diff.is_identical() && diff.is_incomplete());
        // Its text (`UNFINISHED RANK`, `INCOMPLETE`, never `IDENTICAL`) is checked in
        // tests/it/distributed.rs.
    }

    #[test]
    fn an_unfinished_rank_counts_across_world_sizes_too() {
        let dir = tempfile::tempdir().unwrap();
        let single = dir.path().join("single");
        let step =
            || vec![T("w", TensorKind::Weight, vec![1.0], None), T("w.grad", TensorKind::Gradient, vec![0.5], None)];
        stream(&single, 0, 1, vec![step(), step(), step()]);
        let short = ranks_of_steps(&dir.path().join("short"), [3, 2]);
        let diff = diff_runs(&single, &short, &DiffOptions::default()).unwrap();
        assert!(diff.diff.is_identical(), "rank 0 agrees with the single device");
        assert!(!diff.is_identical() && diff.is_incomplete());
    }

    #[test]
    fn a_run_missing_a_rank_or_holding_a_foreign_one_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let run = two_ranks(dir.path(), [0.25, 0.5], 0.75, [0.5, 0.5]);
        std::fs::remove_dir_all(run.join("rank-1")).unwrap();
        let err = rank_streams(&run).unwrap_err().to_string();
        assert!(err.contains("rank 1 of its 2 ranks has no stream"), "{err}");
        // rank-1 holding rank 0's stream.
        stream(&run.join("rank-1"), 0, 2, vec![vec![T("w", TensorKind::Weight, vec![1.0], None)]]);
        let err = rank_streams(&run).unwrap_err().to_string();
        assert!(err.contains("rank-1") && err.contains("it is rank 0 of 2, where rank 1 of 2 belongs"), "{err}");
    }

    #[test]
    fn equal_shares_with_different_sums_blame_the_collective_order() {
        let dir = tempfile::tempdir().unwrap();
        let a = two_ranks(&dir.path().join("a"), [0.25, 0.5], 0.75, [0.5, 0.5]);
        let b = two_ranks(&dir.path().join("b"), [0.25, 0.5], up(0.75, 1), [0.5, 0.5]);
        let diff = diff_runs(&a, &b, &DiffOptions::default()).unwrap();
        assert_eq!(diff.rank, Some(0));
        assert!(
            matches!(diff.cause, Some(DataParallelCause::CollectiveOrder { step: 0, ref tensor }) if tensor == "w.grad")
        );
        // A share that differs comes first: no blame on the collective.
        let c = two_ranks(&dir.path().join("c"), [0.25, up(0.5, 1)], up(0.75, 1), [0.5, 0.5]);
        let diff = diff_runs(&a, &c, &DiffOptions::default()).unwrap();
        assert_eq!(diff.rank, Some(1), "rank 1's share differs before any sum");
        assert_eq!(diff.diff.first_divergence.unwrap().tensor, "w.grad.local");
        assert!(diff.cause.is_none());
    }

    #[test]
    fn across_world_sizes_an_exact_rank_order_sum_means_the_batch_split() {
        let dir = tempfile::tempdir().unwrap();
        let single = dir.path().join("single");
        let step = vec![
            T("x", TensorKind::Input, vec![1.0, 2.0], None),
            T("w", TensorKind::Weight, vec![1.0], None),
            T("w.grad", TensorKind::Gradient, vec![up(0.75, 1)], None),
        ];
        stream(&single, 0, 1, vec![step]);
        let exact = two_ranks(&dir.path().join("exact"), [0.25, 0.5], 0.75, [0.5, 0.5]);
        let diff = diff_runs(&single, &exact, &DiffOptions::default()).unwrap();
        assert_eq!(diff.diff.first_divergence.as_ref().unwrap().tensor, "w.grad", "the batch is not compared");
        assert!(matches!(diff.cause, Some(DataParallelCause::BatchSplit { .. })), "{:?}", diff.cause);
        let rounded = two_ranks(&dir.path().join("rounded"), [0.25, 0.5], up(0.75, 1), [0.5, 0.5]);
        let diff = diff_runs(&single, &rounded, &DiffOptions::default()).unwrap();
        // Now the sum matches A, and the weights after the update differ.
        assert!(diff.cause.is_none(), "{:?}", diff.cause);
        let skewed = two_ranks(&dir.path().join("skewed"), [0.25, 0.5], up(0.75, 2), [0.5, 0.5]);
        let diff = diff_runs(&single, &skewed, &DiffOptions::default()).unwrap();
        assert!(
            matches!(diff.cause, Some(DataParallelCause::CollectiveRounding { max_ulp: 2, .. })),
            "{:?}",
            diff.cause
        );
        // Ranks that record the gradient whole (PyTorch's FSDP): undetermined, and said why.
        let whole = dir.path().join("whole");
        for rank in 0..2 {
            let step = vec![
                T("w", TensorKind::Weight, vec![1.0], None),
                T("w.grad", TensorKind::Gradient, vec![up(0.75, 2)], None),
            ];
            stream(&whole.join(format!("rank-{rank}")), rank, 2, vec![step]);
        }
        let diff = diff_runs(&single, &whole, &DiffOptions::default()).unwrap();
        assert!(
            matches!(diff.cause, Some(DataParallelCause::Undetermined { shares_recorded: false, .. })),
            "{:?}",
            diff.cause
        );
    }
}
