//! Root cause within the first diverging step (docs/diff.md), by the rule its records allow
//! (`CauseRule`):
//!
//! - Recorded inputs (hand-recorded ops): the first tensor, in recording (execution) order, whose
//!   recorded inputs are identical in both runs but which itself differs. Every other differing
//!   tensor of the step is either another such independent divergence, or a consequence of one,
//!   found by following the recorded input edges.
//! - Identical leaves (automatically captured graphs, which have no edges): when every leaf that
//!   feeds the graph (data, parameters) is identical in both runs, the first node that differs
//!   in topological order is a root cause; when a leaf differs, that leaf is (`Leaf`). When the
//!   whole forward graph is identical too, the differing gradients are where the runs part: the
//!   backward pass (`Backward`), or, for a gradient summed over ranks from identical shares, the
//!   collective (`Collective`).
//! - Otherwise only the first difference is known (`FirstDifference`).
//!
//! Under a tolerance, "identical" means bit for bit: a tensor that differs within the tolerance
//! is not, and a difference beyond it that such tensors feed is drift that has grown past the
//! tolerance (`Drift`, `DriftedLeaves`), not a new cause, unless it is far beyond what its inputs'
//! difference explains (`BeyondDrift`).

use crate::divergence::Divergence;
use repro_trace::{Phase, TensorKind};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

/// Which rule established the root cause.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CauseRule {
    /// Every recorded input of the cause is identical in both runs; its output is not.
    RecordedInputs,
    /// A captured graph: every leaf (data, parameter, buffer) is identical in both runs, and the
    /// cause is the first node of the graph, in topological order, that differs.
    IdenticalLeaves,
    /// The cause is itself a leaf (data, a parameter, a buffer or a random generator's state at
    /// the step's start): the runs were fed different values.
    Leaf,
    /// A captured step whose leaves and forward graph (loss included) are identical in both
    /// runs: the backward pass computed the cause, a gradient, differently. Other differing
    /// gradients are listed as separate causes (gradients carry no order among themselves).
    Backward,
    /// Under a tolerance: the cause's inputs (recorded inputs, or the captured graph's leaves and
    /// forward nodes before a gradient) differ only within the tolerance. The difference was
    /// already there and grew past the tolerance here (`drift_from` names where it shows first).
    Drift,
    /// Under a tolerance: a captured graph's leaves (data, parameters) differ only within the
    /// tolerance, as they have since `drift_since`; the cause is the first node whose difference
    /// grew past it.
    DriftedLeaves,
    /// A data-parallel step whose forward pass is identical, where the cause is a gradient summed
    /// across the ranks whose input, this rank's share, is identical in both runs: the collective
    /// added the shares in another order. Other such sums are listed as separate causes.
    Collective,
    /// Only that the cause is the first difference of the step (inputs unknown or not comparable).
    FirstDifference,
    /// Under a tolerance: what the cause is computed from differs only within the tolerance, but
    /// the cause differs orders of magnitude more than that explains ([`AMPLIFICATION`] times, in
    /// ULPs at the scale of the values): a new cause, such as a wrong constant, a missing term or
    /// a transposed weight in a port, not drift. Optimizer updates are exempt: an optimizer such
    /// as Adam amplifies gradient noise by design.
    BeyondDrift,
}

/// How many times more than its inputs' error (in ULPs at the values' scale) an op's output must
/// differ to be a new cause rather than drift. One op with inputs off by rounding moves its
/// output by a bounded multiple of their error (its conditioning); a wrong constant or a
/// missing term moves it by far more.
pub const AMPLIFICATION: f64 = 1000.0;

