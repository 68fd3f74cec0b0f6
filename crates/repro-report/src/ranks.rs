//! Text of a diff between runs that may be data-parallel: how the runs were compared, whether
//! each kept its replicas, the diff itself, and what data parallelism did to the first gradient
//! that differs.

use crate::diff::{render_diff_unless, render_diff_with, DiffText};
use repro_diff::{DataParallelCause, ReplicaDrift, ReplicaReport, RunDiff, Stall, Verdict};
use std::fmt::Write;

/// Renders a run-level diff; for two single-device runs, exactly `render_diff`.
pub fn render_run_diff(r: &RunDiff) -> String {
    render_run_diff_with(r, &DiffText::default())
}

/// `render_run_diff`, showing what `text` asks for of the diff's tables.
pub fn render_run_diff_with(r: &RunDiff, text: &DiffText) -> String {
    if r.world_size_a == 1 && r.world_size_b == 1 {
        return render_diff_with(&r.diff, text);
    }
    let mut out = String::new();
    let ranks = |n: u64| if n == 1 { "1 device".to_string() } else { format!("{n} ranks") };
    let (a, b) = (ranks(r.world_size_a), ranks(r.world_size_b));
    let _ = match r.rank {
        Some(rank) => writeln!(
            out,
            "data-parallel: A and B on {a}, compared rank by rank; shown: rank {rank}, {}",
            if r.diff.first_divergence.is_some() {
                "the first to diverge"
            } else if !r.diff.is_identical() {
                "whose streams do not match"
            } else {
                "and every rank agrees"
            }
        ),
        None => writeln!(
            out,
            "data-parallel: A on {a}, B on {b}: compared are the parameters and the summed gradients (each rank computes its batch, graph and loss from its share of the batch)"
        ),
    };
    if let Some(s) = &r.shards {
        let _ = writeln!(
            out,
            "sharded: A and B shard tensors differently; compared are whole tensors assembled from every rank's shards \
             ({} assembled{})",
            s.assembled,
            if s.left_out > 0 {
                format!(", {} left out: not every rank stored their values", s.left_out)
            } else {
                String::new()
            }
        );
    }
    for report in &r.replicas {
        out.push_str(&replica_line(report));
    }
    // What data parallelism did explains the first difference before the diff does: said first.
    if let Some(cause) = &r.cause {
        let _ = writeln!(out, "{}", cause_sentence(cause, r));
    }
    out.push_str(&render_diff_unless(&r.diff, run_verdict_line(r).as_deref(), text));
    if let (Some(t), Some(rank)) = (&r.all_ranks, r.rank) {
        let _ = writeln!(
            out,
            "over all {} ranks: {} of {} tensors differ (the figures above are rank {rank}'s)",
            t.ranks, t.tensors_diverged, t.tensors_compared
        );
    }
    out
}

/// The verdict line of a run whose streams compared agree while the run as a whole does not
/// (its verdict, and so its exit code, is not the streams'): a run whose replicas drifted or
/// whose shards do not tile, or a rank that did not finish. `None` when the streams' verdict is
/// the run's.
fn run_verdict_line(r: &RunDiff) -> Option<String> {
    let verdict = r.verdict();
    if verdict == r.diff.verdict() {
        return None;
    }
    match verdict {
        Verdict::Diverged => {
            let drifts: Vec<String> = r
                .replicas
                .iter()
                .filter_map(|report| {
                    let drift = report.drift.as_ref()?;
                    Some(match drift.shards {
                        Some(_) => format!("{}'s shards do not tile `{}` (SHARD GAP above)", report.run, drift.tensor),
                        None => format!("{}'s ranks disagree on `{}` (REPLICA DRIFT above)", report.run, drift.tensor),
                    })
                })
                .collect();
            Some(format!(
                "DIVERGED  the streams compared agree bit for bit, but {}: the run is not identical",
                drifts.join("; ")
            ))
        }
        Verdict::Incomplete => {
            let unfinished: Vec<String> = r
                .replicas
                .iter()
                .flat_map(|report| report.unfinished.iter().map(move |u| format!("{} rank {}", report.run, u.rank)))
                .collect();
            Some(format!(
                "INCOMPLETE  the streams compared agree bit for bit, but not every rank finished ({}): the run is not \
                 identical",
                unfinished.join(", ")
            ))
        }
        _ => None,
    }
}

/// Lines saying whether a data-parallel run's ranks finished together and stayed replicas.
pub fn replica_line(r: &ReplicaReport) -> String {
    let mut out = String::new();
    for u in &r.unfinished {
        let why = u.reason.as_deref().unwrap_or("finished early");
        let stale = u
            .stale_mark
            .as_ref()
            .map(|m| format!(" (its mark, {}, is behind its records: they win)", m.describe()))
            .unwrap_or_default();
        let seen = u.last_seen.as_ref().map(|p| format!("; last seen {}{stale}", p.describe())).unwrap_or_default();
        let _ = writeln!(
            out,
            "UNFINISHED RANK  {}: rank {} holds {} of the {} steps its longest rank holds ({why}){seen}",
            r.run, u.rank, u.steps, u.steps_of_longest
        );
    }
    if let Some(stall) = &r.stall {
        out.push_str(&stall_line(&r.run, stall));
    }
    out.push_str(&replica_drift_line(r));
    out
}

