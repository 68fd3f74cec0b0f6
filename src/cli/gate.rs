//! `repro gate`: record a configuration several times (or once, against a committed baseline)
//! and fail on any bit difference. `repro gate -- CMD ARGS` gates a user's own training
//! program, which records itself into the directory named by `REPRO_TRACE_DIR`; on a FAIL, the
//! step where it first diverges is recorded again down to the op (as `repro bisect` does).

use super::error::CliError;
use super::exit::Exit;
use super::program::record_command;
use super::recording::record_for_gate;
use super::report_args::{JsonOutput, ToleranceArgs};
use super::workload_args::WorkloadArgs;
use clap::Args;
use repro::diff::{baseline_mismatch, gate_traces, DiffError, GateReference, GateReport, RunDiff};
use repro::record::RecordEnv;
use repro::report::{render_gate, render_gate_junit, render_gate_markdown, render_run_diff_with, DiffText};
use repro::trace::{FullCapture, TraceReader};
use repro::workloads::WorkloadRun;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Debug, Args)]
// A repeated option keeps its last value.
#[command(
    args_override_self = true,
    mut_arg("tolerance", |a| super::report_args::extend_help(a,
        "Judged on values, so the runs keep them at every step unless --capture says otherwise; a baseline keeps \
         hashes only and cannot be judged by a tolerance")),
)]
pub struct GateArgs {
    /// How many runs to record (default: 2, or 1 with --baseline).
    #[arg(long)]
    runs: Option<usize>,
    /// Compare against this baseline (made by `repro baseline write`) instead of a fresh run.
    #[arg(long, value_name = "FILE")]
    baseline: Option<PathBuf>,
    /// Stop starting new runs after this many seconds (at least two traces are compared).
    #[arg(long, value_name = "SECONDS")]
    budget: Option<u64>,
    /// Stop a run of -- CMD that takes longer than this many seconds (it and every process it
    /// started), and fail with an error naming it.
    #[arg(long, value_name = "SECONDS", requires = "command")]
    timeout: Option<u64>,
    /// Keep the recorded traces in this directory (default: a temporary one, removed).
    #[arg(long, value_name = "DIR")]
    keep: Option<PathBuf>,
    /// Steps whose full values are kept, for exact metrics of a failure: none (hashes only),
    /// all, first-and-last, every:N, steps:A,B,... (a program run with -- CMD is told through
    /// $REPRO_CAPTURE) [default: none, or all with --tolerance].
    #[arg(long)]
    capture: Option<FullCapture>,
    #[command(flatten)]
    tolerance: ToleranceArgs,
    /// Rename or leave out tensors of the reference and the runs before they are paired, as
    /// `repro diff --map` does (a code change that renamed a module or a scope, its values
    /// unchanged: `rename NEW.* OLD.*`; docs/diff.md, "Name maps").
    #[arg(long, value_name = "FILE")]
    map: Option<PathBuf>,
    #[command(flatten)]
    output: JsonOutput,
    /// Write a JUnit XML report here.
    #[arg(long, value_name = "FILE")]
    junit: Option<PathBuf>,
    /// Write a Markdown summary here (also appended to $GITHUB_STEP_SUMMARY when set).
    #[arg(long, value_name = "FILE")]
    markdown: Option<PathBuf>,
    /// Gate data-parallel runs of the built-in workload, one rank per device (cuda:0,cuda:1,
    /// or cpu,cpu with the file stand-in): every run's ranks must also stay replicas.
    #[arg(long, value_delimiter = ',', value_name = "DEVICES", conflicts_with_all = ["baseline", "command"])]
    devices: Vec<String>,
    /// On a FAIL of -- CMD whose diverging step was recorded without every module's and op's
    /// output, do not record it again down to the op (which costs two more runs up to that
    /// step): for CI budgets.
    #[arg(long, requires = "command")]
    no_escalate: bool,
    /// A program that records itself with repro's library into $REPRO_TRACE_DIR.
    #[arg(last = true, value_name = "CMD")]
    command: Vec<String>,
    // What to train: last, so that its help headings come after this command's own options.
    #[command(flatten)]
    train: WorkloadArgs,
}

impl GateArgs {
    /// What it trains, for `cli::main` to note the options given.
    pub fn train_mut(&mut self) -> &mut WorkloadArgs {
        &mut self.train
    }
}

impl GateArgs {
    /// Whether the report is asked for as JSON (errors then come as JSON too).
    pub fn json(&self) -> bool {
        self.output.json
    }

    /// The steps whose values the runs keep: a tolerance judges values, so it keeps them all
    /// unless told otherwise.
    fn capture(&self) -> FullCapture {
        match (&self.capture, self.tolerance.tolerance.is_empty()) {
            (Some(capture), _) => capture.clone(),
            (None, false) => FullCapture::All,
            (None, true) => FullCapture::None,
        }
    }
}

