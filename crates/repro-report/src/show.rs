//! `repro show`: one tensor's values at one step, or the list of a step's tensors.

use crate::format::{column_width, exact, sci, shape};
use repro_diff::TensorStats;
use repro_trace::TensorRecord;
use std::fmt::Write;

/// One tensor's statistics and first values.
pub fn render_tensor(trace: &str, step: u64, tensor: &TensorRecord, stats: &TensorStats) -> String {
    let mut out = String::new();
    let opt = |x: Option<f64>| x.map_or("-".to_string(), sci);
    let _ = writeln!(
        out,
        "`{}` ({}) at step {step} of {trace}: {} {}, {} elements",
        tensor.name,
        tensor.kind,
        tensor.dtype,
        shape(&tensor.shape),
        stats.elements
    );
    if let Some(source) = &tensor.source {
        let _ = writeln!(out, "  recorded in the scope opened at {source}");
    }
    if let Some(block) = &tensor.shard {
        let sum = tensor.reduce_scatter.as_ref().map_or(String::new(), |op| {
            format!(", this rank's part of a reduce-scatter ({op}) of `{}`", tensor.inputs.join("`, `"))
        });
        let _ = writeln!(
            out,
            "  a shard: this rank's block at {} of the whole {}{sum}; the values below are the block's",
            shape(&block.offset),
            shape(&block.whole)
        );
    }
    let _ = writeln!(
        out,
        "  min {}  max {}  mean {}  std {}",
        opt(stats.min),
        opt(stats.max),
        opt(stats.mean),
        opt(stats.std)
    );
    let _ = writeln!(out, "  nan {}  inf {}  zeros {}", stats.nan, stats.infinite, stats.zeros);
    let first: Vec<String> = stats.first.iter().map(|&x| exact(x, tensor.dtype)).collect();
    let more = if (stats.first.len() as u64) < stats.elements { ", ..." } else { "" };
    let _ = writeln!(out, "  values: {}{more}", first.join(", "));
    out
}

/// The tensors of one step, and whether their values are stored.
pub fn render_step_tensors(trace: &str, step: u64, tensors: &[(TensorRecord, bool)]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "step {step} of {trace}: {} tensors", tensors.len());
    let width = column_width(tensors.iter().map(|(t, _)| t.name.len()), 6);
    let _ = writeln!(out, "  {:<width$}  {:<10}  {:<5}  {:<16}  values", "tensor", "kind", "dtype", "shape");
    for (t, stored) in tensors {
        let _ = writeln!(
            out,
            "  {:<width$}  {:<10}  {:<5}  {:<16}  {}",
            t.name,
            t.kind.name(),
            t.dtype.to_string(),
            shape(&t.shape),
            if *stored { "stored" } else { "hash only" }
        );
    }
    out
}

/// One tensor of two traces at one step, side by side: how they differ, then the first elements
/// of each with the ULPs between them.
pub fn render_tensor_pair(
    traces: (&str, &str),
    step: u64,
    tensor: &TensorRecord,
    metrics: &repro_diff::TensorMetrics,
    pairs: &[repro_diff::ElementPair],
) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "`{}` ({}) at step {step}: {} {}\n  A  {}\n  B  {}",
        tensor.name,
        tensor.kind,
        tensor.dtype,
        shape(&tensor.shape),
        traces.0,
        traces.1
    );
    let _ = match metrics.mismatched {
        0 => writeln!(out, "  identical: {} elements, bit for bit", metrics.elements),
        _ => writeln!(out, "  {}", crate::diff::metrics_sentence(metrics)),
    };
    let a: Vec<String> = pairs.iter().map(|p| exact(p.a, tensor.dtype)).collect();
    let b: Vec<String> = pairs.iter().map(|p| exact(p.b, tensor.dtype)).collect();
    let width = column_width(a.iter().chain(&b).map(String::len), 1);
    let _ = writeln!(out, "  {:>7}  {:>width$}  {:>width$}  ulps", "element", "A", "B");
    for (i, ((x, y), p)) in a.iter().zip(&b).zip(pairs).enumerate() {
        let _ = writeln!(out, "  {i:>7}  {x:>width$}  {y:>width$}  {}", p.ulps);
    }
    out
}
