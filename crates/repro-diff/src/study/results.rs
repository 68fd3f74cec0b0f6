//! The studies' results: plain data, serializable, with no model code, so reports and plots
//! (and anything reading a study's JSON) need neither candle nor a GPU.

use super::stats::VariantStats;
use serde::{Deserialize, Serialize};

/// One variant's statistics.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VariantReport {
    /// The variant's name.
    pub variant: String,
    /// Reductions used.
    pub reductions: String,
    /// Whether the seeds varied between runs.
    pub seeds_vary: bool,
    /// Test accuracy of each run, in run order.
    #[serde(default)]
    #[serde(deserialize_with = "crate::study::nans_from_nulls")]
    pub run_accuracies: Vec<f64>,
    /// The statistics.
    #[serde(flatten)]
    pub stats: VariantStats,
}

/// The result of a noise study.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NoiseReport {
    /// The workload, dataset and settings, in words.
    pub subject: String,
    /// Device label.
    pub device: String,
    /// Runs per variant.
    pub runs: usize,
    /// Test examples per run.
    pub test_examples: usize,
    /// Per variant.
    pub variants: Vec<VariantReport>,
    /// stdev(accuracy | impl) / stdev(accuracy | algo+impl): the share of the total spread
    /// that the implementation alone produces (the seed paper's 0.74). `None` when the total
    /// spread is zero.
    pub impl_share_of_accuracy_stdev: Option<f64>,
    /// Per variant, the spread within each sub-group of a dataset with protected attributes
    /// (`--dataset subgroups`); empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subgroups: Vec<super::subgroups::VariantSubgroups>,
}

/// One device's run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeviceRun {
    /// Device label (`cpu`, `cuda:0`).
    pub device: String,
    /// Test error rate (1 - accuracy).
    #[serde(deserialize_with = "crate::study::nan_from_null")]
    pub error_rate: f64,
    /// Training loss at the last step.
    #[serde(deserialize_with = "crate::study::nan_from_null")]
    pub final_loss: f64,
    /// Wall time of training and evaluation, in seconds.
    #[serde(deserialize_with = "crate::study::nan_from_null")]
    pub seconds: f64,
    /// Where its trace is.
    pub trace: String,
}

/// The error of the weights at one step, over all weight tensors.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WeightGap {
    /// The step.
    pub step: u64,
    /// Largest ULP distance of any weight element.
    pub max_ulp: u64,
    /// Largest |a - b| of any weight element.
    #[serde(deserialize_with = "crate::study::nan_from_null")]
    pub max_abs: f64,
    /// Weight elements that differ.
    pub mismatched: u64,
    /// Weight elements compared.
    pub elements: u64,
}

/// A device compared with the first device.
#[derive(Debug, Clone, Serialize, Deserialize)]
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
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DevicesReport {
    /// The workload, in words.
    pub subject: String,
    /// Training steps per run.
    pub steps: u64,
    /// Per device.
    pub runs: Vec<DeviceRun>,
    /// Test error of the model trained on device i (row) evaluated on device j (column), in
    /// the order of `runs`.
    #[serde(default)]
    pub cross_error: Vec<Vec<f64>>,
    /// Each further device against the first.
    pub comparisons: Vec<DeviceComparison>,
}

/// One workload timed in one mode.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CostRow {
    /// The workload, in words.
    pub workload: String,
    /// The reduction mode.
    pub reductions: String,
    /// Whether the mode is bit-reproducible.
    pub deterministic: bool,
    /// Median wall time of a training step, in milliseconds.
    #[serde(deserialize_with = "crate::study::nan_from_null")]
    pub median_ms: f64,
    /// Fastest step, in milliseconds.
    #[serde(deserialize_with = "crate::study::nan_from_null")]
    pub min_ms: f64,
    /// Steps timed.
    pub steps_timed: usize,
    /// (median / median of atomic − 1) × 100: the price of this mode over the
    /// non-deterministic one.
    #[serde(deserialize_with = "crate::study::nan_from_null")]
    pub overhead_vs_atomic_percent: f64,
}

/// The result of a cost study.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CostReport {
    /// Device label.
    pub device: String,
    /// One row per workload and mode.
    pub rows: Vec<CostRow>,
}

