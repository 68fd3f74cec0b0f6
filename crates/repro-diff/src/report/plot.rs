//! SVG charts of the studies (plotters): run accuracies, churn and weight distance per noise
//! variant; the weights' ULP distance over training per device pair; time per step per mode.

use crate::study::results::{CostReport, DevicesReport, NoiseReport};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

type PlotResult = Result<String, String>;

fn err(e: impl std::fmt::Display) -> String {
    format!("cannot draw the chart: {e}")
}

const PALETTE: [RGBColor; 4] =
    [RGBColor(31, 119, 180), RGBColor(255, 127, 14), RGBColor(44, 160, 44), RGBColor(214, 39, 40)];

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
    let label = |x: &f64| {
        let i = x.round();
        if (x - i).abs() < 1e-9 && i >= 0.0 && (i as usize) < n {
            names[i as usize].clone()
        } else {
            String::new()
        }
    };
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

/// The noise study: every run's accuracy per variant, and the mean churn and L2 distance.
pub fn plot_noise(r: &NoiseReport) -> PlotResult {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1200, 420)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let panels = root.split_evenly((1, 3));
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
        let churn: Vec<f64> = r.variants.iter().map(|v| v.stats.churn * 100.0).collect();
        bars(&panels[1], "predictive churn (mean over pairs)", &names, &churn, "churn (%)")?;
        let l2: Vec<f64> = r.variants.iter().map(|v| v.stats.l2_normalized).collect();
        bars(&panels[2], "L2 distance of normalized weights", &names, &l2, "L2")?;
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
