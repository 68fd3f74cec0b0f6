//! `repro diff A B`: compare two traces.

use super::error::CliError;
use super::exit::Exit;
use super::output::print_json;
use super::report_args::{JsonOutput, PlotOutput, ToleranceArgs};
use clap::Args;
use repro::diff::{diff_runs, DiffOptions, NameMap};
use repro::report::{plot_diff, render_run_diff_with, DiffText};
use repro::trace::TensorKind;
use std::path::PathBuf;

#[derive(Debug, Args)]
#[command(mut_arg("plot", |a| a.help(
    "Draw the gap between the runs step by step into this SVG file: the largest |a-b| and ULP distance (where \
     values were stored) and the number of differing tensors, per tensor kind, on log axes, the first divergence \
     marked"
)))]
pub struct DiffArgs {
    /// The reference trace (or data-parallel run: a directory of rank-N traces).
    a: PathBuf,
    /// The trace (or data-parallel run) to compare with it.
    b: PathBuf,
    #[command(flatten)]
    tolerance: ToleranceArgs,
    #[command(flatten)]
    output: JsonOutput,
    #[command(flatten)]
    plot: PlotOutput,
    /// Rename or leave out tensors of both runs before they are paired: a file of `rename
    /// PATTERN NEW`, `ignore PATTERN` and `transpose a|b PATTERN` lines (`*` wildcards), for runs
    /// whose names or layouts differ (a PyTorch original and its candle port; docs/diff.md,
    /// "Name maps").
    #[arg(long, value_name = "FILE")]
    map: Option<PathBuf>,
    /// Also follow this tensor step by step in the plot and the JSON `gaps` (repeatable).
    #[arg(long, value_name = "NAME")]
    plot_tensor: Vec<String>,
    /// Text: the tables too: every tensor's first divergence, the error's growth over the steps
    /// and every structural difference (without it: the verdict, the first divergence, its root
    /// cause and the command that goes further). --rows, --kind and --tensor imply it.
    #[arg(long, conflicts_with = "brief")]
    full: bool,
    /// Text: the default report, without the tables (kept for scripts that ask for it).
    #[arg(long, hide = true)]
    brief: bool,
    /// Text: at most N rows in each table.
    #[arg(long, value_name = "N")]
    rows: Option<usize>,
    /// Text: only tensors of these kinds in the tables (weight, gradient, prediction, loss,
    /// activation, op_output, input, buffer, other; repeatable or comma-separated).
    #[arg(long, value_name = "KIND", value_delimiter = ',', value_parser = parse_kind)]
    kind: Vec<TensorKind>,
    /// Text: only tensors whose name contains this in the tables (repeatable).
    #[arg(long, value_name = "TEXT")]
    tensor: Vec<String>,
}

fn parse_kind(s: &str) -> Result<TensorKind, String> {
    TensorKind::from_name(s)
        .ok_or_else(|| format!("`{s}` is not a tensor kind: {}", TensorKind::ALL.map(TensorKind::name).join(", ")))
}

impl DiffArgs {
    /// Whether the report is asked for as JSON (errors then come as JSON too).
    pub fn json(&self) -> bool {
        self.output.json
    }
}

pub fn run(args: DiffArgs) -> Result<Exit, CliError> {
    let tolerance = args.tolerance.combined();
    let names = match &args.map {
        Some(file) => NameMap::read(file)?,
        None => NameMap::default(),
    };
    let options =
        DiffOptions { tolerance: tolerance.clone(), track: args.plot_tensor.clone(), names, ..DiffOptions::default() };
    let run = diff_runs(&args.a, &args.b, &options)?;
    if let (Some(map), 0, true) = (&args.map, run.diff.tensors_compared, run.diff.steps_compared > 0) {
        return Err(format!(
            "the name map {} leaves no tensor to compare: {} step(s) are common to both runs, and its rules rename \
             or leave out every tensor so that none pairs with the other run's (`repro inspect A` and `repro \
             inspect B` list the names)",
            map.display(),
            run.diff.steps_compared
        )
        .into());
    }
    // A run whose shards do not tile is a divergence the replica check names (SHARD GAP), not
    // a want of values.
    let shards_tile = run.replicas.iter().all(|r| r.drift.as_ref().is_none_or(|d| d.shards.is_none()));
    if let (Some(shards), 0, true) = (run.shards.filter(|s| s.left_out > 0), run.diff.tensors_compared, shards_tile) {
        return Err(format!(
            "A and B shard their parameters differently (FSDP over other world sizes, or against DDP or one \
             device), and {} sharded tensor record(s) keep only hashes: a whole tensor's hash cannot be derived \
             from its shards', so nothing could be compared; record both runs with full values (`--capture all`, \
             or `steps:N` for the steps to compare)",
            shards.left_out
        )
        .into());
    }
    let single = run.world_size_a == 1 && run.world_size_b == 1;
    args.plot.write(|| plot_diff(&run.diff))?;
    if args.output.json {
        let verdict = run.verdict().name();
        // Single-device runs keep their schema; data-parallel ones add the ranks around it.
        if single {
            print_json("repro.diff.v1", Some(verdict), &run.diff)?;
        } else {
            print_json("repro.run-diff.v1", Some(verdict), &run)?;
        }
    } else {
        let text = DiffText {
            tables: args.full || args.rows.is_some() || !args.kind.is_empty() || !args.tensor.is_empty(),
            rows: args.rows,
            kinds: args.kind.clone(),
            tensors: args.tensor.clone(),
            ..DiffText::default()
        };
        super::output::emit(&render_run_diff_with(&run, &text));
    }
    Ok(run.verdict().into())
}
