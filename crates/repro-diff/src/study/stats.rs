//! The statistics of a multi-run study, computed from finished runs alone (no model code):
//! accuracy mean and standard deviation, predictive churn, distance between normalized final
//! weights, and per-class accuracy spread. Every sum runs in a fixed order, so a study's numbers
//! are reproducible from its saved runs.

use serde::{Deserialize, Serialize};

/// What one finished run contributes to the statistics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    /// Test accuracy (fraction correct).
    #[serde(deserialize_with = "crate::study::nan_from_null")]
    pub accuracy: f64,
    /// Accuracy on the test examples of each class.
    #[serde(deserialize_with = "crate::study::nans_from_nulls")]
    pub per_class_accuracy: Vec<f64>,
    /// Predicted class of every test example.
    pub predictions: Vec<u32>,
    /// Loss of the last training step.
    #[serde(deserialize_with = "crate::study::nan_from_null")]
    pub final_loss: f64,
    /// Training steps.
    pub steps: u64,
    /// Wall time of the training run, in seconds.
    #[serde(deserialize_with = "crate::study::nan_from_null")]
    pub seconds: f64,
}

impl RunResult {
    /// Accuracy overall and per class of `predictions` against `labels`.
    pub fn score(predictions: &[u32], labels: &[u32], classes: usize) -> (f64, Vec<f64>) {
        let mut correct = vec![0u64; classes];
        let mut total = vec![0u64; classes];
        for (&p, &l) in predictions.iter().zip(labels) {
            total[l as usize] += 1;
            correct[l as usize] += u64::from(p == l);
        }
        let accuracy = correct.iter().sum::<u64>() as f64 / labels.len().max(1) as f64;
        let per_class = correct.iter().zip(&total).map(|(&c, &t)| c as f64 / t.max(1) as f64).collect();
        (accuracy, per_class)
    }
}

/// The statistics of one variant's runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VariantStats {
    /// Runs summarized.
    pub runs: usize,
    /// Mean test accuracy.
    #[serde(deserialize_with = "crate::study::nan_from_null")]
    pub accuracy_mean: f64,
    /// Sample standard deviation of the test accuracy (n - 1 in the denominator).
    #[serde(deserialize_with = "crate::study::nan_from_null")]
    pub accuracy_stdev: f64,
    /// Smallest and largest accuracy.
    #[serde(deserialize_with = "crate::study::nan_from_null")]
    pub accuracy_min: f64,
    /// Largest accuracy.
    #[serde(deserialize_with = "crate::study::nan_from_null")]
    pub accuracy_max: f64,
    /// Mean over pairs of runs of the fraction of test examples predicted differently.
    #[serde(deserialize_with = "crate::study::nan_from_null")]
    pub churn: f64,
    /// Mean over pairs of runs of `‖w₁/‖w₁‖ − w₂/‖w₂‖‖` for the final weight vectors.
    #[serde(deserialize_with = "crate::study::nan_from_null")]
    pub l2_normalized: f64,
    /// Largest standard deviation of a class's accuracy.
    #[serde(deserialize_with = "crate::study::nan_from_null")]
    pub per_class_stdev_max: f64,
    /// Mean over classes of the standard deviation of the class's accuracy.
    #[serde(deserialize_with = "crate::study::nan_from_null")]
    pub per_class_stdev_mean: f64,
}

/// Mean and sample standard deviation (0 for fewer than two values).
pub fn mean_stdev(values: &[f64]) -> (f64, f64) {
    let n = values.len();
    if n == 0 {
        return (f64::NAN, f64::NAN);
    }
    if values.iter().all(|v| v.to_bits() == values[0].to_bits()) {
        // Equal values spread by exactly nothing (the mean's rounding would say 1e-17).
        return (values[0], 0.0);
    }
    let mean = values.iter().sum::<f64>() / n as f64;
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    (mean, var.sqrt())
}

/// Fraction of positions where `a` and `b` differ.
pub fn churn(a: &[u32], b: &[u32]) -> f64 {
    let differ = a.iter().zip(b).filter(|(x, y)| x != y).count();
    differ as f64 / a.len().max(1) as f64
}

/// Euclidean distance between `a` and `b` after scaling each to unit length.
pub fn l2_normalized(a: &[f32], b: &[f32]) -> f64 {
    let norm = |v: &[f32]| v.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt().max(f64::MIN_POSITIVE);
    let (na, nb) = (norm(a), norm(b));
    a.iter().zip(b).map(|(&x, &y)| (x as f64 / na - y as f64 / nb).powi(2)).sum::<f64>().sqrt()
}

