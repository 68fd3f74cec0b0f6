//! The report `repro record --against` prints when a step diverges from the reference.

use crate::diff::write_root_cause;
use repro_diff::OnlineDivergence;
use std::fmt::Write;

/// Renders an online divergence for people; `trace` is the run being recorded.
pub fn render_online(d: &OnlineDivergence, reference: &str, trace: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "DIVERGED  step {} differs from the reference {reference}", d.step);
    for line in &d.structure {
        let _ = writeln!(out, "  {line}");
    }
    if let Some(root) = &d.root_cause {
        let _ = write_root_cause(&mut out, root);
    }
    let ours: Vec<String> = d.reference_values.iter().map(|(s, _)| s.to_string()).collect();
    if !ours.is_empty() {
        let _ = writeln!(out, "\n{trace} stores full values for step(s) {}.", ours.join(" and "));
        for (step, has) in &d.reference_values {
            let what = if *has { "full values" } else { "only hashes" };
            let _ = writeln!(out, "the reference stores {what} at step {step}");
        }
    }
    let _ = writeln!(out, "compare them with: repro diff {reference} {trace}");
    out
}
