//! Batch invariance, as data: for one sequence run alone and inside other batches, whether its
//! logits came out bit-identical, the first captured op whose slice for that sequence did not,
//! and the classes of batchings that agree with each other (where a kernel's choice flips).
//! Computed by `repro::invariance`; rendered by `report::invariance`.

use crate::metrics::TensorMetrics;
use repro_trace::dtype::DType;
use serde::Serialize;
use std::fmt;

/// How the sequence is run: in a batch of `batch` sequences, at row `position`, followed by
/// `padding` extra tokens, and in pieces of `chunk` tokens against a KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Batching {
    /// Sequences in the batch.
    pub batch: usize,
    /// The sequence's row (0-based).
    pub position: usize,
    /// Tokens appended after the sequence (a causal model's earlier positions must not see
    /// them).
    pub padding: usize,
    /// Tokens per forward pass, each pass after the earlier ones against the model's KV cache:
    /// 1 decodes the sequence token by token, more prefills it in chunks; 0 runs it whole.
    pub chunk: usize,
}

impl Batching {
    /// The sequence alone, unpadded, whole: the reference.
    pub const ALONE: Batching = Batching { batch: 1, position: 0, padding: 0, chunk: 0 };
}

impl fmt::Display for Batching {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.batch {
            1 => write!(f, "1")?,
            b => write!(f, "{b}@{}", self.position)?,
        }
        if self.padding > 0 {
            write!(f, "+{}", self.padding)?;
        }
        match self.chunk {
            0 => {}
            1 => write!(f, " decode")?,
            c => write!(f, " chunk{c}")?,
        }
        Ok(())
    }
}

/// The sequence's slice of one captured op, where it first differs from the reference.
#[derive(Debug, Clone, Serialize)]
pub struct OpDifference {
    /// The node's name (its scope path, or its variable name).
    pub name: String,
    /// Position in the graph's topological order.
    pub position: u64,
    /// Element type.
    pub dtype: DType,
    /// The sequence's slice shape.
    pub shape: Vec<u64>,
    /// How the slice differs.
    pub metrics: TensorMetrics,
    /// In a run in pieces, the first token of the piece where it differs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub at_token: Option<usize>,
}

/// One batching against the reference.
#[derive(Debug, Clone, Serialize)]
pub struct BatchingResult {
    /// The batching.
    pub batching: Batching,
    /// Whether the sequence's logits are bit-identical to the reference's.
    pub logits_identical: bool,
    /// How the logits differ (absent when identical).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logits: Option<TensorMetrics>,
    /// The first op, in topological order, whose slice for the sequence differs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_op: Option<OpDifference>,
    /// Ops whose slice differs, of those compared.
    pub ops_differing: usize,
    /// Ops compared (named the same in both graphs, with a slice for the sequence).
    pub ops_compared: usize,
    /// Per op of the reference graph ([`InvarianceReport::ops`], same order): the largest ULP
    /// distance of the sequence's slice (0: identical), or `None` where it was not compared.
    pub op_max_ulp: Vec<Option<u64>>,
    /// Ops of this graph with no counterpart in the reference's (or no batch dimension that
    /// could be sliced): not compared.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unmatched: Vec<String>,
    /// Why the model could not run this batching (the rest of the result is then empty).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Why its ops were not compared although its logits were: the pass that keeps every op's
    /// output for the comparison failed (out of memory, at large batches), and the logits
    /// come from a pass that keeps none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ops_skipped: Option<String>,
}

