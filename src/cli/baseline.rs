//! `repro baseline write`: record a configuration once and keep its hashes (and environment
//! fingerprint) in one small record file, meant to be committed and gated against.

use super::gate::record_command;
use super::workload_args::WorkloadArgs;
use super::Exit;
use clap::{Args, Subcommand};
use repro::report::bytes;
use repro::trace::FullCapture;
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
        /// Your own training program, which records itself with repro's library into
        /// $REPRO_TRACE_DIR (instead of a built-in workload).
        #[arg(last = true, value_name = "CMD")]
        command: Vec<String>,
        // What to train: last, so that its help headings come after this command's own options.
        #[command(flatten)]
        train: WorkloadArgs,
    },
}

pub fn run(args: BaselineArgs) -> Result<Exit, String> {
    let BaselineAction::Write { train, out, command } = args.action;
    let scratch = super::scratch::ScratchDir::new("baseline")?;
    let work = scratch.path().join("run");
    // A baseline keeps hashes only: it is committed, and the gate compares hashes.
    let recorded = if command.is_empty() {
        train.record_for_gate(&work, &FullCapture::None, &[])
    } else {
        record_command(&command, &work, &FullCapture::None)
    };
    let result = recorded.and_then(|()| {
        if work.join("rank-0").exists() {
            return Err(
                "the program wrote a data-parallel run: a baseline holds one stream; gate such runs with `repro gate \
                 -- CMD` (two runs compared), or record one device for the baseline"
                    .to_string(),
            );
        }
        let records = work.join(repro::trace::format::RECORDS_FILE);
        std::fs::copy(&records, &out).map_err(|e| format!("cannot write {}: {e}", out.display()))
    });
    drop(scratch);
    let size = result?;
    let gate = if command.is_empty() {
        format!("repro gate --baseline {} (its settings are the defaults)", out.display())
    } else {
        format!("repro gate --baseline {} -- {}", out.display(), command.join(" "))
    };
    eprintln!("wrote baseline {} ({}): commit it, then gate with `{gate}`", out.display(), bytes(size));
    Ok(Exit::Same)
}