/// The analysis of the first diverging step.
#[derive(Debug, Clone, Serialize)]
pub struct RootCause {
    /// The first tensor whose inputs agree but which differs.
    pub cause: Divergence,
    /// The rule that makes it the cause.
    pub rule: CauseRule,
    /// Whether every input of the cause was recorded and compared (false: it has no recorded
    /// inputs, or an input could not be compared, so "inputs identical" is not established).
    pub inputs_checked: bool,
    /// Later tensors of the step that also differ although all their recorded inputs agree (or
    /// that record no inputs): divergences with causes of their own (two non-deterministic
    /// reductions, say).
    pub independent: Vec<Divergence>,
    /// Differing tensors of the step that follow from the divergences above.
    pub consequences: Vec<Consequence>,
    /// Whether the step recorded op inputs at all (format 1.1 per-op recording); without them
    /// the analysis can only name the first difference.
    pub inputs_recorded: bool,
    /// Under a tolerance (`Drift`, `DriftedLeaves`): the first tensor of the step that differs
    /// within the tolerance upstream of the cause.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drift_from: Option<String>,
    /// Under a tolerance: the first step at which the runs differed at all (within the
    /// tolerance), when that is before this one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drift_since: Option<u64>,
    /// Under a tolerance (`Drift`, `DriftedLeaves`, `BeyondDrift`): the tensors upstream of the
    /// cause that differ within the tolerance, with by how much: its recorded inputs (an update:
    /// the parameter and its gradient), or in a captured graph the one that differs most.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub upstream: Vec<UpstreamDifference>,
    /// Whether every element of the cause that differs is zero in exactly one run (its values
    /// stored on both sides): the shape of a random mask (dropout) drawn differently, from
    /// randomness the trace does not record, rather than of an op that rounds differently.
    pub random_mask: bool,
    /// Whether the graph's nodes are module outputs (a PyTorch recorder's), not ops: between
    /// two recorded modules runs code the trace does not see (a parent module's own forward,
    /// functional calls such as dropout), so a node that differs after identical ones may have
    /// been fed differently by that code rather than computed differently.
    pub nodes_are_modules: bool,
    /// Whether the cause is a value a PyTorch recorder took after the model ran (the loss, a
    /// prediction), not a module's or op's output, with every leaf identical: what computed it
    /// from them (the forward pass, the loss function) is not in the trace at this step.
    pub forward_unwatched: bool,
    /// Where the cause is the output of an op that draws random numbers (an aten op record of
    /// PyTorch's `ops` level, `path/aten.rand#k`): that op. With its inputs identical, the
    /// generator it drew from was in another state.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub random_op: Option<String>,
}

/// The aten ops that draw from a random generator.
const RANDOM_OPS: &[&str] = &[
    "aten.rand",
    "aten.rand_like",
    "aten.randn",
    "aten.randn_like",
    "aten.randint",
    "aten.randint_like",
    "aten.randperm",
    "aten.bernoulli",
    "aten.bernoulli_",
    "aten.normal",
    "aten.normal_",
    "aten.uniform_",
    "aten.exponential_",
    "aten.multinomial",
    "aten.native_dropout",
    "aten.dropout",
    "aten.rrelu_with_noise",
];

/// The random op a recorded op's name (`path/aten.op[.i]#k`) names, if it is one.
fn random_op(name: &str) -> Option<&'static str> {
    let op = name.rsplit_once('#').map_or(name, |(op, _)| op);
    let op = op.rsplit_once('/').map_or(op, |(_, op)| op);
    RANDOM_OPS.iter().copied().find(|r| op == *r || op.strip_prefix(r).is_some_and(|rest| rest.starts_with('.')))
}

/// A tensor upstream of a cause that differs within the tolerance.
#[derive(Debug, Clone, Serialize)]
pub struct UpstreamDifference {
    /// The tensor.
    pub tensor: String,
    /// Its largest |a - b|.
    #[serde(serialize_with = "crate::json_float::serialize")]
    pub max_abs: f64,
}

impl RootCause {
    /// The largest |a - b| upstream of the cause (`upstream`).
    pub fn upstream_max_abs(&self) -> Option<f64> {
        self.upstream.iter().map(|u| u.max_abs).reduce(f64::max)
    }
}

/// A differing tensor explained by an earlier divergence.
#[derive(Debug, Clone, Serialize)]
pub struct Consequence {
    /// The tensor.
    pub tensor: String,
    /// Its kind.
    pub kind: TensorKind,
    /// Its phase, if recorded.
    pub phase: Option<Phase>,
    /// The root divergences it descends from through recorded inputs (empty: no recorded path),
    /// in the order they were found; at most [`MAX_ROOTS_LISTED`] of them.
    pub from: Vec<String>,
    /// Whether it descends from more roots than `from` lists.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub more_roots: bool,
}

/// Roots listed per consequence. A step where every tensor descends from every earlier root
/// would otherwise take memory, and output, quadratic in its tensors.
pub const MAX_ROOTS_LISTED: usize = 8;

/// A set of roots by index: the first [`MAX_ROOTS_LISTED`] of them, and whether there are more.
/// The first few of a union are found among the first few of its parts, so the cap is exact.
#[derive(Debug, Default, Clone, PartialEq)]
struct Roots {
    first: Vec<u32>,
    more: bool,
}

impl Roots {
    fn one(root: usize) -> Self {
        Roots { first: vec![root as u32], more: false }
    }

    fn union(&self, other: &Roots) -> Roots {
        let mut first: Vec<u32> =
            self.first.iter().chain(&other.first).copied().collect::<BTreeSet<u32>>().into_iter().collect();
        let more = self.more || other.more || first.len() > MAX_ROOTS_LISTED;
        first.truncate(MAX_ROOTS_LISTED);
        Roots { first, more }
    }
}

