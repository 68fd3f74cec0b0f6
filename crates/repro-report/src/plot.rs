//! SVG charts (plotters): the gap between two runs step by step (`repro diff --plot`), the
//! pairwise error matrices as heat maps (`repro matrix --plot`), and the studies' charts (run
//! accuracies, churn and weight distance per noise variant; the weights' ULP distance over
//! training per device pair; time per step per mode).

use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use repro_diff::invariance::InvarianceReport;
use repro_diff::study::results::{CostReport, DevicesReport, NoiseReport, OrderReport};
use repro_diff::MatrixReport;
use repro_diff::{GapPoint, TraceDiff};

type PlotResult = Result<String, String>;

fn err(e: impl std::fmt::Display) -> String {
    format!("cannot draw the chart: {e}")
}

const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;
type CategoryChart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// A chart with one column per name (at x = 0, 1, ...) and a value axis spanning `y`.
fn category_chart<'a, 'b>(
    area: &'a Area<'b>,
    title: &str,
    names: &[String],
    y: std::ops::Range<f64>,
    y_label: &str,
) -> Result<CategoryChart<'a, 'b>, String> {
    let n = names.len();
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.5f64..n as f64 - 0.5, y)
        .map_err(err)?;
    let label = |x: &f64| category_label(names, *x);
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_formatter(&label)
        .y_desc(y_label)
        .draw()
        .map_err(err)?;
    Ok(chart)
}

/// The name of the column at `x` (columns sit at 0, 1, ...), empty between columns.
fn category_label(names: &[String], x: f64) -> String {
    let i = x.round();
    if (x - i).abs() < 1e-9 && i >= 0.0 && (i as usize) < names.len() {
        names[i as usize].clone()
    } else {
        String::new()
    }
}

/// Bars of `values` labelled by `names` on one chart area.
fn bars(area: &Area, title: &str, names: &[String], values: &[f64], y_label: &str) -> Result<(), String> {
    let top = values.iter().copied().fold(0.0f64, f64::max).max(1e-12) * 1.15;
    let mut chart = category_chart(area, title, names, 0.0..top, y_label)?;
    chart
        .draw_series(values.iter().enumerate().map(|(i, &v)| {
            Rectangle::new([(i as f64 - 0.35, 0.0), (i as f64 + 0.35, v)], PALETTE[i % PALETTE.len()].filled())
        }))
        .map_err(err)?;
    Ok(())
}

