//! Tables of the studies' results: plain text for the terminal, Markdown for docs/results.

use crate::format::sci;
use repro_diff::study::results::{CostReport, DevicesReport, NoiseReport, OrderReport};
use std::fmt::Write;

fn pct(x: f64) -> String {
    format!("{:.2}%", x * 100.0)
}

/// Renders rows as an aligned text table (`markdown`: a Markdown table).
fn table(header: &[&str], rows: &[Vec<String>], markdown: bool) -> String {
    let mut out = String::new();
    if markdown {
        let _ = writeln!(out, "| {} |", header.join(" | "));
        let _ = writeln!(out, "|{}", "---|".repeat(header.len()));
        for row in rows {
            let _ = writeln!(out, "| {} |", row.join(" | "));
        }
        return out;
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|c| super::format::column_width(rows.iter().map(|r| r[c].chars().count()).chain([header[c].len()]), 0))
        .collect();
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        padded.join("  ").trim_end().to_string()
    };
    let _ = writeln!(out, "  {}", line(header.to_vec()));
    for row in rows {
        let _ = writeln!(out, "  {}", line(row.iter().map(String::as_str).collect()));
    }
    out
}

/// The noise study's table and the implementation share of the accuracy spread.
pub fn render_noise(r: &NoiseReport, markdown: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "noise study: {} on {}, {} runs per variant, {} test examples\n",
        r.subject, r.device, r.runs, r.test_examples
    );
    let header = [
        "variant",
        "seeds",
        "reductions",
        "accuracy mean ± sd",
        "min – max",
        "churn",
        "L2 (normalized w)",
        "class sd max",
        "class sd mean",
    ];
    let rows: Vec<Vec<String>> = r
        .variants
        .iter()
        .map(|v| {
            let s = &v.stats;
            vec![
                v.variant.to_string(),
                if v.seeds_vary { "vary" } else { "fixed" }.to_string(),
                v.reductions.clone(),
                format!("{} ± {}", pct(s.accuracy_mean), pct(s.accuracy_stdev)),
                format!("{} – {}", pct(s.accuracy_min), pct(s.accuracy_max)),
                pct(s.churn),
                sci(s.l2_normalized),
                pct(s.per_class_stdev_max),
                pct(s.per_class_stdev_mean),
            ]
        })
        .collect();
    out.push_str(&table(&header, &rows, markdown));
    out.push('\n');
    match r.impl_share_of_accuracy_stdev {
        Some(share) => {
            let _ = writeln!(
                out,
                "implementation share of the accuracy spread: sd(impl) / sd(algo+impl) = {share:.2} (the published ResNet-18 study measured 0.74)"
            );
        }
        None => {
            let _ = writeln!(
                out,
                "implementation share of the accuracy spread: undefined (algo+impl runs all scored the same)"
            );
        }
    }
    if let Some(control) = r.variants.iter().find(|v| v.variant == "control") {
        let s = &control.stats;
        // Identical final weights give a distance of exactly 0; any difference a positive one.
        let verdict = if s.l2_normalized.is_nan() || s.accuracy_mean.is_nan() {
            "control runs cannot be compared: training diverged (NaN weights or accuracy); lower the learning rate"
        } else if s.accuracy_min == s.accuracy_max && s.churn == 0.0 && s.l2_normalized == 0.0 {
            "control runs agree exactly: with fixed seeds and ordered reductions training is reproducible here"
        } else {
            "control runs DIFFER: something besides the seeds and the reductions is non-deterministic here"
        };
        let _ = writeln!(out, "{verdict}");
    }
    if !r.subgroups.is_empty() {
        render_subgroups(&mut out, r, markdown);
    }
    out
}

/// The spread within each sub-group, per variant: standard deviations over the runs, each
/// with its multiple of the whole test set's.
fn render_subgroups(out: &mut String, r: &NoiseReport, markdown: bool) {
    let _ = writeln!(
        out,
        "\nspread by sub-group: standard deviation over runs of the error rate, false-positive rate (FPR) and false-negative rate (FNR), and its multiple of the spread over all test examples"
    );
    let with_ratio = |sd: f64, ratio: Option<f64>| match ratio {
        Some(x) => format!("{} ({x:.1}x)", pct(sd)),
        None => pct(sd),
    };
    let rows: Vec<Vec<String>> = r
        .subgroups
        .iter()
        .flat_map(|v| {
            v.groups.iter().map(move |g| {
                vec![
                    v.variant.clone(),
                    g.group.clone(),
                    g.examples.to_string(),
                    format!("{} ({})", g.positives, pct(g.positive_share)),
                    pct(g.error_mean),
                    with_ratio(g.error_stdev, g.error_ratio),
                    with_ratio(g.fpr_stdev, g.fpr_ratio),
                    with_ratio(g.fnr_stdev, g.fnr_ratio),
                ]
            })
        })
        .collect();
    let header = ["variant", "group", "examples", "positives (share)", "error mean", "sd error", "sd FPR", "sd FNR"];
    out.push_str(&table(&header, &rows, markdown));
}