/// One tensor of the first diverging step, in recording order.
pub(crate) struct Entry {
    pub(crate) name: String,
    pub(crate) inputs: Vec<String>,
    /// A node of an automatically captured graph.
    pub(crate) node: bool,
    /// A leaf that feeds the model: data, or a parameter or buffer before the update.
    pub(crate) leaf: bool,
    /// `None`: identical in both runs, or within the tolerance (see `within`). `Some`: differs
    /// (with details).
    pub(crate) divergence: Option<Divergence>,
    /// Differs, but within the tolerance.
    pub(crate) within: bool,
    /// For one that differs within the tolerance: by how much.
    pub(crate) within_metrics: Option<crate::metrics::TensorMetrics>,
    /// The result of a collective across ranks (a summed gradient, whole or this rank's block
    /// of it).
    pub(crate) collective: bool,
    /// Whether it was compared at all (false: only in one run, or dtype/shape differ).
    pub(crate) compared: bool,
}

impl Entry {
    /// The entry for a recorded tensor.
    pub(crate) fn new(tensor: &repro_trace::TensorRecord, divergence: Option<Divergence>, compared: bool) -> Self {
        let leaf = tensor.kind == TensorKind::Input
            || tensor.kind == TensorKind::RngState
            || (matches!(tensor.kind, TensorKind::Weight | TensorKind::Buffer) && tensor.phase != Some(Phase::Update));
        Entry {
            name: tensor.name.clone(),
            inputs: tensor.inputs.clone(),
            node: tensor.node.is_some(),
            leaf,
            divergence,
            within: false,
            within_metrics: None,
            collective: tensor.summed_from().is_some(),
            compared,
        }
    }

    /// The entry for a recorded tensor that differs within the tolerance.
    pub(crate) fn within_tolerance(tensor: &repro_trace::TensorRecord, m: crate::metrics::TensorMetrics) -> Self {
        Entry { within: true, within_metrics: Some(m), ..Entry::new(tensor, None, true) }
    }

    /// Identical bit for bit in both runs.
    fn exact(&self) -> bool {
        self.compared && self.divergence.is_none() && !self.within
    }

    /// Not beyond the tolerance: identical, or within it.
    fn agrees(&self) -> bool {
        self.compared && self.divergence.is_none()
    }
}

/// Finds the root cause among the entries of one step; `None` when nothing differs.
/// `drift_since`: under a tolerance, the first step at which the runs differed within it.
pub(crate) fn analyze(entries: &[Entry], drift_since: Option<u64>) -> Option<RootCause> {
    let mut root = if entries.iter().any(|e| e.node) { analyze_captured(entries)? } else { analyze_ops(entries)? };
    if matches!(root.rule, CauseRule::Drift | CauseRule::DriftedLeaves) {
        root.drift_since = drift_since.filter(|&s| s < root.cause.step);
        let (upstream, upstream_ulps) = upstream_error(entries, &root.cause.tensor);
        root.upstream = upstream;
        let cause_ulps = root.cause.metrics.and_then(|m| m.ulps_at_scale());
        let beyond = cause_ulps.is_some_and(|c| c > AMPLIFICATION * upstream_ulps.unwrap_or(0.0).max(1.0));
        if beyond && root.cause.phase != Some(Phase::Update) {
            root.rule = CauseRule::BeyondDrift;
        }
    }
    root.random_mask = root.rule != CauseRule::Leaf && root.cause.metrics.is_some_and(|m| m.looks_like_a_mask());
    root.random_op = random_op(&root.cause.tensor).map(str::to_string);
    Some(root)
}

