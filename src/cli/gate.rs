//! `repro gate`: record a configuration several times (or once, against a committed baseline)
//! and fail on any bit difference. `repro gate -- CMD ARGS` gates a user's own training
//! program, which records itself into the directory named by `REPRO_TRACE_DIR`.

use super::workload_args::WorkloadArgs;
use super::Exit;
use clap::Args;
use repro::diff::{diff_traces, header_differences, likely_causes, GateReport};
use repro::record::{open_device, Recorder, TRACE_DIR_ENV};
use repro::report::{render_gate, render_gate_junit, render_gate_markdown};
use repro::trace::{CapturePolicy, FullCapture, TraceReader};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Debug, Args)]
pub struct GateArgs {
    #[command(flatten)]
    train: WorkloadArgs,
    /// How many runs to record (default: 2, or 1 with --baseline).
    #[arg(long)]
    runs: Option<usize>,
    /// Compare against this baseline (made by `repro baseline write`) instead of a fresh run.
    #[arg(long, value_name = "FILE")]
    baseline: Option<PathBuf>,
    /// Stop starting new runs after this many seconds (at least two traces are compared).
    #[arg(long, value_name = "SECONDS")]
    budget: Option<u64>,
    /// Keep the recorded traces in this directory (default: a temporary one, removed).
    #[arg(long, value_name = "DIR")]
    keep: Option<PathBuf>,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
    /// Write a JUnit XML report here.
    #[arg(long, value_name = "FILE")]
    junit: Option<PathBuf>,
    /// Write a Markdown summary here (also appended to $GITHUB_STEP_SUMMARY when set).
    #[arg(long, value_name = "FILE")]
    markdown: Option<PathBuf>,
    /// A program that records itself with repro's library into $REPRO_TRACE_DIR.
    #[arg(last = true, value_name = "CMD")]
    command: Vec<String>,
}

