//! Online comparison: checking each step against a reference trace while it is recorded
//! (`repro record --against RUN`). Implements the trace module's `StepCheck` hook, so the
//! recorder needs no knowledge of diffing.

use crate::align::{align, Pairing};
use crate::divergence::Divergence;
use crate::metrics::compare_values;
use crate::root_cause::{analyze, Entry, RootCause};
use repro_trace::{Payload, StepCheck, StepRecord, StepTensor, StepVerdict, TensorValues, TraceError, TraceReader};
use serde::Serialize;
use std::path::Path;

/// Compares recorded steps with a reference trace, step by step.
pub struct ReferenceCheck {
    reader: TraceReader,
    next: Option<StepRecord>,
    steps_checked: u64,
    divergence: Option<OnlineDivergence>,
}

/// The first step found to differ from the reference.
#[derive(Debug, Clone, Serialize)]
pub struct OnlineDivergence {
    /// The step.
    pub step: u64,
    /// Root cause and consequences within the step (`None` when the reference lacks the step).
    pub root_cause: Option<RootCause>,
    /// What differs in the structure of the step (tensors only in one run, other shapes), or
    /// that the reference has no such step.
    pub structure: Vec<String>,
    /// Whether the reference stored full values at this step and the step before.
    pub reference_values: Vec<(u64, bool)>,
}

impl ReferenceCheck {
    /// Opens the reference trace, for a recording whose tensors are hashed with `recording`
    /// (refused when the reference's data hash is another: no hash would agree).
    pub fn open(dir: &Path, recording: repro_trace::DataHash) -> Result<Self, TraceError> {
        let mut reader = TraceReader::open(dir)?;
        let reference = reader.header().data_hash;
        if reference != recording {
            return Err(TraceError::DataHashesDiffer {
                a: dir.to_path_buf(),
                a_kind: reference,
                b: "the run being recorded".into(),
                b_kind: recording,
            });
        }
        let next = reader.next_step()?;
        Ok(ReferenceCheck { reader, next, steps_checked: 0, divergence: None })
    }

    /// The reference trace's header (its run settings and environment).
    pub fn header(&self) -> &repro_trace::Header {
        self.reader.header()
    }

    /// Steps compared so far.
    pub fn steps_checked(&self) -> u64 {
        self.steps_checked
    }

    /// The first divergence, once found.
    pub fn divergence(&self) -> Option<&OnlineDivergence> {
        self.divergence.as_ref()
    }

    /// Moves the reference forward to `step`; returns its record if it has that step.
    fn reference_step(&mut self, step: u64) -> Result<Option<StepRecord>, TraceError> {
        while self.next.as_ref().is_some_and(|r| r.step < step) {
            self.next = self.reader.next_step()?;
        }
        Ok(self.next.clone().filter(|r| r.step == step))
    }
}

