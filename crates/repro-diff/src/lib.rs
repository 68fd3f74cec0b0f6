//! repro-diff: comparing traces. The diff of two runs (alignment, error metrics, root cause),
//! N-run error matrices, the determinism gate's policy and verdict, batch-invariance results
//! and the statistics of multi-run studies, as data; the `repro-report` crate renders them.
//!
//! Everything here reads traces through `repro_trace` and returns plain data. No candle, no
//! model code and no rendering: diffing traces needs no GPU.
#![deny(missing_docs)]

mod align;
mod divergence;
mod error;
mod gate;
pub mod invariance;
mod json_float;
mod loss;
mod matrix;
mod metrics;
mod names;
mod online;
mod ranks;
mod root_cause;
mod shards;
pub mod study;
mod tensor_stats;
#[cfg(test)]
mod testing;
mod tolerance;
mod traces;
mod verdict;

pub use divergence::Divergence;
pub use error::DiffError;
pub use gate::{
    baseline_mismatch, gate_traces, likely_causes, GateComparison, GateReference, GateReport, MAY_DIFFER_FROM_BASELINE,
};
pub use loss::{loss_curve, LossCurve};
pub use matrix::{error_matrices, ErrorMatrix, HashOnlyTensor, MatrixReport, Metric, StepSelector};
pub use metrics::{compare, compare_pairs, compare_values, TensorMetrics};
pub use names::{NameMap, Run};
pub use online::{OnlineDivergence, ReferenceCheck};
pub use ranks::{
    check_replicas, diff_runs, stall, DataParallelCause, RankTotals, ReplicaDrift, ReplicaReport, RunDiff,
    ShardComparison, Stall, UnfinishedRank,
};
pub use root_cause::{CauseRule, Consequence, RootCause, UpstreamDifference, AMPLIFICATION};
pub use tensor_stats::{side_by_side, tensor_stats, ElementPair, TensorStats};
pub use tolerance::Tolerance;
pub use traces::{
    config_differences, diff_traces, diff_traces_with, diff_traces_within, header_differences, DiffOptions,
    FieldDifference, GapPoint, GapSeries, StepMetrics, StructuralDifference, TensorHistory, TraceDiff, TraceSide,
};
pub use verdict::Verdict;
