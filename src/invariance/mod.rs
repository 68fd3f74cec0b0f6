//! Batch invariance of a model's forward pass: the same sequence is run alone, then inside
//! batches of other sequences (at the first and the last row), and its slice of every captured
//! op is compared bit for bit with the alone run's. The first op, in topological order, whose
//! slice differs is where the sequence's result starts to depend on its batch (a matrix product
//! that splits its reduction by problem size, a row reduction whose order follows the batch).
//!
//! The graph comes from `repro::capture`, so the model needs no change: build it on a `VarMap`,
//! hand over a forward function from token ids to logits. An op's slice for the sequence is
//! found by shape: the one dimension whose size is the batch size times its size in the alone
//! run (`[B, T, C]`, or `[B*T, C]` after a reshape), cut at the sequence's row. An op with no
//! such dimension and another shape than alone is listed as not compared.

use crate::capture::{GraphNode, ModelCapture};
use crate::diff::compare;
use crate::diff::invariance::{equivalence_classes, Batching, BatchingResult, InvarianceReport, OpDifference};
use crate::record::{trace_dtype, with_canonical_bytes, RecordError};
use crate::trace::dtype::DType;
use candle_core::{Device, Tensor};
use std::collections::BTreeMap;

pub mod workloads;

/// The default batch sizes: where kernels commonly change their split.
pub const DEFAULT_BATCH_SIZES: [usize; 9] = [1, 2, 3, 4, 8, 16, 32, 64, 128];

/// What to check.
pub struct InvarianceCheck<'a> {
    /// The model's parameters (and the graph capture behind its logits).
    pub capture: &'a ModelCapture,
    /// The sequence whose logits must not depend on its batch.
    pub sequence: Vec<u32>,
    /// Other sequences of the same length that fill the batches (reused in turn if there are
    /// fewer than the largest batch needs).
    pub fillers: Vec<Vec<u32>>,
    /// Batch sizes (1, the reference, is always run).
    pub batch_sizes: Vec<usize>,
    /// Paddings: the sequence alone followed by this many more tokens (from the first filler),
    /// its own positions compared. Needs logits at every position; 0 is the reference.
    pub paddings: Vec<usize>,
    /// The model and its settings, for the report.
    pub subject: String,
    /// The device's label, for the report.
    pub device_label: String,
}

/// One op's values for the alone run.
struct Reference {
    dims: Vec<usize>,
    dtype: DType,
    bytes: Vec<u8>,
}