pub fn run(args: GateArgs) -> Result<Exit, CliError> {
    if !args.command.is_empty() {
        args.train.refuse_with_command()?;
    }
    let runs = args.runs.unwrap_or(if args.baseline.is_some() { 1 } else { 2 });
    if runs == 0 || (args.baseline.is_none() && runs < 2) {
        return Err("a gate needs --runs 2 or more (or --baseline FILE with --runs 1 or more)".into());
    }
    // A baseline that cannot be read, or that was written for other settings, fails the gate
    // before anything is recorded.
    if let (Some(file), Some(tolerance)) = (&args.baseline, args.tolerance.combined()) {
        return Err(format!(
            "--tolerance {tolerance} judges values, and the baseline {} keeps hashes only (values of tensors up to 256 bytes aside): \
             gate fresh runs with `repro gate --tolerance {tolerance}` (no --baseline), or compare a full trace with `repro diff --tolerance {tolerance}`",
            file.display()
        ).into());
    }
    // A built-in workload gated against a baseline runs the baseline's settings, with the
    // options given in place of theirs; one that then differs from it is refused.
    let planned = match (&args.baseline, args.command.is_empty()) {
        (_, false) => None,
        (None, true) => Some(args.train.workload_run()?),
        (Some(file), true) => {
            let baseline = TraceReader::open(file)?;
            let planned = args.train.workload_run_over(&baseline.header().run, file)?;
            let fields = baseline_mismatch(&baseline.header().run, &planned.run_config());
            if !fields.is_empty() {
                return Err(DiffError::BaselineMismatch { baseline: file.clone(), fields }.to_string().into());
            }
            Some(planned)
        }
    };
    // A fault planted through the environment reaches every fresh run of a program alike.
    if let Some(warning) = same_fault_everywhere(&args) {
        eprintln!("{warning}");
    }
    // A program gated against a baseline records with the baseline's data hash.
    let data_hash = match (&args.baseline, &planned) {
        (Some(file), None) => Some(TraceReader::open(file)?.header().data_hash),
        _ => None,
    };
    let scratch;
    let work = match &args.keep {
        Some(dir) if std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some()) => {
            return Err(format!(
                "{} is not empty: --keep needs a new or empty directory (the gate would replace the runs in it)",
                dir.display()
            )
            .into());
        }
        Some(dir) => dir.clone(),
        None => {
            scratch = super::scratch::ScratchDir::new("gate")?;
            scratch.path().to_path_buf()
        }
    };
    std::fs::create_dir_all(&work).map_err(|e| format!("cannot create {}: {e}", work.display()))?;
    let mut report = gate(&args, planned.as_ref(), data_hash, runs, &work)?;
    let mut escalation = escalate(&args, &report, &work);
    if args.keep.is_none() {
        // The traces go with the scratch directory: name no path that will not exist.
        let removed = |side: &mut repro::diff::TraceSide| {
            let path = Path::new(&side.path);
            if let (true, Some(run)) = (path.starts_with(&work), path.file_name()) {
                side.path = format!("{} (removed; --keep DIR keeps the traces)", run.to_string_lossy());
            }
        };
        for c in &mut report.comparisons {
            removed(&mut c.diff.a);
            removed(&mut c.diff.b);
        }
        if let Some(e) = &mut escalation {
            removed(&mut e.diff.diff.a);
            removed(&mut e.diff.diff.b);
        }
    }
    if args.output.json {
        let verdict = if report.passed() { "pass" } else { "fail" };
        #[derive(serde::Serialize)]
        struct Escalated<'a> {
            #[serde(flatten)]
            report: &'a GateReport,
            /// The diverging step recorded again down to the op (`-- CMD` on a FAIL).
            #[serde(skip_serializing_if = "Option::is_none")]
            escalation: Option<&'a Escalation>,
        }
        let document = Escalated { report: &report, escalation: escalation.as_ref() };
        super::output::print_json("repro.gate.v2", Some(verdict), &document)?;
    } else {
        let mut text = render_gate(&report);
        if let Some(e) = &escalation {
            text += &format!(
                "\nstep {} recorded again in both runs with every module's and op's output (--no-escalate skips this):\n",
                e.step
            );
            text += &render_run_diff_with(&e.diff, &DiffText::default());
        }
        super::output::emit(&text);
    }
    if let Some(file) = &args.junit {
        std::fs::write(file, render_gate_junit(&report)?)
            .map_err(|e| format!("cannot write {}: {e}", file.display()))?;
    }
    let markdown = render_gate_markdown(&report);
    if let Some(file) = &args.markdown {
        std::fs::write(file, &markdown).map_err(|e| format!("cannot write {}: {e}", file.display()))?;
    }
    if let Some(summary) = std::env::var_os("GITHUB_STEP_SUMMARY") {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(&summary)
            .map_err(|e| format!("cannot append to $GITHUB_STEP_SUMMARY: {e}"))?;
        let _ = f.write_all(markdown.as_bytes());
    }
    Ok(if report.passed() { Exit::Same } else { Exit::Diverged })
}

