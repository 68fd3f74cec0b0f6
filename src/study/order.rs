//! `repro study order`: does the order of the training data matter when nothing else varies,
//! even when every batch is the whole training set? Runs differ only in the seed that shuffles
//! the examples (weights' seed fixed, augmentation and dropout off, ordered reductions); churn and
//! the distance of the final weights are reported per batch size. At full batch every step sees
//! the same examples, only in another order, so any difference comes from the order of a sum
//! over the batch: two full-batch runs are recorded and the first tensor that exact arithmetic
//! would make equal (one with no batch dimension) and that differs is named.

use super::error::StudyError;
use super::results::{OrderDivergence, OrderReport, OrderRow};
use super::stats::variant_stats;
use super::store::{StudyDir, StudyOut};
use super::subject::{Subject, Variation};
use super::Progress;
use crate::diff::diff_traces;
use crate::ops::Reductions;
use crate::record::{RecordOptions, Recorder};
use crate::trace::{CapturePolicy, FullCapture, TraceReader};
use crate::workloads::Seeds;
use candle_core::Device;

/// Training steps of the two recorded full-batch runs: the first step already differs.
const RECORDED_STEPS: u64 = 3;

/// Runs (or resumes) the data-order study: `runs` runs of `subject` at each of `batch_sizes`
/// (the training set's size is the full batch), kept in the study directory `out`.
pub fn run_order(
    subject: &Subject,
    batch_sizes: &[usize],
    runs: usize,
    device: &Device,
    device_label: &str,
    out: &StudyOut,
    progress: &mut dyn Progress,
) -> Result<(OrderReport, StudyDir), StudyError> {
    let Some(train_examples) = subject.train_examples() else {
        return Err(StudyError::Invalid(
            "the data-order study trains a classifier (mlp, cnn, resnet18): its full batch is its training set".into(),
        ));
    };
    if runs < 2 {
        return Err(StudyError::Invalid("a data-order study needs --runs 2 or more".into()));
    }
    let mut sizes: Vec<usize> = batch_sizes.to_vec();
    sizes.sort_unstable();
    sizes.dedup();
    if sizes.is_empty() || sizes[0] == 0 || sizes[sizes.len() - 1] > train_examples {
        return Err(StudyError::Invalid(format!(
            "--batch-sizes must be between 1 and the {train_examples} training examples (`full`)"
        )));
    }
    let settings = serde_json::json!({
        "run": subject.run_config().params,
        "workload": subject.workload_name(),
        "runs": runs,
        "device": device_label,
        "batch_sizes": sizes,
    });
    let dir = StudyDir::open(&out.dir, "order", &settings, out.restart)?;
    let base = subject.base_seed();
    let total = runs * sizes.len();
    let mut rows = Vec::new();
    for (b, &batch) in sizes.iter().enumerate() {
        let name = format!("batch{batch}");
        let mut results = Vec::with_capacity(runs);
        for run in 0..runs {
            if let Some(saved) = dir.load_run(&name, run)? {
                results.push(saved);
                continue;
            }
            progress.update(b * runs + run, total, &format!("batch {batch}, run {}", run + 1));
            results.push(subject.train_and_save(order_variation(base, run, batch), device, &dir, &name, run)?);
        }
        let stats = variant_stats(&results, |i| dir.load_weights(&name, i))?;
        rows.push(OrderRow {
            batch,
            full_batch: batch == train_examples,
            run_accuracies: results.iter().map(|r| r.accuracy).collect(),
            stats,
        });
    }
    progress.update(total, total, "full-batch traces");
    let full_batch_divergence = if sizes.contains(&train_examples) {
        full_batch_divergence(subject, train_examples, device, &dir)?
    } else {
        None
    };
    let report = OrderReport {
        subject: subject.describe(),
        device: device_label.to_string(),
        runs,
        train_examples,
        rows,
        full_batch_divergence,
    };
    Ok((report, dir))
}

/// Run `run`'s settings: only the order seed moves with the run. Augmentation and dropout are
/// off: their randomness follows the position in the batch, so with them a new order would also
/// give the examples new shifts and masks.
fn order_variation(base: u64, run: usize, batch: usize) -> Variation {
    Variation {
        seeds: Some(Seeds { order: base + run as u64, ..Seeds::all(base) }),
        reductions: Some(Reductions::Ordered),
        batch: Some(batch),
        without_augmentation_and_dropout: true,
        ..Variation::default()
    }
}

/// Records two full-batch runs of a few steps that differ only in the order seed, and finds
/// the first tensor with no batch dimension that differs (see `OrderDivergence`).
fn full_batch_divergence(
    subject: &Subject,
    train_examples: usize,
    device: &Device,
    dir: &StudyDir,
) -> Result<Option<OrderDivergence>, StudyError> {
    let base = subject.base_seed();
    let capture = CapturePolicy { full: FullCapture::All, inline_max_bytes: 4096, ..CapturePolicy::default() };
    let mut traces = Vec::new();
    for run in 0..2 {
        let trace = dir.path().join(format!("full-batch-{run}"));
        if trace.exists() {
            std::fs::remove_dir_all(&trace).map_err(StudyError::io(&trace))?;
        }
        let mut recorder = Recorder::create(
            &trace,
            subject.run_config(),
            device,
            RecordOptions::capture(capture.clone()).replacing(true),
        )?;
        let variation = Variation { steps: Some(RECORDED_STEPS), ..order_variation(base, run, train_examples) };
        subject.train(variation, device, &mut recorder)?;
        recorder.finish()?;
        traces.push(trace);
    }
    let (mut a, mut b) = (TraceReader::open(&traces[0])?, TraceReader::open(&traces[1])?);
    let diff = diff_traces(&mut a, &mut b)?;
    let Some(first) = diff.first_divergence.as_ref().map(|d| d.step) else {
        return Ok(None);
    };
    // The first diverging step, as A recorded it: each tensor's shape, in recording order.
    let mut a = TraceReader::open(&traces[0])?;
    let step = loop {
        match a.next_step()? {
            Some(s) if s.step == first => break s,
            Some(_) => continue,
            None => return Ok(None),
        }
    };
    let diverged: Vec<&str> =
        diff.tensors.iter().filter(|t| t.first_divergent_step == Some(first)).map(|t| t.name.as_str()).collect();
    let mut permuted_before = Vec::new();
    for t in step.tensors.iter().filter(|t| diverged.contains(&t.name.as_str())) {
        let per_example = t.shape.contains(&(train_examples as u64));
        if per_example {
            permuted_before.push(t.name.clone());
            continue;
        }
        let metrics = diff
            .tensors
            .iter()
            .find(|h| h.name == t.name)
            .and_then(|h| h.growth.iter().find(|g| g.step == first))
            .map(|g| g.metrics);
        return Ok(Some(OrderDivergence {
            step: first,
            tensor: t.name.clone(),
            kind: t.kind.to_string(),
            max_ulp: metrics.map(|m| m.max_ulp),
            mismatched: metrics.map(|m| m.mismatched),
            permuted_before,
        }));
    }
    Ok(None)
}
