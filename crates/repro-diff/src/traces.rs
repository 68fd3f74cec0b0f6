//! Comparing two traces: steps aligned by number, tensors by name. Produces plain data
//! (`TraceDiff`); rendering is the report module's job.
//!
//! Both traces are streamed one step at a time, and tensor values are loaded only for tensors
//! whose hashes differ, so memory stays at one step's tensors however long the traces are.

use crate::align::{align, scope, Pairing};
use crate::divergence::Divergence;
use crate::metrics::{compare_values, TensorMetrics};
use crate::names::{NameMap, Run};
use crate::root_cause::{analyze, Entry, RootCause};
use crate::shards::Assembler;
use crate::tolerance::Tolerance;
use repro_trace::{
    Completeness, Header, MissingGradient, MissingGradients, RunConfig, StepRecord, TensorKind, TensorRecord,
    TraceError, TraceReader,
};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

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
}

/// What a comparison does beyond the bit-exact default.
#[derive(Debug, Clone, Default)]
pub struct DiffOptions {
    /// Differences no larger than this count as agreeing.
    pub tolerance: Option<Tolerance>,
    /// Tensors whose gap to follow step by step, by name, besides every kind.
    pub track: Vec<String>,
    /// Compare only the state data-parallel replicas share with a run of another world size:
    /// parameters, and the gradients the optimizer steps on. Left out: the batch, the graph and
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
    /// the same steps. Steps that agree in an unfinished trace are no verdict on the steps it
    /// lacks.
    pub fn is_identical(&self) -> bool {
        self.agrees_so_far() && self.a.complete && self.b.complete
    }

    /// True when every step both traces hold agrees, in values and in structure, whether or not
    /// both finished.
    pub fn agrees_so_far(&self) -> bool {
        self.first_divergence.is_none() && self.structure.is_empty()
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
    fn steps_mut(&mut self) -> &mut u64 {
        match self {
            StructuralDifference::MissingTensor { steps, .. }
            | StructuralDifference::Mismatch { steps, .. }
            | StructuralDifference::Renamed { steps, .. }
            | StructuralDifference::ScopeRenamed { steps, .. }
            | StructuralDifference::GraphChanged { steps, .. }
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
                    shards_left_out += leave_out_shards(&mut sa, &mut sb);
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
    })
}

/// The next step of `reader`, noted in `missing`, its shards made whole where `shards` can.
fn read_step(
    reader: &mut TraceReader,
    shards: Option<&mut Assembler>,
    missing: &mut MissingGradients,
) -> Result<Option<StepRecord>, TraceError> {
    let step = reader.next_step()?;
    step.iter().for_each(|s| missing.observe(s));
    match (step, shards) {
        (Some(step), Some(shards)) => shards.assemble(reader, step).map(Some),
        (step, _) => Ok(step),
    }
}

/// Leaves out of both steps every tensor that either still records as a shard (an assembler
/// could not make it whole); returns how many names it left out.
fn leave_out_shards(a: &mut StepRecord, b: &mut StepRecord) -> u64 {
    let names: BTreeSet<String> =
        a.tensors.iter().chain(&b.tensors).filter(|t| t.shard.is_some()).map(|t| t.name.clone()).collect();
    for step in [a, b] {
        step.tensors.retain(|t| !names.contains(&t.name));
    }
    names.len() as u64
}

/// `step` with only the tensors replicas share with a run of any world size (see
/// `DiffOptions::replicated_state_only`).
fn replicated_state(mut step: StepRecord) -> StepRecord {
    // A parameter's gradient is `NAME.grad` for a parameter `NAME` of the step. Other gradients
    // (of predictions, of activations) are per example, and a rank's share of a sum is
    // `NAME.grad.local`.
    let weights: std::collections::BTreeSet<String> =
        step.tensors.iter().filter(|t| t.kind == TensorKind::Weight).map(|t| t.name.clone()).collect();
    step.tensors.retain(|t| match t.kind {
        TensorKind::Weight => true,
        TensorKind::Gradient => t.name.strip_suffix(".grad").is_some_and(|p| weights.contains(p)),
        _ => false,
    });
    step
}

/// The series in a fixed order: kinds first, then tracked tensors, each by label (the map's
/// order, which partitioning keeps).
fn gap_series(gaps: BTreeMap<String, Vec<GapPoint>>) -> Vec<GapSeries> {
    let (kinds, tensors): (Vec<_>, Vec<_>) = gaps.into_iter().partition(|(label, _)| label.starts_with("kind:"));
    kinds.into_iter().chain(tensors).map(|(label, points)| GapSeries { label, points }).collect()
}

/// A step as compared, beside the step as the trace stores it. A name map renames and leaves out
/// records, and its transpose rules replace some by their transposes; values are still read
/// through the stored records, under the names the trace knows them by.
struct ComparedStep {
    /// As the trace stores it.
    stored: StepRecord,
    /// As compared, when a name map changed it: the records, each with the index of its stored
    /// record (`None`: a transpose, which holds its values itself).
    mapped: Option<(Vec<TensorRecord>, Vec<Option<usize>>)>,
}

impl ComparedStep {
    /// `stored` (a step of run `run`) as `names` maps it. The names of tensors a transpose rule
    /// names whose values the step does not keep go to `left_out`.
    fn new(
        stored: StepRecord,
        names: &NameMap,
        run: Run,
        reader: &mut TraceReader,
        left_out: &mut Vec<String>,
    ) -> Result<Self, TraceError> {
        if names.is_empty() {
            return Ok(ComparedStep { stored, mapped: None });
        }
        let (mut tensors, mut origin): (Vec<TensorRecord>, Vec<Option<usize>>) =
            names.apply(&stored).into_iter().map(|(t, i)| (t, Some(i))).unzip();
        for (t, from) in tensors.iter_mut().zip(&mut origin) {
            if t.shape.len() != 2 || !names.transposes(run, &t.name) {
                continue;
            }
            let index = from.expect("a record the map produced");
            let Some(values) = reader.values(&stored, &stored.tensors[index])? else {
                left_out.push(t.name.clone());
                continue;
            };
            let (rows, cols) = (t.shape[0] as usize, t.shape[1] as usize);
            let size = t.dtype.size_in_bytes();
            let mut bytes = vec![0u8; values.bytes.len()];
            for (i, row) in values.bytes.chunks_exact(cols * size).enumerate() {
                for (j, element) in row.chunks_exact(size).enumerate() {
                    bytes[(j * rows + i) * size..][..size].copy_from_slice(element);
                }
            }
            let shape = vec![t.shape[1], t.shape[0]];
            let hash = repro_trace::hash::tensor_hash(t.dtype, &shape, &bytes);
            *t = TensorRecord { shape, hash, inline: Some(bytes), in_payload: false, view: None, ..t.clone() };
            *from = None;
        }
        Ok(ComparedStep { stored, mapped: Some((tensors, origin)) })
    }

