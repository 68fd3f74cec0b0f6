//! `repro bisect`: from "two runs differ" to the op and its exact error in one command. Records
//! the program (`-- CMD`) or a built-in workload twice keeping hashes only, the second run
//! compared with the first as it records and stopped at their first divergence; then records
//! both sides again keeping full values at that step, and compares those. A divergence that
//! comes earlier in the second pair (it depends on timing) is followed there, a few rounds at
//! most.

use super::program::{check_recorded, run_command};
use super::report_args::JsonOutput;
use super::workload_args::WorkloadArgs;
use super::{print_json, CliError, Exit};
use clap::Args;
use repro::diff::{diff_runs, DiffOptions, ReferenceCheck, RunDiff};
use repro::record::{open_device, RecordEnv, RecordError, RecordOptions, Recorder};
use repro::report::{render_run_diff_with, DiffText};
use repro::trace::{CapturePolicy, FullCapture};
use repro::workloads::{Training, WorkloadRun};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Rounds of re-recording with values before bisect reports what it has.
const MAX_ROUNDS: usize = 3;

#[derive(Debug, Args)]
pub struct BisectArgs {
    /// Keep the recorded traces in this directory (default: a temporary one, removed).
    #[arg(long, value_name = "DIR")]
    keep: Option<PathBuf>,
    /// Stop a run of -- CMD that takes longer than this many seconds.
    #[arg(long, value_name = "SECONDS", requires = "command")]
    timeout: Option<u64>,
    #[command(flatten)]
    output: JsonOutput,
    /// Your own program, which records itself with repro's library (`Recorder::from_env`,
    /// `ModelRecorder::create_or_gated`); without it, the built-in workload the options name.
    #[arg(last = true, value_name = "CMD")]
    command: Vec<String>,
    // What to train: last, so that its help headings come after this command's own options.
    #[command(flatten)]
    train: WorkloadArgs,
}

impl BisectArgs {
    /// Whether the report is asked for as JSON (errors then come as JSON too).
    pub fn json(&self) -> bool {
        self.output.json
    }
}

/// What bisect records: a user's program or a built-in workload.
enum Subject<'a> {
    Program { command: &'a [String], timeout: Option<Duration> },
    Builtin { planned: WorkloadRun, device: &'a str },
}

impl Subject<'_> {
    /// Records one run into `dir`, keeping full values at the steps `capture` names and, with
    /// `against`, compared with that trace as it records and stopped at the first divergence
    /// (the trace then ends there). Whether the run went to its end: a program stopped at the
    /// divergence fails, which only the comparison can tell from another failure (`compare`).
    fn record(&self, dir: &Path, capture: FullCapture, against: Option<&Path>) -> Result<bool, CliError> {
        match self {
            Subject::Program { command, timeout } => {
                let env = RecordEnv {
                    dir: Some(dir.to_path_buf()),
                    capture: Some(capture),
                    replace: true,
                    against: against.map(Path::to_path_buf),
                    ..RecordEnv::default()
                };
                let status = run_command(command, &env, *timeout)?;
                // Stopped at the divergence, the program returns the recorder's error.
                if !status.success() && against.is_none() {
                    return Err(format!("`{}` failed ({status})", command.join(" ")).into());
                }
                match status.success() {
                    true => check_recorded(&command.join(" "), dir).map(|()| true),
                    false => Ok(false),
                }
            }
            Subject::Builtin { planned, device } => {
                let device = open_device(device)?;
                let capture = CapturePolicy { full: capture, ..CapturePolicy::default() };
                let mut options = RecordOptions {
                    perturbation: planned.perturbation.clone(),
                    ..RecordOptions::capture(capture).replacing(true)
                };
                if let Some(reference) = against {
                    options = options.comparing_with(Box::new(ReferenceCheck::open(reference)?), true);
                }
                let mut recorder = Recorder::create(dir, planned.run_config(), &device, options)?;
                match planned.workload.run(Training::on(&device, &mut recorder)) {
                    Ok(()) | Err(RecordError::Diverged { .. }) => {}
                    Err(e) => return Err(e.into()),
                }
                recorder.finish()?;
                // A built-in workload stopped at a divergence finishes its trace.
                Ok(true)
            }
        }
    }

    /// `run` against `reference`; a run that did not go to its end must have stopped at a
    /// divergence, or the program failed for a reason of its own.
    fn compare(&self, reference: &Path, run: &Path, finished: bool) -> Result<RunDiff, CliError> {
        let failed = || format!("{} failed before diverging from {}", self.describe(), reference.display());
        let recorded = run.join(repro::trace::format::RECORDS_FILE).exists() || repro::trace::is_ranked_run(run);
        if !finished && !recorded {
            return Err(failed().into());
        }
        let compared = diff_runs(reference, run, &DiffOptions::default())?;
        if !finished && compared.diff.first_divergence.is_none() {
            return Err(failed().into());
        }
        Ok(compared)
    }

    fn describe(&self) -> String {
        match self {
            Subject::Program { command, .. } => format!("`{}`", command.join(" ")),
            Subject::Builtin { planned, device } => format!("{} on {device}", planned.workload.describe()),
        }
    }
}

