//! `repro record`: train a built-in workload and write its trace.

use super::Exit;
use clap::Args;
use repro::diff::ReferenceCheck;
use repro::ops::Reductions;
use repro::record::{open_device, Perturbation, RecordError, Recorder};
use repro::report::{bytes, render_online};
use repro::trace::{summarize, CapturePolicy, FullCapture};
use repro::workloads::{AdderConfig, Formulation, WORKLOADS};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

#[derive(Debug, Args)]
pub struct RecordArgs {
    /// Workload to train.
    #[arg(long, default_value = "adder", value_parser = clap::builder::PossibleValuesParser::new(WORKLOADS))]
    workload: String,
    /// Trace directory to write (must not hold a trace unless --force).
    #[arg(long)]
    out: PathBuf,
    /// Replace a trace already in --out.
    #[arg(long)]
    force: bool,
    /// Seed of the initial weights.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Seed of the training data (defaults to --seed).
    #[arg(long)]
    data_seed: Option<u64>,
    /// Training steps.
    #[arg(long, default_value_t = AdderConfig::default().steps)]
    steps: u64,
    /// Examples per batch.
    #[arg(long, default_value_t = AdderConfig::default().batch)]
    batch: usize,
    /// Input features.
    #[arg(long, default_value_t = AdderConfig::default().features)]
    features: usize,
    /// Learning rate.
    #[arg(long, default_value_t = AdderConfig::default().lr)]
    lr: f64,
    /// How the adder writes its reductions: reduce (sums, means) or matmul (matrix products).
    #[arg(long, default_value = "reduce")]
    formulation: Formulation,
    /// How the reduce formulation's sums accumulate: candle (built-in kernels), atomic (float
    /// atomics, order decided by timing) or ordered (fixed tree, bit-reproducible).
    #[arg(long, default_value = "candle")]
    reductions: Reductions,
    /// Device: cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Which steps store full tensors: first-and-last, none, all, every:N, steps:A,B,...
    #[arg(long, default_value = "first-and-last")]
    capture: FullCapture,
    /// Tensors up to this many bytes are stored at every step.
    #[arg(long, default_value_t = CapturePolicy::default().inline_max_bytes)]
    inline_max_bytes: u64,
    /// Compare each step with this trace while recording; stop at the first divergence and
    /// store the diverging step and the one before it in full.
    #[arg(long, value_name = "RUN")]
    against: Option<PathBuf>,
    /// With --against: record to the end after a divergence instead of stopping.
    #[arg(long, requires = "against")]
    keep_going: bool,
    /// Fault injection: move element 0 of TENSOR by ULPS units in the last place at STEP.
    #[arg(long, value_name = "STEP:TENSOR:ULPS")]
    perturb: Option<Perturbation>,
}

pub fn run(args: RecordArgs) -> Result<Exit, String> {
    let (perturb, formulation) = (args.perturb, args.formulation);
    let config = AdderConfig {
        seed: args.seed,
        data_seed: args.data_seed.unwrap_or(args.seed),
        steps: args.steps,
        batch: args.batch,
        features: args.features,
        lr: args.lr,
        formulation,
        reductions: args.reductions,
    };
    config.validate(perturb.as_ref()).map_err(|e| e.to_string())?;
    let device = open_device(&args.device).map_err(|e| e.to_string())?;
    let mut run = config.run_config();
    if let Some(p) = &perturb {
        run.params.insert("perturb".into(), p.to_string());
    }
    let capture = CapturePolicy { full: args.capture, inline_max_bytes: args.inline_max_bytes };
    let started = Instant::now();
    let reference = match &args.against {
        Some(dir) => Some(Arc::new(Mutex::new(ReferenceCheck::open(dir).map_err(|e| e.to_string())?))),
        None => None,
    };
    let mut recorder =
        Recorder::create_with(&args.out, run, &device, capture, args.force).map_err(|e| e.to_string())?;
    if let Some(check) = &reference {
        recorder.compare_with(Box::new(check.clone()), !args.keep_going);
    }
    match config.run(&device, &mut recorder, perturb.as_ref()) {
        Ok(()) | Err(RecordError::Diverged { .. }) => {}
        Err(e) => return Err(format!("{e} (the partial trace in {} is marked incomplete)", args.out.display())),
    }
    let steps = recorder.finish().map_err(|e| e.to_string())?;
    let summary = summarize(&args.out).map_err(|e| e.to_string())?;
    eprintln!(
        "recorded {steps} steps of {} ({}, {} reductions, seed {}) on {} into {} in {:.2}s: records {}, payloads {}",
        args.workload,
        formulation,
        args.reductions,
        args.seed,
        args.device,
        args.out.display(),
        started.elapsed().as_secs_f64(),
        bytes(summary.records_bytes),
        bytes(summary.payload_bytes)
    );
    let Some(check) = reference else { return Ok(Exit::Same) };
    let check = check.lock().expect("reference check");
    let against = args.against.as_deref().unwrap_or(Path::new("")).display().to_string();
    match check.divergence() {
        Some(d) => {
            print!("{}", render_online(d, &against, &args.out.display().to_string()));
            Ok(Exit::Diverged)
        }
        None => {
            println!("IDENTICAL  {} steps matched the reference {against} bit for bit", check.steps_checked());
            Ok(Exit::Same)
        }
    }
}
