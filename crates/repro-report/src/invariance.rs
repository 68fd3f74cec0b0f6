//! The human-readable `repro invariance` report: one line per batching, then the classes of
//! batchings that agree.

use crate::diff::metrics_sentence;
use crate::format::shape;
use repro_diff::invariance::{ForwardCostReport, InvarianceReport};
use std::fmt::Write;

/// Renders a batch-invariance check for people.
pub fn render_invariance(r: &InvarianceReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "batch invariance: {} on {}", r.subject, r.device);
    let _ = writeln!(
        out,
        "one sequence of {} tokens, alone (batch {}) as the reference, then at the first and last row of larger batches \
         (B@row), alone followed by padding tokens (1+P), and alone in pieces against the KV cache (decode: one token \
         per pass; chunkN: N tokens per pass)\n",
        r.tokens, r.reference
    );
    if r.parameters_reached < r.parameters {
        let _ = writeln!(
            out,
            "note: the graph behind the logits reaches {} of {} parameters (an op without a backward pass, such as a fused \
             norm, cuts what candle exposes); ops above the cut are not compared, so a difference that starts there \
             shows first in the ops below it\n",
            r.parameters_reached, r.parameters
        );
    }
    let label_width = super::format::column_width(r.results.iter().map(|b| b.batching.to_string().len()), 8);
    for b in &r.results {
        let label = b.batching.to_string();
        if let Some(error) = &b.error {
            let _ = writeln!(out, "  {label:<label_width$}  FAILED  {error}");
            continue;
        }
        if let (Some(why), true) = (&b.ops_skipped, b.logits_identical) {
            let _ = writeln!(out, "  {label:<label_width$}  identical logits; ops not compared: {why}");
            continue;
        }
        if b.logits_identical && b.ops_differing == 0 {
            let _ = writeln!(out, "  {label:<label_width$}  identical ({} ops compared)", b.ops_compared);
            continue;
        }
        let logits = match &b.logits {
            Some(m) => format!("logits differ: {}", metrics_sentence(m)),
            None => "logits identical".into(),
        };
        let _ = writeln!(out, "  {label:<label_width$}  {logits}");
        if let Some(op) = &b.first_op {
            let at = op.at_token.map(|t| format!(", pass from token {t}")).unwrap_or_default();
            let _ = writeln!(
                out,
                "  {:<label_width$}  first op that differs: `{}` (node {}{at}, {} {}): {} ({} of {} ops differ)",
                "",
                op.name,
                op.position,
                op.dtype,
                shape(&op.shape),
                metrics_sentence(&op.metrics),
                b.ops_differing,
                b.ops_compared
            );
        }
        if let Some(why) = &b.ops_skipped {
            let _ = writeln!(out, "  {:<label_width$}  ops not compared: {why}", "");
        }
        if !b.unmatched.is_empty() {
            let _ = writeln!(
                out,
                "  {:<label_width$}  {} op(s) not compared (no counterpart in the reference, or no part to cut)",
                "",
                b.unmatched.len()
            );
        }
    }
    let classes: Vec<String> = r
        .classes
        .iter()
        .map(|c| format!("{{{}}}", c.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")))
        .collect();
    let _ = writeln!(out, "\nbatchings with bit-identical logits: {}", classes.join(" "));
    if r.failed() > 0 {
        let _ = writeln!(
            out,
            "\nINCOMPLETE  the model failed to run {} of {} batchings (above); the others are compared",
            r.failed(),
            r.results.len()
        );
    } else if r.invariant() {
        let _ = writeln!(
            out,
            "\nINVARIANT  the sequence's logits are bit-identical in all {} batchings",
            r.results.len() + 1
        );
    } else {
        let varying = r.results.iter().filter(|b| !b.logits_identical).count();
        let _ = writeln!(
            out,
            "\nNOT INVARIANT  the sequence's logits depend on its batch in {varying} of {} batchings",
            r.results.len()
        );
    }
    out
}

/// Renders the cost of batch-invariant kernels: one row per batch size.
pub fn render_forward_cost(r: &ForwardCostReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "forward pass cost of batch-invariant kernels: {} on {}", r.subject, r.device);
    let _ = writeln!(
        out,
        "(median of {} timed passes, each waited for; max |Δ| compares the two kernels' logits)\n",
        r.passes
    );
    let _ = writeln!(
        out,
        "  {:>6}  {:>6}  {:>12}  {:>16}  {:>7}  {:>9}",
        "batch", "tokens", "default ms", "invariant ms", "ratio", "max |Δ|"
    );
    for c in &r.costs {
        let _ = writeln!(
            out,
            "  {:>6}  {:>6}  {:>12.3}  {:>16.3}  {:>6.2}x  {:>9}",
            c.batch,
            c.tokens,
            c.default_ms,
            c.invariant_ms,
            c.invariant_ms / c.default_ms,
            super::format::sci(c.max_abs_diff)
        );
    }
    out
}
