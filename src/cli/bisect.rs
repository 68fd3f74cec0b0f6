//! `repro bisect`: from "two runs differ" to the op and its exact error in one command. Records
//! the program (`-- CMD`) or a built-in workload twice keeping hashes only, the second run
//! compared with the first as it records and stopped at their first divergence; then records
//! both sides again down to the op at that step, with full values, and compares those. A
//! PyTorch program (a trace of the Python writer) goes there in two pairs, since the values of
//! every op of a step can be tens of GiB: every module's and op's hash at the step, then the
//! values of the tensors that pair first differs in alone. A divergence that comes earlier in a
//! later pair (it depends on timing) is followed there, a few rounds at most.

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

/// How deep a pair of runs is recorded, beyond every step's hashes.
#[derive(Clone, Debug, PartialEq)]
enum Depth {
    /// Hashes only.
    Hashes,
    /// Step `at` down to every module's and op's output (a PyTorch program), as hashes.
    OpHashes { at: u64 },
    /// Step `at` down to the ops, with full values: of every tensor, or of `names` alone.
    Values { at: u64, names: Option<Vec<String>> },
}

impl Depth {
    /// The step recorded down to the ops, if any.
    fn at(&self) -> Option<u64> {
        match self {
            Depth::Hashes => None,
            Depth::OpHashes { at } | Depth::Values { at, .. } => Some(*at),
        }
    }

    /// The steps kept with full values.
    fn capture(&self) -> FullCapture {
        match self {
            Depth::Values { at, .. } => FullCapture::Steps(vec![*at]),
            _ => FullCapture::None,
        }
    }
}

