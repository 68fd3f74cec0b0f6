//! The comparison of one pair of steps (`DiffState::compare_step`), and what it accumulates over
//! a run: counts, the first divergence and its root cause, each tensor's history, structural
//! differences, the gaps over steps and what a tolerance allowed.

use super::step::ComparedStep;
use super::{GapPoint, StepMetrics, StructuralDifference, TensorHistory};
use crate::align::{align, scope, Pairing};
use crate::divergence::Divergence;
use crate::metrics::{compare_values, TensorMetrics};
use crate::root_cause::{analyze, CauseRule, Entry, RootCause};
use crate::tolerance::Tolerance;
use repro_trace::{TensorKind, TensorRecord, TraceError, TraceReader};
use std::collections::BTreeMap;

#[derive(Default)]
pub(super) struct DiffState {
    pub(super) steps_compared: u64,
    pub(super) tensors_compared: u64,
    pub(super) tensors_diverged: u64,
    pub(super) first: Option<Divergence>,
    pub(super) root_cause: Option<RootCause>,
    pub(super) histories: Vec<HistoryBuilder>,
    pub(super) index: BTreeMap<String, usize>,
    pub(super) by_kind: BTreeMap<TensorKind, u64>,
    pub(super) structure: Vec<StructuralDifference>,
    /// Position in `structure` of each difference, by a key naming it.
    pub(super) structure_index: BTreeMap<String, usize>,
    pub(super) tolerance: Option<Tolerance>,
    pub(super) within: u64,
    pub(super) largest_within: Option<Divergence>,
    /// The first step at which a tensor differed within the tolerance.
    pub(super) first_within_step: Option<u64>,
    pub(super) hash_only: u64,
    /// (step, tensor) pairs left out: a view in one trace, hashed by its values in the other.
    pub(super) views_unmatched: u64,
    /// Step-by-step gaps by series label (`kind:...` for every kind seen, `tensor:...` for
    /// the tensors tracked, inserted up front).
    pub(super) gaps: BTreeMap<String, Vec<GapPoint>>,
    /// Names of the tensors followed by name (`DiffOptions::track`).
    pub(super) tracked: std::collections::BTreeSet<String>,
}

pub(super) struct HistoryBuilder {
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

    pub(super) fn compare_step(
        &mut self,
        ra: &mut TraceReader,
        sa: &ComparedStep,
        rb: &mut TraceReader,
        sb: &ComparedStep,
    ) -> Result<(), TraceError> {
        self.steps_compared += 1;
        let first_divergent = self.first.is_none();
        let (torch_a, torch_b) = (records_modules(ra), records_modules(rb));
        // Module outputs one run's recorder watched and the other's did not: (scope, run) -> nodes.
        let mut unwatched: BTreeMap<(&str, &str), u64> = BTreeMap::new();
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
                        Some(_) if torch_a && is_module_output(&ta.name) => {
                            *unwatched.entry((scope(&ta.name), "a")).or_default() += 1
                        }
                        Some(_) => counts(&mut changed, scope(&ta.name)).0 += 1,
                        None => self.missing_tensor("b", &ta.name, sa.step()),
                    }
                    entries.push(Entry::new(ta, None, false));
                    continue;
                }
                Pairing::OnlyB(tb) => {
                    match tb.node {
                        Some(_) if torch_b && is_module_output(&tb.name) => {
                            *unwatched.entry((scope(&tb.name), "b")).or_default() += 1
                        }
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
        for ((scope, recorded_in), nodes) in unwatched {
            self.structural(format!("unwatched/{recorded_in}/{scope}"), || StructuralDifference::NotRecorded {
                scope: scope.to_string(),
                recorded_in: recorded_in.to_string(),
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
            if let Some(root) = &mut self.root_cause {
                // PyTorch's recorder (the Python writer) records module outputs as a step's
                // graph nodes (and at the `ops` level aten ops): code between two modules runs
                // unseen.
                let torch = torch_a || torch_b;
                let op_output = root.cause.kind == TensorKind::OpOutput;
                root.nodes_are_modules = torch && is_module_output(&root.cause.tensor);
                root.forward_unwatched = torch && !op_output && root.rule == CauseRule::IdenticalLeaves;
            }
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

    pub(super) fn missing_step(&mut self, missing_in: &str, step: u64) {
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

    /// Counts a tensor of another dtype or shape in B than in A at `step`.
    pub(super) fn mismatch(&mut self, ta: &TensorRecord, tb: &TensorRecord, step: u64) {
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
    pub(super) fn finish(mut self) -> TensorHistory {
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

/// Whether the trace `reader` reads was written by PyTorch's recorder (the Python writer), whose
/// graph nodes are the module outputs (and aten ops) it chose to watch, not a captured graph of
/// every op.
fn records_modules(reader: &TraceReader) -> bool {
    reader.header().written_by_python()
}

/// Whether a PyTorch recorder's node is a module's output (named by its module path, `#n` for a
/// later call), not an aten op's (`path/aten.op#k`, docs/pytorch.md).
fn is_module_output(name: &str) -> bool {
    !name.contains("aten.")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics(max_ulp: u64) -> TensorMetrics {
        TensorMetrics {
            max_ulp,
            max_abs: max_ulp as f64,
            ..crate::metrics::compare(repro_trace::dtype::DType::F32, &[], &[])
        }
    }

    #[test]
    fn a_histories_growth_keeps_the_first_power_of_two_distances_and_the_last() {
        let history = TensorHistory {
            name: "w".into(),
            kind: TensorKind::Weight,
            steps_compared: 0,
            steps_diverged: 0,
            first_divergent_step: None,
            growth: Vec::new(),
        };
        let mut h = HistoryBuilder { history, last: None };
        for step in 3..=13 {
            h.diverged(step, Some(metrics(step)));
        }
        let h = h.finish();
        let sampled: Vec<u64> = h.growth.iter().map(|m| m.step).collect();
        // 3, then 3 + 1, 2, 4 and 8, then the last.
        assert_eq!(sampled, [3, 4, 5, 7, 11, 13]);
        assert_eq!((h.steps_diverged, h.first_divergent_step), (11, Some(3)));
    }

    #[test]
    fn gaps_add_up_per_step_and_keep_the_largest() {
        let mut state = DiffState::default();
        state.gap("kind:weight".into(), 2, Some(metrics(3)));
        state.gap("kind:weight".into(), 2, Some(metrics(7)));
        state.gap("kind:weight".into(), 2, None);
        state.gap("kind:weight".into(), 5, Some(metrics(1)));
        let points = &state.gaps["kind:weight"];
        assert_eq!(points.len(), 2);
        assert_eq!((points[0].step, points[0].differing, points[0].max_ulp), (2, 3, Some(7)));
        assert_eq!((points[1].step, points[1].differing, points[1].max_ulp), (5, 1, Some(1)));
    }

    #[test]
    fn within_tolerance_the_largest_difference_and_the_first_step_are_kept() {
        let mut state = DiffState::default();
        let t = |name: &str| {
            TensorRecord::of_bytes(name, TensorKind::Weight, repro_trace::dtype::DType::F32, vec![1], &[0; 4])
        };
        state.within_tolerance(&t("a"), 4, metrics(2));
        state.within_tolerance(&t("b"), 6, metrics(9));
        state.within_tolerance(&t("c"), 7, metrics(5));
        assert_eq!((state.within, state.first_within_step), (3, Some(4)));
        assert_eq!(state.largest_within.as_ref().map(|d| d.tensor.as_str()), Some("b"));
    }
}