/// The statistics of `runs`, whose final weights `weights(i)` returns (loaded one pair at a
/// time, so a study of large models needs two weight vectors in memory, not all of them).
pub fn variant_stats<E>(
    runs: &[RunResult],
    mut weights: impl FnMut(usize) -> Result<Vec<f32>, E>,
) -> Result<VariantStats, E> {
    let accuracies: Vec<f64> = runs.iter().map(|r| r.accuracy).collect();
    let (accuracy_mean, accuracy_stdev) = mean_stdev(&accuracies);
    let (mut churn_sum, mut l2_sum, mut pairs) = (0.0, 0.0, 0usize);
    for i in 0..runs.len() {
        let wi = weights(i)?;
        for j in i + 1..runs.len() {
            churn_sum += churn(&runs[i].predictions, &runs[j].predictions);
            l2_sum += l2_normalized(&wi, &weights(j)?);
            pairs += 1;
        }
    }
    let classes = runs.first().map_or(0, |r| r.per_class_accuracy.len());
    let per_class: Vec<f64> =
        (0..classes).map(|c| mean_stdev(&runs.iter().map(|r| r.per_class_accuracy[c]).collect::<Vec<_>>()).1).collect();
    let pair_mean = |sum: f64| if pairs == 0 { 0.0 } else { sum / pairs as f64 };
    Ok(VariantStats {
        runs: runs.len(),
        accuracy_mean,
        accuracy_stdev,
        accuracy_min: accuracies.iter().copied().fold(f64::INFINITY, f64::min),
        accuracy_max: accuracies.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        churn: pair_mean(churn_sum),
        l2_normalized: pair_mean(l2_sum),
        per_class_stdev_max: per_class.iter().copied().fold(0.0, f64::max),
        per_class_stdev_mean: if classes == 0 { 0.0 } else { per_class.iter().sum::<f64>() / classes as f64 },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(accuracy: f64, predictions: Vec<u32>, per_class: Vec<f64>) -> RunResult {
        RunResult { accuracy, per_class_accuracy: per_class, predictions, final_loss: 0.0, steps: 1, seconds: 0.0 }
    }

    #[test]
    fn sample_stdev_uses_n_minus_one() {
        let (m, s) = mean_stdev(&[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(m, 2.5);
        assert!((s - 1.2909944487358056).abs() < 1e-15);
        assert_eq!(mean_stdev(&[5.0]), (5.0, 0.0));
        // Ten equal accuracies: the mean rounds, but the spread is exactly zero.
        assert_eq!(mean_stdev(&[0.9442896935933147; 10]), (0.9442896935933147, 0.0));
    }

    #[test]
    fn churn_counts_disagreements() {
        assert_eq!(churn(&[1, 2, 3, 4], &[1, 2, 0, 0]), 0.5);
        assert_eq!(churn(&[1, 2], &[1, 2]), 0.0);
    }

    #[test]
    fn normalized_distance_ignores_scale_and_sees_direction() {
        assert!(l2_normalized(&[1.0, 2.0], &[2.0, 4.0]) < 1e-12);
        let orthogonal = l2_normalized(&[1.0, 0.0], &[0.0, 3.0]);
        assert!((orthogonal - 2f64.sqrt()).abs() < 1e-12);
    }

    #[test]
    fn variant_stats_average_over_pairs_and_classes() {
        let runs = vec![
            run(0.5, vec![0, 1, 1, 0], vec![0.5, 0.5]),
            run(0.75, vec![0, 1, 1, 1], vec![1.0, 0.5]),
            run(1.0, vec![0, 0, 1, 1], vec![1.0, 1.0]),
        ];
        let weights = [vec![1.0f32, 0.0], vec![1.0, 0.0], vec![0.0, 1.0]];
        let s = variant_stats::<()>(&runs, |i| Ok(weights[i].clone())).unwrap();
        assert_eq!(s.runs, 3);
        assert_eq!(s.accuracy_mean, 0.75);
        assert!((s.accuracy_stdev - 0.25).abs() < 1e-15);
        // Pairs: (0,1) 1 of 4 differ, (0,2) 2 of 4, (1,2) 1 of 4.
        assert!((s.churn - (0.25 + 0.5 + 0.25) / 3.0).abs() < 1e-15);
        assert!((s.l2_normalized - 2.0 * 2f64.sqrt() / 3.0).abs() < 1e-12);
        let class0 = mean_stdev(&[0.5, 1.0, 1.0]).1;
        let class1 = mean_stdev(&[0.5, 0.5, 1.0]).1;
        assert!((s.per_class_stdev_max - class0.max(class1)).abs() < 1e-15);
        assert!((s.per_class_stdev_mean - (class0 + class1) / 2.0).abs() < 1e-15);
    }

    #[test]
    fn scores_per_class() {
        let (acc, per_class) = RunResult::score(&[0, 1, 1, 2], &[0, 1, 2, 2], 3);
        assert_eq!(acc, 0.75);
        assert_eq!(per_class, vec![1.0, 1.0, 0.5]);
    }
}
