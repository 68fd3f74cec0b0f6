//! Comparing two traces: steps aligned by number, tensors by name. Produces plain data
//! (`TraceDiff`); rendering is the report module's job.
//!
//! Both traces are streamed one step at a time, and tensor values are loaded only for tensors
//! whose hashes differ, so memory stays at one step's tensors however long the traces are.
//!
//! This module walks the two streams and owns the result's types. Its parts:
//! - `step`: a step as read and as compared (shards made whole, replicated state, a name map's
//!   renames and transposes, a captured scope's output under its module path);
//! - `state`: the comparison of one pair of steps, and what it accumulates over the run;
//! - `headers`: what differs between the two runs' settings and environments.

mod headers;
mod state;
mod step;

pub use headers::{config_differences, header_differences};

use crate::divergence::Divergence;
use crate::metrics::TensorMetrics;
use crate::names::{NameMap, Run};
use crate::root_cause::RootCause;
use crate::shards::Assembler;
use crate::tolerance::Tolerance;
use repro_trace::{Completeness, MissingGradient, MissingGradients, TensorKind, TraceError, TraceReader};
use serde::Serialize;
use state::{DiffState, HistoryBuilder};
use std::collections::BTreeMap;
use step::{leave_out_shards, read_step, replicated_state, ComparedStep};

/// The outcome of comparing two traces.
#[derive(Debug, Clone, Serialize)]
pub struct TraceDiff {
    /// The first trace.
    pub a: TraceSide,
    /// The second trace.
    pub b: TraceSide,
    /// Run-config settings that differ (workload, steps, params).
    pub config_differences: Vec<FieldDifference>,
    /// Environment fields that differ (device, versions, threads, variables).
    pub environment_differences: Vec<FieldDifference>,
    /// Steps present in both traces.
    pub steps_compared: u64,
    /// (step, tensor) pairs present in both traces.
    pub tensors_compared: u64,
    /// (step, tensor) pairs whose hashes differ.
    pub tensors_diverged: u64,
    /// The earliest divergence: first step, then first tensor in A's recording order.
    pub first_divergence: Option<Divergence>,
    /// Within the first diverging step: the root cause, independent divergences and
    /// consequences (meaningful when traces record op inputs, format 1.1).
    pub root_cause: Option<RootCause>,
    /// Per tensor name, in order of first appearance: when it first diverged and how the error
    /// developed.
    pub tensors: Vec<TensorHistory>,
    /// Per tensor kind, the first step at which a tensor of that kind diverged.
    pub first_divergence_by_kind: BTreeMap<TensorKind, u64>,
    /// Differences in what was recorded (missing steps or tensors, shapes, dtypes).
    pub structure: Vec<StructuralDifference>,
    /// Reasons the comparison may not mean what it seems to: A and B are the same trace, or
    /// traces of different workloads.
    pub warnings: Vec<String>,
    /// The tolerance the comparison used (`None`: bit-exact).
    pub tolerance: Option<Tolerance>,
    /// (step, tensor) pairs whose bits differ but stay within the tolerance.
    pub tensors_within_tolerance: u64,
    /// The largest of those differences (by ULP), if any.
    pub largest_within_tolerance: Option<Divergence>,
    /// (step, tensor) pairs whose hashes differ where a trace stored no values: a tolerance
    /// cannot judge them, so they count as divergences (record with `--capture all`).
    pub hash_only_differences: u64,
    /// (step, tensor) pairs recorded in both traces that could not be compared: a view of an
    /// earlier tensor in one trace, hashed by its values in the other, without values stored on
    /// both sides. A verdict of "identical" holds only for what was compared.
    pub not_compared: u64,
    /// The gap between the runs step by step: one series per tensor kind, then one per tensor
    /// asked for by name (`DiffOptions::track`).
    pub gaps: Vec<GapSeries>,
    /// Where the runs record by the capture ladder's levels (PyTorch's recorder) and the first
    /// diverging step was not recorded at the `ops` level in both: the levels to rerun that step
    /// at (`repro bisect` does).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub escalate: Option<Escalation>,
}

/// A first divergence found at a step the runs did not record down to the op: what is missing.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Escalation {
    /// The first diverging step.
    pub step: u64,
    /// Whether both runs recorded every module's output there.
    pub modules_recorded: bool,
}

