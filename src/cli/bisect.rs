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
use repro::diff::{diff_runs, DiffOptions, ReferenceCheck, RunDiff, StructuralDifference};
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
                // output and every op's (a PyTorch program), to name the op that diverges; a
                // PyTorch program stops after the last of them (nothing later is compared).
                let escalated = (capture != FullCapture::None).then(|| capture.clone());
                let stop_after = match &capture {
                    FullCapture::Steps(steps) => steps.iter().copied().max(),
                    _ => None,
                };
                let env = RecordEnv {
                    dir: Some(dir.to_path_buf()),
                    capture: Some(capture),
                    replace: true,
                    against: against.map(Path::to_path_buf),
                    modules: escalated.clone(),
                    ops: escalated,
                    stop_after,
                    ..RecordEnv::default()
                };
                let status = run_command(command, &env, *timeout)?;
                // Stopped at the divergence, the program returns the recorder's error.
                if !status.success() && against.is_none() {
                    return Err(format!("`{}` failed ({status})", command.join(" ")).into());
                }
                match status.success() {
                    true => check_recorded(&command.join(" "), dir, stop_after).map(|()| true),
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

/// Records the program `command` twice more with every value, module output and op output at
/// `step` (stopping there), into `work/NAME-a` and `work/NAME-b`, the second up to `tries`
/// times until the pair differs; their comparison. What `repro gate -- CMD` does on a FAIL to
/// name the op, as bisect does once it has the step.
pub(super) fn record_down_to_ops(
    command: &[String],
    timeout: Option<Duration>,
    work: &Path,
    name: &str,
    step: u64,
    tries: u32,
) -> Result<RunDiff, CliError> {
    Subject::Program { command, timeout }.record_pair(work, name, FullCapture::Steps(vec![step]), tries)
}

/// What bisect found, for `--json`.
#[derive(serde::Serialize)]
struct BisectReport<'a> {
    subject: String,
    /// The first step whose hashes differ between the two hash-only runs.
    first_differing_step: Option<u64>,
    /// Rounds of re-recording with full values.
    rounds: usize,
    /// Every pair recorded, in order, and where it first differed.
    pairs: &'a [PairOutcome],
    /// The comparison of the pair reported (with full values at the step, when any differ).
    diff: &'a RunDiff,
}

/// One pair of runs bisect recorded, and where they first differed.
#[derive(serde::Serialize)]
struct PairOutcome {
    /// The step recorded with full values and every module's and op's output, if any (`None`:
    /// hashes only).
    values_at: Option<u64>,
    /// The first step at which the pair differs (`None`: it agreed).
    first_differing_step: Option<u64>,
    /// Whether this is the pair the report shows.
    reported: bool,
}

impl PairOutcome {
    /// `pair 2 (values at step 3): first differs at step 3`.
    fn line(&self, number: usize) -> String {
        let recorded = match self.values_at {
            None => "hashes only".to_string(),
            Some(step) => format!("full values at step {step}"),
        };
        let found = match self.first_differing_step {
            Some(step) => format!("first differs at step {step}"),
            None => "agreed".to_string(),
        };
        let reported = if self.reported { " (reported below)" } else { "" };
        format!("  pair {number} ({recorded}): {found}{reported}")
    }
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
    let mut pairs = vec![PairOutcome { values_at: None, first_differing_step: first, reported: true }];
    let mut rounds = 0;
    let mut step = first;
    let mut values_agreed = false;
    while let Some(at) = step.filter(|_| rounds < MAX_ROUNDS) {
        rounds += 1;
        eprintln!("bisect: the runs first differ at step {at}; recording both again with its full values");
        let again = subject.record_pair(&work, &format!("values-{rounds}"), FullCapture::Steps(vec![at]), args.runs)?;
        let found = again.diff.first_divergence.as_ref().map(|d| (d.step, d.metrics.is_some()));
        let differs = found.map(|(s, _)| s);
        if differs.is_some() {
            pairs.iter_mut().for_each(|p| p.reported = false);
        }
        pairs.push(PairOutcome { values_at: Some(at), first_differing_step: differs, reported: differs.is_some() });
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
    // The second run of a pair stops at its first divergence on purpose (the candle recorder's
    // online comparison): the steps it then lacks are no difference of structure.
    if let Some(at) = compared.diff.first_divergence.as_ref().map(|d| d.step) {
        compared.diff.structure.retain(|item| {
            !matches!(item, StructuralDifference::MissingSteps { missing_in, first_step, .. }
                if missing_in == "b" && *first_step > at)
        });
    }
    if args.keep.is_none() {
        // The traces go with the scratch directory: don't show paths that will not exist.
        for (label, side) in [("A", &mut compared.diff.a), ("B", &mut compared.diff.b)] {
            side.path = format!("run {label} (removed; --keep DIR keeps the traces)");
        }
    }
    let verdict = compared.verdict();
    if args.output.json {
        let report = BisectReport {
            subject: subject.describe(),
            first_differing_step: first,
            rounds,
            pairs: &pairs,
            diff: &compared,
        };
        print_json("repro.bisect.v1", Some(verdict.name()), &report)?;
    } else {
        let missing_values = values_agreed.then(|| {
            "hashes differ; the runs agreed when recorded again with values here, so this fault fires only in \
             some runs: `--runs N` records each pair up to N times"
                .to_string()
        });
        let text = DiffText { missing_values, ..DiffText::default() };
        // Which pairs were recorded and what each showed: a fault that fires in some runs only
        // may move or vanish between pairs, and the report is of one pair alone.
        let mut out = String::from("pairs recorded:\n");
        for (number, pair) in pairs.iter().enumerate() {
            out += &pair.line(number + 1);
            out.push('\n');
        }
        out.push('\n');
        out += &render_run_diff_with(&compared, &text);
        super::output::emit(&out);
    }
    Ok(verdict.into())
}
