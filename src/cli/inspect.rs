//! `repro inspect DIR`: what a trace holds.

use super::{print_json, Exit};
use clap::Args;
use repro::report::render_summary;
use repro::trace::{summarize, verify};
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// The trace directory.
    trace: PathBuf,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
    /// Also read every stored value and check it against its recorded hash (exit 2 on damage).
    #[arg(long)]
    verify: bool,
}

impl InspectArgs {
    /// Whether the report is asked for as JSON (errors then come as JSON too).
    pub fn json(&self) -> bool {
        self.json
    }
}

pub fn run(args: InspectArgs) -> Result<Exit, String> {
    if args.verify {
        let v = verify(&args.trace).map_err(|e| e.to_string())?;
        let elsewhere = match v.values_elsewhere {
            0 => String::new(),
            n => format!("; {n} values kept in payload files were not checked (a lone record file has none: verify the trace directory)"),
        };
        eprintln!(
            "verified {}: {} steps, {} tensors, {} stored values match their hashes{}{elsewhere}",
            args.trace.display(),
            v.steps,
            v.tensors,
            v.values_checked,
            if v.complete { "" } else { " (trace incomplete)" }
        );
    }
    let summary = summarize(&args.trace).map_err(|e| e.to_string())?;
    if args.json {
        print_json("repro.inspect.v1", None, &summary)?;
    } else {
        super::output::emit(&render_summary(&summary));
    }
    Ok(Exit::Same)
}