/// The recorded-inputs rule (hand-recorded ops with their input edges).
fn analyze_ops<'a>(entries: &'a [Entry]) -> Option<RootCause> {
    let inputs_recorded = entries.iter().any(|e| !e.inputs.is_empty());
    let identical: BTreeSet<&str> = entries.iter().filter(|e| e.exact()).map(|e| e.name.as_str()).collect();
    let within: BTreeSet<&str> = entries.iter().filter(|e| e.within).map(|e| e.name.as_str()).collect();
    let inputs_agree = |e: &Entry| e.inputs.iter().all(|i| identical.contains(i.as_str()));
    // Inputs none of which differs beyond the tolerance, some within it: the first such input.
    let drifting_input = |e: &Entry| {
        let all_agree = e.inputs.iter().all(|i| identical.contains(i.as_str()) || within.contains(i.as_str()));
        e.inputs.iter().find(|i| within.contains(i.as_str())).filter(|_| all_agree).cloned()
    };
    let mut drift_from = None;
    // For each tensor that differs within the tolerance, the first such tensor it descends from.
    let mut drift_origin: BTreeMap<&str, &str> = BTreeMap::new();
    let mut cause: Option<(Divergence, bool)> = None;
    let mut cause_is_leaf = false;
    let mut independent = Vec::new();
    let mut consequences = Vec::new();
    // The roots (cause and independent divergences), by index, and which of them each differing
    // tensor descends from. Sets are shared, not copied, along chains.
    let mut roots: Vec<&str> = Vec::new();
    let mut taint: BTreeMap<&str, Rc<Roots>> = BTreeMap::new();
    for e in entries {
        let from = e.inputs.iter().filter_map(|i| taint.get(i.as_str())).fold(None, |acc: Option<Rc<Roots>>, t| {
            Some(match acc {
                None => Rc::clone(t),
                Some(acc) => Rc::new(acc.union(t)),
            })
        });
        if e.within {
            // Where its difference within the tolerance comes from: an input's, or its own.
            let origin = e.inputs.iter().find_map(|i| drift_origin.get(i.as_str()).copied()).unwrap_or(&e.name);
            drift_origin.insert(&e.name, origin);
        }
        let Some(d) = &e.divergence else { continue };
        let new_root = |roots: &mut Vec<&'a str>| {
            roots.push(&e.name);
            Rc::new(Roots::one(roots.len() - 1))
        };
        let drifting = drifting_input(e).filter(|_| from.is_none() && cause.is_none());
        if let Some(input) = drifting {
            // Its inputs differ, but only within the tolerance: drift that grew past it here.
            taint.insert(&e.name, new_root(&mut roots));
            drift_from = Some(drift_origin.get(input.as_str()).map_or(input, |o| o.to_string()));
            cause = Some((d.clone(), false));
        } else if !e.inputs.is_empty() && from.is_none() && inputs_agree(e) {
            taint.insert(&e.name, new_root(&mut roots));
            match cause {
                None => cause = Some((d.clone(), true)),
                Some(_) => independent.push(d.clone()),
            }
        } else if cause.is_none() {
            // The first difference, without recorded inputs or with one we could not compare:
            // call it the cause, but say its inputs were not established as identical (or that
            // it is itself data or a parameter the runs were fed differently).
            taint.insert(&e.name, new_root(&mut roots));
            cause_is_leaf = e.leaf;
            cause = Some((d.clone(), false));
        } else if e.inputs.is_empty() && inputs_recorded {
            // Differs, but nothing recorded explains it: a divergence of its own.
            taint.insert(&e.name, new_root(&mut roots));
            independent.push(d.clone());
        } else {
            let from = from.unwrap_or_default();
            consequences.push(Consequence {
                tensor: e.name.clone(),
                kind: d.kind,
                phase: d.phase,
                from: from.first.iter().map(|&r| roots[r as usize].to_string()).collect(),
                more_roots: from.more,
            });
            taint.insert(&e.name, from);
        }
    }
    let (cause, inputs_checked) = cause?;
    let rule = match (inputs_checked, cause_is_leaf, &drift_from) {
        (_, _, Some(_)) => CauseRule::Drift,
        (true, _, None) => CauseRule::RecordedInputs,
        (false, true, None) => CauseRule::Leaf,
        (false, false, None) => CauseRule::FirstDifference,
    };
    Some(RootCause {
        cause,
        rule,
        inputs_checked,
        independent,
        consequences,
        inputs_recorded,
        drift_from,
        drift_since: None,
        random_mask: false,
        nodes_are_modules: false,
        forward_unwatched: false,
        random_op: None,
        upstream: Vec::new(),
    })
}