/// The devices study: error rates side by side, then each comparison.
pub fn render_devices(r: &DevicesReport, markdown: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "devices study: {}, {} steps per run\n", r.subject, r.steps);
    let rows: Vec<Vec<String>> = r
        .runs
        .iter()
        .map(|d| vec![d.device.clone(), pct(d.error_rate), format!("{:.6}", d.final_loss), format!("{:.1}", d.seconds)])
        .collect();
    out.push_str(&table(&["device", "test error", "final loss", "seconds"], &rows, markdown));
    if !r.cross_error.is_empty() {
        let _ = writeln!(out, "\ntest error, trained on (row) and evaluated on (column):");
        let mut header = vec!["trained on".to_string()];
        header.extend(r.runs.iter().map(|d| format!("eval {}", d.device)));
        let rows: Vec<Vec<String>> = r
            .runs
            .iter()
            .zip(&r.cross_error)
            .map(|(d, errors)| std::iter::once(d.device.clone()).chain(errors.iter().map(|&e| pct(e))).collect())
            .collect();
        out.push_str(&table(&header.iter().map(String::as_str).collect::<Vec<_>>(), &rows, markdown));
    }
    for c in &r.comparisons {
        out.push('\n');
        if c.identical {
            let _ = writeln!(
                out,
                "{} vs {}: IDENTICAL, {} tensors bit for bit over {} steps",
                c.device, c.reference, c.tensors_compared, r.steps
            );
            continue;
        }
        let first = c.first_divergence.as_ref().map_or("?".into(), |(s, t)| format!("step {s}, `{t}`"));
        let _ = writeln!(
            out,
            "{} vs {}: DIVERGED, first at {first}; {} of {} recorded tensors differ",
            c.device, c.reference, c.tensors_diverged, c.tensors_compared
        );
        if let Some(cause) = &c.root_cause {
            let _ = writeln!(out, "root cause: {cause}");
        }
        if !c.weight_gap.is_empty() {
            let _ = writeln!(out, "weights over training (steps with stored values):");
            let rows: Vec<Vec<String>> = c
                .weight_gap
                .iter()
                .map(|g| {
                    vec![
                        g.step.to_string(),
                        g.max_ulp.to_string(),
                        sci(g.max_abs),
                        format!("{} of {}", g.mismatched, g.elements),
                    ]
                })
                .collect();
            out.push_str(&table(&["step", "max ULP", "max abs diff", "elements differing"], &rows, markdown));
        }
    }
    out
}

/// The cost study: time per step per mode and the overhead over atomic.
pub fn render_cost(r: &CostReport, markdown: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "cost study on {}: median time per training step\n", r.device);
    let rows: Vec<Vec<String>> = r
        .rows
        .iter()
        .map(|row| {
            vec![
                row.workload.clone(),
                row.reductions.clone(),
                if row.deterministic { "yes" } else { "no" }.to_string(),
                format!("{:.3}", row.median_ms),
                format!("{:.3}", row.min_ms),
                row.steps_timed.to_string(),
                if row.reductions == "atomic" {
                    "—".to_string()
                } else {
                    format!("{:+.1}%", row.overhead_vs_atomic_percent)
                },
            ]
        })
        .collect();
    out.push_str(&table(
        &["workload", "reductions", "deterministic", "median ms", "min ms", "steps", "vs atomic"],
        &rows,
        markdown,
    ));
    out
}

/// Renders the data-order study: one row per batch size, then where two full-batch runs first
/// differ.
pub fn render_order(r: &OrderReport, markdown: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "data-order study: {} on {}, {} runs per batch size differing only in the order seed (ordered reductions; augmentation and dropout off), \
         {} training examples\n",
        r.subject, r.device, r.runs, r.train_examples
    );
    let header = ["batch", "accuracy mean ± sd", "min – max", "churn", "L2 (normalized w)"];
    let rows: Vec<Vec<String>> = r
        .rows
        .iter()
        .map(|row| {
            let s = &row.stats;
            vec![
                if row.full_batch { format!("{} (full)", row.batch) } else { row.batch.to_string() },
                format!("{} ± {}", pct(s.accuracy_mean), pct(s.accuracy_stdev)),
                format!("{} – {}", pct(s.accuracy_min), pct(s.accuracy_max)),
                pct(s.churn),
                sci(s.l2_normalized),
            ]
        })
        .collect();
    out.push_str(&table(&header, &rows, markdown));
    out.push('\n');
    match (&r.full_batch_divergence, r.rows.iter().any(|row| row.full_batch)) {
        (Some(d), _) => {
            let size = match (d.max_ulp, d.mismatched) {
                (Some(ulp), Some(n)) => format!(": {n} element(s) differ, max {ulp} ULP"),
                _ => String::new(),
            };
            let _ = writeln!(
                out,
                "At full batch every step sees the same examples; the first tensor that exact arithmetic makes \
                 order-independent and that differs is `{}` ({}, step {}){size}.",
                d.tensor, d.kind, d.step
            );
            if !d.permuted_before.is_empty() {
                let _ = writeln!(
                    out,
                    "Before it in that step only per-example tensors differ, their rows permuted: {}.",
                    d.permuted_before.join(", ")
                );
            }
        }
        (None, true) => {
            let _ = writeln!(out, "At full batch two runs with different order seeds were bit-identical.");
        }
        (None, false) => {
            let _ = writeln!(out, "The full batch (`full` in --batch-sizes) was not run.");
        }
    }
    out
}
