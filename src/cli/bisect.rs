//! `repro bisect`: from "two runs differ" to the op and its exact error in one command. Records
//! the program (`-- CMD`) or a built-in workload twice keeping hashes only, the second run
//! compared with the first as it records and stopped at their first divergence; then records
//! both sides again keeping full values at that step, and compares those. A divergence that
//! comes earlier in the second pair (it depends on timing) is followed there, a few rounds at
//! most.

use super::error::CliError;
use super::exit::Exit;
use super::output::print_json;
use super::program::{check_recorded, run_command};
use super::report_args::JsonOutput;
use super::workload_args::WorkloadArgs;
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
    /// Record the second run of each pair up to N times, until it differs from the first: for
    /// a fault that fires only in some runs.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
    runs: u32,
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
    /// What it trains, for `cli::main` to note the options given.
    pub fn train_mut(&mut self) -> &mut WorkloadArgs {
        &mut self.train
    }
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
                // The steps kept in full are also recorded down the capture ladder: every module's
                // output and every op's (a PyTorch program), to name the op that diverges.
                let escalated = (capture != FullCapture::None).then(|| capture.clone());
                let env = RecordEnv {
                    dir: Some(dir.to_path_buf()),
                    capture: Some(capture),
                    replace: true,
                    against: against.map(Path::to_path_buf),
                    modules: escalated.clone(),
                    ops: escalated,
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
                    options = options.comparing_with(
                        Box::new(ReferenceCheck::open(reference, repro::trace::DataHash::Blake3)?),
                        true,
                    );
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

    /// Records a pair of runs into `work/NAME-a` and `work/NAME-b`, the second compared with the
    /// first as it records; the second is recorded again, up to `tries` times in all, until the
    /// pair differs. The comparison of the last pair.
    fn record_pair(&self, work: &Path, name: &str, capture: FullCapture, tries: u32) -> Result<RunDiff, CliError> {
        let (reference, run) = (work.join(format!("{name}-a")), work.join(format!("{name}-b")));
        self.record(&reference, capture.clone(), None)?;
        let mut attempt = 1;
        loop {
            let finished = self.record(&run, capture.clone(), Some(&reference))?;
            let compared = self.compare(&reference, &run, finished)?;
            if !compared.diff.agrees_so_far() || attempt >= tries {
                return Ok(compared);
            }
            attempt += 1;
            eprintln!("bisect: the pair agreed; recording the second run again ({attempt} of {tries})");
        }
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
            args.train.refuse_with_command()?;
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
    let mut compared = subject.record_pair(&work, "hashes", FullCapture::None, args.runs)?;
    let first = compared.diff.first_divergence.as_ref().map(|d| d.step);
    let mut rounds = 0;
    let mut step = first;
    let mut values_agreed = false;
    while let Some(at) = step.filter(|_| rounds < MAX_ROUNDS) {
        rounds += 1;
        eprintln!("bisect: the runs first differ at step {at}; recording both again with its full values");
        let again = subject.record_pair(&work, &format!("values-{rounds}"), FullCapture::Steps(vec![at]), args.runs)?;
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
                eprintln!(
                    "bisect: this time the runs agreed ({} tr{}): they do not differ at every run",
                    args.runs,
                    if args.runs == 1 { "y" } else { "ies" }
                );
                values_agreed = true;
                break;
            }
        }
    }
    if args.keep.is_none() {
        // The traces go with the scratch directory: don't show paths that will not exist.
        for (label, side) in [("A", &mut compared.diff.a), ("B", &mut compared.diff.b)] {
            side.path = format!("run {label} (removed; --keep DIR keeps the traces)");
        }
    }
    let verdict = compared.verdict();
    if args.output.json {
        let report = BisectReport { subject: subject.describe(), first_differing_step: first, rounds, diff: &compared };
        print_json("repro.bisect.v1", Some(verdict.name()), &report)?;
    } else {
        let missing_values = values_agreed.then(|| {
            "hashes differ; the runs agreed when recorded again with values here, so this fault fires only in \
             some runs: `--runs N` records each pair up to N times"
                .to_string()
        });
        let brief = DiffText { brief: true, missing_values, ..DiffText::default() };
        super::output::emit(&render_run_diff_with(&compared, &brief));
    }
    Ok(verdict.into())
}
