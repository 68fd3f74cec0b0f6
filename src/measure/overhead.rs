//! What recording costs a training run. Whole runs of a small model vary by more from one run
//! to the next than recording costs (a host-bound step's speed depends on the machine's
//! moment), so the two modes are compared within one run: blocks of steps, each pair of blocks
//! one recorded (hashes of everything, no full values) and one plain (which goes first
//! alternates), the device drained at each block's edges. Each pair gives a ratio; the report
//! gives their median and middle half, and what recording costs in memory: the device's peak
//! in plain and in recorded blocks, the process's peak resident memory, and the trace's bytes
//! per recorded step. `repro overhead` prints it as a table row.

use crate::distributed::DataParallel;
use crate::record::{take_peak_device_memory, RecordError, RecordOptions, Recorder};
use crate::trace::{summarize, CapturePolicy, FullCapture, RunConfig};
use crate::workloads::{Training, Workload};
use candle_core::Device;
use serde::Serialize;
use std::cell::RefCell;
use std::path::Path;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// What to time.
pub struct OverheadRun<'a> {
    /// The workload, trained `repeats` times.
    pub workload: &'a Workload,
    /// Its run configuration, for the trace's header.
    pub run: RunConfig,
    /// The device it trains on.
    pub device: &'a Device,
    /// With data-parallel training, this rank's handle.
    pub data_parallel: Option<&'a mut DataParallel>,
    /// Steps per timed block (fewer when the run is too short for two pairs of blocks).
    pub block: u64,
    /// Training runs; the pairs of blocks of all of them are pooled.
    pub repeats: usize,
    /// Where the timed runs record (replaced by each run).
    pub scratch: &'a Path,
}

/// What recording costs, as measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OverheadReport {
    /// Tensors recorded per step.
    pub tensors: usize,
    /// Median plain step, in milliseconds.
    pub plain_step_ms: f64,
    /// Median recorded step, in milliseconds.
    pub recorded_step_ms: f64,
    /// Median of the pairs' ratios (recorded / plain).
    pub ratio: f64,
    /// Lower and upper quartiles of the ratios.
    pub quartiles: (f64, f64),
    /// Pairs of blocks timed.
    pub pairs: usize,
    /// Steps per block.
    pub block: u64,
    /// The device's peak memory in the first plain block and in recorded blocks (`None` on the CPU).
    pub peak_device_plain: Option<u64>,
    /// See `peak_device_plain`.
    pub peak_device_recorded: Option<u64>,
    /// The process's peak resident memory, where the system reports it.
    pub peak_host: Option<u64>,
    /// Trace bytes per recorded step.
    pub trace_bytes_per_step: u64,
    /// When fewer than `STEADY_PAIRS` pairs were timed: the steps a steady ratio takes.
    pub steps_for_steady: Option<u64>,
}

/// Trains `run.workload` and times its recorded blocks against its plain ones.
pub fn recording_overhead(mut run: OverheadRun) -> Result<OverheadReport, RecordError> {
    let steps = run.workload.run_config().steps.unwrap_or(1);
    let blocks = Blocks::new(steps, run.block);
    let mut pairs: Vec<(Duration, Duration)> = Vec::new();
    let (mut peaks, mut trace_bytes, mut recorded_steps, mut tensors) = (Peaks::default(), 0u64, 0u64, 0);
    for _ in 0..run.repeats.max(1) {
        let capture = CapturePolicy { full: FullCapture::None, ..CapturePolicy::default() };
        let rank = run.data_parallel.as_ref().map(|dp| dp.describe());
        // Asked at the start of every step: drains the device and reads the clock at each
        // block's start, and says whether the step's block records.
        let clock = Rc::new(RefCell::new(Clock::default()));
        let (ticks, at_device) = (clock.clone(), run.device.clone());
        let options = RecordOptions { rank, ..RecordOptions::capture(capture).replacing(true) }
            .recording_only(move |_| ticks.borrow_mut().tick(&at_device, &blocks));
        let mut recorder = Recorder::create(run.scratch, run.run.clone(), run.device, options)?;
        run.workload.run(Training::on(run.device, &mut recorder).as_rank(run.data_parallel.as_deref_mut()))?;
        // The last block ends when the device has finished its steps.
        clock.borrow_mut().mark(run.device);
        recorder.finish()?;
        let clock = Rc::try_unwrap(clock)
            .map_err(|_| RecordError::Unsupported("the recorder kept its step selector".into()))?
            .into_inner();
        pairs.extend(blocks.pairs(&clock.marks()?));
        peaks = peaks.max(blocks.peaks(&clock.peaks));
        let summary = summarize(run.scratch)?;
        trace_bytes += summary.records_bytes + summary.payload_bytes;
        recorded_steps += summary.steps;
        tensors = summary.tensors.len();
    }
    let timing = Timing::of(&pairs, blocks.block);
    Ok(OverheadReport {
        tensors,
        plain_step_ms: timing.plain_step_ms,
        recorded_step_ms: timing.recorded_step_ms,
        ratio: timing.ratio,
        quartiles: timing.quartiles,
        pairs: pairs.len(),
        block: blocks.block,
        peak_device_plain: peaks.plain,
        peak_device_recorded: peaks.recorded,
        peak_host: crate::workloads::host_memory::peak_resident_bytes(),
        trace_bytes_per_step: trace_bytes / recorded_steps.max(1),
        steps_for_steady: (pairs.len() < STEADY_PAIRS).then(|| blocks.steps_for(STEADY_PAIRS)),
    })
}

