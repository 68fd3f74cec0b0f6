//! `repro study devices`: one configuration trained on several devices (the CPU and a GPU, say),
//! each run recorded; reports each device's test error and, against the first device, where the
//! runs first differ and how the weights' ULP distance grows over training.

use super::error::StudyError;
use super::stats::RunResult;
use super::store::StudyDir;
use crate::diff::{diff_traces, RootCause};
use crate::record::{open_device, Recorder};
use crate::trace::{CapturePolicy, FullCapture, TensorKind, TraceReader};
use crate::workloads::classifier::train;
use crate::workloads::{ClassifierConfig, Dataset};
use serde::Serialize;
use std::time::Instant;

/// One device's run.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceRun {
    /// Device label (`cpu`, `cuda:0`).
    pub device: String,
    /// Test error rate (1 - accuracy).
    pub error_rate: f64,
    /// Training loss at the last step.
    pub final_loss: f64,
    /// Wall time of training and evaluation, in seconds.
    pub seconds: f64,
    /// Where its trace is.
    pub trace: String,
}

/// The error of the weights at one step, over all weight tensors.
#[derive(Debug, Clone, Serialize)]
pub struct WeightGap {
    /// The step.
    pub step: u64,
    /// Largest ULP distance of any weight element.
    pub max_ulp: u64,
    /// Largest |a - b| of any weight element.
    pub max_abs: f64,
    /// Weight elements that differ.
    pub mismatched: u64,
    /// Weight elements compared.
    pub elements: u64,
}

/// A device compared with the first device.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceComparison {
    /// The first device.
    pub reference: String,
    /// The other device.
    pub device: String,
    /// Whether every recorded tensor agreed bit for bit.
    pub identical: bool,
    /// (step, tensor) pairs compared and differing.
    pub tensors_compared: u64,
    /// Of those, how many differ.
    pub tensors_diverged: u64,
    /// First differing step and tensor.
    pub first_divergence: Option<(u64, String)>,
    /// The root cause in the first differing step.
    pub root_cause: Option<String>,
    /// The weights' gap at the steps whose values were stored (powers of two and the last).
    pub weight_gap: Vec<WeightGap>,
}

/// The result of a devices study.
#[derive(Debug, Clone, Serialize)]
pub struct DevicesReport {
    /// The workload, in words.
    pub subject: String,
    /// Training steps per run.
    pub steps: u64,
    /// Per device.
    pub runs: Vec<DeviceRun>,
    /// Each further device against the first.
    pub comparisons: Vec<DeviceComparison>,
}

/// The steps whose full tensors a devices study stores: 0, 1, 2, 4, ... and the last.
pub fn sampled_steps(total: u64) -> Vec<u64> {
    let mut steps: Vec<u64> = std::iter::once(0).chain((0..64).map(|k| 1u64 << k).take_while(|&s| s < total)).collect();
    if total > 0 && !steps.contains(&(total - 1)) {
        steps.push(total - 1);
    }
    steps
}

/// Trains `config` on each of `devices` (recording into `dir`) and compares the runs.
pub fn run_devices(config: &ClassifierConfig, devices: &[String], dir: &StudyDir) -> Result<DevicesReport, StudyError> {
    if devices.len() < 2 {
        return Err(StudyError::Invalid("a devices study needs two or more devices, e.g. --devices cpu,cuda:0".into()));
    }
    let data = Dataset::load(config.dataset, config.dataset_seed, config.examples).map_err(StudyError::Invalid)?;
    let steps = config.total_steps(data.train.len());
    let capture = CapturePolicy { full: FullCapture::Steps(sampled_steps(steps)), inline_max_bytes: 4096 };
    let mut runs = Vec::new();
    for (i, label) in devices.iter().enumerate() {
        let device = open_device(label)?;
        let trace = dir.path().join(format!("trace-{i}-{}", label.replace(':', "")));
        let mut recorder = Recorder::create_with(&trace, config.run_config(), &device, capture.clone(), true)?;
        let started = Instant::now();
        let outcome = train(config, &data, &device, &mut recorder, None)?;
        recorder.finish()?;
        let (accuracy, _) = RunResult::score(&outcome.predictions, &outcome.labels, outcome.classes);
        runs.push(DeviceRun {
            device: label.clone(),
            error_rate: 1.0 - accuracy,
            final_loss: outcome.final_loss as f64,
            seconds: started.elapsed().as_secs_f64(),
            trace: trace.display().to_string(),
        });
    }
    let mut comparisons = Vec::new();
    for run in &runs[1..] {
        let mut a = TraceReader::open(&runs[0].trace)?;
        let mut b = TraceReader::open(&run.trace)?;
        let diff = diff_traces(&mut a, &mut b)?;
        let mut gaps: Vec<WeightGap> = Vec::new();
        for history in diff.tensors.iter().filter(|h| h.kind == TensorKind::Weight) {
            for g in &history.growth {
                let at = match gaps.iter().position(|x| x.step == g.step) {
                    Some(at) => at,
                    None => {
                        gaps.push(WeightGap { step: g.step, max_ulp: 0, max_abs: 0.0, mismatched: 0, elements: 0 });
                        gaps.len() - 1
                    }
                };
                let gap = &mut gaps[at];
                gap.max_ulp = gap.max_ulp.max(g.metrics.max_ulp);
                gap.max_abs = gap.max_abs.max(g.metrics.max_abs);
                gap.mismatched += g.metrics.mismatched;
                gap.elements += g.metrics.elements;
            }
        }
        gaps.sort_by_key(|g| g.step);
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
    Ok(DevicesReport {
        subject: format!("{} on {} ({} epoch(s), batch {})", config.model, config.dataset, config.epochs, config.batch),
        steps,
        runs,
        comparisons,
    })
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
