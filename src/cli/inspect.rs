//! `repro inspect DIR`: what a trace holds.

use super::error::CliError;
use super::exit::Exit;
use super::output::print_json;
use super::report_args::JsonOutput;
use clap::Args;
use repro::diff::{check_replicas, ReplicaReport};
use repro::report::{render_summary, replica_line};
use repro::trace::{rank_streams, summarize, verify, TraceSummary};
use std::path::{Path, PathBuf};

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// The trace directory, or a data-parallel run (then every rank, and whether the ranks
    /// stayed replicas; with --verify, exit 1 if they did not).
    trace: PathBuf,
    #[command(flatten)]
    output: JsonOutput,
    /// Also read every stored value and check it against its recorded hash (exit 2 on damage;
    /// exit 1 for a trace that did not finish, or a run whose ranks did not stay replicas).
    #[arg(long)]
    verify: bool,
}

impl InspectArgs {
    /// Whether the report is asked for as JSON (errors then come as JSON too).
    pub fn json(&self) -> bool {
        self.output.json
    }
}

pub fn run(args: InspectArgs) -> Result<Exit, CliError> {
    let Some(ranks) = rank_streams(&args.trace)? else {
        let summary = inspect_stream(&args.trace, args.verify)?;
        if args.output.json {
            print_json("repro.inspect.v1", None, &summary)?;
        } else {
            super::output::emit(&render_summary(&summary));
        }
        // A trace cut short verifies only as far as it goes: that is no clean bill.
        return Ok(if args.verify && !summary.complete { Exit::Diverged } else { Exit::Same });
    };
    // A data-parallel run: each rank's stream, then whether the ranks stayed replicas.
    let mut summaries = Vec::new();
    for rank in &ranks {
        let summary = inspect_stream(rank, args.verify)?;
        if !args.output.json {
            super::output::line(&format!("== {}", rank.display()));
            super::output::emit(&render_summary(&summary));
        }
        summaries.push(summary);
    }
    let replicas = check_replicas(&args.trace, &ranks)?;
    let verdict = match (&replicas.drift, replicas.unfinished.is_empty()) {
        (Some(_), _) => "diverged",
        (None, false) => "incomplete",
        (None, true) => "identical",
    };
    if args.output.json {
        print_json("repro.inspect-run.v1", Some(verdict), &RunSummary { ranks: summaries, replicas: &replicas })?;
    } else {
        super::output::emit(&replica_line(&replicas));
    }
    Ok(if !replicas.passed() && args.verify { Exit::Diverged } else { Exit::Same })
}

/// A data-parallel run as JSON: every rank's summary, and the replica check.
#[derive(serde::Serialize)]
struct RunSummary<'a> {
    ranks: Vec<TraceSummary>,
    replicas: &'a ReplicaReport,
}

/// Verifies (if asked) and summarizes one trace.
fn inspect_stream(trace: &Path, verify_values: bool) -> Result<TraceSummary, CliError> {
    if verify_values {
        let v = verify(trace)?;
        let elsewhere = match v.values_elsewhere {
            0 => String::new(),
            n => format!("; {n} values kept in payload files were not checked (a lone record file has none: verify the trace directory)"),
        };
        eprintln!(
            "verified {}: {} steps, {} tensors, {} stored values match their hashes{}{elsewhere}",
            trace.display(),
            v.steps,
            v.tensors,
            v.values_checked,
            if v.complete { "" } else { " (trace incomplete)" }
        );
    }
    Ok(summarize(trace)?)
}
