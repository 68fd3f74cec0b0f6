//! `repro loss A [B]`: the loss curve of a trace, or two side by side, as text, JSON or SVG.

use super::error::CliError;
use super::exit::Exit;
use super::output::print_json;
use super::report_args::{JsonOutput, PlotOutput};
use clap::Args;
use repro::diff::loss_curve;
use repro::report::{plot_loss, render_loss};
use repro::trace::TraceReader;
use std::path::PathBuf;

#[derive(Debug, Args)]
#[command(mut_arg("plot", |a| a.help("Draw the curves into this SVG file")))]
pub struct LossArgs {
    /// The trace.
    a: PathBuf,
    /// A second trace, shown beside the first.
    b: Option<PathBuf>,
    /// Show every Nth step (the first and last steps, and the first where the losses differ,
    /// always) [default: about 40 rows].
    #[arg(long, value_name = "N")]
    every: Option<usize>,
    #[command(flatten)]
    plot: PlotOutput,
    #[command(flatten)]
    output: JsonOutput,
}

impl LossArgs {
    /// Whether the result is asked for as JSON (errors then come as JSON too).
    pub fn json(&self) -> bool {
        self.output.json
    }
}

pub fn run(args: LossArgs) -> Result<Exit, CliError> {
    let mut curves = vec![loss_curve(&mut TraceReader::open(&args.a)?)?];
    if let Some(b) = &args.b {
        curves.push(loss_curve(&mut TraceReader::open(b)?)?);
    }
    if curves.iter().all(|c| c.tensor.is_none()) {
        return Err(format!("{} records no loss (a scalar tensor of kind `loss`)", args.a.display()).into());
    }
    args.plot.write(|| plot_loss(&curves))?;
    if args.output.json {
        #[derive(serde::Serialize)]
        struct Curves<'a> {
            curves: &'a [repro::diff::LossCurve],
        }
        print_json("repro.loss.v1", None, &Curves { curves: &curves })?;
    } else {
        super::output::emit(&render_loss(&curves, args.every));
    }
    Ok(Exit::Same)
}