/// One batch size of the data-order study.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OrderRow {
    /// Examples per batch.
    pub batch: usize,
    /// Whether the batch is the whole training set.
    pub full_batch: bool,
    /// Test accuracy of each run, in run order.
    #[serde(deserialize_with = "crate::study::nans_from_nulls")]
    pub run_accuracies: Vec<f64>,
    /// The statistics over the runs.
    #[serde(flatten)]
    pub stats: VariantStats,
}

/// Where two full-batch runs that differ only in the data order first differ in a tensor that
/// exact arithmetic would make equal: one with no batch dimension (a loss, a gradient, a weight),
/// which the order of the examples can change only through the order of a sum.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OrderDivergence {
    /// The step.
    pub step: u64,
    /// The tensor's name.
    pub tensor: String,
    /// What it is (`loss`, `gradient`, ...).
    pub kind: String,
    /// Largest ULP distance there, when values were stored.
    pub max_ulp: Option<u64>,
    /// Elements that differ there, when values were stored.
    pub mismatched: Option<u64>,
    /// Tensors recorded before it in that step that differ only because their rows are the
    /// same examples in another order (inputs, per-example outputs).
    pub permuted_before: Vec<String>,
}

/// The data-order study: runs that differ only in the order of the training data, at several
/// batch sizes up to the whole training set, with ordered reductions.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OrderReport {
    /// The workload, dataset and settings, in words.
    pub subject: String,
    /// Device label.
    pub device: String,
    /// Runs per batch size.
    pub runs: usize,
    /// Training examples (the full batch).
    pub train_examples: usize,
    /// One row per batch size, smallest first.
    pub rows: Vec<OrderRow>,
    /// At full batch: where two runs first differ in an order-independent tensor (`None` when
    /// the full batch was not among the sizes, or the runs were identical).
    pub full_batch_divergence: Option<OrderDivergence>,
}

/// Any study's report, as its JSON file holds it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum StudyReport {
    /// `repro study noise`.
    Noise(NoiseReport),
    /// `repro study devices`.
    Devices(DevicesReport),
    /// `repro study cost`.
    Cost(CostReport),
    /// `repro study order`.
    Order(OrderReport),
}

/// The studies, by the name their reports go under (`noise.json`, `noise.md`, `noise.svg`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StudyKind {
    /// `repro study noise`.
    Noise,
    /// `repro study devices`.
    Devices,
    /// `repro study cost`.
    Cost,
    /// `repro study order`.
    Order,
}

impl StudyKind {
    /// Every study, in the order help texts list them.
    pub const ALL: [StudyKind; 4] = [StudyKind::Noise, StudyKind::Devices, StudyKind::Cost, StudyKind::Order];

    /// The study's name: its subcommand, and its report files' stem.
    pub fn name(self) -> &'static str {
        match self {
            StudyKind::Noise => "noise",
            StudyKind::Devices => "devices",
            StudyKind::Cost => "cost",
            StudyKind::Order => "order",
        }
    }

    /// The study whose JSON report goes under `file_name` (`noise.json`), if any.
    pub fn of_report_file(file_name: &str) -> Option<StudyKind> {
        Self::ALL.into_iter().find(|k| file_name.strip_suffix(".json") == Some(k.name()))
    }

    /// Why `text` does not read as this study's report, if it does not: the exact problem for
    /// a file named like this study's (the untagged `StudyReport` can only say that no kind fit).
    pub fn read_error(self, text: &str) -> Option<serde_json::Error> {
        match self {
            StudyKind::Noise => serde_json::from_str::<NoiseReport>(text).err(),
            StudyKind::Devices => serde_json::from_str::<DevicesReport>(text).err(),
            StudyKind::Cost => serde_json::from_str::<CostReport>(text).err(),
            StudyKind::Order => serde_json::from_str::<OrderReport>(text).err(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_study_is_found_by_its_report_file_and_names_what_its_report_lacks() {
        for kind in StudyKind::ALL {
            assert_eq!(StudyKind::of_report_file(&format!("{}.json", kind.name())), Some(kind));
            let problem = kind.read_error("{}").expect("an empty object is no report");
            assert!(problem.to_string().contains("missing field"), "{kind:?}: {problem}");
        }
        assert_eq!(StudyKind::of_report_file("noise.md"), None);
        assert_eq!(StudyKind::of_report_file("study.json"), None);
    }
}