    fn step(&self) -> u64 {
        self.stored.step
    }

    /// The records compared.
    fn tensors(&self) -> &[TensorRecord] {
        self.mapped.as_ref().map_or(&self.stored.tensors, |(tensors, _)| tensors)
    }

    /// Leaves the tensors of these (compared) names out.
    fn leave_out(&mut self, names: &[String]) {
        if let (Some((tensors, origin)), false) = (&mut self.mapped, names.is_empty()) {
            let keep: Vec<bool> = tensors.iter().map(|t| !names.contains(&t.name)).collect();
            let mut flags = keep.iter();
            tensors.retain(|_| *flags.next().expect("one flag a record"));
            let mut flags = keep.iter();
            origin.retain(|_| *flags.next().expect("one flag a record"));
        }
    }

    /// Whether its captured graph's nodes are named by scope (`S#k`, a candle capture).
    fn has_scoped_nodes(&self) -> bool {
        self.tensors().iter().any(|t| t.node.is_some() && t.name.contains('#'))
    }

    /// The names of the records compared.
    fn names(&self) -> BTreeSet<String> {
        self.tensors().iter().map(|t| t.name.clone()).collect()
    }

    /// Adds, for each captured scope whose module path (`h[1]/mlp` stands for `h.1.mlp`) the
    /// other run records and this one does not, an alias of the scope's output under that path:
    /// its last node, nodes of scopes nested in it included (a module returns what its last
    /// submodule computed). The alias follows the node, deeper scopes first, as a PyTorch
    /// module's output follows its submodules'; it reads the node's values. So a candle port,
    /// captured scope by scope, pairs with its PyTorch origin's module outputs by name, with
    /// no name map.
    fn alias_scope_outputs(&mut self, other: &BTreeSet<String>) {
        // Module path -> (index of the scope's last node, depth of the scope).
        let mut outputs: BTreeMap<String, (usize, usize)> = BTreeMap::new();
        for (i, t) in self.tensors().iter().enumerate() {
            let Some((scope, _)) = t.name.rsplit_once('#').filter(|_| t.node.is_some()) else { continue };
            let parts: Vec<&str> = scope.split('/').collect();
            for depth in 1..=parts.len() {
                let path = parts[..depth].join(".").replace('[', ".").replace(']', "");
                outputs.insert(path, (i, depth));
            }
        }
        let own = self.names();
        let mut aliases: Vec<(usize, usize, String)> = outputs
            .into_iter()
            .filter(|(path, _)| other.contains(path) && !own.contains(path))
            .map(|(path, (i, depth))| (i, depth, path))
            .collect();
        if aliases.is_empty() {
            return;
        }
        // After its node; deeper scopes first.
        aliases.sort_by(|x, y| x.0.cmp(&y.0).then(y.1.cmp(&x.1)).then(x.2.cmp(&y.2)));
        let stored = &self.stored;
        let (tensors, origin) =
            self.mapped.get_or_insert_with(|| (stored.tensors.clone(), (0..stored.tensors.len()).map(Some).collect()));
        let mut aliases = aliases.into_iter().peekable();
        let (mut with, mut with_origin) = (Vec::with_capacity(tensors.len()), Vec::with_capacity(origin.len()));
        for (i, (t, from)) in std::mem::take(tensors).into_iter().zip(std::mem::take(origin)).enumerate() {
            let mut added = Vec::new();
            while let Some((_, _, path)) = aliases.next_if(|(at, _, _)| *at == i) {
                added.push(TensorRecord { name: path, ..t.clone() });
            }
            with.push(t);
            with_origin.push(from);
            for alias in added {
                with.push(alias);
                with_origin.push(from);
            }
        }
        (*tensors, *origin) = (with, with_origin);
    }

