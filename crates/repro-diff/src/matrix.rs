//! Pairwise error matrices across N runs: for one step and each chosen tensor, the N×N matrix
//! of a metric (by default the sum of absolute errors) between every two runs' values.

use crate::error::DiffError;
use crate::metrics::{compare_pairs, TensorMetrics};
use crate::shards::Assembler;
use crate::tolerance::Tolerance;
use repro_trace::{StepRecord, TensorValues, TraceReader};
use serde::Serialize;
use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// What each matrix cell holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Metric {
    /// Sum of |a - b| over elements.
    SumAbs,
    /// Largest |a - b|.
    MaxAbs,
    /// Largest distance in ULPs.
    Ulp,
    /// Number of elements whose bits differ.
    Mismatch,
}

impl Metric {
    /// Every metric, for help texts.
    pub const ALL: [Metric; 4] = [Metric::SumAbs, Metric::MaxAbs, Metric::Ulp, Metric::Mismatch];

    fn name(self) -> &'static str {
        match self {
            Metric::SumAbs => "sum-abs",
            Metric::MaxAbs => "max-abs",
            Metric::Ulp => "ulp",
            Metric::Mismatch => "mismatch",
        }
    }

    fn of(self, m: &TensorMetrics) -> f64 {
        match self {
            Metric::SumAbs => m.sum_abs,
            Metric::MaxAbs => m.max_abs,
            Metric::Ulp => m.max_ulp as f64,
            Metric::Mismatch => m.mismatched as f64,
        }
    }
}

impl fmt::Display for Metric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Metric {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Metric::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| format!("unknown metric `{s}`: expected sum-abs, max-abs, ulp or mismatch"))
    }
}

/// Which step to compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepSelector {
    /// The first recorded step.
    First,
    /// The last recorded step.
    Last,
    /// A step number.
    At(u64),
}

impl FromStr for StepSelector {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "first" => Ok(StepSelector::First),
            "last" => Ok(StepSelector::Last),
            _ => s
                .parse()
                .map(StepSelector::At)
                .map_err(|_| format!("invalid step `{s}`: expected a step number, first or last")),
        }
    }
}

/// The matrices for one step.
#[derive(Debug, Clone, Serialize)]
pub struct MatrixReport {
    /// Run directories, in the order given (row and column order).
    pub runs: Vec<String>,
    /// The step compared.
    pub step: u64,
    /// The metric in each cell.
    pub metric: Metric,
    /// One matrix per tensor.
    pub matrices: Vec<ErrorMatrix>,
    /// The tolerance pairs were judged by, if any.
    pub tolerance: Option<Tolerance>,
    /// Tensors of the step that some run stored only as a hash (skipped from the matrices when
    /// every tensor was asked for): compared by hash alone.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hash_only: Vec<HashOnlyTensor>,
    /// Tensors left out: some run holds one rank's block of it (format 1.7 `shard`) without
    /// every block's values, and another run holds it otherwise (whole, or in other blocks): a
    /// whole's hash is not its blocks', so neither values nor hashes can be compared.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_compared: Vec<String>,
}

/// A tensor compared by hash alone, because some run kept no values of it at this step.
#[derive(Debug, Clone, Serialize)]
pub struct HashOnlyTensor {
    /// The tensor's name.
    pub tensor: String,
    /// Whether every run's hash is the same.
    pub identical: bool,
}

impl MatrixReport {
    /// Whether every pair of runs agrees: within the tolerance when there is one, else bit for
    /// bit. A hash-only tensor whose hashes differ never agrees: without values no tolerance can
    /// be judged; nor does a tensor that could not be compared.
    pub fn agrees(&self) -> bool {
        let values_agree = match self.tolerance {
            Some(_) => self.matrices.iter().all(|m| m.beyond_tolerance.is_empty()),
            None => self.matrices.iter().all(|m| m.bit_identical),
        };
        values_agree && self.hash_only.iter().all(|h| h.identical) && self.not_compared.is_empty()
    }
}

