//! `repro study cost`: what determinism costs. Times training steps of each workload with each
//! reduction mode on one device, in one process, and reports the deterministic modes' overhead
//! over the non-deterministic one (atomic).

use super::error::StudyError;
use super::results::{CostReport, CostRow};
use super::store::{StudyDir, StudyOut};
use super::subject::{Subject, Variation};
use super::Progress;
use crate::ops::Reductions;
use crate::record::Recorder;
use candle_core::Device;
use std::time::Duration;

/// The modes timed, deterministic ones first.
pub const MODES: [Reductions; 3] = [Reductions::Candle, Reductions::Ordered, Reductions::Atomic];

/// Times `steps` training steps (after one warm-up step) of each configuration in each mode,
/// the modes interleaved `rounds` times so slow drifts of the machine hit every mode alike. The
/// report is kept in the study directory `out`, which is returned.
pub fn run_cost(
    subjects: &[Subject],
    steps: u64,
    rounds: usize,
    device: &Device,
    device_label: &str,
    out: &StudyOut,
    progress: &mut dyn Progress,
) -> Result<(CostReport, StudyDir), StudyError> {
    if steps == 0 || rounds == 0 {
        return Err(StudyError::Invalid("the cost study needs --steps and --rounds of at least 1".into()));
    }
    let settings = serde_json::json!({
        "runs": subjects.iter().map(Subject::run_config).collect::<Vec<_>>(),
        "device": device_label,
        "steps": steps,
        "rounds": rounds,
    });
    let dir = StudyDir::open(&out.dir, "cost", &settings, out.restart)?;
    let mut rows = Vec::new();
    let total = subjects.len() * rounds.max(1) * MODES.len();
    let mut done = 0;
    for subject in subjects {
        let mut times: Vec<Vec<Duration>> = vec![Vec::new(); MODES.len()];
        for round in 0..rounds.max(1) {
            for (m, mode) in MODES.iter().enumerate() {
                progress.update(done, total, &format!("{} {mode} (round {})", subject.workload_name(), round + 1));
                done += 1;
                let variation = Variation { reductions: Some(*mode), steps: Some(steps + 1), ..Variation::default() };
                let outcome = subject.train(variation, device, &mut Recorder::discard())?;
                times[m].extend(outcome.step_times);
            }
        }
        let medians: Vec<(f64, f64)> = times
            .iter_mut()
            .map(|t| {
                t.sort();
                let ms = |d: Duration| d.as_secs_f64() * 1e3;
                (t.get(t.len() / 2).map_or(f64::NAN, |&d| ms(d)), t.first().map_or(f64::NAN, |&d| ms(d)))
            })
            .collect();
        let atomic = medians[MODES.iter().position(|m| *m == Reductions::Atomic).expect("atomic is timed")].0;
        for (m, mode) in MODES.iter().enumerate() {
            rows.push(CostRow {
                workload: subject.describe_briefly(),
                reductions: mode.to_string(),
                deterministic: *mode != Reductions::Atomic,
                median_ms: medians[m].0,
                min_ms: medians[m].1,
                steps_timed: times[m].len(),
                overhead_vs_atomic_percent: (medians[m].0 / atomic - 1.0) * 100.0,
            });
        }
    }
    progress.update(total, total, "done");
    Ok((CostReport { device: device_label.to_string(), rows }, dir))
}