/// The leaf rule, for a step whose graph was captured automatically (no edges): a differing leaf
/// is the cause; with every leaf identical, the first differing graph node is. Every later
/// difference is listed as a consequence without a path (it is downstream of the cause, or of a
/// separate cause the missing edges cannot tell apart).
fn analyze_captured(entries: &[Entry]) -> Option<RootCause> {
    let differing: Vec<&Entry> = entries.iter().filter(|e| e.divergence.is_some()).collect();
    let leaves = || entries.iter().filter(|e| e.leaf);
    let leaves_agree = leaves().all(Entry::agrees);
    let forward_compared = entries.iter().filter(|e| e.node).all(|e| e.compared);
    // Under a tolerance, what differs within it upstream of a cause: a leaf anywhere, or a node
    // recorded before it (`before`: its position in the step).
    let within_upstream = |before: usize| {
        let leaf = leaves().find(|e| e.within);
        let node = || entries[..before].iter().find(|e| e.node && e.within);
        leaf.map(|e| (e, CauseRule::DriftedLeaves)).or_else(|| node().map(|e| (e, CauseRule::Drift)))
    };
    let position = |wanted: &Entry| entries.iter().position(|e| std::ptr::eq(e, wanted)).unwrap_or(entries.len());
    let mut drift_from = None;
    let (cause, rule) = if let Some(leaf) = differing.iter().find(|e| e.leaf) {
        (*leaf, CauseRule::Leaf)
    } else if let Some(node) = differing.iter().find(|e| e.node).filter(|_| leaves_agree) {
        match within_upstream(position(node)) {
            None => (*node, CauseRule::IdenticalLeaves),
            Some((from, rule)) => {
                drift_from = Some(from.name.clone());
                (*node, rule)
            }
        }
    } else if let Some(grad) = differing.iter().find(|e| is_gradient(e)).filter(|_| leaves_agree && forward_compared) {
        // Nothing of the forward pass differs beyond the tolerance; within it, it is drift.
        // A sum across ranks whose shares are identical: the collective's own order.
        let shares_identical = |e: &Entry| {
            e.collective
                && !e.inputs.is_empty()
                && e.inputs.iter().all(|i| entries.iter().any(|x| &x.name == i && x.exact()))
        };
        match within_upstream(position(grad)) {
            None if shares_identical(grad) => (*grad, CauseRule::Collective),
            None => (*grad, CauseRule::Backward),
            Some((from, _)) => {
                drift_from = Some(from.name.clone());
                (*grad, CauseRule::Drift)
            }
        }
    } else if let Some(update) = differing.first().filter(|e| {
        e.divergence.as_ref().is_some_and(|d| d.phase == Some(Phase::Update))
            && !e.inputs.is_empty()
            && e.inputs.iter().all(|i| entries.iter().any(|x| &x.name == i && x.agrees()))
    }) {
        // An updated parameter whose recorded inputs (the parameter, its gradient) agree.
        match entries.iter().find(|x| x.within && update.inputs.contains(&x.name)) {
            Some(from) => {
                drift_from = Some(from.name.clone());
                (*update, CauseRule::Drift)
            }
            None => (*update, CauseRule::RecordedInputs),
        }
    } else {
        (*differing.first()?, CauseRule::FirstDifference)
    };
    let separate = |e: &Entry| matches!(rule, CauseRule::Backward | CauseRule::Collective) && is_gradient(e);
    let independent = differing
        .iter()
        .filter(|e| e.name != cause.name && separate(e))
        .map(|e| e.divergence.clone().expect("differing"))
        .collect();
    let consequences = differing
        .iter()
        .filter(|e| e.name != cause.name && !separate(e))
        .map(|e| {
            let d = e.divergence.as_ref().expect("differing");
            Consequence { tensor: e.name.clone(), kind: d.kind, phase: d.phase, from: Vec::new(), more_roots: false }
        })
        .collect();
    Some(RootCause {
        cause: cause.divergence.clone().expect("differing"),
        rule,
        inputs_checked: matches!(rule, CauseRule::IdenticalLeaves | CauseRule::Backward | CauseRule::RecordedInputs),
        independent,
        consequences,
        inputs_recorded: false,
        drift_from,
        drift_since: None,
        random_mask: false,
        nodes_are_modules: false,
        forward_unwatched: false,
        random_op: None,
        upstream: Vec::new(),
    })
}

/// The tensors upstream of `cause` that differ within the tolerance, and the largest ULPs at
/// the values' scale among them: its recorded inputs, or, in a captured graph (no edges), the
/// one that differs most among those recorded before it.
fn upstream_error(entries: &[Entry], cause: &str) -> (Vec<UpstreamDifference>, Option<f64>) {
    let Some(at) = entries.iter().position(|e| e.name == cause) else { return (Vec::new(), None) };
    let inputs = &entries[at].inputs;
    let upstream: Vec<(&Entry, crate::metrics::TensorMetrics)> = entries[..at]
        .iter()
        .filter(|e| inputs.is_empty() || inputs.contains(&e.name))
        .filter_map(|e| e.within_metrics.map(|m| (e, m)))
        .collect();
    let ulps = upstream.iter().filter_map(|(_, m)| m.ulps_at_scale()).reduce(f64::max);
    let listed = upstream.iter().map(|(e, m)| UpstreamDifference { tensor: e.name.clone(), max_abs: m.max_abs });
    let listed: Vec<UpstreamDifference> = match inputs.is_empty() {
        false => listed.collect(),
        true => listed.max_by(|x, y| x.max_abs.total_cmp(&y.max_abs)).into_iter().collect(),
    };
    (listed, ulps)
}

fn is_gradient(e: &Entry) -> bool {
    e.divergence.as_ref().is_some_and(|d| d.kind == TensorKind::Gradient)
}