/// What a comparison does beyond the bit-exact default.
#[derive(Debug, Clone, Default)]
pub struct DiffOptions {
    /// Differences no larger than this count as agreeing.
    pub tolerance: Option<Tolerance>,
    /// Tensors whose gap to follow step by step, by name, besides every kind.
    pub track: Vec<String>,
    /// Compare only the state data-parallel replicas share with a run of another world size:
    /// parameters, buffers, and the gradients the optimizer steps on. Left out: the batch, the graph and
    /// the loss (each rank computes them from its share of the batch), and a rank's own share of
    /// a gradient sum.
    pub replicated_state_only: bool,
    /// Renames and leaves out tensors of both runs before they are paired (`repro diff --map`):
    /// runs of two frameworks, or of a port, whose names differ.
    pub names: NameMap,
}

/// The gap between two runs over the steps, for one tensor kind or one named tensor.
#[derive(Debug, Clone, Serialize)]
pub struct GapSeries {
    /// `kind:weight`, `kind:gradient`, ... or `tensor:NAME`.
    pub label: String,
    /// One point per step at which some tensor of the series differs, in step order.
    pub points: Vec<GapPoint>,
}

/// How far apart the runs are at one step, over the tensors of a series.
#[derive(Debug, Clone, Serialize)]
pub struct GapPoint {
    /// The step.
    pub step: u64,
    /// Tensors whose bits differ (from hashes, so known at every step).
    pub differing: u64,
    /// Largest |a - b| among those whose values both traces stored (`None`: hashes only).
    #[serde(serialize_with = "crate::json_float::option")]
    pub max_abs: Option<f64>,
    /// Largest ULP distance among those.
    pub max_ulp: Option<u64>,
}

impl TraceDiff {
    /// True when both traces are finished and recorded the same tensors with the same bits at
    /// the same steps, every one of them compared. Steps that agree in an unfinished trace are no
    /// verdict on the steps it lacks, nor is a tensor that could not be compared.
    pub fn is_identical(&self) -> bool {
        self.verdict().is_same()
    }

    /// True when nothing both traces hold differs, in values or in structure (apart from nodes
    /// only one run recorded, which were not compared), whether or not both finished.
    pub fn agrees_so_far(&self) -> bool {
        self.first_divergence.is_none() && self.structure.iter().all(StructuralDifference::is_recording_gap)
    }

    /// Module outputs one run watched and the other did not: not compared (counted at the first
    /// step of each scope's gap).
    pub fn nodes_recorded_once(&self) -> u64 {
        self.structure
            .iter()
            .filter(|s| s.is_recording_gap())
            .map(|s| match s {
                StructuralDifference::NotRecorded { nodes, .. } => *nodes,
                _ => 0,
            })
            .sum()
    }
}

/// One side of a diff.
#[derive(Debug, Clone, Serialize)]
pub struct TraceSide {
    /// The trace directory as given.
    pub path: String,
    /// Workload name.
    pub workload: String,
    /// Step records read.
    pub steps: u64,
    /// Whether the trace was finished.
    pub complete: bool,
    /// Why the trace is incomplete, if it is.
    pub incomplete_reason: Option<String>,
    /// Trainable parameters that received no gradient at some step of this run.
    pub no_gradient: Vec<MissingGradient>,
}

/// A setting with different values in the two traces (`None`: absent on that side).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FieldDifference {
    /// The setting's name.
    pub field: String,
    /// Its value in A.
    pub a: Option<String>,
    /// Its value in B.
    pub b: Option<String>,
}

impl FieldDifference {
    /// The values in A and B as shown to people: `(unset)` where a side lacks the setting.
    pub fn values(&self) -> (&str, &str) {
        (self.a.as_deref().unwrap_or("(unset)"), self.b.as_deref().unwrap_or("(unset)"))
    }
}

/// How one tensor compared over the run.
#[derive(Debug, Clone, Serialize)]
pub struct TensorHistory {
    /// The tensor's name.
    pub name: String,
    /// What the tensor is.
    pub kind: TensorKind,
    /// Steps at which both traces recorded it (with equal dtype and shape).
    pub steps_compared: u64,
    /// Of those, steps at which its hashes differ.
    pub steps_diverged: u64,
    /// The first such step.
    pub first_divergent_step: Option<u64>,
    /// Exact metrics at a sample of divergent steps where values were stored: the first, then
    /// at power-of-two distances from it, and the last (bounded in size however long the run).
    pub growth: Vec<StepMetrics>,
}

