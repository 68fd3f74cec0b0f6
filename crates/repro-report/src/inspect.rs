//! The human-readable `repro inspect` report.

use crate::format::{bytes, missing_gradients, shape, step_list};
use repro_trace::TraceSummary;
use std::fmt::Write;

/// Renders a trace summary for people.
pub fn render_summary(s: &TraceSummary) -> String {
    let mut out = String::new();
    let h = &s.header;
    let e = &h.environment;
    let status = match &s.incomplete_reason {
        None => "complete".to_string(),
        Some(why) => format!("INCOMPLETE: {why}"),
    };
    let _ = writeln!(out, "trace      {}", s.path);
    let _ = writeln!(out, "format     {} (written by {})", s.format, h.producer);
    let _ = writeln!(out, "status     {status}");
    let _ = writeln!(out, "\nrun");
    let _ = writeln!(out, "  workload       {}", h.run.workload);
    if let Some(n) = h.run.steps {
        let _ = writeln!(out, "  steps          {n}");
    }
    for (k, v) in &h.run.params {
        let _ = writeln!(out, "  {k:<14} {v}");
    }
    let _ = writeln!(out, "\nenvironment");
    // A PyTorch recorder's header keeps torch's version where candle's goes (`torch 2.11.0`),
    // and no compiler.
    let framework = match e.candle_version.strip_prefix("torch ") {
        Some(torch) => ("torch", torch.to_string()),
        None => ("candle", e.candle_version.clone()),
    };
    let rows = [
        ("device", format!("{} ({})", e.device, e.device_name)),
        ("cpu", e.cpu_model.clone()),
        ("os", e.os.clone()),
        ("threads", e.threads.to_string()),
        ("repro", e.repro_version.clone()),
        framework,
        ("rustc", e.rustc.clone()),
    ];
    for (k, v) in rows.into_iter().filter(|(_, v)| !v.is_empty()) {
        let _ = writeln!(out, "  {k:<14} {v}");
    }
    for (k, v) in &e.env {
        let _ = writeln!(out, "  {k:<14} {v}");
    }
    let _ = writeln!(
        out,
        "\ncapture    full tensors: {}; inline up to {} bytes; data hash {}",
        h.capture.full,
        h.capture.inline_max_bytes,
        h.data_hash.name()
    );
    if h.capture.modules.is_some() || h.capture.ops.is_some() {
        let level = |p: &Option<repro_trace::FullCapture>| p.as_ref().map_or("(unset)".to_string(), |p| p.to_string());
        let _ = writeln!(
            out,
            "levels     every step's state; module outputs at {}; op outputs at {}",
            level(&h.capture.modules),
            level(&h.capture.ops)
        );
    }
    let range = match (s.first_step, s.last_step) {
        (Some(a), Some(b)) => format!("{} steps ({a} to {b})", s.steps),
        _ => "no steps".into(),
    };
    let _ = writeln!(out, "steps      {range}");
    let _ =
        writeln!(out, "full steps {}", if s.full_steps.is_empty() { "none".into() } else { step_list(&s.full_steps) });
    if !s.tensors.is_empty() {
        let width = super::format::column_width(s.tensors.iter().map(|t| t.name.len()), 6);
        let _ = writeln!(out, "\ntensors per step, in recording order");
        let _ = writeln!(
            out,
            "  {:<width$}  {:<10}  {:<8}  {:<5}  {:<14}  {:>10}  inputs",
            "name", "kind", "phase", "dtype", "shape", "size"
        );
        for t in &s.tensors {
            let phase = t.phase.map_or("-", |p| p.name());
            // A view's values are its owner's, read through its layout (format 1.5).
            let inputs = match &t.view_of {
                Some(owner) => format!("view of {owner}"),
                None => t.inputs.join(", "),
            };
            // A rank's block of a sharded tensor (format 1.7), and of a sum across the ranks (1.8).
            let inputs = match (&t.shard, &t.reduce_scatter) {
                (None, _) => inputs,
                (Some(block), sum) => {
                    let of = match sum {
                        Some(op) => format!("a reduce-scatter ({op}) of {inputs}: "),
                        None if inputs.is_empty() => String::new(),
                        None => format!("{inputs}; "),
                    };
                    format!("{of}block at {} of {}", shape(&block.offset), shape(&block.whole))
                }
            };
            // Where a captured node's scope was opened: the user's code to look at.
            let inputs = match &t.source {
                Some(source) if inputs.is_empty() => format!("at {source}"),
                Some(source) => format!("{inputs}; at {source}"),
                None => inputs,
            };
            let line = format!(
                "  {:<width$}  {:<10}  {:<8}  {:<5}  {:<14}  {:>10}  {}",
                t.name,
                t.kind.name(),
                phase,
                t.dtype.name(),
                shape(&t.shape),
                bytes(t.bytes),
                inputs
            );
            let _ = writeln!(out, "{}", line.trim_end());
        }
    }
    if !s.no_gradient.is_empty() {
        let _ = writeln!(
            out,
            "\nno gradient {} trainable parameter(s) that backpropagation never reached (an op without a \
             backward pass, or unused by the loss): {}",
            s.no_gradient.len(),
            missing_gradients(&s.no_gradient)
        );
    }
    let _ = writeln!(out, "\nsize       records {}, payloads {}", bytes(s.records_bytes), bytes(s.payload_bytes));
    out
}
