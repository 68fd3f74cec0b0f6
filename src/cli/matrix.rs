//! `repro matrix R1 ... RN`: pairwise error matrices at one step.

use super::CliError;
use super::{print_json, Exit};
use clap::Args;
use repro::diff::{error_matrices, Metric, StepSelector, Tolerance};
use repro::report::{plot_matrix, render_matrix};
use std::path::PathBuf;

#[derive(Debug, Args)]
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
    /// Judge every pair of runs by this tolerance: ulp:N, abs:X or rel:X (exit 0 when every
    /// pair is within it; default: bit-exact).
    #[arg(long, value_name = "ulp:N|abs:X|rel:X|allclose:A:R")]
    tolerance: Vec<Tolerance>,
    /// Print the matrices as JSON.
    #[arg(long)]
    json: bool,
    /// Draw the matrices as heat maps (log colour scale) into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
}

impl MatrixArgs {
    /// Whether the report is asked for as JSON (errors then come as JSON too).
    pub fn json(&self) -> bool {
        self.json
    }
}

pub fn run(args: MatrixArgs) -> Result<Exit, CliError> {
    let tolerance = Tolerance::combine(args.tolerance.clone());
    let report = error_matrices(&args.runs, args.step, &args.tensor, args.metric, tolerance.clone())?;
    let agrees = report.agrees();
    if let Some(path) = &args.plot {
        super::output::write_plot(path, plot_matrix(&report))?;
    }
    if args.json {
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
