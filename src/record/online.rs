//! Comparing a run with a reference run while it records (`RecordOptions::comparing_with`, `repro
//! record --against`). Every step is checked as soon as its records are whole. The last step
//! that matched is held back with its full values, so that when the next step diverges, the
//! step before the divergence is written in full too; once the runs diverge, or the reference
//! can no longer be read, recording goes on as if not comparing.

use super::error::RecordError;
use crate::trace::{StepCheck, StepTensor, StepVerdict};

/// A step to hand to the trace writer.
pub(crate) type StepToWrite = (u64, Vec<StepTensor>);

/// An online comparison with a reference run and its state (`RecordOptions::comparing_with`
/// makes one).
pub struct OnlineComparison {
    check: Box<dyn StepCheck>,
    stop_at_divergence: bool,
    state: State,
}

enum State {
    /// Every step so far matched; the last one is held back with its full values.
    Comparing(Option<Held>),
    /// A step diverged.
    Diverged,
    /// The reference could not be read: no more comparing.
    Abandoned,
}

struct Held {
    step: u64,
    tensors: Vec<StepTensor>,
    /// Whether the capture policy itself wanted this step's full values.
    policy_full: bool,
}

/// What checking a step decided: the steps to write now, in order, and whether the run goes on.
pub(crate) struct Checked {
    pub(crate) write: Vec<StepToWrite>,
    pub(crate) result: Result<(), RecordError>,
}

impl OnlineComparison {
    pub(crate) fn new(check: Box<dyn StepCheck>, stop_at_divergence: bool) -> Self {
        OnlineComparison { check, stop_at_divergence, state: State::Comparing(None) }
    }

    /// Whether steps are still being compared: they then keep their full values until checked,
    /// and are checked before the next one runs.
    pub(crate) fn comparing(&self) -> bool {
        matches!(self.state, State::Comparing(_))
    }

    /// Whether the run stopped at a divergence (so the trace ends early on purpose).
    pub(crate) fn stopped_the_run(&self) -> bool {
        matches!(self.state, State::Diverged) && self.stop_at_divergence
    }

    /// Checks `step`'s whole records against the reference. `policy_full`: whether the capture
    /// policy wants this step's full values (a step that matches keeps them only then).
    pub(crate) fn check(&mut self, step: u64, tensors: Vec<StepTensor>, policy_full: bool) -> Checked {
        let held = match std::mem::replace(&mut self.state, State::Abandoned) {
            State::Comparing(held) => held,
            other => {
                self.state = other;
                return Checked { write: vec![(step, tensors)], result: Ok(()) };
            }
        };
        let verdict = match self.check.check_step(step, &tensors) {
            Ok(verdict) => verdict,
            // The reference could not be read: keep the held step and this one, then stop.
            Err(e) => {
                let mut write: Vec<StepToWrite> = held.into_iter().map(Held::into_policy_wants).collect();
                write.push((step, strip(tensors, policy_full)));
                return Checked { write, result: Err(e.into()) };
            }
        };
        match verdict {
            StepVerdict::Same => {
                self.state = State::Comparing(Some(Held { step, tensors, policy_full }));
                Checked { write: held.into_iter().map(Held::into_policy_wants).collect(), result: Ok(()) }
            }
            StepVerdict::Diverged => {
                self.state = State::Diverged;
                // The step before the divergence and the diverging step, in full.
                let mut write: Vec<StepToWrite> = held.into_iter().map(|h| (h.step, h.tensors)).collect();
                write.push((step, tensors));
                let result = if self.stop_at_divergence { Err(RecordError::Diverged { step }) } else { Ok(()) };
                Checked { write, result }
            }
        }
    }

    /// The step held back, to write with the capture policy's values when recording ends.
    pub(crate) fn take_held(&mut self) -> Option<StepToWrite> {
        match &mut self.state {
            State::Comparing(held) => held.take().map(Held::into_policy_wants),
            _ => None,
        }
    }
}

impl Held {
    fn into_policy_wants(self) -> StepToWrite {
        (self.step, strip(self.tensors, self.policy_full))
    }
}

/// `tensors` without their full values unless `policy_full`.
fn strip(mut tensors: Vec<StepTensor>, policy_full: bool) -> Vec<StepTensor> {
    if !policy_full {
        for t in &mut tensors {
            t.payload = None;
        }
    }
    tensors
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{Payload, TensorKind, TensorRecord, TraceError};

    /// A reference that matches up to `diverges_at`, or cannot be read from it.
    struct Reference {
        diverges_at: u64,
        unreadable: bool,
    }

    impl StepCheck for Reference {
        fn check_step(&mut self, step: u64, _: &[StepTensor]) -> Result<StepVerdict, TraceError> {
            match step {
                s if s < self.diverges_at => Ok(StepVerdict::Same),
                _ if self.unreadable => Err(TraceError::NotATrace { path: "ref".into(), reason: "gone".into() }),
                _ => Ok(StepVerdict::Diverged),
            }
        }
    }

    fn step_tensors() -> Vec<StepTensor> {
        let record = TensorRecord {
            in_payload: true,
            ..TensorRecord::of_bytes("w", TensorKind::Weight, crate::dtype::DType::U8, vec![1], &[7])
        };
        vec![StepTensor { record, payload: Some(Payload::Bytes(vec![7])) }]
    }

    fn written(checked: &Checked) -> Vec<(u64, bool)> {
        checked.write.iter().map(|(step, t)| (*step, t[0].payload.is_some())).collect()
    }

    #[test]
    fn a_match_is_held_back_and_a_divergence_writes_the_step_before_it_in_full() {
        let mut online = OnlineComparison::new(Box::new(Reference { diverges_at: 2, unreadable: false }), true);
        assert!(written(&online.check(0, step_tensors(), false)).is_empty(), "step 0 held back");
        let one = online.check(1, step_tensors(), false);
        assert_eq!(written(&one), [(0, false)], "step 0 written as the policy wants: hashes only");
        let two = online.check(2, step_tensors(), false);
        assert_eq!(written(&two), [(1, true), (2, true)], "the step before and the diverging one in full");
        assert!(matches!(two.result, Err(RecordError::Diverged { step: 2 })));
        assert!(!online.comparing() && online.stopped_the_run());
        assert!(online.take_held().is_none());
        // Past the divergence, steps are written as they come.
        assert_eq!(written(&online.check(3, step_tensors(), false)), [(3, true)]);
    }

    #[test]
    fn an_unreadable_reference_ends_the_comparison_not_the_run() {
        let mut online = OnlineComparison::new(Box::new(Reference { diverges_at: 1, unreadable: true }), true);
        let _ = online.check(0, step_tensors(), true);
        let one = online.check(1, step_tensors(), false);
        assert_eq!(written(&one), [(0, true), (1, false)]);
        assert!(one.result.is_err());
        assert!(!online.comparing() && !online.stopped_the_run());
        let mut kept = OnlineComparison::new(Box::new(Reference { diverges_at: 9, unreadable: false }), false);
        let _ = kept.check(0, step_tensors(), false);
        assert_eq!(kept.take_held().map(|(step, t)| (step, t[0].payload.is_some())), Some((0, false)));
    }
}