/// What bisect records: a user's program or a built-in workload.
enum Subject<'a> {
    Program { command: &'a [String], timeout: Option<Duration> },
    Builtin { planned: WorkloadRun, device: &'a str },
}

impl Subject<'_> {
    /// Records one run into `dir` as deep as `depth` says and, with `against`, compared with
    /// that trace as it records and stopped at the first divergence (the trace then ends
    /// there). Whether the run went to its end: a program stopped at the divergence fails,
    /// which only the comparison can tell from another failure (`compare`).
    fn record(&self, dir: &Path, depth: &Depth, against: Option<&Path>) -> Result<bool, CliError> {
        let capture = depth.capture();
        match self {
            Subject::Program { command, timeout } => {
                // The step looked into is recorded down the capture ladder: every module's output
                // and every op's (a PyTorch program), to name the op that diverges; a PyTorch
                // program stops after it (nothing later is compared).
                let escalated = depth.at().map(|at| FullCapture::Steps(vec![at]));
                let stop_after = depth.at();
                let capture_names = match depth {
                    Depth::Values { names, .. } => names.clone(),
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
                    capture_names,
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
    fn record_pair(&self, work: &Path, name: &str, depth: &Depth, tries: u32) -> Result<RunDiff, CliError> {
        let (reference, run) = (work.join(format!("{name}-a")), work.join(format!("{name}-b")));
        self.record(&reference, depth, None)?;
        let mut attempt = 1;
        loop {
            let finished = self.record(&run, depth, Some(&reference))?;
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

impl Subject<'_> {
    /// Records step `at` of both runs again down to the op, with values, into `work/*-ROUND-*`:
    /// in one pair keeping every value, or (`two_stage`, a PyTorch program) in two, every
    /// module's and op's hash first, then the values of the tensors that pair first differs in
    /// alone (a second pair only where the first differs at `at`). Each pair recorded, in order.
    fn down_to_ops(
        &self,
        work: &Path,
        round: usize,
        at: u64,
        tries: u32,
        two_stage: bool,
    ) -> Result<Vec<(Depth, RunDiff)>, CliError> {
        if !two_stage {
            let depth = Depth::Values { at, names: None };
            let diff = self.record_pair(work, &format!("values-{round}"), &depth, tries)?;
            return Ok(vec![(depth, diff)]);
        }
        let depth = Depth::OpHashes { at };
        let hashes = self.record_pair(work, &format!("ops-{round}"), &depth, tries)?;
        let names = diverging_names(&hashes, at);
        let mut pairs = vec![(depth, hashes)];
        if let Some(names) = names {
            eprintln!("bisect: they first differ in {}; recording both again with those values", quoted(&names));
            let depth = Depth::Values { at, names: Some(names) };
            let values = self.record_pair(work, &format!("values-{round}"), &depth, tries)?;
            pairs.push((depth, values));
        }
        Ok(pairs)
    }
}

/// The tensors a pair first differs in at step `at`, where it does (the first divergence, and
/// the root cause where that is another tensor), for the next pair to keep the values of.
fn diverging_names(compared: &RunDiff, at: u64) -> Option<Vec<String>> {
    let first = compared.diff.first_divergence.as_ref().filter(|d| d.step == at)?;
    let mut names = vec![first.tensor.clone()];
    if let Some(cause) = compared.diff.root_cause.as_ref().map(|r| &r.cause) {
        if cause.step == at && !names.contains(&cause.tensor) {
            names.push(cause.tensor.clone());
        }
    }
    Some(names)
}

/// `a`, `b`.
fn quoted(names: &[String]) -> String {
    names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
}

/// Whether the run in `dir` (or its first rank's stream) was written by the Python writer, the
/// trace of a PyTorch program (`repro.torch`).
pub(super) fn written_by_python(dir: &Path) -> bool {
    let stream = match repro::trace::rank_streams(dir) {
        Ok(Some(streams)) => streams.into_iter().next(),
        _ => Some(dir.to_path_buf()),
    };
    stream.and_then(|s| repro::trace::TraceReader::open(&s).ok()).is_some_and(|r| r.header().written_by_python())
}

/// Records the program `command` twice more down to the op at `step` (stopping there), into
/// `work/*-1-a` and `-b`, the second up to `tries` times until the pair differs: with every
/// value at the step, or for a PyTorch program (`two_stage`) every op's hash and then the
/// values of the tensors the pair first differs in. The comparison of the last pair that
/// differed (of the last pair, where none did). What `repro gate -- CMD` does on a FAIL to name
/// the op, as bisect does once it has the step.
pub(super) fn record_down_to_ops(
    command: &[String],
    timeout: Option<Duration>,
    work: &Path,
    step: u64,
    tries: u32,
    two_stage: bool,
) -> Result<RunDiff, CliError> {
    let mut pairs = Subject::Program { command, timeout }.down_to_ops(work, 1, step, tries, two_stage)?;
    let differed = pairs.iter().rposition(|(_, d)| d.diff.first_divergence.is_some());
    let (_, diff) = pairs.swap_remove(differed.unwrap_or(pairs.len() - 1));
    Ok(diff)
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
    /// hashes only, or `ops_at`).
    values_at: Option<u64>,
    /// The step recorded with every module's and op's hash, without values (a PyTorch program).
    #[serde(skip_serializing_if = "Option::is_none")]
    ops_at: Option<u64>,
    /// The tensors whose values `values_at` kept, where not every one's.
    #[serde(skip_serializing_if = "Option::is_none")]
    values_of: Option<Vec<String>>,
    /// The first step at which the pair differs (`None`: it agreed).
    first_differing_step: Option<u64>,
    /// Whether this is the pair the report shows.
    reported: bool,
}

impl PairOutcome {
    fn of(depth: &Depth, first_differing_step: Option<u64>) -> Self {
        let (values_at, ops_at, values_of) = match depth {
            Depth::Hashes => (None, None, None),
            Depth::OpHashes { at } => (None, Some(*at), None),
            Depth::Values { at, names } => (Some(*at), None, names.clone()),
        };
        PairOutcome { values_at, ops_at, values_of, first_differing_step, reported: false }
    }

    /// `pair 2 (values at step 3): first differs at step 3`.
    fn line(&self, number: usize) -> String {
        let recorded = match (self.values_at, self.ops_at, &self.values_of) {
            (Some(step), _, Some(names)) => format!("values of {} at step {step}", quoted(names)),
            (Some(step), _, None) => format!("full values at step {step}"),
            (None, Some(step), _) => format!("every op's hash at step {step}"),
            (None, None, _) => "hashes only".to_string(),
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
    let mut compared = subject.record_pair(&work, "hashes", &Depth::Hashes, args.runs)?;
    let first = compared.diff.first_divergence.as_ref().map(|d| d.step);
    let mut pairs = vec![PairOutcome { reported: true, ..PairOutcome::of(&Depth::Hashes, first) }];
    let two_stage = matches!(subject, Subject::Program { .. }) && written_by_python(&work.join("hashes-a"));
    let mut rounds = 0;
    let mut step = first;
    let mut values_agreed = false;
    while let Some(at) = step.filter(|_| rounds < MAX_ROUNDS) {
        rounds += 1;
        eprintln!(
            "bisect: the runs first differ at step {at}; recording both again {}",
            if two_stage { "with every module's and op's hash there" } else { "with its full values" }
        );
        let mut last = None;
        for (depth, again) in subject.down_to_ops(&work, rounds, at, args.runs, two_stage)? {
            let found = again.diff.first_divergence.as_ref().map(|d| (d.step, d.metrics.is_some()));
            if found.is_some() {
                pairs.iter_mut().for_each(|p| p.reported = false);
                compared = again;
            }
            pairs.push(PairOutcome { reported: found.is_some(), ..PairOutcome::of(&depth, found.map(|(s, _)| s)) });
            last = Some(found);
        }
        match last.flatten() {
            // Values at the divergence: done.
            Some((s, true)) if s == at => break,
            // The last pair first differs elsewhere, or without values here: follow it.
            Some((s, _)) => step = Some(s),
            // The last pair agrees: the runs differ only sometimes; report the last that differed.
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
