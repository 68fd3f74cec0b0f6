//! `repro baseline write`: record a configuration once and keep its hashes (and environment
//! fingerprint) in one small record file, meant to be committed and gated against.

use super::error::CliError;
use super::exit::Exit;
use super::program::record_command;
use super::workload_args::WorkloadArgs;
use clap::{Args, Subcommand};
use repro::record::RecordEnv;
use repro::report::bytes;
use repro::trace::FullCapture;
use std::path::{Path, PathBuf};

#[derive(Debug, Args)]
pub struct BaselineArgs {
    #[command(subcommand)]
    action: BaselineAction,
}

impl BaselineArgs {
    /// What it trains, for `cli::main` to note the options given.
    pub fn train_mut(&mut self) -> &mut WorkloadArgs {
        let BaselineAction::Write { train, .. } = &mut self.action;
        train
    }
}

#[derive(Debug, Subcommand)]
enum BaselineAction {
    /// Record once and write the baseline file.
    Write {
        /// The baseline file to write (e.g. repro-baseline.rpr).
        #[arg(long)]
        out: PathBuf,
        /// Replace the file if it exists (it is replaced whole or not at all).
        #[arg(long)]
        force: bool,
        /// Your own training program, which records itself with repro's library into
        /// $REPRO_TRACE_DIR (instead of a built-in workload).
        #[arg(last = true, value_name = "CMD")]
        command: Vec<String>,
        // What to train: last, so that its help headings come after this command's own options.
        #[command(flatten)]
        train: WorkloadArgs,
    },
}

/// Copies `records` to `out` through a temporary file beside it, renamed into place once whole
/// and on disk: a full disk or a crash leaves the old baseline as it was. Without `replace`, an
/// `out` that appeared meanwhile is kept. Returns the bytes written.
fn write_whole(records: &Path, out: &Path, replace: bool) -> std::io::Result<u64> {
    let dir = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    let size = std::io::copy(&mut std::fs::File::open(records)?, &mut tmp)?;
    tmp.as_file().sync_all()?;
    let persisted = if replace { tmp.persist(out) } else { tmp.persist_noclobber(out) };
    persisted.map_err(|e| e.error)?;
    Ok(size)
}

pub fn run(args: BaselineArgs) -> Result<Exit, CliError> {
    let BaselineAction::Write { train, out, force, command } = args.action;
    if !command.is_empty() {
        train.refuse_with_command()?;
    }
    if !force && std::fs::symlink_metadata(&out).is_ok() {
        return Err(format!("{} exists: pass --force to replace it with a new baseline", out.display()).into());
    }
    let scratch = super::scratch::ScratchDir::new("baseline")?;
    let work = scratch.path().join("run");
    // A baseline keeps hashes only: it is committed, and the gate compares hashes.
    let recorded = if command.is_empty() {
        train.workload_run().and_then(|planned| {
            super::recording::record_for_gate(&planned, &work, &FullCapture::None, &[], &train.device)
        })
    } else {
        record_command(
            &command,
            &RecordEnv { dir: Some(work.clone()), capture: Some(FullCapture::None), ..RecordEnv::default() },
            None,
        )
    };
    let result = recorded.and_then(|()| {
        if repro::trace::is_ranked_run(&work) {
            return Err(
                "the program wrote a data-parallel run: a baseline holds one stream; gate such runs with `repro gate \
                 -- CMD` (two runs compared), or record one device for the baseline"
                    .to_string()
                    .into(),
            );
        }
        write_whole(&work.join(repro::trace::format::RECORDS_FILE), &out, force)
            .map_err(|e| format!("cannot write {}: {e}", out.display()))
            .map_err(CliError::from)
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