/// The warning for a program gated in fresh runs with `REPRO_PERTURB` set: each run gets the same
/// fault (its header says so), so they agree and the gate passes whatever the fault, which is
/// rarely what whoever set it meant.
fn same_fault_everywhere(args: &GateArgs) -> Option<String> {
    let fault = std::env::var_os(repro::record::PERTURB_ENV).filter(|f| !f.is_empty())?;
    (!args.command.is_empty() && args.baseline.is_none()).then(|| {
        format!(
            "gate: warning: {env}={fault} plants the same fault in every run, so they are compared with it planted \
             alike and pass or fail as they would without it; to see whether the gate catches it, write a baseline \
             without it (`repro baseline write --out FILE -- CMD`) and gate against that with it set \
             (`{env}={fault} repro gate --baseline FILE -- CMD`)",
            env = repro::record::PERTURB_ENV,
            fault = fault.to_string_lossy()
        )
    })
}

/// A failed gate's diverging step recorded again down to the op.
#[derive(serde::Serialize)]
struct Escalation {
    /// The step.
    step: u64,
    /// The reference and the first failing run recorded again, compared.
    diff: RunDiff,
}

/// On a FAIL of `-- CMD` (fresh runs, not a baseline) whose first diverging step was recorded
/// without every module's and op's output: both recorded again there (`bisect`'s second
/// round). A rerun that fails is said on stderr; the gate's verdict stands either way.
fn escalate(args: &GateArgs, report: &GateReport, work: &Path) -> Option<Escalation> {
    if report.passed() || args.command.is_empty() || args.baseline.is_some() || args.no_escalate {
        return None;
    }
    let step = report.comparisons.iter().find(|c| !c.passed)?.diff.escalate.as_ref()?.step;
    eprintln!("gate: the runs first differ at step {step}; recording both again down to the op there");
    let timeout = args.timeout.map(Duration::from_secs);
    // A PyTorch program's runs are looked into in two pairs (every op's hash, then the values of
    // the tensors that first differ), as bisect does.
    let two_stage = super::bisect::written_by_python(&work.join("run-0"));
    match super::bisect::record_down_to_ops(&args.command, timeout, &work.join("escalated"), step, 3, two_stage) {
        Ok(diff) => Some(Escalation { step, diff }),
        Err(e) => {
            eprintln!("gate: recording step {step} again down to the op failed: {e}");
            None
        }
    }
}

/// Records the runs, `planned` (a built-in workload's) or the command's, and compares them.
fn gate(
    args: &GateArgs,
    planned: Option<&WorkloadRun>,
    data_hash: Option<repro::trace::DataHash>,
    runs: usize,
    work: &Path,
) -> Result<GateReport, CliError> {
    let subject = match planned {
        Some(planned) => {
            let on = match args.devices.len() {
                0 | 1 => args.devices.first().unwrap_or(&args.train.device).clone(),
                n => format!("{n} ranks ({})", args.devices.join(", ")),
            };
            format!("{} on {on}", planned.workload.describe())
        }
        None => format!("`{}`", args.command.join(" ")),
    };
    // A run takes seconds to minutes: the spinner and the clock keep moving meanwhile.
    let progress = super::progress::Progress::new("recording run", Some(runs as u64)).tick_steadily();
    let started = Instant::now();
    let mut traces = Vec::new();
    for i in 0..runs {
        progress.working_on(i as u64);
        let dir = work.join(format!("run-{i}"));
        match planned {
            Some(planned) => record_for_gate(planned, &dir, &args.capture(), &args.devices, &args.train.device)?,
            None => {
                let env = RecordEnv {
                    dir: Some(dir.clone()),
                    capture: Some(args.capture()),
                    data_hash,
                    ..RecordEnv::default()
                };
                record_command(&args.command, &env, args.timeout.map(Duration::from_secs))?
            }
        }
        traces.push(dir);
        let enough = traces.len() + usize::from(args.baseline.is_some()) >= 2;
        if enough && args.budget.is_some_and(|b| started.elapsed() > Duration::from_secs(b)) {
            break;
        }
    }
    drop(progress);
    // Say so when the budget cut the runs short: "2 runs identical" must not read as the 5 asked.
    let subject = match args.budget {
        Some(b) if traces.len() < runs => {
            format!("{subject} (--budget {b}s stopped it after {} of {runs} runs)", traces.len())
        }
        _ => subject,
    };

    let reference = match &args.baseline {
        Some(file) => GateReference::Baseline(file),
        None => GateReference::FirstRun,
    };
    let names = match &args.map {
        Some(file) => repro::diff::NameMap::read(file)?,
        None => repro::diff::NameMap::default(),
    };
    let options = repro::diff::DiffOptions { tolerance: args.tolerance.combined(), names, ..Default::default() };
    Ok(gate_traces(subject, reference, &traces, &options)?)
}