#[cfg(test)]
mod tests {
    use super::*;
    use repro_trace::dtype::DType;

    fn analyze(entries: &[Entry]) -> Option<RootCause> {
        super::analyze(entries, None)
    }

    fn entry(name: &str, inputs: &[&str], differs: bool) -> Entry {
        Entry {
            name: name.into(),
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
            node: false,
            leaf: false,
            divergence: differs.then(|| Divergence {
                step: 3,
                tensor: name.into(),
                kind: TensorKind::OpOutput,
                phase: Some(Phase::Forward),
                dtype: DType::F32,
                shape: vec![1],
                metrics: None,
                b_layout: None,
                source: None,
                source_opens_scope: false,
                tensor_b: None,
            }),
            within: false,
            within_metrics: None,
            collective: false,
            compared: true,
        }
    }

    /// An entry that differs within the tolerance.
    fn within(mut e: Entry) -> Entry {
        e.within = true;
        e
    }

    #[test]
    fn first_op_with_agreeing_inputs_is_the_cause_and_the_rest_follow() {
        let r = analyze(&[
            entry("x", &[], false),
            entry("w", &[], false),
            entry("mm", &["x", "w"], false),
            entry("sum", &["mm"], true),
            entry("loss", &["sum"], true),
            entry("mm.grad", &["mm"], false),
            entry("bias.grad", &["mm.grad"], true),
            entry("w.new", &["w", "loss"], true),
        ])
        .unwrap();
        assert_eq!(r.cause.tensor, "sum");
        assert!(r.inputs_checked);
        let independent: Vec<&str> = r.independent.iter().map(|d| d.tensor.as_str()).collect();
        assert_eq!(independent, ["bias.grad"]);
        let consequences: Vec<(&str, Vec<String>)> =
            r.consequences.iter().map(|c| (c.tensor.as_str(), c.from.clone())).collect();
        assert_eq!(consequences, [("loss", vec!["sum".to_string()]), ("w.new", vec!["sum".to_string()])]);
    }

    #[test]
    fn an_unexplained_later_difference_is_its_own_cause() {
        let r = analyze(&[
            entry("x", &[], false),
            entry("mm", &["x"], true),
            entry("x2", &[], true),
            entry("out", &["mm", "x2"], true),
        ])
        .unwrap();
        assert_eq!(r.cause.tensor, "mm");
        assert_eq!(r.independent.iter().map(|d| d.tensor.as_str()).collect::<Vec<_>>(), ["x2"]);
        assert_eq!(r.consequences[0].from, ["mm", "x2"]);
    }

    #[test]
    fn roots_are_listed_in_execution_order_and_capped_so_a_long_chain_stays_linear() {
        // Each link consumes the previous link and a new root of its own: link k descends from
        // k + 1 roots, so listing them all would take memory quadratic in the links.
        let links = 3000;
        let mut entries = vec![entry("x", &[], false), entry("root0", &["x"], true)];
        for k in 1..links {
            let (root, prev) =
                (format!("root{k}"), if k == 1 { "root0".to_string() } else { format!("link{}", k - 1) });
            entries.push(entry(&root, &[], true));
            entries.push(entry(&format!("link{k}"), &[&prev, &root], true));
        }
        let r = analyze(&entries).unwrap();
        assert_eq!(r.cause.tensor, "root0");
        assert_eq!(r.independent.len(), links - 1);
        let last = r.consequences.last().unwrap();
        assert_eq!(last.tensor, format!("link{}", links - 1));
        let expected: Vec<String> = (0..MAX_ROOTS_LISTED).map(|k| format!("root{k}")).collect();
        assert_eq!(last.from, expected, "the earliest roots, in the order they were found");
        assert!(last.more_roots);
        let first = &r.consequences[0];
        assert_eq!((first.from.clone(), first.more_roots), (vec!["root0".to_string(), "root1".to_string()], false));
    }

    fn captured(name: &str, leaf: bool, differs: bool) -> Entry {
        Entry { node: !leaf, leaf, ..entry(name, &[], differs) }
    }

    #[test]
    fn with_identical_leaves_the_first_differing_node_is_the_cause() {
        let r = analyze(&[
            captured("x", true, false),
            captured("w", true, false),
            captured("layers[0]/mlp#0", false, false),
            captured("layers[1]/mlp#0", false, true),
            captured("loss", false, true),
        ])
        .unwrap();
        assert_eq!(r.cause.tensor, "layers[1]/mlp#0");
        assert_eq!(r.rule, CauseRule::IdenticalLeaves);
        assert!(r.inputs_checked);
        assert_eq!(r.consequences.iter().map(|c| c.tensor.as_str()).collect::<Vec<_>>(), ["loss"]);
    }