impl InvarianceCheck<'_> {
    /// Runs `forward` (token ids `[B, T]` u32 on `device` to logits, whose first dimension is
    /// the batch) on every batching and compares.
    pub fn run(
        &self,
        device: &Device,
        forward: &mut dyn FnMut(&Tensor) -> Result<Tensor, RecordError>,
    ) -> Result<InvarianceReport, RecordError> {
        if self.sequence.is_empty() || self.fillers.is_empty() {
            return Err(RecordError::Unsupported("an invariance check needs a sequence and filler sequences".into()));
        }
        if let Some(f) = self.fillers.iter().find(|f| f.len() != self.sequence.len()) {
            return Err(RecordError::Unsupported(format!(
                "filler sequences must have the sequence's {} tokens, not {}",
                self.sequence.len(),
                f.len()
            )));
        }
        let reference_batching = Batching::ALONE;
        let nodes = self.graph(device, reference_batching, forward)?;
        let mut reference = BTreeMap::new();
        for node in nodes.iter().filter(|n| !n.is_variable) {
            let dtype = trace_dtype(node.tensor.dtype())?;
            let bytes = with_canonical_bytes(&node.tensor, <[u8]>::to_vec)?;
            reference.insert(node.name.clone(), Reference { dims: node.tensor.dims().to_vec(), dtype, bytes });
        }
        let root = nodes.last().expect("a graph has a root").name.clone();
        let ops: Vec<String> = nodes.iter().filter(|n| !n.is_variable).map(|n| n.name.clone()).collect();
        let column: BTreeMap<&str, usize> = ops.iter().enumerate().map(|(i, n)| (n.as_str(), i)).collect();
        let parameters_reached = nodes.iter().filter(|n| n.is_variable).count();
        let mut fingerprints = vec![(reference_batching, blake3::hash(&reference[&root].bytes))];
        let mut results = Vec::new();
        for batching in self.batchings() {
            let nodes = self.graph(device, batching, forward)?;
            let mut result = BatchingResult {
                batching,
                logits_identical: false,
                logits: None,
                first_op: None,
                ops_differing: 0,
                ops_compared: 0,
                unmatched: Vec::new(),
                op_max_ulp: vec![None; ops.len()],
            };
            let last = nodes.len() - 1;
            for (i, node) in nodes.iter().enumerate().filter(|(_, n)| !n.is_variable) {
                let name = if i == last { &root } else { &node.name };
                let Some(r) = reference.get(name) else {
                    result.unmatched.push(node.name.clone());
                    continue;
                };
                let Some(slice) = slice_for(&node.tensor, &r.dims, batching, self.sequence.len())? else {
                    result.unmatched.push(node.name.clone());
                    continue;
                };
                let dtype = trace_dtype(slice.dtype())?;
                // The slice is read once: compared, and for the logits also fingerprinted.
                let read = with_canonical_bytes(&slice, |bytes| {
                    let fingerprint = (i == last).then(|| blake3::hash(bytes));
                    (dtype == r.dtype && bytes.len() == r.bytes.len())
                        .then(|| (compare(dtype, &r.bytes, bytes), fingerprint))
                })?;
                let Some((metrics, fingerprint)) = read else {
                    result.unmatched.push(node.name.clone());
                    continue;
                };
                result.ops_compared += 1;
                result.op_max_ulp[column[name.as_str()]] = Some(metrics.max_ulp);
                if let Some(fingerprint) = fingerprint {
                    fingerprints.push((batching, fingerprint));
                    result.logits_identical = metrics.mismatched == 0;
                    result.logits = (metrics.mismatched > 0).then_some(metrics);
                }
                if metrics.mismatched > 0 {
                    result.ops_differing += 1;
                    if result.first_op.is_none() {
                        result.first_op = Some(OpDifference {
                            name: name.clone(),
                            position: node.position,
                            dtype,
                            shape: slice.dims().iter().map(|&d| d as u64).collect(),
                            metrics,
                        });
                    }
                }
            }
            results.push(result);
        }
        Ok(InvarianceReport {
            subject: self.subject.clone(),
            device: self.device_label.clone(),
            tokens: self.sequence.len(),
            reference: reference_batching,
            ops,
            results,
            parameters_reached,
            parameters: self.capture.parameters().len(),
            classes: equivalence_classes(fingerprints),
        })
    }

    /// Every batching but the reference: each batch size above 1, with the sequence first and
    /// last; then each padding, alone.
    fn batchings(&self) -> Vec<Batching> {
        let distinct = |values: &[usize]| {
            let mut v: Vec<usize> = values.iter().copied().filter(|&x| x > 0).collect();
            v.sort_unstable();
            v.dedup();
            v
        };
        let batches = distinct(&self.batch_sizes)
            .into_iter()
            .filter(|&b| b > 1)
            .flat_map(|batch| [0, batch - 1].map(|position| Batching { batch, position, padding: 0 }));
        let padded = distinct(&self.paddings).into_iter().map(|padding| Batching { padding, ..Batching::ALONE });
        batches.chain(padded).collect()
    }

    /// The captured graph of one batching's forward pass.
    fn graph(
        &self,
        device: &Device,
        batching: Batching,
        forward: &mut dyn FnMut(&Tensor) -> Result<Tensor, RecordError>,
    ) -> Result<Vec<GraphNode>, RecordError> {
        let len = self.sequence.len() + batching.padding;
        let pad = self.fillers[0].iter().cycle();
        let mut ids: Vec<u32> = Vec::with_capacity(batching.batch * len);
        for row in 0..batching.batch {
            let tokens =
                if row == batching.position { &self.sequence } else { &self.fillers[row % self.fillers.len()] };
            ids.extend(tokens.iter().chain(pad.clone()).take(len));
        }
        let tokens = Tensor::from_vec(ids, (batching.batch, len), &Device::Cpu)?.to_device(device)?;
        let logits = forward(&tokens)?;
        self.capture.graph(&logits)
    }
}