/// What bisect found, for `--json`.
#[derive(serde::Serialize)]
struct BisectReport<'a> {
    subject: String,
    /// The first step whose hashes differ between the two hash-only runs.
    first_differing_step: Option<u64>,
    /// Rounds of re-recording with full values.
    rounds: usize,
    /// The comparison of the last pair recorded (with full values at the step, when any differ).
    diff: &'a RunDiff,
}

pub fn run(args: BisectArgs) -> Result<Exit, CliError> {
    let subject = match args.command.is_empty() {
        true => Subject::Builtin { planned: args.train.workload_run()?, device: &args.train.device },
        false => {
            super::workload_args::refuse_workload_options_with_command()?;
            Subject::Program { command: &args.command, timeout: args.timeout.map(Duration::from_secs) }
        }
    };
    let scratch;
    let work = match &args.keep {
        Some(dir) if std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some()) => {
            return Err(format!("{} is not empty: --keep needs a new or empty directory", dir.display()).into());
        }
        Some(dir) => dir.clone(),
        None => {
            scratch = super::scratch::ScratchDir::new("bisect")?;
            scratch.path().to_path_buf()
        }
    };
    std::fs::create_dir_all(&work).map_err(|e| format!("cannot create {}: {e}", work.display()))?;

    eprintln!("bisect: recording {} twice, hashes only", subject.describe());
    let (reference, run) = (work.join("hashes-a"), work.join("hashes-b"));
    subject.record(&reference, FullCapture::None, None)?;
    let finished = subject.record(&run, FullCapture::None, Some(&reference))?;
    let mut compared = subject.compare(&reference, &run, finished)?;
    let first = compared.diff.first_divergence.as_ref().map(|d| d.step);
    let mut rounds = 0;
    let mut step = first;
    while let Some(at) = step.filter(|_| rounds < MAX_ROUNDS) {
        rounds += 1;
        eprintln!("bisect: the runs first differ at step {at}; recording both again with its full values");
        let keep = FullCapture::Steps(vec![at]);
        let (reference, run) = (work.join(format!("values-{rounds}-a")), work.join(format!("values-{rounds}-b")));
        subject.record(&reference, keep.clone(), None)?;
        let finished = subject.record(&run, keep, Some(&reference))?;
        let again = subject.compare(&reference, &run, finished)?;
        let found = again.diff.first_divergence.as_ref().map(|d| (d.step, d.metrics.is_some()));
        match found {
            // Values at the divergence: done.
            Some((s, true)) if s == at => {
                compared = again;
                break;
            }
            // This pair first differs elsewhere: follow it there.
            Some((s, _)) => {
                compared = again;
                step = Some(s);
            }
            // This pair agrees: the runs differ only sometimes; report the first pair.
            None => {
                eprintln!("bisect: this time the runs agreed: they do not differ at every run");
                break;
            }
        }
    }
    if args.output.json {
        let verdict = if compared.diff.first_divergence.is_some() { "diverged" } else { "identical" };
        let report = BisectReport { subject: subject.describe(), first_differing_step: first, rounds, diff: &compared };
        print_json("repro.bisect.v1", Some(verdict), &report)?;
    } else {
        let brief = DiffText { brief: true, ..DiffText::default() };
        super::output::emit(&render_run_diff_with(&compared, &brief));
    }
    Ok(if first.is_some() { Exit::Diverged } else { Exit::Same })
}
