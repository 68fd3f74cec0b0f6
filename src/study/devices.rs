//! `repro study devices`: one configuration trained on several devices (the CPU and a GPU, say),
//! each run recorded; reports each device's test error and, against the first device, where the
//! runs first differ and how the weights' ULP distance grows over training.

use super::error::StudyError;
use super::results::{DeviceComparison, DeviceRun, DevicesReport, WeightGap};
use super::stats::RunResult;
use super::store::{StudyDir, StudyOut};
use super::subject::{Subject, Variation};
use crate::diff::{compare_values, diff_traces, RootCause};
use crate::record::{open_device, RecordOptions, Recorder};
use crate::trace::{CapturePolicy, FullCapture, TensorKind, TraceReader};
use std::time::Instant;

/// The steps whose full tensors a devices study stores: 0, 1, 2, 4, ... and the last.
pub fn sampled_steps(total: u64) -> Vec<u64> {
    let mut steps: Vec<u64> = std::iter::once(0).chain((0..64).map(|k| 1u64 << k).take_while(|&s| s < total)).collect();
    if total > 0 && !steps.contains(&(total - 1)) {
        steps.push(total - 1);
    }
    steps
}

/// Trains `config` on each of `devices` (recording into `dir`) and compares the runs.
/// The traces and reports are kept in the study directory `out`, which is returned.
pub fn run_devices(
    subject: &Subject,
    devices: &[String],
    out: &StudyOut,
) -> Result<(DevicesReport, StudyDir), StudyError> {
    if devices.len() < 2 {
        return Err(StudyError::Invalid("a devices study needs two or more devices, e.g. --devices cpu,cuda:0".into()));
    }
    let settings = serde_json::json!({
        "run": subject.run_config().params,
        "workload": subject.workload_name(),
        "devices": devices,
    });
    // Opened before the study directory exists: an unavailable device leaves nothing behind.
    let opened = devices.iter().map(|label| open_device(label)).collect::<Result<Vec<_>, _>>()?;
    let dir = StudyDir::open(&out.dir, "devices", &settings, out.restart)?;
    let steps = subject.steps();
    let capture = CapturePolicy {
        full: FullCapture::Steps(sampled_steps(steps)),
        inline_max_bytes: 4096,
        ..CapturePolicy::default()
    };
    let mut runs = Vec::new();
    let mut states = Vec::new();
    let mut labels = Vec::new();
    let mut classes = 0;
    for (i, (label, device)) in devices.iter().zip(&opened).enumerate() {
        let trace = dir.path().join(format!("trace-{i}-{}", label.replace(':', "")));
        let mut recorder = Recorder::create(
            &trace,
            subject.run_config(),
            device,
            RecordOptions::capture(capture.clone()).replacing(true),
        )?;
        let started = Instant::now();
        let outcome = subject.train(Variation::default(), device, &mut recorder)?;
        recorder.finish()?;
        let (accuracy, _) = RunResult::score(&outcome.predictions, &outcome.labels, outcome.classes);
        classes = outcome.classes;
        runs.push(DeviceRun {
            device: label.clone(),
            error_rate: 1.0 - accuracy,
            final_loss: outcome.final_loss as f64,
            seconds: started.elapsed().as_secs_f64(),
            trace: trace.display().to_string(),
        });
        states.push((outcome.state, outcome.predictions));
        labels = outcome.labels;
    }
    // Every trained model evaluated on every device (its own device's predictions are reused).
    let mut cross_error = Vec::new();
    for (i, (state, own)) in states.iter().enumerate() {
        let mut row = Vec::new();
        for (j, device) in opened.iter().enumerate() {
            let predictions = if i == j { own.clone() } else { subject.evaluate(device, state)? };
            row.push(1.0 - RunResult::score(&predictions, &labels, classes).0);
        }
        cross_error.push(row);
    }
    let mut comparisons = Vec::new();
    for run in &runs[1..] {
        let mut a = TraceReader::open(&runs[0].trace)?;
        let mut b = TraceReader::open(&run.trace)?;
        let diff = diff_traces(&mut a, &mut b)?;
        let gaps = weight_gaps(&runs[0].trace, &run.trace, &sampled_steps(steps))?;
        comparisons.push(DeviceComparison {
            reference: runs[0].device.clone(),
            device: run.device.clone(),
            identical: diff.is_identical(),
            tensors_compared: diff.tensors_compared,
            tensors_diverged: diff.tensors_diverged,
            first_divergence: diff.first_divergence.as_ref().map(|d| (d.step, d.tensor.clone())),
            root_cause: diff.root_cause.as_ref().map(describe_cause),
            weight_gap: gaps,
        });
    }
    let report = DevicesReport { subject: subject.describe(), steps, runs, cross_error, comparisons };
    Ok((report, dir))
}

/// The gap between the weights of two traces at each of `steps` where both stored them.
fn weight_gaps(a: &str, b: &str, steps: &[u64]) -> Result<Vec<WeightGap>, StudyError> {
    let (mut ra, mut rb) = (TraceReader::open(a)?, TraceReader::open(b)?);
    let mut gaps = Vec::new();
    while let (Some(sa), Some(sb)) = (ra.next_step()?, rb.next_step()?) {
        if sa.step != sb.step || !steps.contains(&sa.step) {
            continue;
        }
        let mut gap = WeightGap { step: sa.step, max_ulp: 0, max_abs: 0.0, mismatched: 0, elements: 0 };
        for ta in sa.tensors.iter().filter(|t| t.kind == TensorKind::Weight) {
            let Some(tb) = sb.tensors.iter().find(|t| t.name == ta.name && t.shape == ta.shape && t.dtype == ta.dtype)
            else {
                continue;
            };
            let (Some(va), Some(vb)) = (ra.values(&sa, ta)?, rb.values(&sb, tb)?) else { continue };
            let m = compare_values(&va, &vb);
            gap.max_ulp = gap.max_ulp.max(m.max_ulp);
            gap.max_abs = gap.max_abs.max(m.max_abs);
            gap.mismatched += m.mismatched;
            gap.elements += m.elements;
        }
        gaps.push(gap);
    }
    Ok(gaps)
}

fn describe_cause(cause: &RootCause) -> String {
    let c = &cause.cause;
    let inputs = if cause.inputs_checked { ", its inputs identical" } else { "" };
    format!("`{}` ({}) at step {}{inputs}", c.tensor, c.kind, c.step)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampled_steps_are_powers_of_two_and_the_last() {
        assert_eq!(sampled_steps(1), vec![0]);
        assert_eq!(sampled_steps(10), vec![0, 1, 2, 4, 8, 9]);
        assert_eq!(sampled_steps(9), vec![0, 1, 2, 4, 8]);
    }
}
