//! `repro overhead`: the cost of recording (`repro::measure::overhead`), as a table row: any
//! built-in workload trained with hashes-only recording of everything it records switched on
//! and off every few steps.

use super::error::CliError;
use super::exit::Exit;
use super::ranks::RankArgs;
use super::workload_args::WorkloadArgs;
use clap::Args;
use repro::measure::overhead::{recording_overhead, OverheadRun, STEADY_PAIRS};
use repro::record::open_device;

#[derive(Debug, Args)]
pub struct OverheadArgs {
    /// Steps per timed block: recording is switched on or off every this many steps (fewer
    /// when the run is too short for two pairs of blocks).
    #[arg(long, default_value_t = 10)]
    block: u64,
    /// Training runs to time; the pairs of blocks of all of them are pooled.
    #[arg(long, default_value_t = 1)]
    repeats: usize,
    /// Print the table header too.
    #[arg(long)]
    header: bool,
    /// With --devices, rank 0 prints the row. Steps are of the whole batch, so the plain column
    /// against one device's is the speed-up.
    #[command(flatten)]
    ranks: RankArgs,
    // What to train: last, so that its help headings come after this command's own options.
    #[command(flatten)]
    train: WorkloadArgs,
}

impl OverheadArgs {
    /// What it trains, for `cli::main` to note the options given.
    pub fn train_mut(&mut self) -> &mut WorkloadArgs {
        &mut self.train
    }
}

pub fn run(args: OverheadArgs) -> Result<Exit, CliError> {
    let planned = args.ranks.workload_run(&args.train)?;
    let workload = &planned.workload;
    if args.ranks.starts_ranks() {
        super::ranks::check_devices(&args.ranks.devices)?;
        workload.check_data_parallel()?;
    }
    let steps = workload.run_config().steps.unwrap_or(1);
    if steps < 2 {
        return Err(format!(
            "repro overhead compares recorded steps with plain ones of the same run: pass --steps 2 or more (not {steps})"
        )
        .into());
    }
    if args.ranks.starts_ranks() {
        let mut child =
            vec!["--repeats".to_string(), args.repeats.to_string(), "--block".into(), args.block.to_string()];
        if args.header {
            child.push("--header".into());
        }
        super::ranks::supervise("overhead", &args.ranks.devices, None, &child, &planned.run_config())?;
        return Ok(Exit::Same);
    }
    let device_name = args.ranks.device(&args.train.device)?;
    let device = open_device(&device_name)?;
    let capture = repro::trace::CapturePolicy { full: repro::trace::FullCapture::None, ..Default::default() };
    let mut dp = args.ranks.data_parallel(&device, &super::ranks::run_settings(&planned.run_config(), &capture))?;
    let scratch = super::scratch::ScratchDir::new("overhead")?;
    let report = recording_overhead(OverheadRun {
        workload,
        run: planned.run_config(),
        device: &device,
        data_parallel: dp.as_mut(),
        block: args.block,
        repeats: args.repeats,
        scratch: &scratch.path().join("run"),
    })?;
    drop(scratch);
    if args.ranks.launched()?.is_some_and(|place| place.rank > 0) {
        return Ok(Exit::Same);
    }
    let on = match args.ranks.devices.len() {
        0 | 1 => device_name.to_string(),
        n => format!("{n} x {}", args.ranks.devices.join(",")),
    };
    if args.header {
        super::output::line(
            "| device | workload | tensors/step | plain step | hashes-only recording | ratio | middle half | pairs \
             | peak device memory, plain | recorded | peak host memory | trace/step |",
        );
        super::output::line("|---|---|---|---|---|---|---|---|---|---|---|---|");
    }
    let r = &report;
    super::output::line(&format!(
        "| {on} | {} | {} | {:.3} ms | {:.3} ms | {:.3}x | {:.3}x to {:.3}x | {} | {} | {} | {} | {:.1} KiB |",
        workload.describe(),
        r.tensors,
        r.plain_step_ms,
        r.recorded_step_ms,
        r.ratio,
        r.quartiles.0,
        r.quartiles.1,
        r.pairs,
        r.peak_device_plain.map_or("-".into(), mib),
        r.peak_device_recorded.map_or("-".into(), mib),
        r.peak_host.map_or("-".into(), mib),
        r.trace_bytes_per_step as f64 / 1024.0,
    ));
    if let Some(steps) = r.steps_for_steady {
        eprintln!(
            "note: {} pair(s) of {}-step blocks timed; a ratio is steady from about {STEADY_PAIRS} pairs: pass --steps {steps} \
             or more",
            r.pairs, r.block
        );
    }
    Ok(Exit::Same)
}

/// Bytes as MiB, for the table.
fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}