/// Metrics of one tensor at one step.
#[derive(Debug, Clone, Serialize)]
pub struct StepMetrics {
    /// The step.
    pub step: u64,
    /// The metrics there.
    pub metrics: TensorMetrics,
}

/// A difference in what the traces recorded, reported once per kind and tensor.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum StructuralDifference {
    /// A tensor recorded in only one trace.
    MissingTensor {
        /// The tensor.
        tensor: String,
        /// Which trace lacks it: "a" or "b".
        missing_in: String,
        /// The first step where it is missing.
        first_step: u64,
        /// At how many steps it is missing.
        steps: u64,
    },
    /// A tensor with a different dtype or shape.
    Mismatch {
        /// The tensor.
        tensor: String,
        /// The first step where it differs.
        first_step: u64,
        /// At how many steps.
        steps: u64,
        /// `dtype shape` in A.
        a: String,
        /// `dtype shape` in B.
        b: String,
    },
    /// A tensor recorded under another name at the same place of the op sequence (same dtype
    /// and shape); it is compared under both names.
    Renamed {
        /// Its name in A.
        a: String,
        /// Its name in B.
        b: String,
        /// The first step where it is renamed.
        first_step: u64,
        /// At how many steps.
        steps: u64,
    },
    /// A scope of a captured graph whose nodes B records under another scope's name, at the same
    /// places with the same dtypes and shapes (code that renamed a module or a span): one entry
    /// for all its nodes, which are compared under both names.
    ScopeRenamed {
        /// The scope's name in A.
        a: String,
        /// Its name in B.
        b: String,
        /// How many of its nodes are paired so, at its first step.
        nodes: u64,
        /// The first step where it is renamed.
        first_step: u64,
        /// At how many steps.
        steps: u64,
    },
    /// A captured graph whose nodes differ in a scope: ops inserted or removed there (a fused
    /// kernel against the ops it replaces, say). Its nodes are paired by dtype and shape at
    /// their place in the graph, not by their ordinals (`scope#k`), which shift.
    GraphChanged {
        /// The scope (`h[0]/ln_1`).
        scope: String,
        /// The first step where it differs.
        first_step: u64,
        /// At how many steps.
        steps: u64,
        /// Nodes of the scope only A has, at the first step.
        only_in_a: u64,
        /// Nodes of the scope only B has, at the first step.
        only_in_b: u64,
    },
    /// Module outputs (a PyTorch recorder's graph nodes) that one run watched and the other did
    /// not, in one scope: a compiled model runs its modules inside its graph, where their hooks
    /// are not called, or the runs were recorded at other levels. Not compared; nothing says
    /// they differ.
    NotRecorded {
        /// The scope (the module path).
        scope: String,
        /// Which run recorded them: "a" or "b".
        recorded_in: String,
        /// How many nodes, at the first step.
        nodes: u64,
        /// The first step where one run lacks them.
        first_step: u64,
        /// At how many steps.
        steps: u64,
    },
    /// Steps recorded in only one trace.
    MissingSteps {
        /// Which trace lacks them: "a" or "b".
        missing_in: String,
        /// The first such step.
        first_step: u64,
        /// How many.
        steps: u64,
    },
}

impl StructuralDifference {
    /// Whether it only says that one run watched module outputs the other did not: what was
    /// recorded differs, not what was computed. Such nodes were not compared; nothing says they
    /// differ.
    pub fn is_recording_gap(&self) -> bool {
        matches!(self, StructuralDifference::NotRecorded { .. })
    }

    fn steps_mut(&mut self) -> &mut u64 {
        match self {
            StructuralDifference::MissingTensor { steps, .. }
            | StructuralDifference::Mismatch { steps, .. }
            | StructuralDifference::Renamed { steps, .. }
            | StructuralDifference::ScopeRenamed { steps, .. }
            | StructuralDifference::GraphChanged { steps, .. }
            | StructuralDifference::NotRecorded { steps, .. }
            | StructuralDifference::MissingSteps { steps, .. } => steps,
        }
    }
}

/// Compares two open traces.
pub fn diff_traces(a: &mut TraceReader, b: &mut TraceReader) -> Result<TraceDiff, TraceError> {
    diff_traces_within(a, b, None)
}

