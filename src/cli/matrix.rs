//! `repro matrix R1 ... RN`: pairwise error matrices at one step.

use super::error::CliError;
use super::exit::Exit;
use super::output::print_json;
use super::report_args::{JsonOutput, PlotOutput, ToleranceArgs};
use clap::Args;
use repro::diff::{error_matrices, Metric, StepSelector};
use repro::report::{plot_matrix, render_matrix};
use std::path::PathBuf;

#[derive(Debug, Args)]
#[command(
    mut_arg("plot", |a| a.help("Draw the matrices as heat maps (log colour scale) into this SVG file")),
    mut_arg("tolerance", |a| super::report_args::extend_help(a, "Every pair of runs is judged by it: exit 0 when every pair is within it")),
)]
pub struct MatrixArgs {
    /// Two or more traces.
    #[arg(required = true, num_args = 2..)]
    runs: Vec<PathBuf>,
    /// Step to compare: a number, first or last.
    #[arg(long, default_value = "last")]
    step: StepSelector,
    /// Tensor to compare (repeatable); default: every tensor of the step.
    #[arg(long)]
    tensor: Vec<String>,
    /// Cell value: sum-abs, max-abs, ulp or mismatch.
    #[arg(long, default_value = "sum-abs")]
    metric: Metric,
    #[command(flatten)]
    tolerance: ToleranceArgs,
    #[command(flatten)]
    output: JsonOutput,
    #[command(flatten)]
    plot: PlotOutput,
}

impl MatrixArgs {
    /// Whether the report is asked for as JSON (errors then come as JSON too).
    pub fn json(&self) -> bool {
        self.output.json
    }
}

pub fn run(args: MatrixArgs) -> Result<Exit, CliError> {
    let tolerance = args.tolerance.combined();
    let report = error_matrices(&args.runs, args.step, &args.tensor, args.metric, tolerance.clone())?;
    let agrees = report.agrees();
    args.plot.write(|| plot_matrix(&report))?;
    if args.output.json {
        let verdict = match (agrees, &tolerance) {
            (false, _) => "diverged",
            (true, None) => "identical",
            (true, Some(_)) => "within_tolerance",
        };
        print_json("repro.matrix.v1", Some(verdict), &report)?;
    } else {
        super::output::emit(&render_matrix(&report));
    }
    Ok(if agrees { Exit::Same } else { Exit::Diverged })
}