    #[test]
    fn with_the_whole_forward_graph_identical_the_differing_gradients_are_the_causes() {
        let gradient = |name: &str, differs: bool| {
            let mut e = entry(name, &[], differs);
            if let Some(d) = &mut e.divergence {
                d.kind = TensorKind::Gradient;
            }
            e
        };
        let updated = entry("w.updated", &[], true);
        let entries = || {
            vec![
                captured("x", true, false),
                captured("w", true, false),
                captured("mlp#0", false, false),
                captured("loss", false, false),
                gradient("a.grad", false),
                gradient("b.grad", true),
                gradient("c.grad", true),
            ]
        };
        let mut all = entries();
        all.push(updated);
        let r = analyze(&all).unwrap();
        assert_eq!((r.cause.tensor.as_str(), r.rule), ("b.grad", CauseRule::Backward));
        assert_eq!(r.independent.iter().map(|d| d.tensor.as_str()).collect::<Vec<_>>(), ["c.grad"]);
        assert_eq!(r.consequences.iter().map(|c| c.tensor.as_str()).collect::<Vec<_>>(), ["w.updated"]);
        // A forward node missing from one run: the forward pass is not established as identical.
        let mut partial = entries();
        partial[2].compared = false;
        assert_eq!(analyze(&partial).unwrap().rule, CauseRule::FirstDifference);
    }

    #[test]
    fn a_differing_leaf_is_the_cause_wherever_it_was_recorded() {
        let r =
            analyze(&[captured("layers[0]/mlp#0", false, true), captured("x", true, false), captured("w", true, true)])
                .unwrap();
        assert_eq!(r.cause.tensor, "w");
        assert_eq!(r.rule, CauseRule::Leaf);
        assert!(!r.inputs_checked);
    }

    #[test]
    fn a_leaf_that_was_not_compared_leaves_only_the_first_difference() {
        let mut x = captured("x", true, false);
        x.compared = false;
        let r = analyze(&[x, captured("n#0", false, false), captured("n#1", false, true)]).unwrap();
        assert_eq!(r.cause.tensor, "n#1");
        assert_eq!(r.rule, CauseRule::FirstDifference);
    }

    #[test]
    fn an_op_that_draws_random_numbers_is_named_by_its_record() {
        assert_eq!(random_op("1/aten.rand#0"), Some("aten.rand"));
        assert_eq!(random_op("drop/aten.native_dropout.0#3"), Some("aten.native_dropout"));
        assert_eq!(random_op("aten.bernoulli_#2"), Some("aten.bernoulli_"));
        assert_eq!(random_op("fc/aten.addmm#1"), None);
        assert_eq!(random_op("aten.randomize#1"), None, "a prefix is not a match");
    }

    #[test]
    fn nothing_differs_means_no_cause() {
        assert!(analyze(&[entry("a", &[], false)]).is_none());
    }

    #[test]
    fn under_a_tolerance_an_op_fed_by_differences_within_it_is_drift_not_a_new_cause() {
        let r = analyze(&[
            entry("x", &[], false),
            within(entry("mm", &["x"], false)),
            within(entry("relu", &["mm"], false)),
            entry("sum", &["relu"], true),
            entry("loss", &["sum"], true),
        ])
        .unwrap();
        assert_eq!((r.cause.tensor.as_str(), r.rule), ("sum", CauseRule::Drift));
        assert_eq!(r.drift_from.as_deref(), Some("mm"), "where the drift began, not the input that carries it");
        assert!(!r.inputs_checked, "its inputs are not identical");
        // A difference beyond the tolerance with bit-identical inputs is still a new cause.
        let r = analyze(&[entry("x", &[], false), entry("mm", &["x"], true)]).unwrap();
        assert_eq!((r.rule, r.drift_from), (CauseRule::RecordedInputs, None));
    }

    /// Metrics of `a` against `b` (F32).
    fn metrics(a: &[f32], b: &[f32]) -> crate::metrics::TensorMetrics {
        let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        crate::metrics::compare(DType::F32, &bytes(a), &bytes(b))
    }