    /// The record that holds `t`'s values, `t` being one of `tensors()`: its stored record.
    fn holder<'s>(&'s self, t: &'s TensorRecord) -> &'s TensorRecord {
        let Some((tensors, origin)) = &self.mapped else { return t };
        let offset = (t as *const TensorRecord as usize).wrapping_sub(tensors.as_ptr() as usize);
        let index = offset / std::mem::size_of::<TensorRecord>();
        assert!(index < tensors.len() && std::ptr::eq(&tensors[index], t), "a record of this step");
        origin[index].map_or(t, |i| &self.stored.tensors[i])
    }

    /// Whether the trace holds `t`'s values.
    fn has_values(&self, reader: &TraceReader, t: &TensorRecord) -> bool {
        reader.has_values(&self.stored, self.holder(t))
    }

    /// `t`'s values, where the trace holds them.
    fn values<'r>(
        &'r self,
        reader: &'r mut TraceReader,
        t: &'r TensorRecord,
    ) -> Result<Option<repro_trace::TensorValues<'r>>, TraceError> {
        reader.values(&self.stored, self.holder(t))
    }
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

/// Differences between the headers' run configs and environments, in a fixed order.
pub fn header_differences(a: &Header, b: &Header) -> (Vec<FieldDifference>, Vec<FieldDifference>) {
    let config = config_differences(&a.run, &b.run);
    let (ea, eb) = (&a.environment, &b.environment);
    let mut env = Vec::new();
    let fields: [(&str, &String, &String); 7] = [
        ("device", &ea.device, &eb.device),
        ("device_name", &ea.device_name, &eb.device_name),
        ("cpu_model", &ea.cpu_model, &eb.cpu_model),
        ("os", &ea.os, &eb.os),
        ("repro_version", &ea.repro_version, &eb.repro_version),
        ("candle_version", &ea.candle_version, &eb.candle_version),
        ("rustc", &ea.rustc, &eb.rustc),
    ];
    for (name, x, y) in fields {
        push_if_differs(&mut env, name, Some(x), Some(y));
    }
    push_if_differs(&mut env, "threads", Some(&ea.threads.to_string()), Some(&eb.threads.to_string()));
    // Data parallelism: how many ranks, over what. A stream's own rank is not a difference.
    let world = |h: &Header| h.distributed.as_ref().map_or("1".to_string(), |d| d.world_size.to_string());
    let backend =
        |h: &Header| h.distributed.as_ref().map(|d| format!("{} {}", d.backend, d.backend_version).trim().to_string());
    push_if_differs(&mut env, "world_size", Some(&world(a)), Some(&world(b)));
    push_if_differs(&mut env, "collective", backend(a).as_ref(), backend(b).as_ref());
    map_differences(&mut env, "env.", &ea.env, &eb.env);
    (config, env)
}

