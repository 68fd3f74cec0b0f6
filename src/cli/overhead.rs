//! `repro overhead`: the cost of recording. Trains any built-in workload un-instrumented and
//! with hashes-only recording of everything it records (every graph node for `gpt`), in one
//! process on one device, alternating the two, and prints the time per training step.

use super::ranks::RankArgs;
use super::workload_args::WorkloadArgs;
use super::Exit;
use clap::Args;
use repro::distributed::DataParallel;
use repro::record::{open_device, Recorder};
use repro::trace::{summarize, CapturePolicy, FullCapture};
use std::time::{Duration, Instant};

#[derive(Debug, Args)]
pub struct OverheadArgs {
    /// Measurements of each mode, alternating; the pair with the median ratio is printed.
    #[arg(long, default_value_t = 5)]
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

pub fn run(args: OverheadArgs) -> Result<Exit, String> {
    let workload = args.train.workload()?;
    if args.ranks.starts_ranks() {
        super::ranks::check_devices(&args.ranks.devices)?;
        workload.check_data_parallel().map_err(|e| e.to_string())?;
        let mut child = vec!["--repeats".to_string(), args.repeats.to_string()];
        if args.header {
            child.push("--header".into());
        }
        child.extend(super::workload_args::options_for(&workload.run_config()));
        super::ranks::supervise("overhead", &args.ranks.devices, None, &child)?;
        return Ok(Exit::Same);
    }
    let device_name = args.ranks.device(&args.train.device)?;
    let device = open_device(device_name).map_err(|e| e.to_string())?;
    let mut dp = args.ranks.data_parallel(&device)?;
    let steps = workload.run_config().steps.unwrap_or(1).max(1);
    let scratch = super::scratch::ScratchDir::new("overhead")?;
    let dir = scratch.path().join("run");
    let mut time = |record: bool| -> Result<Duration, String> {
        let started = Instant::now();
        let mut recorder = if record {
            let capture = CapturePolicy { full: FullCapture::None, ..CapturePolicy::default() };
            let (run, rank) = (args.train.run_config(&workload), dp.as_ref().map(DataParallel::describe));
            Recorder::create_stream(&dir, run, &device, capture, true, rank).map_err(|e| e.to_string())?
        } else {
            Recorder::discard()
        };
        workload.run_ranked(&device, &mut recorder, None, dp.as_mut()).map_err(|e| e.to_string())?;
        recorder.finish().map_err(|e| e.to_string())?;
        device.synchronize().map_err(|e| e.to_string())?;
        Ok(started.elapsed())
    };
    // Alternate the two, swapping which goes first each repeat, so that warm-up and drifts of
    // the machine's speed hit both alike; each repeat gives one ratio, and the median of those
    // is the one printed (machines vary by more between runs than one pair does).
    let mut pairs: Vec<(Duration, Duration)> = Vec::new();
    for repeat in 0..args.repeats.max(1) {
        let (plain, recorded) = if repeat % 2 == 0 {
            let plain = time(false)?;
            (plain, time(true)?)
        } else {
            let recorded = time(true)?;
            (time(false)?, recorded)
        };
        pairs.push((plain, recorded));
    }
    let (plain, recorded) = median_pair(&pairs);
    let tensors = summarize(&dir).map_err(|e| e.to_string())?.tensors.len();
    drop(scratch);
    let per_step = |d: Duration| d.as_secs_f64() * 1e3 / steps as f64;
    if args.ranks.rank.is_some_and(|rank| rank > 0) {
        return Ok(Exit::Same);
    }
    let on = match args.ranks.devices.len() {
        0 | 1 => device_name.to_string(),
        n => format!("{n} x {}", args.ranks.devices.join(",")),
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
    if let Some(enough) = steps_for_a_steady_ratio(plain, steps) {
        eprintln!(
            "note: one plain run took {:.0} ms ({steps} steps, building the model included); ratios of runs this \
             short vary by several percent from run to run: pass --steps {enough} or more",
            plain.as_secs_f64() * 1e3
        );
    }
    Ok(Exit::Same)
}

/// How long one measurement should last for its ratio to be steady: the model's construction
/// and the first steps' warm-up then weigh little, and a machine's hiccups average out.
const STEADY_MEASUREMENT: Duration = Duration::from_secs(1);

/// The step count (a round number) that makes a plain run last `STEADY_MEASUREMENT`, if one of
/// `steps` steps took `plain`, less than that; `None` if the run was long enough.
fn steps_for_a_steady_ratio(plain: Duration, steps: u64) -> Option<u64> {
    if plain >= STEADY_MEASUREMENT {
        return None;
    }
    let scale = STEADY_MEASUREMENT.as_secs_f64() / plain.as_secs_f64().max(1e-9);
    let needed = (steps as f64 * scale).ceil().min(1e12) as u64;
    // Rounded up to one significant digit: 20 steps in 150 ms asks for 200, not 134.
    let unit = 10u64.pow(needed.max(1).ilog10());
    Some(needed.div_ceil(unit) * unit)
}

/// The pair (plain, recorded) whose ratio is the median of all pairs' (the lower middle one for
/// an even count).
fn median_pair(pairs: &[(Duration, Duration)]) -> (Duration, Duration) {
    let ratio = |(p, r): &(Duration, Duration)| r.as_secs_f64() / p.as_secs_f64().max(f64::MIN_POSITIVE);
    let mut sorted = pairs.to_vec();
    sorted.sort_by(|a, b| ratio(a).total_cmp(&ratio(b)));
    sorted[(sorted.len() - 1) / 2]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_runs_are_told_a_round_step_count_that_lasts_a_second() {
        let ms = Duration::from_millis;
        assert_eq!(steps_for_a_steady_ratio(ms(150), 20), Some(200));
        assert_eq!(steps_for_a_steady_ratio(ms(400), 20), Some(50));
        assert_eq!(steps_for_a_steady_ratio(ms(1), 3), Some(3000));
        assert_eq!(steps_for_a_steady_ratio(ms(999), 1000), Some(2000));
        assert_eq!(steps_for_a_steady_ratio(ms(1000), 20), None);
        assert_eq!(steps_for_a_steady_ratio(Duration::ZERO, 1), Some(1_000_000_000));
    }

    #[test]
    fn the_median_pair_is_the_one_with_the_middle_ratio() {
        let ms = |p: u64, r: u64| (Duration::from_millis(p), Duration::from_millis(r));
        // Ratios 1.5, 1.1, 0.9, 1.2, 3.0: the median is 1.2, from a pair that is neither the
        // fastest plain nor the fastest recorded run.
        let pairs = [ms(100, 150), ms(200, 220), ms(300, 270), ms(110, 132), ms(90, 270)];
        assert_eq!(median_pair(&pairs), ms(110, 132));
        assert_eq!(median_pair(&pairs[..2]), ms(200, 220), "an even count takes the lower middle");
    }
}