/// Pairs of blocks for a steady ratio (beyond the first pair, which warms up).
pub const STEADY_PAIRS: usize = 8;

/// How a run's steps fall into timed blocks: block `k` covers steps `k * block ..`; blocks go
/// in pairs, one recorded and one plain, the plain one first in even pairs. The first pair
/// warms up (the model's first steps, the recorder's buffers) and is not timed when others are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Blocks {
    /// Steps per block.
    block: u64,
    /// Whole blocks in the run; steps after them are not timed.
    count: u64,
}

impl Blocks {
    /// `block` steps per block, fewer if the run's `steps` would not hold two pairs of blocks.
    fn new(steps: u64, block: u64) -> Self {
        let block = block.clamp(1, (steps / 4).max(1));
        Blocks { block, count: steps / block }
    }

    /// Whether block `k` records.
    fn records(k: u64) -> bool {
        let plain_first = (k / 2).is_multiple_of(2);
        (k % 2 == 1) == plain_first
    }

    /// (plain, recorded) durations of each timed pair, from the times at which blocks began
    /// (one more mark for the end of the last).
    fn pairs(&self, marks: &[Instant]) -> Vec<(Duration, Duration)> {
        let durations: Vec<Duration> = marks.windows(2).map(|w| w[1] - w[0]).take(self.count as usize).collect();
        let pairs: Vec<(Duration, Duration)> = durations
            .chunks_exact(2)
            .enumerate()
            .map(|(j, d)| if Self::records(2 * j as u64) { (d[1], d[0]) } else { (d[0], d[1]) })
            .collect();
        // The first pair warms up, unless it is the only one.
        let warm_up = usize::from(pairs.len() > 1);
        pairs[warm_up..].to_vec()
    }

    /// The device's peak memory in plain steps and in recorded ones, from the peak read at each
    /// mark (`peaks[k]` covers the span that mark `k` ended: block `k - 1`). Plain is block 0,
    /// which runs before anything is recorded: the recorder keeps its device buffers for reuse
    /// once it has made them, so later plain blocks hold them too. Recorded is the highest of
    /// the whole recorded blocks.
    fn peaks(&self, peaks: &[Option<u64>]) -> Peaks {
        let plain = peaks.get(1).copied().flatten();
        let whole = self.count - self.count % 2;
        let recorded =
            (0..whole).filter(|&k| Self::records(k)).filter_map(|k| peaks.get(k as usize + 1).copied().flatten()).max();
        Peaks { plain, recorded }
    }

    /// The step count (a round number) that times `pairs` pairs after the warm-up.
    fn steps_for(&self, pairs: usize) -> u64 {
        let needed = (pairs as u64 + 1) * 2 * self.block;
        let unit = 10u64.pow(needed.ilog10());
        needed.div_ceil(unit) * unit
    }
}

/// The clock of one timed run, driven by the recorder's step selector.
#[derive(Default)]
struct Clock {
    /// Steps begun so far.
    steps: u64,
    /// When each block began, once the device had drained.
    marks: Vec<Instant>,
    /// At each mark, the device's peak memory since the mark before (`None` on the CPU).
    peaks: Vec<Option<u64>>,
    /// The first failure to drain the device.
    error: Option<String>,
}

impl Clock {
    /// A step begins: marks the time if it begins a block; whether it records.
    fn tick(&mut self, device: &candle_core::Device, blocks: &Blocks) -> bool {
        let (step, block) = (self.steps, self.steps / blocks.block);
        self.steps += 1;
        if step.is_multiple_of(blocks.block) && block <= blocks.count {
            self.mark(device);
        }
        Blocks::records(block)
    }

    /// Drains the device and notes the time.
    fn mark(&mut self, device: &candle_core::Device) {
        if let Err(e) = device.synchronize() {
            self.error.get_or_insert_with(|| format!("cannot wait for {device:?}: {e}"));
        }
        self.marks.push(Instant::now());
        match take_peak_device_memory(device) {
            Ok(peak) => self.peaks.push(peak),
            Err(e) => {
                self.error.get_or_insert_with(|| e.to_string());
            }
        }
    }

    fn marks(&self) -> Result<Vec<Instant>, RecordError> {
        match &self.error {
            Some(e) => Err(RecordError::Unsupported(e.clone())),
            None => Ok(self.marks.clone()),
        }
    }
}

/// The highest device memory of plain and of recorded blocks, in bytes (`None` on the CPU).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Peaks {
    plain: Option<u64>,
    recorded: Option<u64>,
}

impl Peaks {
    fn max(self, other: Peaks) -> Peaks {
        let max = |a: Option<u64>, b: Option<u64>| a.max(b);
        Peaks { plain: max(self.plain, other.plain), recorded: max(self.recorded, other.recorded) }
    }
}