/// Differences between two run configs: workload, steps, then every setting, in a fixed order.
pub fn config_differences(a: &RunConfig, b: &RunConfig) -> Vec<FieldDifference> {
    let mut config = Vec::new();
    push_if_differs(&mut config, "workload", Some(&a.workload), Some(&b.workload));
    push_if_differs(
        &mut config,
        "steps",
        a.steps.map(|s| s.to_string()).as_ref(),
        b.steps.map(|s| s.to_string()).as_ref(),
    );
    map_differences(&mut config, "", &a.params, &b.params);
    config
}

fn push_if_differs(out: &mut Vec<FieldDifference>, field: &str, a: Option<&String>, b: Option<&String>) {
    if a != b {
        out.push(FieldDifference { field: field.to_string(), a: a.cloned(), b: b.cloned() });
    }
}

fn map_differences(
    out: &mut Vec<FieldDifference>,
    prefix: &str,
    a: &BTreeMap<String, String>,
    b: &BTreeMap<String, String>,
) {
    let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    for key in keys {
        push_if_differs(out, &format!("{prefix}{key}"), a.get(key), b.get(key));
    }
}

#[derive(Default)]
struct DiffState {
    steps_compared: u64,
    tensors_compared: u64,
    tensors_diverged: u64,
    first: Option<Divergence>,
    root_cause: Option<RootCause>,
    histories: Vec<HistoryBuilder>,
    index: BTreeMap<String, usize>,
    by_kind: BTreeMap<TensorKind, u64>,
    structure: Vec<StructuralDifference>,
    /// Position in `structure` of each difference, by a key naming it.
    structure_index: BTreeMap<String, usize>,
    tolerance: Option<Tolerance>,
    within: u64,
    largest_within: Option<Divergence>,
    /// The first step at which a tensor differed within the tolerance.
    first_within_step: Option<u64>,
    hash_only: u64,
    /// (step, tensor) pairs left out: a view in one trace, hashed by its values in the other.
    views_unmatched: u64,
    /// Step-by-step gaps by series label (`kind:...` for every kind seen, `tensor:...` for
    /// the tensors tracked, inserted up front).
    gaps: BTreeMap<String, Vec<GapPoint>>,
    /// Names of the tensors followed by name (`DiffOptions::track`).
    tracked: std::collections::BTreeSet<String>,
}

struct HistoryBuilder {
    history: TensorHistory,
    last: Option<StepMetrics>,
}

impl DiffState {
    /// Adds one differing tensor to the series `label` at `step`.
    fn gap(&mut self, label: String, step: u64, metrics: Option<TensorMetrics>) {
        let points = self.gaps.entry(label).or_default();
        if points.last().is_none_or(|p| p.step != step) {
            points.push(GapPoint { step, differing: 0, max_abs: None, max_ulp: None });
        }
        let point = points.last_mut().expect("pushed above");
        point.differing += 1;
        if let Some(m) = metrics {
            point.max_abs = Some(point.max_abs.map_or(m.max_abs, |x| x.max(m.max_abs)));
            point.max_ulp = Some(point.max_ulp.map_or(m.max_ulp, |x| x.max(m.max_ulp)));
        }
    }

    /// Notes a difference that the tolerance allows, keeping the largest (by ULP).
    fn within_tolerance(&mut self, t: &TensorRecord, step: u64, m: TensorMetrics) {
        self.within += 1;
        self.first_within_step.get_or_insert(step);
        if self.largest_within.as_ref().and_then(|d| d.metrics).is_none_or(|l| m.max_ulp > l.max_ulp) {
            self.largest_within = Some(Divergence::of(t, step, Some(m)));
        }
    }

