//! The human-readable `repro matrix` report: one N×N table per tensor.

use crate::format::sci;
use repro_diff::{MatrixReport, Metric};
use std::fmt::Write;

/// Renders error matrices for people.
pub fn render_matrix(r: &MatrixReport) -> String {
    let mut out = String::new();
    let what = match r.metric {
        Metric::SumAbs => "sum |a-b|",
        Metric::MaxAbs => "max |a-b|",
        Metric::Ulp => "max ULP distance",
        Metric::Mismatch => "elements that differ",
    };
    let _ = writeln!(out, "step {}: {what} between every two runs", r.step);
    for (i, run) in r.runs.iter().enumerate() {
        let _ = writeln!(out, "  r{i}  {run}");
    }
    for m in &r.matrices {
        let cells: Vec<Vec<String>> = m
            .values
            .iter()
            .map(|row| {
                row.iter()
                    .map(|&v| match r.metric {
                        Metric::Ulp | Metric::Mismatch => format!("{v}"),
                        _ => sci(v),
                    })
                    .collect()
            })
            .collect();
        let width = super::format::column_width(
            cells.iter().flatten().map(String::len),
            format!("r{}", r.runs.len() - 1).len(),
        );
        let _ = writeln!(out, "\n{}", m.tensor);
        let mut header = format!("{:>w$}", "", w = 4);
        for j in 0..r.runs.len() {
            let _ = write!(header, "  {:>width$}", format!("r{j}"));
        }
        let _ = writeln!(out, "{}", header.trim_end());
        for (i, row) in cells.iter().enumerate() {
            let mut line = format!("{:>4}", format!("r{i}"));
            for cell in row {
                let _ = write!(line, "  {cell:>width$}");
            }
            let _ = writeln!(out, "{line}");
        }
        match (&r.tolerance, m.bit_identical) {
            (_, true) => {
                let _ = writeln!(out, "  (all runs bit-identical)");
            }
            (Some(t), false) if m.beyond_tolerance.is_empty() => {
                let _ = writeln!(out, "  (every pair within {t})");
            }
            (Some(t), false) => {
                let pairs: Vec<String> = m.beyond_tolerance.iter().map(|[i, j]| format!("r{i}-r{j}")).collect();
                let _ = writeln!(out, "  beyond {t}: {}", pairs.join(", "));
            }
            (None, false) if m.values.iter().flatten().all(|&v| v == 0.0) => {
                let _ = writeln!(out, "  (every cell is 0, but the bits differ: +0 against -0)");
            }
            (None, false) => {}
        }
    }
    if !r.not_compared.is_empty() {
        let _ = writeln!(
            out,
            "\n{} tensor(s) not compared at step {}: sharded otherwise in one run than in another, without every \
             block's values (record with `--capture steps:{}` to compare them whole): {}",
            r.not_compared.len(),
            r.step,
            r.step,
            r.not_compared.join(", ")
        );
    }
    if !r.hash_only.is_empty() {
        let names = |identical: bool| -> Vec<&str> {
            r.hash_only.iter().filter(|h| h.identical == identical).map(|h| h.tensor.as_str()).collect()
        };
        let _ = writeln!(
            out,
            "\n{} tensor(s) stored as hashes only at step {} (record with `--capture steps:{}` to compare values):",
            r.hash_only.len(),
            r.step,
            r.step
        );
        for (identical, label) in [(true, "same hash in every run"), (false, "hashes differ")] {
            let list = names(identical);
            if !list.is_empty() {
                let _ = writeln!(out, "  {label}: {}", list.join(", "));
            }
        }
    }
    out
}
