//! `repro record`: train a built-in workload and write its trace.

use super::error::CliError;
use super::exit::Exit;
use super::ranks::{self, RankArgs};
use super::workload_args::WorkloadArgs;
use clap::Args;
use repro::diff::{check_replicas, diff_runs, DiffOptions};
use repro::diff::{config_differences, ReferenceCheck};
use repro::distributed::DataParallel;
use repro::record::RecordEnv;
use repro::record::{open_device, RecordError, RecordOptions, Recorder, StepProgress};
use repro::report::{bytes, render_online, render_run_diff_with, replica_line, DiffText};
use repro::trace::{summarize, CapturePolicy, DataHash, FullCapture};
use repro::workloads::{Training, WorkloadRun};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

#[derive(Debug, Args)]
pub struct RecordArgs {
    /// Trace directory to write (must not hold a trace unless --force).
    #[arg(long)]
    out: PathBuf,
    /// Replace a trace already in --out.
    #[arg(long)]
    force: bool,
    /// Which steps store full tensors: first-and-last, none, all, every:N, steps:A,B,...
    /// [default: first-and-last; with -- CMD, the program's own policy]
    #[arg(long)]
    capture: Option<FullCapture>,
    /// With -- CMD: the steps at which every module's output is recorded, the capture ladder's
    /// `modules` level (a policy as --capture takes, plus `first`) [default: the program's own;
    /// repro.torch: first].
    #[arg(long, value_name = "POLICY", requires = "command")]
    modules: Option<FullCapture>,
    /// With -- CMD: the steps at which every op's output inside the step is recorded (PyTorch's
    /// aten ops, the `ops` level) [default: the program's own; repro.torch: none].
    #[arg(long, value_name = "POLICY", requires = "command")]
    ops: Option<FullCapture>,
    /// Tensors up to this many bytes are stored at every step [default: 256].
    #[arg(long, conflicts_with = "command")]
    inline_max_bytes: Option<u64>,
    /// Compare each step with this trace while recording; stop at the first divergence and
    /// store the diverging step and the one before it in full.
    #[arg(long, value_name = "RUN", conflicts_with = "devices")]
    against: Option<PathBuf>,
    /// How tensors' data are hashed: blake3, or xxh3-1k (twice as fast on a GPU; a PyTorch
    /// program's, through REPRO_DATA_HASH; docs/trace-format.md, section 5.5) [default: blake3].
    /// Traces of different data hashes cannot be compared.
    #[arg(long, value_name = "HASH")]
    data_hash: Option<DataHash>,
    /// With --against: record to the end after a divergence instead of stopping.
    #[arg(long, requires = "against")]
    keep_going: bool,
    /// Stop a run of -- CMD that takes longer than this many seconds (with every process it
    /// started).
    #[arg(long, value_name = "SECONDS", requires = "command")]
    timeout: Option<u64>,
    #[command(flatten)]
    ranks: RankArgs,
    /// Your own program, which records itself with repro's library (`Recorder::from_env`,
    /// `ModelRecorder::create_or_gated`): --out, --capture, --against, --keep-going and --force
    /// reach it through the environment (docs/capture.md lists the variables).
    #[arg(last = true, value_name = "CMD")]
    command: Vec<String>,
    // What to train: last, so that its help headings come after this command's own options.
    #[command(flatten)]
    train: WorkloadArgs,
}

impl RecordArgs {
    /// What it trains, for `cli::main` to note the options given.
    pub fn train_mut(&mut self) -> &mut WorkloadArgs {
        &mut self.train
    }
}

impl RecordArgs {
    fn capture_policy(&self) -> CapturePolicy {
        let defaults = CapturePolicy::default();
        CapturePolicy {
            full: self.capture.clone().unwrap_or(defaults.full),
            inline_max_bytes: self.inline_max_bytes.unwrap_or(defaults.inline_max_bytes),
            ..defaults
        }
    }
}

