//! Running a user's program that records itself (`repro record -- CMD`, `gate -- CMD`, `bisect
//! -- CMD`, `baseline write -- CMD`): the environment contract set for it (`RecordEnv`), its
//! process group stopped whole on a timeout or an interrupt, and what it left checked before
//! anything reads it.

use super::error::CliError;
use repro::record::{RecordEnv, TRACE_DIR_ENV};
use std::path::Path;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

/// Runs a self-recording program as `env` asks (see `record::env`), into `env.dir` (which
/// must be given), and checks that it left a finished trace: the command's failure, or a
/// trace it cannot use, is an error. Nothing in the directory is removed here: replacing a
/// trace is the program's recorder's to do (`REPRO_REPLACE`), and any other file stays.
pub fn record_command(command: &[String], env: &RecordEnv, timeout: Option<Duration>) -> Result<(), CliError> {
    let status = run_command(command, env, timeout)?;
    if !status.success() {
        return Err(format!(
            "`{}` failed ({status}); repro needs it to train and record successfully",
            command.join(" ")
        )
        .into());
    }
    check_recorded(&command.join(" "), env.dir.as_deref().expect("a trace directory"), env.stop_after)
}

/// Where a PyTorch program finds repro's GPU hashing library (python/repro/torch/cuda_hash.py); a
/// program run by repro is told the one built beside this binary, unless the variable is set
/// already.
const CUDA_HASH_LIB_ENV: &str = "REPRO_CUDA_HASH_LIB";

/// `librepro_cuda_hash.so` where `make cuda` builds it, beside this binary.
fn cuda_hash_library() -> Option<std::path::PathBuf> {
    let exe = std::env::current_exe().ok()?;
    Some(exe.parent()?.join("librepro_cuda_hash.so")).filter(|p| p.is_file())
}

/// Runs the program as [`record_command`] does, and returns how it exited.
///
/// The program runs supervised (`supervise`: a cgroup of its own where the machine allows, else
/// as this process's descendants). It is stopped, with every process it started (in its group
/// or session or not: torchrun's workers), when the run passes `timeout` or this process is
/// interrupted, and what it leaves running is stopped when it exits; the program itself also
/// dies with this process.
/// Its standard output goes to repro's standard error (repro's own report is its standard
/// output, for scripts and `--json`), as its errors do.
pub fn run_command(command: &[String], env: &RecordEnv, timeout: Option<Duration>) -> Result<ExitStatus, CliError> {
    let mut program = std::process::Command::new(&command[0]);
    repro::record::user_environment(&mut program);
    program.args(&command[1..]).stdout(std::process::Stdio::from(std::io::stderr()));
    for (name, value) in env.vars() {
        match value {
            Some(value) => program.env(name, value),
            None => program.env_remove(name),
        };
    }
    if std::env::var_os(CUDA_HASH_LIB_ENV).is_none() {
        if let Some(library) = cuda_hash_library() {
            program.env(CUDA_HASH_LIB_ENV, library);
        }
    }
    let (mut child, supervised) =
        super::supervise::spawn(&mut program).map_err(|e| format!("cannot run `{}`: {e}", command[0]))?;
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                super::interrupt::unless_interrupted();
                break status;
            }
            Ok(None) if timeout.is_some_and(|t| started.elapsed() > t) => {
                supervised.stop();
                let _ = child.wait();
                let owned_by = supervised.owned_by();
                supervised.release();
                return Err(format!(
                    "`{}` ran longer than --timeout {}s and was stopped, with every process it started ({owned_by})",
                    command.join(" "),
                    timeout.unwrap_or_default().as_secs()
                )
                .into());
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => {
                // (The interrupt handler stopping the program may have reaped it first.)
                super::interrupt::unless_interrupted();
                supervised.release();
                return Err(format!("cannot wait for `{}`: {e}", command[0]).into());
            }
        }
    };
    // Whatever the program left running goes with it, in its group or not.
    supervised.release();
    Ok(status)
}

/// The signal that ended a program interrupted from outside (Ctrl-C, `kill`): SIGINT, SIGTERM
/// or SIGHUP, which no recorder sends. `None` for a program that exited, or crashed.
pub fn interrupted(status: &ExitStatus) -> Option<i32> {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        status.signal().filter(|s| [1, 2, 15].contains(s))
    }
    #[cfg(not(unix))]
    {
        let _ = status;
        None
    }
}

/// Checks what a program left in `dir` before anything compares or keeps it: a finished trace of
/// at least one step, or a data-parallel run of such rank traces; never a link. With
/// `stop_after` (the program was asked to stop after that step, `REPRO_STOP_AFTER`), a trace
/// stopped on purpose there counts as finished.
pub fn check_recorded(program: &str, dir: &Path, stop_after: Option<u64>) -> Result<(), CliError> {
    let streams = match repro::trace::rank_streams(dir) {
        Ok(Some(ranks)) => ranks,
        Ok(None) => vec![dir.to_path_buf()],
        Err(e) => return Err(format!("`{program}` left a data-parallel run that cannot be read: {e}").into()),
    };
    for stream in &streams {
        let records = stream.join(repro::trace::format::RECORDS_FILE);
        match std::fs::symlink_metadata(&records) {
            Err(_) => {
                return Err(format!(
                    "`{program}` recorded nothing: it should record into the directory in ${TRACE_DIR_ENV} (see \
                     `Recorder::from_env`)"
                )
                .into())
            }
            Ok(meta) if !meta.file_type().is_file() => {
                return Err(format!(
                    "`{program}` left {} as a link or other non-file; repro reads and keeps only files it wrote",
                    records.display()
                )
                .into())
            }
            Ok(_) => {}
        }
        let summary = repro::trace::summarize(stream)
            .map_err(|e| format!("`{program}` left something that is not a readable trace: {e}"))?;
        let stopped_as_asked = stop_after.is_some_and(|step| {
            summary.last_step == Some(step)
                && summary.incomplete_reason.as_deref().is_some_and(|why| why.starts_with("stopped early"))
        });
        if !summary.complete && !stopped_as_asked {
            let why = summary.incomplete_reason.unwrap_or_default();
            return Err(format!(
                "`{program}` left an unfinished trace in {} ({why}): did it return before `Recorder::finish`?",
                stream.display()
            )
            .into());
        }
        if summary.steps == 0 {
            return Err(format!("`{program}` recorded no steps in {}: nothing to compare", stream.display()).into());
        }
    }
    Ok(())
}
