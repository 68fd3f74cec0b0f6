//! Loss curves as text (a table of steps) and as an SVG line chart.

use crate::format::sci;
use plotters::prelude::*;
use repro_diff::LossCurve;
use std::fmt::Write;

/// Rows shown by default: about this many steps, evenly spaced, with the first and last.
const DEFAULT_ROWS: usize = 40;

/// One or two loss curves side by side: every `every`-th step (the first and last steps always,
/// and the first step where the curves part), or about 40 rows when `every` is `None`.
pub fn render_loss(curves: &[LossCurve], every: Option<usize>) -> String {
    let mut out = String::new();
    let labels = ["A", "B"];
    for (label, c) in labels.iter().zip(curves) {
        let tensor = c.tensor.as_deref().map_or("no loss tensor".to_string(), |t| format!("`{t}`"));
        let _ = writeln!(out, "{label}  {}  ({tensor}, {} steps)", c.trace, c.points.len());
    }
    let steps: Vec<u64> = curves[0].points.iter().map(|(s, _)| *s).collect();
    let value = |c: &LossCurve, step: u64| c.points.iter().find(|(s, _)| *s == step).and_then(|(_, v)| *v);
    let parted = (curves.len() == 2)
        .then(|| {
            steps
                .iter()
                .copied()
                .find(|&s| value(&curves[0], s).map(f64::to_bits) != value(&curves[1], s).map(f64::to_bits))
        })
        .flatten();
    let every = every.unwrap_or_else(|| steps.len().div_ceil(DEFAULT_ROWS).max(1)).max(1);
    let _ = write!(out, "\n  {:>8}", "step");
    for label in &labels[..curves.len()] {
        let _ = write!(out, "  {:>14}", label);
    }
    let _ = writeln!(out, "{}", if curves.len() == 2 { format!("  {:>10}", "|A - B|") } else { String::new() });
    for (i, &step) in steps.iter().enumerate() {
        if !(i % every == 0 || i + 1 == steps.len() || Some(step) == parted) {
            continue;
        }
        let _ = write!(out, "  {step:>8}");
        for c in curves {
            let shown = value(c, step).map_or("-".to_string(), |v| format!("{v:.7e}"));
            let _ = write!(out, "  {shown:>14}");
        }
        if let [a, b] = curves {
            let gap = match (value(a, step), value(b, step)) {
                (Some(x), Some(y)) => sci((x - y).abs()),
                _ => "-".into(),
            };
            let mark = if Some(step) == parted { "  <- first difference" } else { "" };
            let _ = write!(out, "  {gap:>10}{mark}");
        }
        let _ = writeln!(out);
    }
    if curves.len() == 2 {
        let _ = match parted {
            Some(step) => writeln!(out, "\nthe losses first differ at step {step}"),
            None => writeln!(out, "\nthe losses are bit-identical at every step both traces hold"),
        };
    }
    out
}

/// The curves as an SVG line chart (loss against step).
pub fn plot_loss(curves: &[LossCurve]) -> Result<String, String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let points: Vec<Vec<(f64, f64)>> = curves
        .iter()
        .map(|c| c.points.iter().filter_map(|&(s, v)| v.filter(|v| v.is_finite()).map(|v| (s as f64, v))).collect())
        .collect();
    let all = points.iter().flatten();
    let (x_hi, y_lo, y_hi) =
        all.fold((1f64, f64::INFINITY, f64::NEG_INFINITY), |(x, lo, hi), &(s, v)| (x.max(s), lo.min(v), hi.max(v)));
    let (y_lo, y_hi) =
        if y_lo.is_finite() && y_hi > y_lo { (y_lo, y_hi) } else { (y_lo.min(0.0), y_lo.max(0.0) + 1.0) };
    let pad = (y_hi - y_lo) * 0.05;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (900, 450)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption("loss", ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(75)
            .build_cartesian_2d(0f64..x_hi, (y_lo - pad)..(y_hi + pad))
            .map_err(|e| err(&e))?;
        chart.configure_mesh().x_desc("step").y_desc("loss").draw().map_err(|e| err(&e))?;
        for (i, (curve, pts)) in curves.iter().zip(points).enumerate() {
            let color = [BLUE, RED][i % 2];
            chart
                .draw_series(LineSeries::new(pts, color.stroke_width(2)))
                .map_err(|e| err(&e))?
                .label(format!("{} {}", ["A", "B"][i % 2], curve.trace))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))?;
    }
    Ok(svg)
}