    fn compare_step(
        &mut self,
        ra: &mut TraceReader,
        sa: &ComparedStep,
        rb: &mut TraceReader,
        sb: &ComparedStep,
    ) -> Result<(), TraceError> {
        self.steps_compared += 1;
        let first_divergent = self.first.is_none();
        let mut entries = Vec::new();
        // Scopes of a captured graph whose nodes differ, in graph order: nodes only in A, only in B.
        let mut changed: Vec<(&str, (u64, u64))> = Vec::new();
        fn counts<'v, 's>(changed: &'v mut Vec<(&'s str, (u64, u64))>, scope: &'s str) -> &'v mut (u64, u64) {
            let at = changed.iter().position(|(s, _)| *s == scope).unwrap_or_else(|| {
                changed.push((scope, (0, 0)));
                changed.len() - 1
            });
            &mut changed[at].1
        }
        // Captured nodes paired across scopes of other names, by (A's scope, B's scope).
        let mut renamed_scopes: BTreeMap<(&str, &str), u64> = BTreeMap::new();
        for pairing in align(sa.tensors(), sb.tensors()) {
            let (ta, tb) = match pairing {
                Pairing::Same(ta, tb) => (ta, tb),
                Pairing::Renamed(ta, tb) => {
                    match (ta.node.and(ta.name.rsplit_once('#')), tb.node.and(tb.name.rsplit_once('#'))) {
                        (Some((scope_a, _)), Some((scope_b, _))) => {
                            *renamed_scopes.entry((scope_a, scope_b)).or_default() += 1;
                        }
                        _ => self.renamed(ta, tb, sa.step()),
                    }
                    (ta, tb)
                }
                Pairing::Moved(ta, tb) => {
                    counts(&mut changed, scope(&ta.name));
                    (ta, tb)
                }
                Pairing::OnlyA(ta) => {
                    match ta.node {
                        Some(_) => counts(&mut changed, scope(&ta.name)).0 += 1,
                        None => self.missing_tensor("b", &ta.name, sa.step()),
                    }
                    entries.push(Entry::new(ta, None, false));
                    continue;
                }
                Pairing::OnlyB(tb) => {
                    match tb.node {
                        Some(_) => counts(&mut changed, scope(&tb.name)).1 += 1,
                        None => self.missing_tensor("a", &tb.name, sb.step()),
                    }
                    continue;
                }
            };
            let view_against_values = ta.view.is_some() != tb.view.is_some();
            if view_against_values && !(sa.has_values(ra, ta) && sb.has_values(rb, tb)) {
                // A view of an earlier tensor in one trace (its hash derived from that tensor's),
                // hashed by its values in the other, without values on both sides to compare:
                // the hashes say nothing of each other. The tensor it reads is compared in its
                // place, and the verdict says what was left out.
                self.views_unmatched += 1;
                entries.push(Entry::new(ta, None, false));
                continue;
            }
            if ta.dtype != tb.dtype || ta.shape != tb.shape {
                // A tensor of another dtype or shape differs as surely as one of other values:
                // it can be the first divergence (an input batch of another size, say).
                // It counts as compared and diverged, like a pair whose values differ.
                self.mismatch(ta, tb, sa.step());
                self.tensors_compared += 1;
                self.tensors_diverged += 1;
                self.by_kind.entry(ta.kind).or_insert(sa.step());
                let divergence = Divergence {
                    b_layout: Some((tb.dtype, tb.shape.clone())),
                    ..Divergence::between(ta, tb, sa.step(), None)
                };
                if self.first.is_none() {
                    self.first = Some(divergence.clone());
                }
                let h = self.history(ta);
                self.histories[h].history.steps_compared += 1;
                self.histories[h].diverged(sa.step(), None);
                entries.push(Entry::new(ta, Some(divergence), false));
                continue;
            }
            self.tensors_compared += 1;
            let h = self.history(ta);
            self.histories[h].history.steps_compared += 1;
            if ta.hash == tb.hash && !view_against_values {
                entries.push(Entry::new(ta, None, true));
                continue;
            }
            // The metrics, and whether the values are within the tolerance (`allclose` reads
            // them again, element by element).
            // The rule that judges this tensor (rules may name tensors by kind or name).
            let tolerance = self.tolerance.as_ref().and_then(|t| t.for_tensor(&ta.name, ta.kind)).cloned();
            let (metrics, within) = match (sa.values(ra, ta)?, sb.values(rb, tb)?) {
                (Some(va), Some(vb)) => {
                    let m = compare_values(&va, &vb);
                    (Some(m), tolerance.as_ref().is_some_and(|t| t.allows_values(&va, &vb, &m)))
                }
                _ => (None, false),
            };
            if view_against_values && metrics.is_some_and(|m| m.mismatched == 0) {
                // A view and a plain tensor: their hashes differ by construction, their values
                // read through the view's layout are what count.
                entries.push(Entry::new(ta, None, true));
                continue;
            }
            self.gap(format!("kind:{}", ta.kind), sa.step(), metrics);
            if self.tracked.contains(&ta.name) {
                self.gap(format!("tensor:{}", ta.name), sa.step(), metrics);
            }
            if tolerance.is_some() {
                match metrics {
                    Some(m) if within => {
                        self.within_tolerance(ta, sa.step(), m);
                        entries.push(Entry::within_tolerance(ta, m));
                        continue;
                    }
                    None => self.hash_only += 1,
                    Some(_) => {}
                }
            }
            self.tensors_diverged += 1;
            self.by_kind.entry(ta.kind).or_insert(sa.step());
            let divergence = Divergence::between(ta, tb, sa.step(), metrics);
            if self.first.is_none() {
                self.first = Some(divergence.clone());
            }
            self.histories[h].diverged(sa.step(), metrics);
            entries.push(Entry::new(ta, Some(divergence), true));
        }
        for ((a, b), nodes) in renamed_scopes {
            self.structural(format!("scope-renamed/{a}/{b}"), || StructuralDifference::ScopeRenamed {
                a: a.to_string(),
                b: b.to_string(),
                nodes,
                first_step: sa.step(),
                steps: 1,
            });
        }
        for (scope, (only_in_a, only_in_b)) in changed {
            self.structural(format!("graph/{scope}"), || StructuralDifference::GraphChanged {
                scope: scope.to_string(),
                first_step: sa.step(),
                steps: 1,
                only_in_a,
                only_in_b,
            });
        }
        if first_divergent && self.first.is_some() {
            self.root_cause = analyze(&entries, self.first_within_step);
        }
        Ok(())
    }

