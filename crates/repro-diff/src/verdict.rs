//! The one answer every comparing command gives: whether two runs are the same, and how sure
//! that is. `diff`, `bisect`, `record --against` and `gate` read their exit code and their JSON
//! `verdict` from here, so no command can print one verdict and exit with another.

use crate::ranks::RunDiff;
use crate::traces::TraceDiff;
use serde::Serialize;

/// How a comparison of two runs ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Both runs finished and recorded the same tensors with the same bits at the same steps.
    Identical,
    /// Some bits differ, but no difference exceeds the tolerance asked for.
    WithinTolerance,
    /// Values, structure (steps or tensors recorded) or replicas differ.
    Diverged,
    /// Every step compared agrees, but a trace or a rank did not finish: no verdict on the rest.
    Incomplete,
    /// Everything compared agrees, but some tensors could not be compared: both runs recorded
    /// them in forms whose hashes say nothing of each other (shards against wholes, a view
    /// against a plain tensor, hashes only), or one run recorded captured nodes the other did
    /// not watch (a compiled model's modules). No verdict on those.
    Unverified,
}

impl Verdict {
    /// The verdict as JSON and scripts name it.
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Identical => "identical",
            Verdict::WithinTolerance => "within_tolerance",
            Verdict::Diverged => "diverged",
            Verdict::Incomplete => "incomplete",
            Verdict::Unverified => "unverified",
        }
    }

    /// Whether the runs count as the same (exit 0): identical, or within the tolerance asked for.
    pub fn is_same(self) -> bool {
        matches!(self, Verdict::Identical | Verdict::WithinTolerance)
    }
}

impl RunDiff {
    /// The verdict on the compared runs: the traces' own, unless a run's replicas drifted
    /// (diverged) or a rank did not finish (incomplete).
    pub fn verdict(&self) -> Verdict {
        let traces = self.diff.verdict();
        if traces == Verdict::Diverged || self.replicas.iter().any(|r| r.drift.is_some()) {
            Verdict::Diverged
        } else if traces == Verdict::Incomplete || self.replicas.iter().any(|r| !r.unfinished.is_empty()) {
            Verdict::Incomplete
        } else {
            traces
        }
    }
}

impl TraceDiff {
    /// The verdict on the two traces alone (a run of ranks adds its replicas: `RunDiff::verdict`).
    /// What differs comes first, then what was not read (an unfinished trace), then what was
    /// read and not compared.
    pub fn verdict(&self) -> Verdict {
        if !self.agrees_so_far() {
            Verdict::Diverged
        } else if !(self.a.complete && self.b.complete) {
            Verdict::Incomplete
        } else if self.not_compared > 0 || !self.structure.is_empty() {
            // What remains of the structure are nodes one run recorded and the other did not.
            Verdict::Unverified
        } else if self.tolerance.is_some() {
            Verdict::WithinTolerance
        } else {
            Verdict::Identical
        }
    }
}