/// The line naming the ranks that never reached the collective others waited in.
fn stall_line(run: &str, stall: &Stall) -> String {
    let ranks = |ranks: &mut dyn Iterator<Item = u64>| {
        let listed: Vec<String> = ranks.map(|r| r.to_string()).collect();
        format!("{} {}", if listed.len() == 1 { "rank" } else { "ranks" }, listed.join(", "))
    };
    let behind: Vec<String> = stall
        .behind
        .iter()
        .map(|(rank, seen)| match seen {
            Some(p) => format!("rank {rank} last seen {}", p.describe()),
            None => format!("rank {rank} left no progress mark"),
        })
        .collect();
    let waited = stall.waited_in.describe();
    let waited = waited.strip_prefix("waiting in ").unwrap_or(&waited);
    format!(
        "STALLED  {run}: {} waited in {waited}, which {} never reached ({})\n",
        ranks(&mut stall.waiting.iter().copied()),
        ranks(&mut stall.behind.iter().map(|(r, _)| *r)),
        behind.join("; ")
    )
}

/// The line of the replica check proper.
fn replica_drift_line(r: &ReplicaReport) -> String {
    match &r.drift {
        None => format!(
            "replicas: {} kept identical parameters and gradient sums on all {} ranks at all {} steps {}({} tensors checked against rank 0{})\n",
            r.run,
            r.world_size,
            r.steps_checked,
            if r.unfinished.is_empty() { "" } else { "that every rank holds " },
            r.tensors_checked,
            if r.shards_checked > 0 {
                format!("; {} sharded tensors tiled by their ranks' shards", r.shards_checked)
            } else {
                String::new()
            }
        ),
        Some(d @ ReplicaDrift { shards: Some(why), .. }) => {
            format!("SHARD GAP  {}: at step {}, `{}` ({}): {why}\n", r.run, d.step, d.tensor, d.kind)
        }
        Some(d) => {
            let ranks: Vec<String> = d.ranks.iter().map(u64::to_string).collect();
            format!(
                "REPLICA DRIFT  {}: at step {}, `{}` ({}) on rank(s) {} differs from rank 0\n",
                r.run,
                d.step,
                d.tensor,
                d.kind,
                ranks.join(", ")
            )
        }
    }
}

fn cause_sentence(cause: &DataParallelCause, r: &RunDiff) -> String {
    match cause {
        DataParallelCause::CollectiveOrder { step, tensor } => format!(
            "cause: the collective's order. At step {step}, every rank's share of `{tensor}` is bit-identical in A and B, and the sums differ: the collective added the shares in another order (for NCCL: its algorithm, protocol or channels; see the environment above)"
        ),
        DataParallelCause::BatchSplit { step, tensor }
            if r.diff.config_differences.iter().any(|f| f.field.contains("batch")) =>
        {
            let settings: Vec<String> = r
                .diff
                .config_differences
                .iter()
                .filter(|f| f.field.contains("batch"))
                .map(|f| {
                    let (a, b) = f.values();
                    format!("{} {a} in A, {b} in B", f.field)
                })
                .collect();
            format!(
                "cause: the batch setting ({}). At step {step}, `{tensor}` is a sum over other batches in A and B, \
                 whatever the split over ranks: compare runs of one batch size",
                settings.join("; ")
            )
        }
        DataParallelCause::BatchSplit { step, tensor } => {
            let split = r.world_size_a.max(r.world_size_b);
            format!(
                "cause: the batch split. At step {step}, each data-parallel run's sum of `{tensor}` equals its ranks' shares added in rank order, bit for bit: the collective added no rounding of its own. The runs differ because the gradient is summed in parts, over 1/{split} of the batch each, and then the parts are added"
            )
        }
        DataParallelCause::ForwardDiffers { step, tensor, loss_a, loss_b } => format!(
            "cause: the ranks' forward passes, not the batch split alone. At step {step}, each data-parallel run's sum \
             of `{tensor}` equals its ranks' shares added in rank order (the collective added no rounding of its \
             own), but with identical parameters the runs' losses disagree beyond rounding (A {}, B {}, added over \
             their ranks): the ranks computed their examples otherwise than one device did. Random draws made per \
             rank (dropout masks, from each rank's own generator) or other rows given to a rank do that; a batch \
             split alone leaves the losses within rounding",
            crate::format::sci(*loss_a),
            crate::format::sci(*loss_b)
        ),
        DataParallelCause::CollectiveRounding { step, tensor, run, max_ulp } => format!(
            "cause: the collective's order. At step {step}, {run}'s sum of `{tensor}` is up to {max_ulp} ULP from its ranks' shares added in rank order"
        ),
        DataParallelCause::Undetermined { step, tensor, shares_recorded: true } => format!(
            "cause: undetermined. The ranks' shares of `{tensor}` at step {step} were stored as hashes only, so a batch split cannot be told from the collective's order: record with --capture all (or steps:{step})"
        ),
        DataParallelCause::Undetermined { step, tensor, shares_recorded: false } => format!(
            "cause: undetermined. The runs do not record `{tensor}` as a sum with each rank's share beside it (a collective or reduce-scatter record naming its input), so a batch split cannot be told from the collective's order at step {step}; the world sizes differ, and with them both"
        ),
    }
}