    fn history(&mut self, t: &TensorRecord) -> usize {
        if let Some(&i) = self.index.get(&t.name) {
            return i;
        }
        self.histories.push(HistoryBuilder {
            history: TensorHistory {
                name: t.name.clone(),
                kind: t.kind,
                steps_compared: 0,
                steps_diverged: 0,
                first_divergent_step: None,
                growth: Vec::new(),
            },
            last: None,
        });
        self.index.insert(t.name.clone(), self.histories.len() - 1);
        self.histories.len() - 1
    }

    /// Counts one more step for the structural difference `key`, adding it (made by `new`)
    /// the first time it is seen.
    fn structural(&mut self, key: String, new: impl FnOnce() -> StructuralDifference) {
        match self.structure_index.get(&key) {
            Some(&i) => *self.structure[i].steps_mut() += 1,
            None => {
                self.structure_index.insert(key, self.structure.len());
                self.structure.push(new());
            }
        }
    }

    fn missing_step(&mut self, missing_in: &str, step: u64) {
        self.structural(format!("steps/{missing_in}"), || StructuralDifference::MissingSteps {
            missing_in: missing_in.into(),
            first_step: step,
            steps: 1,
        });
    }

    fn missing_tensor(&mut self, missing_in: &str, tensor: &str, step: u64) {
        self.structural(format!("missing/{missing_in}/{tensor}"), || StructuralDifference::MissingTensor {
            tensor: tensor.into(),
            missing_in: missing_in.into(),
            first_step: step,
            steps: 1,
        });
    }

    fn renamed(&mut self, ta: &TensorRecord, tb: &TensorRecord, step: u64) {
        self.structural(format!("renamed/{}/{}", ta.name, tb.name), || StructuralDifference::Renamed {
            a: ta.name.clone(),
            b: tb.name.clone(),
            first_step: step,
            steps: 1,
        });
    }

    fn mismatch(&mut self, ta: &TensorRecord, tb: &TensorRecord, step: u64) {
        self.structural(format!("mismatch/{}", ta.name), || StructuralDifference::Mismatch {
            tensor: ta.name.clone(),
            first_step: step,
            steps: 1,
            a: format!("{} {:?}", ta.dtype, ta.shape),
            b: format!("{} {:?}", tb.dtype, tb.shape),
        });
    }
}

impl HistoryBuilder {
    fn finish(mut self) -> TensorHistory {
        self.history.growth.extend(self.last);
        self.history
    }

    fn diverged(&mut self, step: u64, metrics: Option<TensorMetrics>) {
        let h = &mut self.history;
        h.steps_diverged += 1;
        let first = *h.first_divergent_step.get_or_insert(step);
        let Some(metrics) = metrics else { return };
        let sample = StepMetrics { step, metrics };
        let distance = step - first;
        if distance == 0 || distance.is_power_of_two() || h.growth.is_empty() {
            h.growth.push(sample);
            self.last = None;
        } else {
            self.last = Some(sample);
        }
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
