//! `repro overhead`: the cost of recording. Trains any built-in workload un-instrumented and
//! with hashes-only recording of everything it records (every graph node for `gpt`), in one
//! process on one device, alternating the two, and prints the time per training step.

use super::workload_args::WorkloadArgs;
use super::Exit;
use clap::Args;
use repro::distributed::{self, DataParallel};
use repro::record::{open_device, Recorder};
use repro::trace::{summarize, CapturePolicy, FullCapture};
use std::time::{Duration, Instant};

#[derive(Debug, Args)]
pub struct OverheadArgs {
    /// Measurements of each mode; the fastest counts.
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Print the table header too.
    #[arg(long)]
    header: bool,
    /// Time data-parallel training, one rank process per device (cuda:0,cuda:1); rank 0 prints
    /// the row. Steps are of the whole batch, so the plain column against one device's is the
    /// speed-up.
    #[arg(long, value_delimiter = ',', value_name = "DEVICES")]
    devices: Vec<String>,
    /// Set by the process that starts the ranks: this process's rank.
    #[arg(long, hide = true, requires = "rendezvous")]
    rank: Option<usize>,
    /// Set by the process that starts the ranks: where the ranks meet.
    #[arg(long, hide = true, requires = "rank")]
    rendezvous: Option<std::path::PathBuf>,
    // What to train: last, so that its help headings come after this command's own options.
    #[command(flatten)]
    train: WorkloadArgs,
}

pub fn run(args: OverheadArgs) -> Result<Exit, String> {
    let workload = args.train.workload()?;
    if args.devices.len() > 1 && args.rank.is_none() {
        super::ranks::check_devices(&args.devices)?;
        let mut child = vec!["--repeats".to_string(), args.repeats.to_string()];
        if args.header {
            child.push("--header".into());
        }
        child.extend(super::workload_args::options_for(&workload.run_config()));
        super::ranks::supervise("overhead", &args.devices, None, &child)?;
        return Ok(Exit::Same);
    }
    let device_name = match args.rank {
        Some(rank) => args.devices.get(rank).ok_or_else(|| format!("rank {rank} has no device in --devices"))?,
        None => args.devices.first().unwrap_or(&args.train.device),
    };
    let device = open_device(device_name).map_err(|e| e.to_string())?;
    let mut dp = match (args.rank, &args.rendezvous) {
        (Some(rank), Some(rendezvous)) => Some(DataParallel::new(
            distributed::join(&device, rendezvous, rank, args.devices.len()).map_err(|e| e.to_string())?,
        )),
        _ => None,
    };
    let steps = workload.run_config().steps.unwrap_or(1).max(1);
    let scratch = super::scratch::ScratchDir::new("overhead")?;
    let dir = scratch.path().join("run");
    let mut time = |record: bool| -> Result<Duration, String> {
        let started = Instant::now();
        let mut recorder = if record {
            let capture = CapturePolicy { full: FullCapture::None, ..CapturePolicy::default() };
            let run = args.train.run_config(&workload);
            match &dp {
                Some(dp) => Recorder::create_rank(&dir, run, &device, capture, true, dp.describe()),
                None => Recorder::create_with(&dir, run, &device, capture, true),
            }
            .map_err(|e| e.to_string())?
        } else {
            Recorder::discard()
        };
        workload.run_ranked(&device, &mut recorder, None, dp.as_mut()).map_err(|e| e.to_string())?;
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
    let tensors = summarize(&dir).map_err(|e| e.to_string())?.tensors.len();
    drop(scratch);
    let per_step = |d: Duration| d.as_secs_f64() * 1e3 / steps as f64;
    if args.rank.is_some_and(|rank| rank > 0) {
        return Ok(Exit::Same);
    }
    let on = match args.devices.len() {
        0 | 1 => device_name.clone(),
        n => format!("{n} x {}", args.devices.join(",")),
    };
    if args.header {
        super::output::line("| device | workload | tensors/step | plain step | hashes-only recording | ratio |");
        super::output::line("|---|---|---|---|---|---|");
    }
    super::output::line(&format!(
        "| {} | {} | {tensors} | {:.3} ms | {:.3} ms | {:.3}x |",
        on,
        workload.describe(),
        per_step(plain),
        per_step(recorded),
        recorded.as_secs_f64() / plain.as_secs_f64()
    ));
    Ok(Exit::Same)
}