/// `diff_traces`, where tensors that differ by no more than `tolerance` count as agreeing: the
/// first divergence, the root cause and the verdict are then about differences beyond it.
pub fn diff_traces_within(
    a: &mut TraceReader,
    b: &mut TraceReader,
    tolerance: Option<Tolerance>,
) -> Result<TraceDiff, TraceError> {
    diff_traces_with(a, b, &DiffOptions { tolerance, ..DiffOptions::default() })
}

/// `diff_traces` with options: a tolerance, and tensors whose gap to follow by name.
pub fn diff_traces_with(
    a: &mut TraceReader,
    b: &mut TraceReader,
    options: &DiffOptions,
) -> Result<TraceDiff, TraceError> {
    diff_assembling(a, None, b, None, options)
}

/// `diff_traces_with`, where A's and B's shards (format 1.7) are read as the whole tensors an
/// assembler makes of every rank's (for a run read through its rank 0's stream).
pub(crate) fn diff_assembling(
    a: &mut TraceReader,
    mut shards_a: Option<&mut Assembler>,
    b: &mut TraceReader,
    mut shards_b: Option<&mut Assembler>,
    options: &DiffOptions,
) -> Result<TraceDiff, TraceError> {
    a.comparable_with(b)?;
    let tolerance = options.tolerance.clone();
    let mut state = DiffState { tolerance: tolerance.clone(), ..DiffState::default() };
    for name in &options.track {
        // Inserted up front: a tracked tensor that never differs still has its (empty) series.
        state.gaps.insert(format!("tensor:{name}"), Vec::new());
        state.tracked.insert(name.clone());
    }
    let (config_differences, environment_differences) = header_differences(a.header(), b.header());
    let (mut missing_a, mut missing_b) = (MissingGradients::default(), MissingGradients::default());
    let mut next_a = read_step(a, shards_a.as_deref_mut(), &mut missing_a)?;
    let mut next_b = read_step(b, shards_b.as_deref_mut(), &mut missing_b)?;
    // Sharded records that could not be made whole, left out of both runs.
    let mut shards_left_out = 0u64;
    let assembling = shards_a.is_some() || shards_b.is_some();
    let (mut steps_a, mut steps_b) = (0u64, 0u64);
    // The first step either run recorded (where a policy's `first` points).
    let first_step = next_a.iter().chain(&next_b).map(|s| s.step).min();
    // Tensors a `transpose` rule names at steps that keep no values for them: not compared.
    let mut untransposed = 0u64;
    loop {
        match (&next_a, &next_b) {
            (None, None) => break,
            (Some(sa), Some(sb)) if sa.step == sb.step => {
                let (mut sa, mut sb) = (next_a.take().unwrap(), next_b.take().unwrap());
                if options.replicated_state_only {
                    (sa, sb) = (replicated_state(sa), replicated_state(sb));
                }
                if assembling {
                    let left_out = leave_out_shards(&mut sa, &mut sb);
                    shards_left_out += left_out.not_compared;
                    for (ta, tb) in &left_out.wholes_differ {
                        state.mismatch(ta, tb, sa.step);
                    }
                }
                let mut left_out = Vec::new();
                let mut sa = ComparedStep::new(sa, &options.names, Run::A, a, &mut left_out)?;
                let mut sb = ComparedStep::new(sb, &options.names, Run::B, b, &mut left_out)?;
                // Left out of both runs, so that neither reads as recorded in one alone.
                untransposed += left_out.len() as u64;
                sa.leave_out(&left_out);
                sb.leave_out(&left_out);
                // A captured scope's output under the module path the other run names it by:
                // where one run's graph is named by scopes (`S#k`) and the other's by module.
                if sa.has_scoped_nodes() != sb.has_scoped_nodes() {
                    let (names_a, names_b) = (sa.names(), sb.names());
                    sa.alias_scope_outputs(&names_b);
                    sb.alias_scope_outputs(&names_a);
                }
                state.compare_step(a, &sa, b, &sb)?;
                steps_a += 1;
                steps_b += 1;
                next_a = read_step(a, shards_a.as_deref_mut(), &mut missing_a)?;
                next_b = read_step(b, shards_b.as_deref_mut(), &mut missing_b)?;
            }
            (Some(sa), sb) if sb.as_ref().is_none_or(|sb| sa.step < sb.step) => {
                state.missing_step("b", sa.step);
                steps_a += 1;
                next_a = read_step(a, shards_a.as_deref_mut(), &mut missing_a)?;
            }
            (_, Some(sb)) => {
                state.missing_step("a", sb.step);
                steps_b += 1;
                next_b = read_step(b, shards_b.as_deref_mut(), &mut missing_b)?;
            }
            (Some(_), None) => unreachable!("handled by the arm above"),
        }
    }
    let mut warnings = comparison_warnings(a, b);
    if untransposed > 0 {
        warnings.push(format!(
            "the name map transposes {untransposed} tensor record(s) at steps that keep only their hashes: those were not \
             compared (record those steps with full values, `--capture`, to compare them)"
        ));
    }
    for shards in [shards_a, shards_b].into_iter().flatten() {
        shards.left_out = shards_left_out;
    }
    if shards_left_out > 0 {
        warnings.push(format!(
            "{shards_left_out} sharded tensor record(s) were not compared: the runs shard them differently, and a whole \
             tensor is assembled from its shards only where every rank stored the values (its hash cannot be derived \
             from theirs); record with full values (`--capture`) at those steps to compare whole tensors"
        ));
    }
    if state.views_unmatched > 0 {
        warnings.push(format!(
            "{} tensor record(s) are views of an earlier tensor in one trace and hashed by their values in the other \
             (a trace made before format 1.5, or a parameter read at another point of its step), with values not \
             stored on both sides: those were not compared, the tensors they read were (record both runs with full \
             values at those steps, `--capture`, to compare them)",
            state.views_unmatched
        ));
    }
    Ok(TraceDiff {
        warnings,
        tolerance,
        tensors_within_tolerance: state.within,
        largest_within_tolerance: state.largest_within,
        hash_only_differences: state.hash_only,
        not_compared: state.views_unmatched + shards_left_out,
        a: side(a, steps_a, missing_a.finish()),
        b: side(b, steps_b, missing_b.finish()),
        config_differences,
        environment_differences,
        steps_compared: state.steps_compared,
        tensors_compared: state.tensors_compared,
        tensors_diverged: state.tensors_diverged,
        first_divergence: state.first,
        root_cause: state.root_cause,
        tensors: state.histories.into_iter().map(HistoryBuilder::finish).collect(),
        first_divergence_by_kind: state.by_kind,
        structure: state.structure,
        gaps: gap_series(state.gaps),
        escalate: None,
    }
    .with_escalation(a.header(), b.header(), first_step.unwrap_or(0)))
}