    #[test]
    fn an_output_off_by_far_more_than_its_inputs_explain_is_a_new_cause_not_drift() {
        // The input is off by 2 ULPs at 1.0; the output by 1e-2 (about 84,000 ULPs): a port
        // bug (a wrong epsilon, a missing bias), named as a cause of its own with both numbers.
        let input =
            Entry { within_metrics: Some(metrics(&[1.0], &[1.0 + 2.0 * f32::EPSILON])), ..entry("x", &[], false) };
        let mut ln = entry("ln", &["x"], true);
        ln.divergence.as_mut().unwrap().metrics = Some(metrics(&[0.5], &[0.51]));
        let r = analyze(&[within(input), ln]).unwrap();
        assert_eq!((r.cause.tensor.as_str(), r.rule), ("ln", CauseRule::BeyondDrift));
        assert_eq!(r.upstream_max_abs(), Some(2.0 * f32::EPSILON as f64));

        // Off by 50 times its input's error: rounding carried through, drift.
        let input =
            Entry { within_metrics: Some(metrics(&[1.0], &[1.0 + 2.0 * f32::EPSILON])), ..entry("x", &[], false) };
        let mut mm = entry("mm", &["x"], true);
        mm.divergence.as_mut().unwrap().metrics = Some(metrics(&[1.0], &[1.0 + 100.0 * f32::EPSILON]));
        let r = analyze(&[within(input), mm]).unwrap();
        assert_eq!(r.rule, CauseRule::Drift);

        // An optimizer's update amplifies gradient noise by design: drift, however large.
        let grad = Entry { within_metrics: Some(metrics(&[1e-3], &[1.0001e-3])), ..entry("w.grad", &[], false) };
        let mut updated = entry("w.updated", &["w.grad"], true);
        let d = updated.divergence.as_mut().unwrap();
        (d.metrics, d.phase) = (Some(metrics(&[0.5], &[0.6])), Some(Phase::Update));
        let r = analyze(&[within(grad), updated]).unwrap();
        assert_eq!(r.rule, CauseRule::Drift);
    }

    #[test]
    fn under_a_tolerance_drifted_leaves_and_a_drifted_forward_pass_are_said_so() {
        // Parameters that differ within the tolerance: not "every leaf is identical".
        let r = super::analyze(
            &[captured("x", true, false), within(captured("w", true, false)), captured("mlp#0", false, true)],
            Some(1),
        )
        .unwrap();
        assert_eq!((r.cause.tensor.as_str(), r.rule), ("mlp#0", CauseRule::DriftedLeaves));
        assert_eq!((r.drift_from.as_deref(), r.drift_since), (Some("w"), Some(1)), "the cause is at step 3");
        // A forward node within the tolerance and a gradient beyond it: not the backward pass.
        let mut grad = entry("w.grad", &[], true);
        grad.divergence.as_mut().unwrap().kind = TensorKind::Gradient;
        let r = analyze(&[captured("x", true, false), within(captured("mlp#0", false, false)), grad]).unwrap();
        assert_eq!((r.cause.tensor.as_str(), r.rule), ("w.grad", CauseRule::Drift));
        assert_eq!(r.drift_from.as_deref(), Some("mlp#0"));
    }

    #[test]
    fn under_a_tolerance_a_node_after_one_that_differs_within_it_is_not_the_first_difference() {
        let r = analyze(&[
            captured("x", true, false),
            captured("w", true, false),
            within(captured("wpe#0", false, false)),
            captured("attn#24", false, true),
        ])
        .unwrap();
        assert_eq!((r.cause.tensor.as_str(), r.rule), ("attn#24", CauseRule::Drift));
        assert_eq!(r.drift_from.as_deref(), Some("wpe#0"));
        assert!(!r.inputs_checked);
    }

    #[test]
    fn a_sum_across_ranks_of_identical_shares_is_the_collective_s_order() {
        let gradient = |name: &str, inputs: &[&str], differs: bool, collective: bool| {
            let mut e = entry(name, inputs, differs);
            e.collective = collective;
            if let Some(d) = &mut e.divergence {
                d.kind = TensorKind::Gradient;
            }
            e
        };
        let r = analyze(&[
            captured("x", true, false),
            captured("w", true, false),
            captured("mlp#0", false, false),
            gradient("w.grad.local", &[], false, false),
            gradient("w.grad", &["w.grad.local"], true, true),
            gradient("b.grad.local", &[], false, false),
            gradient("b.grad", &["b.grad.local"], true, true),
        ])
        .unwrap();
        assert_eq!((r.cause.tensor.as_str(), r.rule), ("w.grad", CauseRule::Collective));
        assert_eq!(r.independent.iter().map(|d| d.tensor.as_str()).collect::<Vec<_>>(), ["b.grad"]);
        // A share that differs: the backward pass, not the collective.
        let r = analyze(&[
            captured("x", true, false),
            captured("mlp#0", false, false),
            gradient("w.grad.local", &[], true, false),
            gradient("w.grad", &["w.grad.local"], true, true),
        ])
        .unwrap();
        assert_eq!((r.cause.tensor.as_str(), r.rule), ("w.grad.local", CauseRule::Backward));
    }
}