impl StepCheck for ReferenceCheck {
    fn check_step(&mut self, step: u64, tensors: &[StepTensor]) -> Result<StepVerdict, TraceError> {
        let previous_had_values = self.next.as_ref().filter(|r| r.step + 1 == step).map(|r| r.payload.is_some());
        let Some(reference) = self.reference_step(step)? else {
            self.divergence = Some(OnlineDivergence {
                step,
                root_cause: None,
                structure: vec![format!("the reference has no step {step}")],
                reference_values: vec![],
            });
            return Ok(StepVerdict::Diverged);
        };
        self.steps_checked += 1;
        let ours: Vec<_> = tensors.iter().map(|t| t.record.clone()).collect();
        let mut entries = Vec::new();
        let mut structure = Vec::new();
        for pairing in align(&ours, &reference.tensors) {
            let (mine, theirs) = match pairing {
                Pairing::Same(a, b) => (a, b),
                Pairing::Renamed(a, b) | Pairing::Moved(a, b) => {
                    structure.push(format!("`{}` is `{}` in the reference", a.name, b.name));
                    (a, b)
                }
                Pairing::OnlyA(a) => {
                    structure.push(format!("`{}` is not in the reference", a.name));
                    continue;
                }
                Pairing::OnlyB(b) => {
                    structure.push(format!("`{}` is only in the reference", b.name));
                    continue;
                }
            };
            if mine.view.is_some() != theirs.view.is_some() {
                // A view in one run and hashed by its values in the other (a reference recorded
                // before format 1.5): the hashes say nothing of each other; its owner is compared.
                entries.push(Entry::new(mine, None, false));
                continue;
            }
            if mine.dtype != theirs.dtype || mine.shape != theirs.shape {
                structure.push(format!("`{}` has another dtype or shape than in the reference", mine.name));
                entries.push(Entry::new(mine, None, false));
                continue;
            }
            let divergence = (mine.hash != theirs.hash).then(|| -> Result<Divergence, TraceError> {
                let my_values = tensors
                    .iter()
                    .find(|t| t.record.name == mine.name)
                    .and_then(|t| t.record.inline.as_deref().or(t.payload.as_ref().and_then(Payload::bytes)));
                let metrics = match (my_values, self.reader.values(&reference, theirs)?) {
                    (Some(a), Some(b)) => {
                        Some(compare_values(&TensorValues::in_memory(mine.dtype, mine.shape.clone(), a), &b))
                    }
                    _ => None,
                };
                Ok(Divergence::of(mine, step, metrics))
            });
            let divergence = divergence.transpose()?;
            entries.push(Entry::new(mine, divergence, true));
        }
        let root_cause = analyze(&entries, None);
        if root_cause.is_none() && structure.is_empty() {
            return Ok(StepVerdict::Same);
        }
        let mut reference_values = Vec::new();
        if let Some(had) = previous_had_values {
            reference_values.push((step - 1, had));
        }
        reference_values.push((step, reference.payload.is_some()));
        self.divergence = Some(OnlineDivergence { step, root_cause, structure, reference_values });
        Ok(StepVerdict::Diverged)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use repro_trace::dtype::DType;
    use repro_trace::view::view_hash;
    use repro_trace::{CapturePolicy, Header, TensorKind, TensorRecord, TraceWriter, ViewOf, CURRENT_FORMAT};

    /// A reference that hashed a node by its values (recorded before format 1.5) and a run that
    /// records the same node as a view of a weight: the pair is left out, not a divergence; a
    /// node that is a view in both is compared by its derived hash.
    #[test]
    fn a_node_that_is_a_view_in_one_run_only_is_not_compared() {
        let weight = TensorRecord::of_bytes("w", TensorKind::Weight, DType::F32, vec![2, 2], &[1; 16]);
        let by_values = TensorRecord {
            node: Some(1),
            ..TensorRecord::of_bytes("w.t", TensorKind::OpOutput, DType::F32, vec![2, 2], &[1; 16])
        };
        let view = ViewOf { of: "w".into(), offset: 0, strides: vec![1, 2] };
        let as_view = TensorRecord {
            hash: view_hash(DType::F32, &[2, 2], &weight.hash, 0, &view.strides),
            view: Some(view),
            ..by_values.clone()
        };
        let dir = tempfile::tempdir().unwrap();
        let header = Header {
            format: CURRENT_FORMAT,
            producer: "test".into(),
            run: Default::default(),
            environment: Default::default(),
            capture: CapturePolicy::default(),
            distributed: None,
            data_hash: Default::default(),
        };
        let mut w = TraceWriter::create(dir.path(), &header, false).unwrap();
        let step = |records: &[&TensorRecord]| -> Vec<StepTensor> {
            records.iter().map(|&r| StepTensor { record: r.clone(), payload: None }).collect()
        };
        w.write_step(0, step(&[&weight, &by_values])).unwrap();
        w.write_step(1, step(&[&weight, &as_view])).unwrap();
        w.finish().unwrap();
        let mut check = ReferenceCheck::open(dir.path(), repro_trace::DataHash::Blake3).unwrap();
        assert_eq!(check.check_step(0, &step(&[&weight, &as_view])).unwrap(), StepVerdict::Same);
        let moved = TensorRecord { hash: weight.hash, ..as_view.clone() };
        assert_eq!(check.check_step(1, &step(&[&weight, &moved])).unwrap(), StepVerdict::Diverged);
    }
}