impl TraceDiff {
    /// Notes, where both runs say at which steps they recorded the capture ladder's levels, the
    /// levels missing at the first diverging step.
    /// `first_step`: the first step either run recorded.
    fn with_escalation(mut self, a: &repro_trace::Header, b: &repro_trace::Header, first_step: u64) -> Self {
        let Some(step) = self.first_divergence.as_ref().map(|d| d.step) else { return self };
        let at = |h: &repro_trace::Header, level: &Option<repro_trace::FullCapture>| {
            level.as_ref().map(|p| p.names(step, first_step, h.run.steps))
        };
        let (Some(ops_a), Some(ops_b)) = (at(a, &a.capture.ops), at(b, &b.capture.ops)) else { return self };
        if !(ops_a && ops_b) {
            let modules = at(a, &a.capture.modules).unwrap_or(false) && at(b, &b.capture.modules).unwrap_or(false);
            self.escalate = Some(Escalation { step, modules_recorded: modules });
        }
        self
    }
}

/// The series in a fixed order: kinds first, then tracked tensors, each by label (the map's
/// order, which partitioning keeps).
fn gap_series(gaps: BTreeMap<String, Vec<GapPoint>>) -> Vec<GapSeries> {
    let (kinds, tensors): (Vec<_>, Vec<_>) = gaps.into_iter().partition(|(label, _)| label.starts_with("kind:"));
    kinds.into_iter().chain(tensors).map(|(label, points)| GapSeries { label, points }).collect()
}

/// What makes a comparison meaningless, said before anyone trusts its verdict.
fn comparison_warnings(a: &TraceReader, b: &TraceReader) -> Vec<String> {
    let mut warnings = Vec::new();
    let same_file = match (std::fs::canonicalize(a.records_path()), std::fs::canonicalize(b.records_path())) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    };
    if same_file {
        warnings.push(format!(
            "A and B are the same trace ({}): this comparison cannot find a difference",
            a.records_path().display()
        ));
    }
    let levels = a.header().capture.level_differences(&b.header().capture);
    if !levels.is_empty() {
        let said: Vec<String> =
            levels.iter().map(|(level, x, y)| format!("`{level}` at {x} in A and at {y} in B")).collect();
        warnings.push(format!(
            "the runs were recorded down the capture ladder at other steps ({}): nodes one run recorded and the \
             other did not are not compared",
            said.join(", ")
        ));
    }
    let (wa, wb) = (&a.header().run.workload, &b.header().run.workload);
    if wa != wb {
        warnings.push(format!(
            "A records workload `{wa}` and B `{wb}`: their tensors are not the same computation, so the differences below are expected"
        ));
    }
    warnings
}

