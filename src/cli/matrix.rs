//! `repro matrix R1 ... RN`: pairwise error matrices at one step.

use super::{print_json, Exit};
use clap::Args;
use repro::diff::{error_matrices, Metric, StepSelector};
use repro::report::render_matrix;
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
    /// Print the matrices as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(args: MatrixArgs) -> Result<Exit, String> {
    let report = error_matrices(&args.runs, args.step, &args.tensor, args.metric).map_err(|e| e.to_string())?;
    let all_zero = report.matrices.iter().flat_map(|m| m.values.iter().flatten()).all(|&v| v == 0.0);
    if args.json {
        print_json("repro.matrix.v1", Some(if all_zero { "identical" } else { "diverged" }), &report)?;
    } else {
        super::output::emit(&render_matrix(&report));
    }
    Ok(if all_zero { Exit::Same } else { Exit::Diverged })
}
