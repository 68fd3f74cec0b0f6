//! `repro baseline write`: record a configuration once and keep its hashes (and environment
//! fingerprint) in one small record file, meant to be committed and gated against.

use super::workload_args::WorkloadArgs;
use super::Exit;
use clap::{Args, Subcommand};
use repro::report::bytes;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct BaselineArgs {
    #[command(subcommand)]
    action: BaselineAction,
}

#[derive(Debug, Subcommand)]
enum BaselineAction {
    /// Record once and write the baseline file.
    Write {
        /// The baseline file to write (e.g. repro-baseline.rpr).
        #[arg(long)]
        out: PathBuf,
        // What to train: last, so that its help headings come after this command's own options.
        #[command(flatten)]
        train: WorkloadArgs,
    },
}

pub fn run(args: BaselineArgs) -> Result<Exit, String> {
    let BaselineAction::Write { train, out } = args.action;
    let work = std::env::temp_dir().join(format!("repro-baseline-{}", std::process::id()));
    let result = train.record_for_gate(&work).and_then(|()| {
        let records = work.join(repro::trace::format::RECORDS_FILE);
        std::fs::copy(&records, &out).map_err(|e| format!("cannot write {}: {e}", out.display()))
    });
    let _ = std::fs::remove_dir_all(&work);
    let size = result?;
    eprintln!(
        "wrote baseline {} ({}): commit it, then gate with `repro gate --baseline {}`",
        out.display(),
        bytes(size),
        out.display()
    );
    Ok(Exit::Same)
}