/// The whole check.
#[derive(Debug, Clone, Serialize)]
pub struct InvarianceReport {
    /// What was checked: the model and its settings.
    pub subject: String,
    /// The device.
    pub device: String,
    /// Tokens in the sequence.
    pub tokens: usize,
    /// The reference batching (the sequence alone).
    pub reference: Batching,
    /// The ops of the reference graph (its non-parameter nodes), in topological order: the
    /// columns of every result's `op_max_ulp`.
    pub ops: Vec<String>,
    /// Every other batching, in the order run.
    pub results: Vec<BatchingResult>,
    /// Parameters the captured graph behind the logits reaches, of all the model's: fewer when
    /// an op without a backward pass (a fused kernel) cuts the graph candle exposes, and the ops
    /// above the cut are not compared.
    pub parameters_reached: usize,
    /// The model's parameters.
    pub parameters: usize,
    /// Batchings whose logits for the sequence are bit-identical, grouped; the reference's
    /// class first, then in order of first appearance.
    pub classes: Vec<Vec<Batching>>,
}

impl InvarianceReport {
    /// Whether the sequence's logits are the same in every batching.
    pub fn invariant(&self) -> bool {
        self.results.iter().all(|r| r.logits_identical)
    }

    /// Batchings the model failed to run.
    pub fn failed(&self) -> usize {
        self.results.iter().filter(|r| r.error.is_some()).count()
    }
}

/// The time of one forward pass at a batch size, with default and with batch-invariant kernels.
#[derive(Debug, Clone, Serialize)]
pub struct ForwardCost {
    /// Sequences per pass.
    pub batch: usize,
    /// Tokens per sequence.
    pub tokens: usize,
    /// Median milliseconds with the default kernels.
    pub default_ms: f64,
    /// Median milliseconds with the batch-invariant kernels.
    pub invariant_ms: f64,
    /// Largest |a - b| between the two kernels' logits (rounding only: a wrong kernel shows
    /// here).
    pub max_abs_diff: f64,
}

/// What batch-invariant kernels cost a model's forward pass, per batch size.
#[derive(Debug, Clone, Serialize)]
pub struct ForwardCostReport {
    /// The model and its settings.
    pub subject: String,
    /// The device.
    pub device: String,
    /// Passes timed per batch size and kernel.
    pub passes: usize,
    /// One row per batch size.
    pub costs: Vec<ForwardCost>,
}

/// Groups `items` (a batching and a fingerprint of its logits) into classes of equal
/// fingerprints, in order of first appearance.
pub fn equivalence_classes<K: PartialEq>(items: impl IntoIterator<Item = (Batching, K)>) -> Vec<Vec<Batching>> {
    let mut classes: Vec<(K, Vec<Batching>)> = Vec::new();
    for (batching, key) in items {
        match classes.iter_mut().find(|(k, _)| *k == key) {
            Some((_, members)) => members.push(batching),
            None => classes.push((key, vec![batching])),
        }
    }
    classes.into_iter().map(|(_, members)| members).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(batch: usize, position: usize) -> Batching {
        Batching { batch, position, ..Batching::ALONE }
    }

    #[test]
    fn classes_group_equal_fingerprints_in_order_of_first_appearance() {
        // A split that changes at batch 4: {1, 2, 3} agree, {4, 8} agree with each other.
        let items = [(b(1, 0), 7), (b(2, 1), 7), (b(4, 0), 9), (b(3, 2), 7), (b(8, 7), 9)];
        assert_eq!(classes_of(&items), vec![vec![b(1, 0), b(2, 1), b(3, 2)], vec![b(4, 0), b(8, 7)]]);
        assert_eq!(classes_of(&[(b(1, 0), 1)]), vec![vec![b(1, 0)]]);
        assert_eq!(b(1, 0).to_string(), "1");
        assert_eq!(b(8, 7).to_string(), "8@7");
        assert_eq!(Batching { padding: 16, ..Batching::ALONE }.to_string(), "1+16");
        assert_eq!(Batching { chunk: 1, ..Batching::ALONE }.to_string(), "1 decode");
        assert_eq!(Batching { chunk: 8, ..Batching::ALONE }.to_string(), "1 chunk8");
    }

    fn classes_of(items: &[(Batching, i32)]) -> Vec<Vec<Batching>> {
        equivalence_classes(items.iter().copied())
    }
}