/// The sequence's slice of `tensor` in `batching`, given the op's dims in the alone run and
/// the sequence's length `tokens`: cut along the one dimension that grew by the batch size (at
/// the sequence's row), and, when padded, along every dimension that grew from k·T to
/// k·(T + padding) (to its first k·T: the sequence's own positions); the whole tensor if
/// nothing grew. `None` when the shapes differ in any other way.
fn slice_for(
    tensor: &Tensor,
    alone: &[usize],
    batching: Batching,
    tokens: usize,
) -> Result<Option<Tensor>, RecordError> {
    let dims = tensor.dims();
    if dims.len() != alone.len() {
        return Ok(None);
    }
    let mut slice = tensor.clone();
    let mut batch_cut = false;
    for d in 0..dims.len() {
        if dims[d] == alone[d] {
            continue;
        }
        if batching.batch > 1 && !batch_cut && dims[d] == alone[d] * batching.batch {
            slice = slice.narrow(d, batching.position * alone[d], alone[d])?;
            batch_cut = true;
        } else if batching.padding > 0
            && alone[d].is_multiple_of(tokens)
            && dims[d] == alone[d] / tokens * (tokens + batching.padding)
        {
            slice = slice.narrow(d, 0, alone[d])?;
        } else {
            return Ok(None);
        }
    }
    Ok(Some(slice.contiguous()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::scope;
    use candle_core::{DType, Module, D};
    use candle_nn::{VarBuilder, VarMap};

    /// A tiny model: an embedding, then (in scope `planted`) a row sum that, from batch 4 on,
    /// sums the row scaled by 3 and divides by 3 afterwards: the same ops, the same graph, other
    /// rounding, as a kernel choosing its variant by problem size does; then a linear head.
    fn planted(batch_dependent: bool) -> Result<InvarianceReport, RecordError> {
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
        let embedding = candle_nn::embedding(256, 64, vb.pp("embed"))?;
        let head = candle_nn::linear(1, 8, vb.pp("head"))?;
        let capture = ModelCapture::new(&varmap);
        let mut forward = |tokens: &Tensor| -> Result<Tensor, RecordError> {
            let x = scope("embed", || embedding.forward(tokens))?;
            let batch = tokens.dim(0)?;
            let sum = scope("planted", || -> candle_core::Result<Tensor> {
                let scale = if batch_dependent && batch >= 4 { 3.0 } else { 1.0 };
                x.affine(scale, 0.0)?.sum_keepdim(D::Minus1)?.affine(1.0 / scale, 0.0)
            })?;
            Ok(scope("head", || head.forward(&sum))?)
        };
        let sequence: Vec<u32> = (0..16).map(|i| (i * 37 % 256) as u32).collect();
        let fillers: Vec<Vec<u32>> =
            (1..5).map(|k| (0..16).map(|i| ((i * 11 + k * 53) % 256) as u32).collect()).collect();
        let check = InvarianceCheck {
            capture: &capture,
            sequence,
            fillers,
            batch_sizes: vec![1, 2, 3, 4, 8],
            paddings: Vec::new(),
            subject: "planted".into(),
            device_label: "cpu".into(),
        };
        check.run(&Device::Cpu, &mut forward)
    }

    #[test]
    fn slices_follow_the_batch_row_and_the_sequence_s_own_positions() {
        let t = |dims: &[usize]| {
            let n: usize = dims.iter().product();
            Tensor::arange(0f32, n as f32, &Device::Cpu).unwrap().reshape(dims).unwrap()
        };
        let dims = |s: Option<Tensor>| s.map(|s| s.dims().to_vec());
        let padded = Batching { padding: 2, ..Batching::ALONE };
        // Attention scores [1, heads, T+P, T+P] against [1, heads, T, T], T = 6: both cut to T.
        let scores = slice_for(&t(&[1, 4, 8, 8]), &[1, 4, 6, 6], padded, 6).unwrap();
        assert_eq!(dims(scores.clone()), Some(vec![1, 4, 6, 6]));
        assert_eq!(scores.unwrap().get(0).unwrap().get(0).unwrap().get(1).unwrap().to_vec1::<f32>().unwrap()[0], 8.0);
        // Tokens flattened with the batch, [T+P, C]: the first T rows.
        assert_eq!(dims(slice_for(&t(&[8, 12]), &[6, 12], padded, 6).unwrap()), Some(vec![6, 12]));
        // Row 2 of a batch of 3, [3·T, C].
        let row = Batching { batch: 3, position: 2, padding: 0 };
        let rows = slice_for(&t(&[18, 2]), &[6, 2], row, 6).unwrap().unwrap();
        assert_eq!(rows.to_vec2::<f32>().unwrap()[0], [24.0, 25.0]);
        // A shape change that neither explains is not compared.
        assert!(slice_for(&t(&[7, 12]), &[6, 12], padded, 6).unwrap().is_none());
        assert!(slice_for(&t(&[6, 13]), &[6, 12], row, 6).unwrap().is_none());
    }

    #[test]
    fn a_planted_batch_dependent_reduction_is_found_named_and_classed() {
        let report = planted(true).unwrap();
        assert!(!report.invariant());
        let b = |batch, position| Batching { batch, position, padding: 0 };
        assert_eq!(
            report.classes,
            vec![vec![b(1, 0), b(2, 0), b(2, 1), b(3, 0), b(3, 2)], vec![b(4, 0), b(4, 3), b(8, 0), b(8, 7)]]
        );
        for r in &report.results {
            if r.batching.batch < 4 {
                assert!(r.logits_identical && r.first_op.is_none(), "{r:?}");
            } else {
                let op = r.first_op.as_ref().expect("the split is found");
                assert!(op.name.starts_with("planted#"), "{}", op.name);
                assert!(op.metrics.mismatched > 0 && op.metrics.max_ulp > 0);
                assert!(r.unmatched.is_empty(), "{:?}", r.unmatched);
            }
        }
        // The same model without the split is invariant in every batching.
        let fixed = planted(false).unwrap();
        assert!(fixed.invariant(), "{:?}", fixed.results);
        assert_eq!(fixed.classes.len(), 1);
        assert!(fixed.results.iter().all(|r| r.ops_compared > 0 && r.ops_differing == 0));
    }
}