pub fn run(args: GateArgs) -> Result<Exit, String> {
    let runs = args.runs.unwrap_or(if args.baseline.is_some() { 1 } else { 2 });
    if runs == 0 || (args.baseline.is_none() && runs < 2) {
        return Err("a gate needs --runs 2 or more (or --baseline FILE with --runs 1 or more)".into());
    }
    let baseline = match &args.baseline {
        Some(file) => Some(TraceReader::open(file).map_err(|e| e.to_string())?),
        None => None,
    };
    let work = match &args.keep {
        Some(dir) => dir.clone(),
        None => std::env::temp_dir().join(format!("repro-gate-{}", std::process::id())),
    };
    std::fs::create_dir_all(&work).map_err(|e| format!("cannot create {}: {e}", work.display()))?;
    let result = gate(&args, runs, baseline, &work);
    if args.keep.is_none() {
        let _ = std::fs::remove_dir_all(&work);
    }
    let report = result?;
    if args.json {
        super::print_json(&report)?;
    } else {
        print!("{}", render_gate(&report));
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

fn gate(args: &GateArgs, runs: usize, baseline: Option<TraceReader>, work: &Path) -> Result<GateReport, String> {
    let subject = if args.command.is_empty() {
        format!("{} on {}", args.train.workload()?.describe(), args.train.device)
    } else {
        format!("`{}`", args.command.join(" "))
    };
    let progress = indicatif::ProgressBar::new(runs as u64);
    progress.set_style(
        indicatif::ProgressStyle::with_template("{spinner} recording run {pos}/{len} {wide_bar} {elapsed}")
            .expect("valid template"),
    );
    let started = Instant::now();
    let mut traces = Vec::new();
    for i in 0..runs {
        let dir = work.join(format!("run-{i}"));
        if args.command.is_empty() {
            record_builtin(&args.train, &dir)?;
        } else {
            record_command(&args.command, &dir)?;
        }
        traces.push(dir);
        progress.inc(1);
        let enough = traces.len() + usize::from(baseline.is_some()) >= 2;
        if enough && args.budget.is_some_and(|b| started.elapsed() > Duration::from_secs(b)) {
            break;
        }
    }
    progress.finish_and_clear();

    let (mut comparisons, mut likely) = (Vec::new(), Vec::new());
    match baseline {
        Some(base) => {
            let reference = args.baseline.as_ref().expect("baseline given").display().to_string();
            let path = base.records_path().to_path_buf();
            for (i, dir) in traces.iter().enumerate() {
                let mut a = TraceReader::open(&path).map_err(|e| e.to_string())?;
                let mut b = TraceReader::open(dir).map_err(|e| e.to_string())?;
                let (mut config, env) = header_differences(a.header(), b.header());
                // A planted fault stands for a code change: that is what the gate should catch.
                config.retain(|f| f.field != "perturb");
                if !config.is_empty() {
                    let fields: Vec<String> = config
                        .iter()
                        .map(|f| {
                            format!(
                                "{} {} vs {}",
                                f.field,
                                f.a.as_deref().unwrap_or("-"),
                                f.b.as_deref().unwrap_or("-")
                            )
                        })
                        .collect();
                    return Err(format!(
                        "{reference} was written for another configuration ({}); rewrite it with `repro baseline write` or gate the same settings",
                        fields.join(", ")
                    ));
                }
                if likely.is_empty() {
                    likely = likely_causes(&env);
                }
                let d = diff_traces(&mut a, &mut b).map_err(|e| e.to_string())?;
                comparisons.push((format!("run {i}"), d));
            }
            Ok(GateReport { subject, reference, comparisons, likely_causes: likely })
        }
        None => {
            for (i, dir) in traces.iter().enumerate().skip(1) {
                let mut a = TraceReader::open(&traces[0]).map_err(|e| e.to_string())?;
                let mut b = TraceReader::open(dir).map_err(|e| e.to_string())?;
                let d = diff_traces(&mut a, &mut b).map_err(|e| e.to_string())?;
                comparisons.push((format!("run {i}"), d));
            }
            Ok(GateReport { subject, reference: "run 0".into(), comparisons, likely_causes: Vec::new() })
        }
    }
}

/// The capture a gate records with: hashes, and small tensors' values for exact metrics.
pub fn gate_capture() -> CapturePolicy {
    CapturePolicy { full: FullCapture::None, ..CapturePolicy::default() }
}

/// Records one run of a built-in workload into `dir`.
pub fn record_builtin(train: &WorkloadArgs, dir: &Path) -> Result<(), String> {
    let workload = train.workload()?;
    let device = open_device(&train.device).map_err(|e| e.to_string())?;
    let mut recorder = Recorder::create_with(dir, train.run_config(&workload), &device, gate_capture(), true)
        .map_err(|e| e.to_string())?;
    workload.run(&device, &mut recorder, train.perturb.as_ref()).map_err(|e| e.to_string())?;
    recorder.finish().map_err(|e| e.to_string())?;
    Ok(())
}

/// Runs a self-recording program with `REPRO_TRACE_DIR` set to `dir`.
fn record_command(command: &[String], dir: &Path) -> Result<(), String> {
    let _ = std::fs::remove_dir_all(dir);
    let status = std::process::Command::new(&command[0])
        .args(&command[1..])
        .env(TRACE_DIR_ENV, dir)
        .stdout(std::process::Stdio::null())
        .status()
        .map_err(|e| format!("cannot run `{}`: {e}", command[0]))?;
    if !status.success() {
        return Err(format!(
            "`{}` failed ({status}); the gate needs it to train and record successfully",
            command.join(" ")
        ));
    }
    if !dir.join(repro::trace::format::RECORDS_FILE).exists() {
        return Err(format!(
            "`{}` recorded nothing: it should record into the directory in ${TRACE_DIR_ENV} (see `Recorder::from_env`)",
            command.join(" ")
        ));
    }
    Ok(())
}