/// What the timed pairs say.
#[derive(Debug, PartialEq)]
struct Timing {
    /// Median block time of each mode, per step.
    plain_step_ms: f64,
    recorded_step_ms: f64,
    /// Median of the pairs' ratios (recorded / plain).
    ratio: f64,
    /// Lower and upper quartiles of the ratios.
    quartiles: (f64, f64),
}

impl Timing {
    fn of(pairs: &[(Duration, Duration)], block: u64) -> Timing {
        let ms = |d: &Duration| d.as_secs_f64() * 1e3 / block as f64;
        let plain: Vec<f64> = pairs.iter().map(|(p, _)| ms(p)).collect();
        let recorded: Vec<f64> = pairs.iter().map(|(_, r)| ms(r)).collect();
        let ratios: Vec<f64> = pairs.iter().map(|(p, r)| r.as_secs_f64() / p.as_secs_f64().max(1e-12)).collect();
        Timing {
            plain_step_ms: quantile(&plain, 0.5),
            recorded_step_ms: quantile(&recorded, 0.5),
            ratio: quantile(&ratios, 0.5),
            quartiles: (quantile(&ratios, 0.25), quantile(&ratios, 0.75)),
        }
    }
}

/// The `q` quantile of `values` (linear between the two nearest; `NaN` for none).
fn quantile(values: &[f64], q: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    if sorted.is_empty() {
        return f64::NAN;
    }
    let at = q * (sorted.len() - 1) as f64;
    let (low, high) = (at.floor() as usize, at.ceil() as usize);
    sorted[low] + (sorted[high] - sorted[low]) * (at - low as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_alternate_which_mode_goes_first_and_shrink_for_short_runs() {
        let modes: Vec<bool> = (0..8).map(Blocks::records).collect();
        assert_eq!(modes, [false, true, true, false, false, true, true, false]);
        assert_eq!(Blocks::new(200, 10), Blocks { block: 10, count: 20 });
        assert_eq!(Blocks::new(205, 10), Blocks { block: 10, count: 20 }, "the last 5 steps are not timed");
        assert_eq!(Blocks::new(20, 10), Blocks { block: 5, count: 4 }, "two pairs at least");
        assert_eq!(Blocks::new(2, 10), Blocks { block: 1, count: 2 });
        assert_eq!(Blocks::new(200, 0), Blocks { block: 1, count: 200 });
        assert_eq!(Blocks::new(200, 10).steps_for(8), 200);
        assert_eq!(Blocks::new(200, 7).steps_for(8), 200, "126 rounds up");
        assert_eq!(Blocks::new(2000, 100).steps_for(8), 2000);
    }

    #[test]
    fn pairs_skip_the_warm_up_and_put_the_plain_block_first() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        // Blocks of 10, 30 (the warm-up pair), 110 recorded and 100 plain (the second pair
        // records first), 100 plain and 120 recorded; a trailing block that is not whole is
        // left out.
        let lengths = [10, 30, 110, 100, 100, 120, 999];
        let mut marks = vec![t0];
        for l in lengths {
            marks.push(*marks.last().unwrap() + ms(l));
        }
        let blocks = Blocks { block: 10, count: 6 };
        assert_eq!(blocks.pairs(&marks), [(ms(100), ms(110)), (ms(100), ms(120))]);
        // A single pair is all there is: it is kept.
        assert_eq!(Blocks { block: 1, count: 2 }.pairs(&marks[..3]), [(ms(10), ms(30))]);
    }

    #[test]
    fn peaks_take_the_plain_block_before_any_recording_and_the_highest_recorded_block() {
        // Six blocks: plain, recorded, recorded, plain, plain, recorded. Mark k reads the peak
        // of block k - 1; mark 0 read the set-up's. The later plain blocks (which hold the
        // recorder's kept buffers) do not count.
        let peaks = [Some(999), Some(20), Some(35), Some(30), Some(50), Some(12), Some(40)];
        let blocks = Blocks { block: 10, count: 6 };
        assert_eq!(blocks.peaks(&peaks), Peaks { plain: Some(20), recorded: Some(40) });
        assert_eq!(Blocks { block: 1, count: 2 }.peaks(&peaks[..3]), Peaks { plain: Some(20), recorded: Some(35) });
        // No device, no figure.
        assert_eq!(blocks.peaks(&[None; 7]), Peaks::default());
    }

    #[test]
    fn timing_takes_medians_and_quartiles_per_step() {
        let ms = Duration::from_millis;
        let pairs = [(ms(100), ms(110)), (ms(100), ms(120)), (ms(200), ms(200)), (ms(100), ms(300))];
        let t = Timing::of(&pairs, 10);
        assert_eq!(t.plain_step_ms, 10.0);
        assert!((t.recorded_step_ms - 16.0).abs() < 1e-9, "{t:?}");
        assert!((t.ratio - 1.15).abs() < 1e-9, "{t:?}");
        assert!((t.quartiles.0 - 1.075).abs() < 1e-9 && (t.quartiles.1 - 1.65).abs() < 1e-9, "{t:?}");
        assert!(quantile(&[], 0.5).is_nan());
    }
}
