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
}

impl Verdict {
    /// The verdict as JSON and scripts name it.
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Identical => "identical",
            Verdict::WithinTolerance => "within_tolerance",
            Verdict::Diverged => "diverged",
            Verdict::Incomplete => "incomplete",
        }
    }

    /// Whether the runs count as the same (exit 0): identical, or within the tolerance asked for.
    pub fn is_same(self) -> bool {
        matches!(self, Verdict::Identical | Verdict::WithinTolerance)
    }
}

impl RunDiff {
    /// The verdict on the compared runs.
    pub fn verdict(&self) -> Verdict {
        if self.is_identical() {
            match self.diff.tolerance {
                None => Verdict::Identical,
                Some(_) => Verdict::WithinTolerance,
            }
        } else if self.is_incomplete() {
            Verdict::Incomplete
        } else {
            Verdict::Diverged
        }
    }
}

impl TraceDiff {
    /// The verdict on the two traces alone (a run of ranks adds its replicas: `RunDiff::verdict`).
    pub fn verdict(&self) -> Verdict {
        match (self.is_identical(), self.agrees_so_far(), &self.tolerance) {
            (true, _, None) => Verdict::Identical,
            (true, _, Some(_)) => Verdict::WithinTolerance,
            (false, true, _) => Verdict::Incomplete,
            (false, false, _) => Verdict::Diverged,
        }
    }
}
