//! The determinism gate's policy and verdict: which runs are compared with what, when a baseline
//! fits a run, and, when the reference was recorded elsewhere, what in the environment most
//! likely explains a failure. Recording the runs is the caller's job; this module only reads them.

use crate::error::DiffError;
use crate::ranks::{diff_runs, ReplicaReport, RunDiff};
use crate::traces::{
    config_differences, diff_traces_with, header_differences, DiffOptions, FieldDifference, TraceDiff,
};
use repro_trace::{RunConfig, TraceReader};
use serde::Serialize;
use std::path::{Path, PathBuf};

/// The outcome of a gate.
#[derive(Debug, Clone, Serialize)]
pub struct GateReport {
    /// What was gated (workload and settings, or the command).
    pub subject: String,
    /// The reference: `run 0` or the baseline file.
    pub reference: String,
    /// Whether the reference is a baseline, which keeps hashes only (no run of the gate can
    /// then measure a difference from it).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub baseline: bool,
    /// One comparison per run against the reference.
    pub comparisons: Vec<GateComparison>,
    /// Environment differences that most likely explain a failure, most likely first.
    pub likely_causes: Vec<String>,
}

impl GateReport {
    /// True when every run is bit-identical to the reference (or within the tolerance).
    pub fn passed(&self) -> bool {
        self.comparisons.iter().all(|c| c.passed)
    }
}

/// One of the gate's runs against the reference.
#[derive(Debug, Clone, Serialize)]
pub struct GateComparison {
    /// Which run: `run 1`, `run 2`, ...
    pub run: String,
    /// Whether it agrees with the reference: bit for bit, or within the tolerance.
    pub passed: bool,
    /// The full comparison (for data-parallel runs, of the rank that diverged first).
    pub diff: TraceDiff,
    /// For data-parallel runs: whether each kept its replicas.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub replicas: Vec<ReplicaReport>,
}

impl GateComparison {
    fn new(run: String, diff: TraceDiff) -> Self {
        GateComparison { run, passed: diff.is_identical(), diff, replicas: Vec::new() }
    }

    fn of_runs(run: String, runs: RunDiff) -> Self {
        GateComparison { run, passed: runs.is_identical(), diff: runs.diff, replicas: runs.replicas }
    }
}

/// What a gate compares its runs with.
#[derive(Debug, Clone, Copy)]
pub enum GateReference<'a> {
    /// The first of the gate's own runs (needs two runs or more).
    FirstRun,
    /// A committed baseline: a trace directory or a lone record file.
    Baseline(&'a Path),
}

/// Run settings that may differ between a baseline and a run gated against it: a planted fault
/// (`--perturb`) stands for a code change, which is exactly what the gate should catch.
pub const MAY_DIFFER_FROM_BASELINE: &[&str] = &["perturb"];

/// The run settings for which `baseline` was not written, compared with `run`'s: every config
/// difference except those in [`MAY_DIFFER_FROM_BASELINE`]. Empty when they fit. A gate checks
/// this before it records anything, and again on every recorded run.
pub fn baseline_mismatch(baseline: &RunConfig, run: &RunConfig) -> Vec<FieldDifference> {
    let mut config = config_differences(baseline, run);
    config.retain(|f| !MAY_DIFFER_FROM_BASELINE.contains(&f.field.as_str()));
    config
}

/// Compares each recorded run in `runs` with `reference` as `options` say (within their
/// tolerance, if any, else bit for bit; through their name map) and returns the gate's verdict
/// about `subject` (what was gated, in words). Against a baseline, every run must fit the
/// baseline's settings ([`baseline_mismatch`]); environment differences become the likely causes.
pub fn gate_traces(
    subject: String,
    reference: GateReference,
    runs: &[PathBuf],
    options: &DiffOptions,
) -> Result<GateReport, DiffError> {
    let mut comparisons = Vec::new();
    match reference {
        GateReference::Baseline(baseline) => {
            let records = TraceReader::open(baseline)?.records_path().to_path_buf();
            let mut likely = Vec::new();
            for (i, run) in runs.iter().enumerate() {
                let mut a = TraceReader::open(&records)?;
                let mut b = TraceReader::open(run)?;
                let fields = baseline_mismatch(&a.header().run, &b.header().run);
                if !fields.is_empty() {
                    return Err(DiffError::RunSettingsDiffer { baseline: baseline.to_path_buf(), fields });
                }
                if likely.is_empty() {
                    likely = likely_causes(&header_differences(a.header(), b.header()).1);
                }
                comparisons.push(GateComparison::new(format!("run {i}"), diff_traces_with(&mut a, &mut b, options)?));
            }
            let reference = baseline.display().to_string();
            Ok(GateReport { subject, reference, baseline: true, comparisons, likely_causes: likely })
        }
        GateReference::FirstRun => {
            let Some(first) = runs.first().filter(|_| runs.len() >= 2) else {
                return Err(DiffError::Usage("a gate without a baseline needs two runs or more".into()));
            };
            for (i, run) in runs.iter().enumerate().skip(1) {
                // Each run may be data-parallel: then its ranks must also have stayed replicas.
                comparisons.push(GateComparison::of_runs(format!("run {i}"), diff_runs(first, run, options)?));
            }
            Ok(GateReport {
                subject,
                reference: "run 0".into(),
                baseline: false,
                comparisons,
                likely_causes: Vec::new(),
            })
        }
    }
}

