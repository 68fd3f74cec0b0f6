//! Noise by sub-group: how much a binary classifier's error rate, false-positive rate and
//! false-negative rate spread over runs within each sub-group of the test examples (those with,
//! and those without, a protected attribute), against the spread over all examples. A group that
//! holds few positives can spread several times as much as the whole.

use super::stats::{mean_stdev, RunResult};
use serde::{Deserialize, Serialize};

/// A sub-group of the test examples.
#[derive(Debug, Clone, PartialEq)]
pub struct Subgroup {
    /// Its name (`male`, `female`).
    pub name: String,
    /// Whether each test example belongs to it.
    pub members: Vec<bool>,
}

/// One sub-group's spread over the runs of one variant. Rates are fractions; a ratio is the
/// group's standard deviation over the whole test set's (`None` when that is zero, as in a
/// variant whose runs are identical).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubgroupSpread {
    /// The group (`all` for every test example).
    pub group: String,
    /// Test examples in it.
    pub examples: u64,
    /// Positive examples in it.
    pub positives: u64,
    /// Its share of all positive test examples.
    pub positive_share: f64,
    /// Mean error rate over the runs.
    pub error_mean: f64,
    /// Sample standard deviation of the error rate over the runs.
    pub error_stdev: f64,
    /// Of the false-positive rate (negatives predicted positive).
    pub fpr_stdev: f64,
    /// Of the false-negative rate (positives predicted negative).
    pub fnr_stdev: f64,
    /// `error_stdev` over the whole test set's.
    pub error_ratio: Option<f64>,
    /// `fpr_stdev` over the whole test set's.
    pub fpr_ratio: Option<f64>,
    /// `fnr_stdev` over the whole test set's.
    pub fnr_ratio: Option<f64>,
}

/// One variant's sub-group spreads: the whole test set first, then every group in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VariantSubgroups {
    /// The variant.
    pub variant: String,
    /// The rows.
    pub groups: Vec<SubgroupSpread>,
}

/// Error rate, false-positive rate and false-negative rate of `predictions` on the examples
/// `members` selects (positive class `positive`); NaN where the group has no such example.
fn rates(predictions: &[u32], labels: &[u32], positive: u32, members: &[bool]) -> [f64; 3] {
    let (mut n, mut wrong, mut negatives, mut false_pos, mut positives, mut false_neg) =
        (0u64, 0u64, 0u64, 0u64, 0u64, 0u64);
    for ((&p, &l), _) in predictions.iter().zip(labels).zip(members).filter(|(_, &member)| member) {
        n += 1;
        wrong += u64::from(p != l);
        if l == positive {
            positives += 1;
            false_neg += u64::from(p != positive);
        } else {
            negatives += 1;
            false_pos += u64::from(p == positive);
        }
    }
    let frac = |a: u64, b: u64| if b == 0 { f64::NAN } else { a as f64 / b as f64 };
    [frac(wrong, n), frac(false_pos, negatives), frac(false_neg, positives)]
}

/// The spreads of `runs` (their test predictions) over the whole test set and over each of
/// `groups`, for a binary task whose positive class is `positive`.
pub fn subgroup_spreads(runs: &[RunResult], labels: &[u32], positive: u32, groups: &[Subgroup]) -> Vec<SubgroupSpread> {
    let all = Subgroup { name: "all".into(), members: vec![true; labels.len()] };
    let total_positives = labels.iter().filter(|&&l| l == positive).count() as u64;
    let mut rows: Vec<SubgroupSpread> = std::iter::once(&all)
        .chain(groups)
        .map(|g| {
            let per_run: Vec<[f64; 3]> =
                runs.iter().map(|r| rates(&r.predictions, labels, positive, &g.members)).collect();
            let spread = |k: usize| mean_stdev(&per_run.iter().map(|r| r[k]).collect::<Vec<f64>>());
            let positives = g.members.iter().zip(labels).filter(|(&m, &l)| m && l == positive).count() as u64;
            SubgroupSpread {
                group: g.name.clone(),
                examples: g.members.iter().filter(|&&m| m).count() as u64,
                positives,
                positive_share: if total_positives == 0 { f64::NAN } else { positives as f64 / total_positives as f64 },
                error_mean: spread(0).0,
                error_stdev: spread(0).1,
                fpr_stdev: spread(1).1,
                fnr_stdev: spread(2).1,
                error_ratio: None,
                fpr_ratio: None,
                fnr_ratio: None,
            }
        })
        .collect();
    // Each group's spread against the whole test set's (the first row).
    let overall = [rows[0].error_stdev, rows[0].fpr_stdev, rows[0].fnr_stdev];
    let ratio = |x: f64, whole: f64| (whole > 0.0 && x.is_finite()).then(|| x / whole);
    for row in &mut rows {
        row.error_ratio = ratio(row.error_stdev, overall[0]);
        row.fpr_ratio = ratio(row.fpr_stdev, overall[1]);
        row.fnr_ratio = ratio(row.fnr_stdev, overall[2]);
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(predictions: Vec<u32>) -> RunResult {
        RunResult { accuracy: 0.0, per_class_accuracy: vec![], predictions, final_loss: 0.0, steps: 1, seconds: 0.0 }
    }

    #[test]
    fn a_small_group_whose_predictions_flip_spreads_more_than_the_whole() {
        // Eight examples; the group is the last two (one positive, one negative).
        let labels = vec![0, 0, 0, 1, 1, 1, 1, 0];
        let group =
            Subgroup { name: "rare".into(), members: vec![false, false, false, false, false, false, true, true] };
        // Run A gets everything right; run B misses the group's positive.
        let runs = vec![run(vec![0, 0, 0, 1, 1, 1, 1, 0]), run(vec![0, 0, 0, 1, 1, 1, 0, 0])];
        let rows = subgroup_spreads(&runs, &labels, 1, &[group]);
        assert_eq!((rows[0].group.as_str(), rows[0].examples, rows[0].positives), ("all", 8, 4));
        assert_eq!((rows[1].examples, rows[1].positives, rows[1].positive_share), (2, 1, 0.25));
        // Error: all 0 and 1/8; the group 0 and 1/2. FNR: all 0 and 1/4; the group 0 and 1.
        let s = std::f64::consts::FRAC_1_SQRT_2;
        assert!((rows[0].error_stdev - s / 8.0).abs() < 1e-15);
        assert!((rows[1].error_stdev - s / 2.0).abs() < 1e-15);
        assert!((rows[1].error_ratio.unwrap() - 4.0).abs() < 1e-12);
        assert!((rows[1].fnr_ratio.unwrap() - 4.0).abs() < 1e-12);
        // No false positives anywhere: no spread to normalize by.
        assert_eq!((rows[0].fpr_stdev, rows[1].fpr_ratio), (0.0, None));
    }
}