/// One tensor's N×N matrix; symmetric with a zero diagonal.
#[derive(Debug, Clone, Serialize)]
pub struct ErrorMatrix {
    /// The tensor's name.
    pub tensor: String,
    /// `values[i][j]`: the metric between run i and run j.
    #[serde(serialize_with = "crate::json_float::matrix")]
    pub values: Vec<Vec<f64>>,
    /// Whether every run holds the same bits (a zero cell can hide +0 against -0).
    pub bit_identical: bool,
    /// With a tolerance: the pairs `[i, j]` (i < j) that differ beyond it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub beyond_tolerance: Vec<[usize; 2]>,
}

/// Computes the matrices of `metric` at `step` for `tensors` (all tensors of the step when
/// empty) across the traces in `dirs`.
pub fn error_matrices(
    dirs: &[PathBuf],
    step: StepSelector,
    tensors: &[String],
    metric: Metric,
    tolerance: Option<Tolerance>,
) -> Result<MatrixReport, DiffError> {
    if dirs.len() < 2 {
        return Err(DiffError::Usage("a matrix needs at least two runs".into()));
    }
    let mut runs = Vec::new();
    for dir in dirs {
        // A data-parallel run is read through rank 0's stream: its replicas hold the same
        // parameters and gradient sums; its batch, predictions and loss are rank 0's share. A
        // sharded tensor (FSDP) is read whole, assembled from every rank's block where each
        // stored its values.
        let streams = repro_trace::rank_streams(dir)?.unwrap_or_else(|| vec![dir.clone()]);
        let mut reader = TraceReader::open(&streams[0])?;
        if let Some((first, _)) = runs.first() {
            TraceReader::comparable_with(first, &reader)?;
        }
        let record = find_step(&mut reader, step)?;
        let record = Assembler::open(&streams)?.assemble(&mut reader, record)?;
        runs.push((reader, record));
    }
    let chosen = runs[0].1.step;
    if let Some((reader, record)) = runs.iter().find(|(_, r)| r.step != chosen) {
        return Err(DiffError::Usage(format!(
            "the runs' selected steps differ ({} is at step {}, {} at step {chosen}); pass --step N",
            reader.dir().display(),
            record.step,
            runs[0].0.dir().display()
        )));
    }
    let every_tensor = tensors.is_empty();
    let names: Vec<String> =
        if every_tensor { runs[0].1.tensors.iter().map(|t| t.name.clone()).collect() } else { tensors.to_vec() };
    // Each run's tensors by name, looked up once per name (finding each name by a scan of the
    // step made a step of 40,000 tensors take 12 s).
    let positions = positions_by_name(&runs);
    let mut matrices = Vec::new();
    let mut hash_only = Vec::new();
    let mut not_compared = Vec::new();
    for name in &names {
        if sharded_otherwise(&runs, &positions, name) {
            not_compared.push(name.clone());
            continue;
        }
        if every_tensor {
            if let Some(identical) = hash_only_agreement(&runs, &positions, name) {
                hash_only.push(HashOnlyTensor { tensor: name.clone(), identical });
                continue;
            }
        }
        // The rule that judges this tensor, where rules name tensors by kind or name.
        let kind =
            positions[0].get(name.as_str()).map_or(repro_trace::TensorKind::Other, |&p| runs[0].1.tensors[p].kind);
        let judged = tolerance.as_ref().and_then(|t| t.for_tensor(name, kind));
        let values = runs
            .iter_mut()
            .zip(&positions)
            .map(|((reader, record), positions)| load(reader, record, positions, name))
            .collect::<Result<Vec<_>, _>>()?;
        for (i, v) in values.iter().enumerate().skip(1) {
            if v.dtype != values[0].dtype || v.shape != values[0].shape {
                return Err(DiffError::Usage(format!(
                    "`{name}` is {} {:?} in {} but {} {:?} in {}",
                    values[0].dtype,
                    values[0].shape,
                    dirs[0].display(),
                    v.dtype,
                    v.shape,
                    dirs[i].display()
                )));
            }
        }
        let n = values.len();
        let mut cells = vec![vec![0.0; n]; n];
        let mut beyond_tolerance = Vec::new();
        let mut bit_identical = true;
        let pairs = (0..n).flat_map(|i| (i + 1..n).map(move |j| (i, j)));
        for ((i, j), metrics) in pairs.zip(compare_pairs(&values.iter().collect::<Vec<_>>())) {
            bit_identical &= metrics.mismatched == 0;
            if tolerance.is_some() && !judged.is_some_and(|t| t.allows_values(&values[i], &values[j], &metrics)) {
                beyond_tolerance.push([i, j]);
            }
            let m = metric.of(&metrics);
            cells[i][j] = m;
            cells[j][i] = m;
        }
        matrices.push(ErrorMatrix { tensor: name.clone(), values: cells, bit_identical, beyond_tolerance });
    }
    if matrices.is_empty() && hash_only.is_empty() && !not_compared.is_empty() {
        return Err(DiffError::Usage(format!(
            "at step {chosen} no tensor could be compared: {} sharded otherwise in one run than in another, without \
             every block's values (record with `--capture steps:{chosen}` to compare them whole)",
            not_compared.join(", ")
        )));
    }
    if matrices.is_empty() && !hash_only.is_empty() {
        let unsharded = match not_compared.is_empty() {
            true => String::new(),
            false => format!(" ({} also sharded otherwise in one run than in another)", not_compared.join(", ")),
        };
        return Err(DiffError::Usage(format!(
            "step {chosen} holds only hashes in {}{unsharded}; record with `--capture steps:{chosen}` (or `--capture all`) to compare values",
            dirs.iter()
                .zip(&runs)
                .filter(|(_, (_, record))| record.tensors.iter().any(|t| t.inline.is_none() && !t.in_payload))
                .map(|(dir, _)| dir.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let runs = dirs.iter().map(|d| d.display().to_string()).collect();
    Ok(MatrixReport { runs, step: chosen, metric, matrices, tolerance, hash_only, not_compared })
}

/// Each run's tensors of its step, by name: where each is in its step record.
fn positions_by_name(runs: &[(TraceReader, StepRecord)]) -> Vec<HashMap<String, usize>> {
    runs.iter()
        .map(|(_, record)| record.tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect())
        .collect()
}

/// Whether some run still holds `name` as one rank's block (its whole could not be assembled)
/// while another holds it otherwise: nothing of it can then be compared.
fn sharded_otherwise(runs: &[(TraceReader, StepRecord)], positions: &[HashMap<String, usize>], name: &str) -> bool {
    let layouts: Vec<_> = runs
        .iter()
        .zip(positions)
        .filter_map(|((_, record), at)| at.get(name).map(|&i| &record.tensors[i]))
        .map(|t| t.shard.as_ref().map(|s| (&s.whole, &s.offset, &t.shape)))
        .collect();
    layouts.iter().any(Option::is_some) && layouts.iter().any(|l| *l != layouts[0])
}

/// When some run keeps no values of `name` (or lacks it), whether all runs' hashes agree; `None`
/// when every run has its values.
fn hash_only_agreement(
    runs: &[(TraceReader, StepRecord)],
    positions: &[HashMap<String, usize>],
    name: &str,
) -> Option<bool> {
    let found: Vec<_> =
        runs.iter().zip(positions).map(|((_, record), at)| at.get(name).map(|&i| &record.tensors[i])).collect();
    if found.iter().all(|t| t.is_some_and(|t| t.inline.is_some() || t.in_payload)) {
        return None;
    }
    let first = found[0]?;
    Some(
        found
            .iter()
            .all(|t| t.is_some_and(|t| t.hash == first.hash && t.dtype == first.dtype && t.shape == first.shape)),
    )
}

fn find_step(reader: &mut TraceReader, step: StepSelector) -> Result<StepRecord, DiffError> {
    let mut last = None;
    while let Some(record) = reader.next_step()? {
        match step {
            StepSelector::First => return Ok(record),
            StepSelector::At(n) if record.step == n => return Ok(record),
            StepSelector::At(n) if record.step > n => break,
            _ => last = Some(record),
        }
    }
    match (step, last) {
        (StepSelector::Last, Some(record)) => Ok(record),
        (StepSelector::At(n), _) => Err(DiffError::Usage(format!("{} has no step {n}", reader.dir().display()))),
        _ => Err(DiffError::Usage(format!("{} has no steps", reader.dir().display()))),
    }
}

fn load<'a>(
    reader: &'a mut TraceReader,
    record: &'a StepRecord,
    positions: &HashMap<String, usize>,
    name: &str,
) -> Result<TensorValues<'a>, DiffError> {
    let Some(tensor) = positions.get(name).map(|&i| &record.tensors[i]) else {
        let known: Vec<&str> = record.tensors.iter().map(|t| t.name.as_str()).collect();
        return Err(DiffError::Usage(format!(
            "{} has no tensor `{name}` at step {}; it has {}",
            reader.dir().display(),
            record.step,
            known.join(", ")
        )));
    };
    let dir = reader.dir().display().to_string();
    reader.values(record, tensor)?.ok_or_else(|| {
        DiffError::Usage(format!(
            "{dir} stored only the hash of `{name}` at step {}; record with `--capture steps:{}` (or `--capture all`) to compare values",
            record.step,
            record.step
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{one_hash_trace, one_value_trace};

    fn trace(dir: &std::path::Path, value: f32) -> PathBuf {
        one_value_trace(dir, value, &[], "cpu")
    }

    #[test]
    fn zero_cells_are_not_taken_for_identical_bits() {
        let tmp = tempfile::tempdir().unwrap();
        let runs = [trace(&tmp.path().join("p"), 0.0), trace(&tmp.path().join("n"), -0.0)];
        let report = error_matrices(&runs, StepSelector::Last, &[], Metric::SumAbs, None).unwrap();
        assert_eq!(report.matrices[0].values, vec![vec![0.0, 0.0], vec![0.0, 0.0]]);
        assert!(!report.matrices[0].bit_identical);
        assert!(!report.agrees(), "+0 and -0 have other bits");
        let same = [trace(&tmp.path().join("a"), 1.5), trace(&tmp.path().join("b"), 1.5)];
        assert!(error_matrices(&same, StepSelector::Last, &[], Metric::SumAbs, None).unwrap().agrees());
    }

    #[test]
    fn hash_only_tensors_are_compared_by_hash_and_a_step_of_hashes_alone_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let with_values = [trace(&tmp.path().join("v"), 1.5), trace(&tmp.path().join("w"), 1.5)];
        let hashes = [one_hash_trace(&tmp.path().join("h"), 1.5), one_hash_trace(&tmp.path().join("i"), 2.5)];
        let mixed = [with_values[0].clone(), hashes[0].clone()];
        let report = error_matrices(&mixed, StepSelector::Last, &[], Metric::SumAbs, None);
        let err = report.unwrap_err().to_string();
        assert!(err.contains("step 0 holds only hashes in") && err.contains("--capture steps:0"), "{err}");
        assert!(!err.contains(&with_values[0].display().to_string()), "only the hash-only run is named: {err}");
        // Asked for by name, the tensor's missing values are an error naming the run.
        let named = error_matrices(&mixed, StepSelector::Last, &["loss".into()], Metric::SumAbs, None);
        assert!(named.unwrap_err().to_string().contains("stored only the hash of `loss`"));
        assert!(hash_only_agreement_of(&[hashes[0].clone(), hashes[0].clone()]));
        assert!(!hash_only_agreement_of(&hashes));
    }

    fn hash_only_agreement_of(dirs: &[PathBuf]) -> bool {
        let runs: Vec<_> = dirs
            .iter()
            .map(|d| {
                let mut reader = TraceReader::open(d).unwrap();
                let record = find_step(&mut reader, StepSelector::Last).unwrap();
                (reader, record)
            })
            .collect();
        hash_only_agreement(&runs, &positions_by_name(&runs), "loss").expect("some run keeps only the hash")
    }
}