pub fn run(args: RecordArgs) -> Result<Exit, CliError> {
    if !args.command.is_empty() {
        return record_program(&args);
    }
    if let Some(kind) = args.data_hash.filter(|k| !k.is_blake3()) {
        return Err(format!(
            "--data-hash {kind}: the built-in workloads record with blake3 only; {kind} is for programs recorded \
             with `repro record -- CMD` (repro.torch)"
        )
        .into());
    }
    let planned = args.ranks.workload_run(&args.train)?;
    if args.ranks.starts_ranks() {
        return record_ranks(&args, &planned);
    }
    let workload = &planned.workload;
    let device_name = args.ranks.device(&args.train.device)?;
    let device = open_device(&device_name)?;
    let run = planned.run_config();
    // A rank its launcher started writes its own stream of the run, `OUT/rank-N`.
    let out = match args.ranks.launched()? {
        Some(place) => {
            ranks::check_launched_out(&args.out)?;
            repro::trace::rank_dir(&args.out, place.rank as u64)
        }
        None => args.out.clone(),
    };
    let capture = args.capture_policy();
    let started = Instant::now();
    let reference = match &args.against {
        Some(dir) => Some(ReferenceCheck::open(dir, repro::trace::DataHash::Blake3)?),
        None => None,
    };
    // Settings that differ from the reference's explain a divergence before anyone looks for one.
    let settings = reference.as_ref().map_or_else(Vec::new, |r| config_differences(&r.header().run, &run));
    let reference = reference.map(|r| Arc::new(Mutex::new(r)));
    let mut dp = args.ranks.data_parallel(&device, &ranks::run_settings(&run, &capture))?;
    let rank = dp.as_ref().map(DataParallel::describe);
    let options = RecordOptions {
        capture,
        replace: args.force,
        rank,
        perturbation: planned.perturbation.clone(),
        ..RecordOptions::default()
    }
    .on_step(progress_display());
    let options = match &reference {
        Some(check) => options.comparing_with(Box::new(check.clone()), !args.keep_going),
        None => options,
    };
    let mut recorder = Recorder::create(&out, run, &device, options)?;
    match workload.run(Training::on(&device, &mut recorder).as_rank(dp.as_mut())) {
        Ok(()) | Err(RecordError::Diverged { .. }) => {}
        Err(e) => return Err(format!("{e} (the partial trace in {} is marked incomplete)", out.display()).into()),
    }
    let steps = recorder.finish()?;
    let summary = summarize(&out)?;
    eprintln!(
        "recorded {steps} steps of {} on {} into {} in {:.2}s: records {}, payloads {}",
        workload.describe(),
        device_name,
        out.display(),
        started.elapsed().as_secs_f64(),
        bytes(summary.records_bytes),
        bytes(summary.payload_bytes)
    );
    let Some(check) = reference else { return Ok(Exit::Same) };
    if !settings.is_empty() {
        let mut text = String::from("config differs from the reference:\n");
        for f in &settings {
            let (a, b) = f.values();
            text.push_str(&format!("  {}: {a} | {b}\n", f.field));
        }
        super::output::line(&text);
    }
    let check = check.lock().expect("reference check");
    let against = args.against.as_deref().unwrap_or(Path::new("")).display().to_string();
    match check.divergence() {
        Some(d) => {
            super::output::emit(&render_online(d, &against, &args.out.display().to_string()));
            Ok(Exit::Diverged)
        }
        None => {
            super::output::line(&format!(
                "IDENTICAL  {} steps matched the reference {against} bit for bit",
                check.steps_checked()
            ));
            Ok(Exit::Same)
        }
    }
}

