//! `repro overhead`: the cost of recording. Trains the adder un-instrumented and with per-op,
//! hashes-only recording, in one process on one device, and prints the step times.

use super::Exit;
use clap::Args;
use repro::record::{open_device, Recorder};
use repro::trace::{CapturePolicy, FullCapture};
use repro::workloads::AdderConfig;
use std::time::{Duration, Instant};

#[derive(Debug, Args)]
pub struct OverheadArgs {
    /// Device: cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Training steps per measurement.
    #[arg(long, default_value_t = 100)]
    steps: u64,
    /// Examples per batch (repeatable: one row per size).
    #[arg(long, default_values_t = [10_000usize, 100_000])]
    batch: Vec<usize>,
    /// Measurements per configuration; the fastest counts.
    #[arg(long, default_value_t = 3)]
    repeats: usize,
}

pub fn run(args: OverheadArgs) -> Result<Exit, String> {
    let device = open_device(&args.device).map_err(|e| e.to_string())?;
    let dir = std::env::temp_dir().join(format!("repro-overhead-{}", std::process::id()));
    println!("| device | adder batch | tensors/step | plain step | per-op hashes-only recording | overhead |");
    println!("|---|---|---|---|---|---|");
    for &batch in &args.batch {
        let config = AdderConfig { steps: args.steps, batch, ..AdderConfig::default() };
        let time = |record: bool| -> Result<Duration, String> {
            let started = Instant::now();
            let mut recorder = if record {
                let capture = CapturePolicy { full: FullCapture::None, ..CapturePolicy::default() };
                Recorder::create_with(&dir, config.run_config(), &device, capture, true).map_err(|e| e.to_string())?
            } else {
                Recorder::discard()
            };
            config.run(&device, &mut recorder, None).map_err(|e| e.to_string())?;
            recorder.finish().map_err(|e| e.to_string())?;
            device.synchronize().map_err(|e| e.to_string())?;
            Ok(started.elapsed())
        };
        // Alternate the two so that warm-up and machine noise hit both alike.
        let (mut plain, mut recorded) = (Duration::MAX, Duration::MAX);
        for _ in 0..args.repeats.max(1) {
            plain = plain.min(time(false)?);
            recorded = recorded.min(time(true)?);
        }
        let per_step = |d: Duration| d.as_secs_f64() * 1e3 / args.steps as f64;
        println!(
            "| {} | {batch} | {} | {:.3} ms | {:.3} ms | {:+.1}% |",
            args.device,
            config.tensor_names().len(),
            per_step(plain),
            per_step(recorded),
            100.0 * (recorded.as_secs_f64() / plain.as_secs_f64() - 1.0)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(Exit::Same)
}