/// Bars on a log axis; a zero bar is drawn as a "0" at the floor of the axis.
fn log_bars(area: &Area, title: &str, names: &[String], values: &[f64], y_label: &str) -> Result<(), String> {
    let positive = values.iter().copied().filter(|v| *v > 0.0 && v.is_finite());
    let (lo, hi) = positive.fold((f64::INFINITY, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let (floor, top) = if hi > 0.0 { (lo / 10.0, hi * 3.0) } else { (1e-12, 1.0) };
    let n = names.len();
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.5f64..n as f64 - 0.5, (floor..top).log_scale())
        .map_err(err)?;
    let label = |x: &f64| category_label(names, *x);
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_formatter(&label)
        .y_label_formatter(&|y| sci(*y))
        .y_desc(y_label)
        .draw()
        .map_err(err)?;
    for (i, &v) in values.iter().enumerate() {
        let x = i as f64;
        if v > 0.0 && v.is_finite() {
            let rect = Rectangle::new([(x - 0.35, floor), (x + 0.35, v)], PALETTE[i % PALETTE.len()].filled());
            chart.draw_series([rect]).map_err(err)?;
        }
        let text = Text::new(sci(v), (x - 0.3, if v > 0.0 { v * 1.3 } else { floor * 1.5 }), ("sans-serif", 12));
        chart.draw_series([text]).map_err(err)?;
    }
    Ok(())
}

fn sci(x: f64) -> String {
    super::format::sci(x)
}

/// The noise study: every run's accuracy per variant, and the mean churn and L2 distance.
pub fn plot_noise(r: &NoiseReport) -> PlotResult {
    let mut svg = String::new();
    {
        // A second row, on a dataset with protected attributes: the spread within each group.
        let rows = if r.subgroups.is_empty() { 1 } else { 2 };
        let root = SVGBackend::with_string(&mut svg, (1200, 420 * rows)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let panels = root.split_evenly((rows as usize, 3));
        if rows == 2 {
            subgroup_panels(r, &panels[3..6])?;
        }
        let names: Vec<String> = r.variants.iter().map(|v| v.variant.to_string()).collect();
        let all: Vec<f64> = r.variants.iter().flat_map(|v| &v.run_accuracies).map(|a| a * 100.0).collect();
        let lo = all.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = all.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let pad = ((hi - lo) * 0.15).max(0.05);
        let title = format!("test accuracy, {} runs per variant", r.runs);
        let mut chart = category_chart(&panels[0], &title, &names, (lo - pad)..(hi + pad), "accuracy (%)")?;
        for (i, runs) in r.variants.iter().map(|v| &v.run_accuracies).enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            let count = runs.len().max(2) as f64;
            chart
                .draw_series(runs.iter().enumerate().map(|(k, &a)| {
                    // Spread the runs sideways so equal accuracies stay visible.
                    let x = i as f64 - 0.2 + 0.4 * k as f64 / (count - 1.0);
                    Circle::new((x, a * 100.0), 3, color.filled())
                }))
                .map_err(err)?;
            let s = &r.variants[i].stats;
            let (m, sd) = (s.accuracy_mean * 100.0, s.accuracy_stdev * 100.0);
            chart
                .draw_series([
                    PathElement::new(vec![(i as f64 - 0.3, m), (i as f64 + 0.3, m)], BLACK.stroke_width(2)),
                    PathElement::new(vec![(i as f64, m - sd), (i as f64, m + sd)], BLACK.stroke_width(1)),
                ])
                .map_err(err)?;
        }
        // Log axes: implementation noise (L2 ~ 1e-8) sits beside algorithmic noise (~1e-1).
        let churn: Vec<f64> = r.variants.iter().map(|v| v.stats.churn * 100.0).collect();
        log_bars(&panels[1], "predictive churn (mean over pairs)", &names, &churn, "churn (%), log")?;
        let l2: Vec<f64> = r.variants.iter().map(|v| v.stats.l2_normalized).collect();
        log_bars(&panels[2], "L2 distance of normalized weights", &names, &l2, "L2, log")?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

/// Per metric (error, false-positive and false-negative rate), each group's spread over runs
/// against the whole test set's, one colour per variant (variants whose runs agree have no
/// ratio and are left out).
fn subgroup_panels(r: &NoiseReport, panels: &[Area<'_>]) -> Result<(), String> {
    type Ratio = fn(&repro_diff::study::subgroups::SubgroupSpread) -> Option<f64>;
    let metrics: [(&str, Ratio); 3] = [
        ("error rate", |g| g.error_ratio),
        ("false-positive rate", |g| g.fpr_ratio),
        ("false-negative rate", |g| g.fnr_ratio),
    ];
    let names: Vec<String> =
        r.subgroups.first().map_or(Vec::new(), |v| v.groups.iter().map(|g| g.group.clone()).collect());
    for (panel, (metric, ratio)) in panels.iter().zip(metrics) {
        let all: Vec<f64> = r.subgroups.iter().flat_map(|v| v.groups.iter().filter_map(ratio)).collect();
        let hi = all.iter().copied().fold(1.0, f64::max) * 1.15;
        let title = format!("sd of the {metric} over runs, / all examples'");
        let mut chart = category_chart(panel, &title, &names, 0.0..hi, "x the whole test set")?;
        for (i, variant) in r.subgroups.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            let offset = -0.2 + 0.4 * i as f64 / r.subgroups.len().max(2) as f64;
            let points: Vec<(f64, f64)> = variant
                .groups
                .iter()
                .enumerate()
                .filter_map(|(k, g)| ratio(g).map(|y| (k as f64 + offset, y)))
                .collect();
            chart
                .draw_series(points.into_iter().map(|p| Circle::new(p, 4, color.filled())))
                .map_err(err)?
                .label(variant.variant.clone())
                .legend(move |(x, y)| Circle::new((x, y), 4, color.filled()));
        }
        chart.configure_series_labels().border_style(BLACK).background_style(WHITE).draw().map_err(err)?;
    }
    Ok(())
}

/// The data-order study: churn and weight distance per batch size (log scales).
pub fn plot_order(r: &OrderReport) -> PlotResult {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (900, 420)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let panels = root.split_evenly((1, 2));
        let names: Vec<String> = r
            .rows
            .iter()
            .map(|row| if row.full_batch { format!("{} (full)", row.batch) } else { row.batch.to_string() })
            .collect();
        let churn: Vec<f64> = r.rows.iter().map(|row| row.stats.churn * 100.0).collect();
        log_bars(&panels[0], "predictive churn by batch size (order seed only)", &names, &churn, "churn (%), log")?;
        let l2: Vec<f64> = r.rows.iter().map(|row| row.stats.l2_normalized).collect();
        log_bars(&panels[1], "L2 distance of normalized weights", &names, &l2, "L2, log")?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

/// The devices study: largest ULP distance of the weights at each stored step, per comparison.
pub fn plot_devices(r: &DevicesReport) -> PlotResult {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (800, 480)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let max_step = r.steps.max(2) as f64;
        let max_ulp =
            r.comparisons.iter().flat_map(|c| c.weight_gap.iter().map(|g| g.max_ulp)).max().unwrap_or(1).max(1) as f64;
        let mut chart = ChartBuilder::on(&root)
            .caption(format!("weights' largest ULP distance over training: {}", r.subject), ("sans-serif", 16))
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d((1f64..max_step + 1.0).log_scale(), (1f64..max_ulp * 2.0).log_scale())
            .map_err(err)?;
        chart.configure_mesh().x_desc("step + 1").y_desc("max ULP (+1)").draw().map_err(err)?;
        for (i, c) in r.comparisons.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            let points: Vec<(f64, f64)> =
                c.weight_gap.iter().map(|g| (g.step as f64 + 1.0, g.max_ulp as f64 + 1.0)).collect();
            chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
                .map_err(err)?
                .label(format!("{} vs {}", c.device, c.reference))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
            chart.draw_series(points.into_iter().map(|p| Circle::new(p, 3, color.filled()))).map_err(err)?;
        }
        chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw().map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

/// The cost study: median time per step of each mode, one panel per workload.
pub fn plot_cost(r: &CostReport) -> PlotResult {
    let mut workloads: Vec<&str> = Vec::new();
    for row in &r.rows {
        if !workloads.contains(&row.workload.as_str()) {
            workloads.push(&row.workload);
        }
    }
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (400 * workloads.len().max(1) as u32, 400)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let panels = root.split_evenly((1, workloads.len().max(1)));
        for (panel, workload) in panels.iter().zip(&workloads) {
            let rows: Vec<_> = r.rows.iter().filter(|row| row.workload == *workload).collect();
            let names: Vec<String> = rows.iter().map(|row| row.reductions.clone()).collect();
            let ms: Vec<f64> = rows.iter().map(|row| row.median_ms).collect();
            bars(panel, &format!("{workload} on {}", r.device), &names, &ms, "ms per step (median)")?;
        }
        root.present().map_err(err)?;
    }
    Ok(svg)
}

/// `repro diff --plot`: how far apart the runs are at each step, one line per tensor kind (and
/// per tensor asked for), on log axes: the largest |a - b|, the largest ULP distance (both where
/// values were stored), and how many tensors differ (from hashes, at every step). A red line
/// marks the first divergence.
pub fn plot_diff(d: &TraceDiff) -> PlotResult {
    let first = d.first_divergence.as_ref();
    let last_step = d.gaps.iter().flat_map(|g| g.points.iter().map(|p| p.step)).max().unwrap_or(0);
    let steps = (d.steps_compared.max(1) as f64).max(last_step as f64 + 1.0);
    let title = match first {
        Some(f) => format!("first divergence: step {}, `{}`", f.step, f.tensor),
        None if d.gaps.is_empty() => format!("identical: {} steps, bit-exact", d.steps_compared),
        None => "within tolerance at every step".to_string(),
    };
    type Value = fn(&GapPoint) -> Option<f64>;
    let panels: [(&str, Value); 3] = [
        ("max |a - b| (values stored)", |p| p.max_abs),
        ("max ULP distance (values stored)", |p| p.max_ulp.map(|u| u as f64)),
        ("tensors that differ (hashes)", |p| Some(p.differing as f64)),
    ];
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (900, 820)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let root = root.titled(&format!("{}  vs  {}: {title}", d.a.path, d.b.path), ("sans-serif", 16)).map_err(err)?;
        for (area, (label, value)) in root.split_evenly((3, 1)).iter().zip(panels) {
            let values: Vec<f64> =
                d.gaps.iter().flat_map(|g| g.points.iter().filter_map(value)).filter(|v| *v > 0.0).collect();
            let hi = values.iter().copied().fold(0.0f64, f64::max);
            let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
            let (lo, hi) = if hi > 0.0 { (lo / 3.0, hi * 3.0) } else { (0.1, 10.0) };
            let mut chart = ChartBuilder::on(area)
                .margin(10)
                .x_label_area_size(35)
                .y_label_area_size(75)
                .build_cartesian_2d(0f64..steps, (lo..hi).log_scale())
                .map_err(err)?;
            chart.configure_mesh().x_desc("step").y_desc(label).y_label_formatter(&|y| sci(*y)).draw().map_err(err)?;
            if values.is_empty() {
                let why = if d.gaps.is_empty() {
                    "no tensor differs".to_string()
                } else {
                    "no values stored where the runs differ: record with --capture all".to_string()
                };
                chart
                    .draw_series([Text::new(why, (steps * 0.05, (lo * hi).sqrt()), ("sans-serif", 14))])
                    .map_err(err)?;
            }
            // The first divergence behind the series, so its point stays visible.
            if let Some(f) = first {
                let x = f.step as f64;
                chart
                    .draw_series(DashedLineSeries::new(vec![(x, lo), (x, hi)], 6, 4, RED.mix(0.6).stroke_width(2)))
                    .map_err(err)?;
            }
            for (i, series) in d.gaps.iter().enumerate() {
                let color = PALETTE[i % PALETTE.len()];
                let points: Vec<(f64, f64)> = series
                    .points
                    .iter()
                    .filter_map(|p| value(p).filter(|v| *v > 0.0).map(|v| (p.step as f64, v)))
                    .collect();
                if points.is_empty() {
                    continue;
                }
                let name = series.label.split_once(':').map_or(series.label.as_str(), |(_, n)| n).to_string();
                chart
                    .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
                    .map_err(err)?
                    .label(name)
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
                chart.draw_series(points.into_iter().map(|p| Circle::new(p, 3, color.filled()))).map_err(err)?;
            }
            if !values.is_empty() {
                chart
                    .configure_series_labels()
                    .position(SeriesLabelPosition::LowerRight)
                    .background_style(WHITE.mix(0.8))
                    .border_style(BLACK)
                    .draw()
                    .map_err(err)?;
            }
        }
        root.present().map_err(err)?;
    }
    Ok(svg)
}

/// `repro matrix --plot`: one heat map per tensor, cell (i, j) coloured by the log of the
/// metric between run i and run j; bit-identical pairs are white, and every cell is labelled.
pub fn plot_matrix(r: &MatrixReport) -> PlotResult {
    let n = r.runs.len();
    let maps = r.matrices.len().max(1);
    let cell = 70u32.min(560 / n.max(1) as u32).max(28);
    let side = cell * n as u32 + 120;
    let mut svg = String::new();
    {
        let root =
            SVGBackend::with_string(&mut svg, (side * maps as u32, side + 40 + 16 * n as u32)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let title = format!("pairwise {} at step {}", r.metric, r.step);
        let root = root.titled(&title, ("sans-serif", 16)).map_err(err)?;
        let (maps_area, legend) = root.split_vertically(side);
        let all: Vec<f64> =
            r.matrices.iter().flat_map(|m| m.values.iter().flatten().copied()).filter(|v| *v > 0.0).collect();
        let lo = all.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = all.iter().copied().fold(0.0f64, f64::max);
        for (area, m) in maps_area.split_evenly((1, maps)).iter().zip(&r.matrices) {
            let mut chart = ChartBuilder::on(area)
                .caption(&m.tensor, ("sans-serif", 14))
                .margin(10)
                .x_label_area_size(25)
                .y_label_area_size(30)
                .build_cartesian_2d(0f64..n as f64, n as f64..0f64)
                .map_err(err)?;
            let numbers: Vec<String> = (0..n).map(|i| i.to_string()).collect();
            let index = |x: &f64| cell_label(&numbers, *x);
            chart
                .configure_mesh()
                .disable_mesh()
                .x_labels(2 * n + 1)
                .y_labels(2 * n + 1)
                .x_label_formatter(&index)
                .y_label_formatter(&index)
                .draw()
                .map_err(err)?;
            for (i, row) in m.values.iter().enumerate() {
                for (j, &v) in row.iter().enumerate() {
                    let (x, y) = (j as f64, i as f64);
                    let shade = if v > 0.0 && hi > lo {
                        ((v.ln() - lo.ln()) / (hi.ln() - lo.ln())).clamp(0.0, 1.0)
                    } else {
                        1.0
                    };
                    let color = if v > 0.0 { heat(shade) } else { WHITE };
                    chart.draw_series([Rectangle::new([(x, y), (x + 1.0, y + 1.0)], color.filled())]).map_err(err)?;
                    chart.draw_series([Rectangle::new([(x, y), (x + 1.0, y + 1.0)], BLACK.mix(0.3))]).map_err(err)?;
                    let text_color = if shade > 0.6 && v > 0.0 { WHITE } else { BLACK };
                    let style = ("sans-serif", 11).into_font().color(&text_color);
                    chart.draw_series([Text::new(sci(v), (x + 0.08, y + 0.55), style)]).map_err(err)?;
                }
            }
        }
        for (i, run) in r.runs.iter().enumerate() {
            let at = (10, 4 + 16 * i as i32);
            legend.draw(&Text::new(format!("{i}: {run}"), at, ("sans-serif", 12))).map_err(err)?;
        }
        root.present().map_err(err)?;
    }
    Ok(svg)
}

/// The label of the cell whose middle is at `v` (cells span `[i, i + 1)`), empty elsewhere:
/// ticks at every half cell, labelled only at the middles.
fn cell_label(labels: &[String], v: f64) -> String {
    let i = v.floor();
    match labels.get(i as usize) {
        Some(label) if v - i > 0.4 && v - i < 0.6 && i >= 0.0 => label.clone(),
        _ => String::new(),
    }
}

/// A sequential colour map from pale yellow (0) to dark red (1).
fn heat(t: f64) -> RGBColor {
    let lerp = |a: f64, b: f64| (a + (b - a) * t).round() as u8;
    RGBColor(lerp(255.0, 128.0), lerp(237.0, 0.0), lerp(160.0, 38.0))
}

/// The batch-invariance heat map: one row per batching, one column per op of the graph in
/// topological order, coloured by the largest ULP distance of the sequence's slice (log scale;
/// white: identical, grey: not compared), the first differing op of each row outlined.
pub fn plot_invariance(r: &InvarianceReport) -> PlotResult {
    let (rows, cols) = (r.results.len().max(1), r.ops.len().max(1));
    let cell_w = (900 / cols as u32).clamp(2, 24);
    let cell_h = 18u32;
    let title = format!("batch invariance: {} on {} (max ULP of the sequence's slice, per op)", r.subject, r.device);
    let width = (cell_w * cols as u32 + 160).max(7 * title.len() as u32 + 40);
    let height = cell_h * rows as u32 + 150;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (width, height)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let root = root.titled(&title, ("sans-serif", 14)).map_err(err)?;
        let (plot_area, note_area) = root.split_vertically(height - 50);
        let mut chart = ChartBuilder::on(&plot_area)
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(70)
            .build_cartesian_2d(0f64..cols as f64, rows as f64..0f64)
            .map_err(err)?;
        let whole = |x: &f64| if x.fract() == 0.0 { format!("{}", *x as usize) } else { String::new() };
        let labels: Vec<String> = r.results.iter().map(|b| b.batching.to_string()).collect();
        let row_label = |y: &f64| cell_label(&labels, *y);
        chart
            .configure_mesh()
            .disable_mesh()
            .y_labels(2 * rows + 1)
            .y_label_formatter(&row_label)
            .x_labels(cols.min(10) + 1)
            .x_label_formatter(&whole)
            .x_desc("op (graph node, topological order)")
            .y_desc("batch@row")
            .draw()
            .map_err(err)?;
        let hi = r.results.iter().flat_map(|b| b.op_max_ulp.iter().flatten()).copied().max().unwrap_or(1).max(1);
        for (i, b) in r.results.iter().enumerate() {
            for (j, ulp) in b.op_max_ulp.iter().enumerate() {
                let (x, y) = (j as f64, i as f64);
                let color = match ulp {
                    None => RGBColor(200, 200, 200),
                    Some(0) => WHITE,
                    Some(u) => heat(((*u as f64).ln_1p() / (hi as f64).ln_1p()).clamp(0.0, 1.0)),
                };
                chart.draw_series([Rectangle::new([(x, y), (x + 1.0, y + 1.0)], color.filled())]).map_err(err)?;
            }
            if let Some(first) = b.first_op.as_ref().and_then(|op| r.ops.iter().position(|n| *n == op.name)) {
                let (x, y) = (first as f64, i as f64);
                chart
                    .draw_series([Rectangle::new([(x, y), (x + 1.0, y + 1.0)], BLACK.stroke_width(2))])
                    .map_err(err)?;
            }
        }
        let note = format!("largest: {hi} ULP (dark red); outlined: the first op that differs in each row");
        note_area.draw(&Text::new(note, (10, 5), ("sans-serif", 12))).map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}