/// Records a data-parallel run: starts one rank process per device and waits for them, then
/// checks that the ranks' parameters stayed replicas.
fn record_ranks(args: &RecordArgs, planned: &WorkloadRun) -> Result<Exit, CliError> {
    let started = Instant::now();
    let capture = args.capture_policy();
    ranks::record_ranks(&args.ranks.devices, &args.out, args.force, &capture, planned)?;
    eprintln!(
        "recorded {} ranks of {} on {} into {} in {:.2}s",
        args.ranks.devices.len(),
        planned.workload.describe(),
        args.ranks.devices.join(", "),
        args.out.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(Exit::Same)
}

/// The summary of each trace a program recorded in `out`: its own, or each rank's of a run of
/// ranks (`torchrun` under `repro record -- CMD`), in rank order.
fn recorded_streams(out: &Path) -> Result<Vec<repro::trace::TraceSummary>, CliError> {
    let streams = repro::trace::rank_streams(out)?.unwrap_or_else(|| vec![out.to_path_buf()]);
    Ok(streams.iter().map(|s| summarize(s)).collect::<Result<Vec<_>, _>>()?)
}

/// Checks `--out` before a program runs: it may be new or empty, hold a trace to replace with
/// `--force`, or not (then the program would fail only once it starts recording, or write
/// beside someone's files).
fn check_program_out(out: &Path, force: bool) -> Result<(), CliError> {
    let holds_trace = out.join(repro::trace::format::RECORDS_FILE).exists() || repro::trace::is_ranked_run(out);
    if holds_trace && !force {
        return Err(format!("{} already holds a trace; --force replaces it", out.display()).into());
    }
    match std::fs::symlink_metadata(out) {
        Err(_) => Ok(()),
        Ok(meta) if !meta.is_dir() => {
            Err(format!("--out {} is not a directory: record into a new or empty directory", out.display()).into())
        }
        Ok(_) if holds_trace => Ok(()),
        Ok(_) => {
            let mut entries = std::fs::read_dir(out).map_err(|e| format!("cannot read {}: {e}", out.display()))?;
            match entries.next() {
                None => Ok(()),
                Some(entry) => Err(format!(
                    "{} holds files that are not a repro trace ({}): record into a new or empty directory",
                    out.display(),
                    entry.map(|e| e.file_name().to_string_lossy().into_owned()).unwrap_or_default()
                )
                .into()),
            }
        }
    }
}

/// Records a user's program (`repro record -- CMD`), which records itself as the environment
/// contract says; with --against, reports how its run compares with the reference.
fn record_program(args: &RecordArgs) -> Result<Exit, CliError> {
    args.train.refuse_with_command()?;
    let out = &args.out;
    check_program_out(out, args.force)?;
    if let Some(reference) = &args.against {
        // A reference that cannot be read fails now, not after the program has trained.
        summarize(reference).map_err(|e| format!("--against {}: {e}", reference.display()))?;
    }
    let env = RecordEnv {
        dir: Some(out.clone()),
        capture: args.capture.clone(),
        replace: args.force,
        against: args.against.clone(),
        keep_going: args.keep_going,
        perturbation: None,
        data_hash: args.data_hash,
        modules: args.modules.clone(),
        ops: args.ops.clone(),
        stop_after: None,
        capture_names: None,
    };
    let program = args.command.join(" ");
    let started = Instant::now();
    let status = super::program::run_command(&args.command, &env, args.timeout.map(std::time::Duration::from_secs))
        .map_err(|e| with_ranks(e.to_string(), out))?;
    if let Some(signal) = super::program::interrupted(&status) {
        let why = format!(
            "`{program}` was interrupted (signal {signal}); what it recorded in {} is unfinished",
            out.display()
        );
        return Err(with_ranks(why, out));
    }
    let Some(reference) = &args.against else {
        if !status.success() {
            return Err(with_ranks(format!("`{program}` failed ({status})"), out));
        }
        super::program::check_recorded(&program, out, None)?;
        let summaries = recorded_streams(out)?;
        let ranks = match summaries.len() {
            1 => String::new(),
            n => format!(" on {n} ranks"),
        };
        eprintln!(
            "recorded {} steps of `{program}`{ranks} into {} in {:.2}s: records {}, payloads {}",
            summaries[0].steps,
            out.display(),
            started.elapsed().as_secs_f64(),
            bytes(summaries.iter().map(|s| s.records_bytes).sum()),
            bytes(summaries.iter().map(|s| s.payload_bytes).sum())
        );
        return Ok(Exit::Same);
    };
    // Stopped at the first divergence, the program returns the recorder's error: the trace
    // then ends at the diverging step, which the comparison below shows. A program that fails
    // has stopped at the divergence only where its trace says so (its recorder finished it
    // there); any other failure is a crash, whatever the steps show.
    let stopped_at_divergence = !status.success()
        && recorded_streams(out).is_ok_and(|streams| {
            streams.iter().any(|s| s.incomplete_reason.as_deref().is_some_and(|r| r.starts_with("stopped early")))
        });
    if !status.success() && !stopped_at_divergence {
        let why = format!(
            "`{program}` failed ({status}); what it recorded in {} is unfinished (a crash, not a divergence)",
            out.display()
        );
        return Err(with_ranks(why, out));
    }
    let compared = diff_runs(reference, out, &DiffOptions::default())?;
    if status.success() {
        super::program::check_recorded(&program, out, None)?;
    } else {
        eprintln!(
            "`{program}` stopped at the divergence ({status}), as --against asks (--keep-going records to the end)"
        );
    }
    super::output::emit(&render_run_diff_with(&compared, &DiffText::default()));
    Ok(compared.verdict().into())
}

/// `why` a program's run failed, followed, where it recorded a run of ranks, by where each rank
/// stopped: the unfinished ranks, the last mark each left, and the ranks that never reached the
/// collective the others waited in (a hung rank, which its launcher or --timeout ended).
fn with_ranks(why: String, out: &Path) -> CliError {
    let Ok(Some(streams)) = repro::trace::rank_streams(out) else { return why.into() };
    match check_replicas(out, &streams) {
        Ok(replicas) => format!("{why}\n{}", replica_line(&replicas).trim_end()).into(),
        Err(_) => why.into(),
    }
}

/// A progress bar on a terminal (hidden otherwise), and, at the first step that stores full
/// values, how much the payloads will take in all.
fn progress_display() -> impl FnMut(&StepProgress) + 'static {
    let mut bar = Some(super::progress::Progress::new("recording step", None));
    let mut told = false;
    move |p: &StepProgress| {
        let Some(shown) = &bar else { return };
        shown.done(p.step + 1, p.total_steps.unwrap_or(p.step + 1));
        if !told && p.payload_bytes > 0 {
            told = true;
            if let Some(n) = p.full_steps {
                let note = format!(
                    "note: full values take about {} per stored step; {n} step(s) store them: about {} in all (--capture sets which)",
                    bytes(p.payload_bytes),
                    bytes(p.payload_bytes.saturating_mul(n))
                );
                shown.note(&note);
            }
        }
        if p.total_steps.is_some_and(|t| p.step + 1 >= t) {
            bar = None;
        }
    }
}
