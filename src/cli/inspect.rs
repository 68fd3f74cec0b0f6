//! `repro inspect DIR`: what a trace holds.

use super::{print_json, Exit};
use clap::Args;
use repro::report::render_summary;
use repro::trace::summarize;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// The trace directory.
    trace: PathBuf,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(args: InspectArgs) -> Result<Exit, String> {
    let summary = summarize(&args.trace).map_err(|e| e.to_string())?;
    if args.json {
        print_json(&summary)?;
    } else {
        print!("{}", render_summary(&summary));
    }
    Ok(Exit::Same)
}