/// Names, from environment differences, the likely causes of a divergence, most likely first.
pub fn likely_causes(env: &[FieldDifference]) -> Vec<String> {
    let mut causes: Vec<(u8, String)> = env
        .iter()
        .map(|d| {
            let (a, b) = d.values();
            let (rank, text) = match d.field.as_str() {
                "device" => (0, format!("another device ({a} vs {b}): kernels sum in other orders")),
                "device_name" => (1, format!("another device model ({a} vs {b}): libraries pick other kernels")),
                "cpu_model" => (2, format!("another CPU ({a} vs {b}): CPU matrix kernels are chosen per CPU")),
                "candle_version" if a.starts_with("torch ") || b.starts_with("torch ") => {
                    (3, format!("{a} vs {b}: kernels may have changed"))
                }
                "candle_version" => (3, format!("candle {a} vs {b}: kernels may have changed")),
                "threads" => (4, format!("{a} vs {b} worker threads")),
                "repro_version" => (5, format!("repro {a} vs {b}: built-in workloads may have changed")),
                "rustc" => (6, format!("another compiler ({a} vs {b}): code generation may differ")),
                field => match field.strip_prefix("env.") {
                    Some(var) => (4, format!("{var}={a} vs {b}: this variable changes numerics")),
                    None => (7, format!("{field}: {a} vs {b}")),
                },
            };
            (rank, text)
        })
        .collect();
    causes.sort_by_key(|(rank, _)| *rank);
    causes.into_iter().map(|(_, text)| text).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::one_value_trace as trace;

    #[test]
    fn runs_are_compared_with_the_first_run() {
        let tmp = tempfile::tempdir().unwrap();
        let runs = [
            trace(&tmp.path().join("0"), 1.0, &[], "cpu"),
            trace(&tmp.path().join("1"), 1.0, &[], "cpu"),
            trace(&tmp.path().join("2"), 1.5, &[], "cpu"),
        ];
        let report = gate_traces("t".into(), GateReference::FirstRun, &runs, &DiffOptions::default()).unwrap();
        assert_eq!(report.reference, "run 0");
        let labels: Vec<&str> = report.comparisons.iter().map(|c| c.run.as_str()).collect();
        assert_eq!(labels, ["run 1", "run 2"]);
        assert!(report.comparisons[0].passed);
        assert!(!report.comparisons[1].passed);
        assert!(!report.passed());
        assert!(gate_traces("t".into(), GateReference::FirstRun, &runs[..1], &DiffOptions::default()).is_err());
    }

    #[test]
    fn a_baseline_for_other_settings_is_refused_but_a_planted_fault_is_gated() {
        let tmp = tempfile::tempdir().unwrap();
        let base = trace(&tmp.path().join("base"), 1.0, &[("seed", "0")], "cpu");
        let other = trace(&tmp.path().join("other"), 1.0, &[("seed", "1")], "cpu");
        let planted = trace(&tmp.path().join("planted"), 2.0, &[("seed", "0"), ("perturb", "0:loss:1")], "cuda:0");

        let err =
            gate_traces("t".into(), GateReference::Baseline(&base), &[other], &DiffOptions::default()).unwrap_err();
        let message = err.to_string();
        assert!(message.contains("written by a run of other settings (seed 0 vs 1)"), "{message}");

        let report =
            gate_traces("t".into(), GateReference::Baseline(&base), &[planted], &DiffOptions::default()).unwrap();
        assert!(!report.passed());
        assert_eq!(report.reference, base.display().to_string());
        assert!(report.likely_causes[0].starts_with("another device (cpu vs cuda:0)"), "{:?}", report.likely_causes);
    }

    #[test]
    fn a_gate_pairs_names_through_its_map() {
        use crate::testing::{f32_tensor, one_step_trace};
        use repro_trace::TensorKind;
        let tmp = tempfile::tempdir().unwrap();
        let runs = [
            one_step_trace(&tmp.path().join("0"), vec![f32_tensor("mlp.w", TensorKind::Weight, vec![1], &[1.0], true)]),
            one_step_trace(&tmp.path().join("1"), vec![f32_tensor("ffn.w", TensorKind::Weight, vec![1], &[1.0], true)]),
        ];
        let plain = gate_traces("t".into(), GateReference::FirstRun, &runs, &DiffOptions::default()).unwrap();
        assert!(!plain.passed(), "other names are other structure");
        let names = crate::NameMap::parse("rename ffn.* mlp.*").unwrap();
        let mapped =
            gate_traces("t".into(), GateReference::FirstRun, &runs, &DiffOptions { names, ..DiffOptions::default() });
        assert!(mapped.unwrap().passed());
    }

    fn field(name: &str, a: &str, b: &str) -> FieldDifference {
        FieldDifference { field: name.into(), a: Some(a.into()), b: Some(b.into()) }
    }

    #[test]
    fn device_changes_rank_before_threads_and_variables() {
        let causes = likely_causes(&[
            field("threads", "2", "16"),
            field("env.CUBLAS_WORKSPACE_CONFIG", ":4096:8", ":16:8"),
            field("device_name", "NVIDIA H100 80GB HBM3", "NVIDIA H200"),
        ]);
        assert!(causes[0].starts_with("another device model"), "{causes:?}");
        assert_eq!(causes.len(), 3);
        assert!(causes.iter().any(|c| c.starts_with("CUBLAS_WORKSPACE_CONFIG=:4096:8")));
    }
}