fn side(reader: &TraceReader, steps: u64, no_gradient: Vec<MissingGradient>) -> TraceSide {
    let incomplete_reason = match reader.completeness() {
        Some(Completeness::Complete) => None,
        Some(Completeness::Incomplete(why)) => Some(why.clone()),
        None => Some("not read to the end".into()),
    };
    TraceSide {
        path: reader.dir().display().to_string(),
        workload: reader.header().run.workload.clone(),
        steps,
        complete: incomplete_reason.is_none(),
        incomplete_reason,
        no_gradient,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{f32_tensor, one_step_trace};
    use repro_trace::{StepTensor, ViewOf};
    use std::path::Path;

    /// A [2, 3] weight `w` and the node `w.t` that reads it transposed: as a view of it (format
    /// 1.5), or as a tensor of its own holding `transposed`.
    fn weight_and_transpose(as_view: bool, transposed: &[f32], stored: bool) -> Vec<StepTensor> {
        let w = f32_tensor("w", TensorKind::Weight, vec![2, 3], &[1., 2., 3., 4., 5., 6.], true);
        let mut t = f32_tensor("w.t", TensorKind::OpOutput, vec![3, 2], transposed, stored && !as_view);
        t.record.node = Some(1);
        if as_view {
            let view = ViewOf { of: "w".into(), offset: 0, strides: vec![1, 3] };
            t.record.hash = repro_trace::view::view_hash(
                t.record.dtype,
                &t.record.shape,
                &w.record.hash,
                view.offset,
                &view.strides,
            );
            t.record.view = Some(view);
            t.record.inline = None;
        }
        vec![w, t]
    }

    fn diff(a: &Path, b: &Path, options: &DiffOptions) -> TraceDiff {
        diff_traces_with(&mut TraceReader::open(a).unwrap(), &mut TraceReader::open(b).unwrap(), options).unwrap()
    }

    #[test]
    fn a_view_and_a_plain_tensor_are_compared_by_their_values_where_both_are_stored() {
        let dir = tempfile::tempdir().unwrap();
        let transposed = [1., 4., 2., 5., 3., 6.];
        let view = one_step_trace(&dir.path().join("view"), weight_and_transpose(true, &transposed, true));
        let same = one_step_trace(&dir.path().join("same"), weight_and_transpose(false, &transposed, true));
        let d = diff(&view, &same, &DiffOptions::default());
        assert!(d.is_identical() && d.not_compared == 0 && d.warnings.is_empty(), "{d:?}");
        assert_eq!(d.tensors_compared, 2);

        // Other values in the plain tensor: a divergence at the view, measured.
        let other = [1., 4., 2., 5., 3., 7.];
        let wrong = one_step_trace(&dir.path().join("wrong"), weight_and_transpose(false, &other, true));
        let d = diff(&view, &wrong, &DiffOptions::default());
        assert!(!d.is_identical());
        let first = d.first_divergence.expect("the view differs");
        assert_eq!(first.tensor, "w.t");
        assert_eq!(first.metrics.map(|m| (m.mismatched, m.max_abs)), Some((1, 1.0)));
    }

    #[test]
    fn a_view_against_a_tensor_without_values_is_counted_as_not_compared() {
        let dir = tempfile::tempdir().unwrap();
        let view = one_step_trace(&dir.path().join("view"), weight_and_transpose(true, &[0.; 6], true));
        let plain = one_step_trace(&dir.path().join("plain"), weight_and_transpose(false, &[9.; 6], false));
        let d = diff(&view, &plain, &DiffOptions::default());
        assert_eq!(d.not_compared, 1);
        assert_eq!(d.tensors_compared, 1, "the weight it reads is compared");
        assert!(d.warnings.iter().any(|w| w.contains("were not compared")), "{:?}", d.warnings);
    }

    /// A captured node named `name`, at `position` of the graph, holding `values`.
    fn node(name: &str, position: u64, values: &[f32]) -> StepTensor {
        let mut t = f32_tensor(name, TensorKind::OpOutput, vec![values.len() as u64], values, true);
        t.record.node = Some(position);
        t
    }

    /// Issue 45, item 9b: a candle port captured scope by scope pairs with its origin's module
    /// outputs (PyTorch's `h.0.attn`, `h.0.attn.c_proj`, `h.0.mlp`) by name, with no map.
    #[test]
    fn a_captured_scopes_output_pairs_with_the_module_of_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let candle = one_step_trace(
            &dir.path().join("candle"),
            vec![
                node("h[0]/attn#0", 0, &[1.0, 2.0]),
                node("h[0]/attn/c_proj#0", 1, &[3.0, 4.0]),
                node("h[0]/mlp#0", 2, &[5.0]),
                node("h[0]/mlp#1", 3, &[6.0, 7.0]),
            ],
        );
        let torch = |dir: &Path, mlp: f32| {
            one_step_trace(
                dir,
                vec![
                    node("h.0.attn.c_proj", 0, &[3.0, 4.0]),
                    node("h.0.attn", 1, &[3.0, 4.0]),
                    node("h.0.mlp", 2, &[6.0, mlp]),
                ],
            )
        };
        let same = torch(&dir.path().join("same"), 7.0);
        let d = diff(&candle, &same, &DiffOptions::default());
        assert!(d.first_divergence.is_none(), "{:?}", d.first_divergence);
        assert_eq!(d.tensors_compared, 3, "each module output paired with its scope's: {d:?}");
        // Where the module's output differs, the divergence names it, with its values compared.
        let off = torch(&dir.path().join("off"), 8.0);
        let d = diff(&candle, &off, &DiffOptions::default());
        let first = d.first_divergence.expect("the mlp differs");
        assert_eq!(first.tensor, "h.0.mlp");
        assert_eq!(first.metrics.map(|m| m.mismatched), Some(1));
    }

    /// Issue 66, item 6: a compiled model's modules run inside its graph without their hooks, so
    /// its trace lacks their outputs. Nodes one run recorded and the other did not were not
    /// compared: the verdict is UNVERIFIED, not DIVERGED, while what both recorded agrees; a
    /// node replaced by another (nodes only in A and only in B) still diverges in structure.
    #[test]
    fn nodes_only_one_run_recorded_leave_the_runs_unverified_not_diverged() {
        let dir = tempfile::tempdir().unwrap();
        let w = || f32_tensor("w", TensorKind::Weight, vec![2], &[1., 2.], true);
        let torch = |dir: &Path, tensors| {
            crate::testing::one_step_trace_with(dir, tensors, |h| h.producer = "repro-py 0.1.0".into())
        };
        let eager = torch(
            &dir.path().join("eager"),
            vec![w(), node("fc1", 0, &[1.0]), node("act", 1, &[2.0]), node("fc2", 2, &[3.0])],
        );
        let compiled = torch(&dir.path().join("compiled"), vec![w(), node("fc1", 0, &[1.0]), node("fc2", 1, &[3.0])]);
        let d = diff(&eager, &compiled, &DiffOptions::default());
        assert_eq!(d.verdict(), crate::Verdict::Unverified, "{d:?}");
        assert!(d.agrees_so_far() && !d.is_identical() && d.nodes_recorded_once() == 1, "{d:?}");
        assert_eq!(d.tensors_compared, 3);
        // A value that differs is still a divergence.
        let off = torch(&dir.path().join("off"), vec![w(), node("fc1", 0, &[1.0]), node("fc2", 1, &[4.0])]);
        assert_eq!(diff(&eager, &off, &DiffOptions::default()).verdict(), crate::Verdict::Diverged);
        // A captured graph of every op (candle's) that lacks a node computed otherwise (a fused
        // kernel): a change of structure.
        let ops = one_step_trace(&dir.path().join("ops"), vec![w(), node("m#0", 0, &[1.0]), node("m#1", 1, &[2.0])]);
        let fused = one_step_trace(&dir.path().join("fused"), vec![w(), node("m#0", 0, &[1.0])]);
        assert_eq!(diff(&ops, &fused, &DiffOptions::default()).verdict(), crate::Verdict::Diverged);
        // An op replaced by another (a node only in A and another only in B, of one scope).
        let a = one_step_trace(
            &dir.path().join("a"),
            vec![w(), node("m#0", 0, &[1.0]), node("m#1", 1, &[2.0]), node("m#2", 2, &[3.0])],
        );
        let b = one_step_trace(
            &dir.path().join("b"),
            vec![w(), node("m#0", 0, &[1.0]), node("m#1", 1, &[2.0, 5.0, 6.0]), node("m#2", 2, &[3.0])],
        );
        let d = diff(&a, &b, &DiffOptions::default());
        assert_eq!(d.verdict(), crate::Verdict::Diverged, "{d:?}");
    }

    /// Issue 67: runs recorded by the capture ladder's levels say where their levels differ, and
    /// a divergence at a step not recorded down to the op says which levels to rerun it at.
    #[test]
    fn levels_that_differ_are_said_and_a_step_without_ops_is_to_be_escalated() {
        use repro_trace::FullCapture;
        let dir = tempfile::tempdir().unwrap();
        let levels = |modules: FullCapture, ops: FullCapture| {
            move |h: &mut repro_trace::Header| {
                h.capture.modules = Some(modules);
                h.capture.ops = Some(ops);
            }
        };
        let loss = |v: f32| vec![f32_tensor("loss", TensorKind::Loss, vec![1], &[v], true)];
        let first = || levels(FullCapture::First, FullCapture::None);
        let a = crate::testing::one_step_trace_with(&dir.path().join("a"), loss(1.0), first());
        let b = crate::testing::one_step_trace_with(&dir.path().join("b"), loss(2.0), first());
        let d = diff(&a, &b, &DiffOptions::default());
        assert!(d.warnings.is_empty(), "{:?}", d.warnings);
        assert_eq!(d.escalate, Some(Escalation { step: 0, modules_recorded: true }));
        // Ops recorded at the diverging step in both: nothing to escalate.
        let ops = || levels(FullCapture::None, FullCapture::All);
        let c = crate::testing::one_step_trace_with(&dir.path().join("c"), loss(1.0), ops());
        let e = crate::testing::one_step_trace_with(&dir.path().join("e"), loss(2.0), ops());
        assert_eq!(diff(&c, &e, &DiffOptions::default()).escalate, None);
        // Levels that differ, said; a trace that names no levels, no escalation.
        let d = diff(&a, &c, &DiffOptions::default());
        assert!(d.warnings.iter().any(|w| w.contains("`modules` at first in A and at none in B")), "{:?}", d.warnings);
        let plain = one_step_trace(&dir.path().join("plain"), loss(2.0));
        assert_eq!(diff(&a, &plain, &DiffOptions::default()).escalate, None);
    }

    #[test]
    fn renamed_tensors_read_their_values_under_the_names_the_trace_stores() {
        let dir = tempfile::tempdir().unwrap();
        let a = one_step_trace(
            &dir.path().join("a"),
            vec![f32_tensor("model.w", TensorKind::Weight, vec![4], &[1., 2., 3., 4.], true)],
        );
        let b = one_step_trace(
            &dir.path().join("b"),
            vec![f32_tensor("w", TensorKind::Weight, vec![4], &[1., 2., 3., 5.], true)],
        );
        let names = NameMap::parse("rename model.* *").unwrap();
        let d = diff(&a, &b, &DiffOptions { names, ..DiffOptions::default() });
        let first = d.first_divergence.expect("the values differ");
        assert_eq!(first.tensor, "w");
        assert_eq!(first.metrics.map(|m| m.mismatched), Some(1), "values read from the payload");

        // A view whose owner the map renames, or leaves out, still reads through it.
        let transposed = [1., 4., 2., 5., 3., 6.];
        let view = one_step_trace(&dir.path().join("view"), weight_and_transpose(true, &transposed, true));
        let plain = one_step_trace(&dir.path().join("plain"), weight_and_transpose(false, &transposed, true));
        let names = NameMap::parse("rename w* m*").unwrap();
        let d = diff(&view, &plain, &DiffOptions { names, ..DiffOptions::default() });
        assert!(d.is_identical() && d.tensors_compared == 2, "{d:?}");
        let names = NameMap::parse("ignore w").unwrap();
        let d = diff(&view, &plain, &DiffOptions { names, ..DiffOptions::default() });
        assert!(d.is_identical() && d.tensors_compared == 1 && d.not_compared == 0, "{d:?}");
    }
}
