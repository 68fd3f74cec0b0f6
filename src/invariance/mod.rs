//! Batch invariance of a model's forward pass: the same sequence is run alone, then inside
//! batches of other sequences (at the first and the last row), followed by padding, and in
//! pieces against a KV cache (decoded one token at a time, or prefilled in chunks); its part of
//! every captured op is compared bit for bit with the alone run's. The first op, in topological
//! order, whose part differs is where the sequence's result starts to depend on how it was run
//! (a matrix product that splits its reduction by problem size, a row reduction whose order
//! follows the row's length).
//!
//! The graph comes from `repro::capture`, so the model needs no change: build it on a `VarMap`,
//! hand over a forward function from token ids to logits at every position. Ops of two runs are
//! paired by a sequence diff over their scope names (a decoding step has ops a prefill has not:
//! the KV cache's concatenation), then each pair is cut to the sequence's part by shape: the
//! dimension that grew by the batch size, at the sequence's row; a dimension that grew by the
//! padding, to the sequence's own positions; for a piece of the sequence at tokens
//! `offset..offset + n`, the alone run's token dimension to those tokens (queries) or to the
//! tokens seen so far (keys). A pair with no such cut is listed as not compared.

use crate::capture::{tensor_number, GraphNode, ModelCapture};
use crate::diff::compare;
use crate::diff::invariance::{equivalence_classes, Batching, BatchingResult, InvarianceReport, OpDifference};
use crate::record::{trace_dtype, with_canonical_bytes, RecordError};
use candle_core::{Device, Tensor};

pub mod cost;
pub mod workloads;

/// The default batch sizes: where kernels commonly change their split.
pub const DEFAULT_BATCH_SIZES: [usize; 9] = [1, 2, 3, 4, 8, 16, 32, 64, 128];

/// A model's forward pass as the check drives it: token ids `[B, n]` (u32, on the device) at
/// positions `offset..offset + n` to logits `[B, n, ...]` for every one of them. At offset 0 the
/// model starts afresh (an empty KV cache); at a later offset it has been given the tokens
/// before it, in earlier calls. A model without a KV cache is only called at offset 0.
pub type Forward<'f> = dyn FnMut(&Tensor, usize) -> Result<Tensor, RecordError> + 'f;

/// What to check.
pub struct InvarianceCheck<'a> {
    /// The model's parameters (and the graph capture behind its logits).
    pub capture: &'a ModelCapture,
    /// The sequence whose logits must not depend on how it is run.
    pub sequence: Vec<u32>,
    /// Other sequences of the same length that fill the batches (reused in turn if there are
    /// fewer than the largest batch needs).
    pub fillers: Vec<Vec<u32>>,
    /// Batch sizes (1, the reference, is always run).
    pub batch_sizes: Vec<usize>,
    /// Paddings: the sequence alone followed by this many more tokens (from the first filler),
    /// its own positions compared; 0 is the reference.
    pub paddings: Vec<usize>,
    /// Pieces: the sequence alone, run this many tokens per forward pass against the model's
    /// KV cache (1 decodes it token by token; more prefills it in chunks).
    pub chunks: Vec<usize>,
    /// The model and its settings, for the report.
    pub subject: String,
    /// The device's label, for the report.
    pub device_label: String,
}

/// One forward pass of a batching: the sequence's tokens `offset..offset + len` (with the
/// batching's padding after them when it has one).
#[derive(Debug, Clone, Copy)]
struct Piece {
    offset: usize,
    len: usize,
}

impl InvarianceCheck<'_> {
    /// Runs `forward` on every batching and compares each with the sequence alone.
    pub fn run(&self, device: &Device, forward: &mut Forward) -> Result<InvarianceReport, RecordError> {
        self.run_with(device, forward, None)
    }

    /// `run`, with `plain`: the same model built with its weights as plain tensors (not the
    /// `VarMap`'s variables), whose passes keep no graph. Every batching's logits then come
    /// from `plain`, which needs the memory of one op's output at a time; its ops are compared
    /// when the pass that keeps them all fits in memory too, and are listed as not compared
    /// (with why) when it fails. So batches far larger than a whole graph fits are checked.
    pub fn run_with_plain(
        &self,
        device: &Device,
        forward: &mut Forward,
        plain: &mut Forward,
    ) -> Result<InvarianceReport, RecordError> {
        self.run_with(device, forward, Some(plain))
    }

    fn run_with(
        &self,
        device: &Device,
        forward: &mut Forward,
        mut plain: Option<&mut Forward>,
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
        let tokens = self.sequence.len();
        let (reference, parameters_reached) =
            self.pass(device, Batching::ALONE, Piece { offset: 0, len: tokens }, forward)?;
        let ops: Vec<String> = reference.iter().map(|n| n.name.clone()).collect();
        let root = reference.last().expect("a graph has a root");
        let reference_logits = with_canonical_bytes(&root.tensor, <[u8]>::to_vec)?;
        let mut fingerprints = vec![(Batching::ALONE, blake3::hash(&reference_logits))];
        let mut results = Vec::new();
        for batching in self.batchings() {
            let mut result = BatchingResult {
                batching,
                logits_identical: false,
                logits: None,
                first_op: None,
                ops_differing: 0,
                ops_compared: 0,
                unmatched: Vec::new(),
                op_max_ulp: vec![None; ops.len()],
                error: None,
                ops_skipped: None,
            };
            // The sequence's logits from the passes that keep no graph, when there are such.
            let plain_logits = match plain.as_deref_mut() {
                Some(plain) => match self.plain_logits(device, batching, &root.tensor, plain) {
                    Ok(logits) => Some(logits),
                    Err(e) => {
                        result.error = Some(format!("the forward pass failed: {e}"));
                        results.push(result);
                        continue;
                    }
                },
                None => None,
            };
            // The sequence's logits, piece after piece; `None` once a piece's cannot be cut.
            let mut logits: Option<Vec<u8>> = Some(Vec::new());
            let mut differs = vec![false; ops.len()];
            for piece in self.pieces(batching) {
                // A model that cannot run a batching (a shape it does not support, a bug in its
                // cache path) fails that batching, not the check.
                let pass = match self.pass(device, batching, piece, forward) {
                    Ok((pass, _)) => pass,
                    Err(e) if plain_logits.is_some() => {
                        // The logits are known: only the op-by-op comparison is lost.
                        result.ops_skipped =
                            Some(format!("keeping every op of the pass from token {} failed: {e}", piece.offset));
                        result.first_op = None;
                        result.op_max_ulp = vec![None; ops.len()];
                        differs.iter_mut().for_each(|d| *d = false);
                        break;
                    }
                    Err(e) => {
                        result.error = Some(format!("the forward pass from token {} failed: {e}", piece.offset));
                        logits = None;
                        break;
                    }
                };
                let piece_logits =
                    compare_pass(&reference, &pass, Run { batching, piece, tokens }, &mut result, &mut differs)?;
                logits = logits.zip(piece_logits).map(|(mut all, more)| {
                    all.extend(more);
                    all
                });
            }
            result.ops_differing = differs.iter().filter(|&&d| d).count();
            result.ops_compared = result.op_max_ulp.iter().filter(|u| u.is_some()).count();
            let logits = match plain_logits {
                Some(plain) => plain,
                None => logits,
            };
            if let Some(logits) = logits.filter(|l| l.len() == reference_logits.len()) {
                let dtype = trace_dtype(root.tensor.dtype())?;
                let metrics = compare(dtype, &reference_logits, &logits);
                fingerprints.push((batching, blake3::hash(&logits)));
                result.logits_identical = metrics.mismatched == 0;
                result.logits = (metrics.mismatched > 0).then_some(metrics);
            }
            results.push(result);
        }
        Ok(InvarianceReport {
            subject: self.subject.clone(),
            device: self.device_label.clone(),
            tokens,
            reference: Batching::ALONE,
            ops,
            results,
            parameters_reached,
            parameters: self.capture.parameters().len(),
            classes: equivalence_classes(fingerprints),
        })
    }

    /// Every batching but the reference: each batch size above 1, with the sequence first and
    /// last; each padding, alone; each chunk size, alone.
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
            .flat_map(|batch| [0, batch - 1].map(|position| Batching { batch, position, ..Batching::ALONE }));
        let padded = distinct(&self.paddings).into_iter().map(|padding| Batching { padding, ..Batching::ALONE });
        let pieces = distinct(&self.chunks)
            .into_iter()
            .filter(|&c| c < self.sequence.len())
            .map(|chunk| Batching { chunk, ..Batching::ALONE });
        batches.chain(padded).chain(pieces).collect()
    }

    /// The forward passes of a batching: the whole sequence at once, or its chunks in order.
    fn pieces(&self, batching: Batching) -> Vec<Piece> {
        let tokens = self.sequence.len();
        let chunk = if batching.chunk == 0 { tokens } else { batching.chunk };
        (0..tokens).step_by(chunk).map(|offset| Piece { offset, len: chunk.min(tokens - offset) }).collect()
    }

    /// The sequence's logits in `batching` from `plain`'s passes (which keep no graph), cut
    /// as the root op is (`reference_root`: the logits of the sequence alone); `None` when a
    /// piece's cannot be cut.
    fn plain_logits(
        &self,
        device: &Device,
        batching: Batching,
        reference_root: &Tensor,
        plain: &mut Forward,
    ) -> Result<Option<Vec<u8>>, RecordError> {
        let tokens = self.sequence.len();
        let mut all = Vec::new();
        for piece in self.pieces(batching) {
            let logits = plain(&self.token_ids(device, batching, piece)?, piece.offset);
            // Its scopes are not the next graph pass's.
            self.capture.forget_scopes();
            let logits = logits?;
            match cut(reference_root, &logits, Run { batching, piece, tokens })? {
                Some((_, ours)) => with_canonical_bytes(&ours, |bytes| all.extend_from_slice(bytes))?,
                None => return Ok(None),
            }
        }
        Ok(Some(all))
    }

    /// One forward pass: its ops (parameters and the graph of earlier passes that a KV cache
    /// links in left out; the root, the logits, last) and the number of parameters its graph
    /// reaches.
    fn pass(
        &self,
        device: &Device,
        batching: Batching,
        piece: Piece,
        forward: &mut Forward,
    ) -> Result<(Vec<GraphNode>, usize), RecordError> {
        let tokens = self.token_ids(device, batching, piece)?;
        // Every tensor this pass creates has a higher id than its input's.
        let first = tensor_number(&tokens);
        let logits = forward(&tokens, piece.offset)?;
        let nodes = self.capture.graph_after(&logits, Some(first))?;
        let parameters = nodes.iter().filter(|n| n.is_variable).count();
        Ok((nodes.into_iter().filter(|n| !n.is_variable).collect(), parameters))
    }

    /// The token ids `[batch, len]` of one pass: the sequence's piece in its row, fillers'
    /// in the others, and the batching's padding after each.
    fn token_ids(&self, device: &Device, batching: Batching, piece: Piece) -> Result<Tensor, RecordError> {
        let len = piece.len + batching.padding;
        let pad = self.fillers[0].iter().cycle();
        let mut ids: Vec<u32> = Vec::with_capacity(batching.batch * len);
        for row in 0..batching.batch {
            let tokens =
                if row == batching.position { &self.sequence } else { &self.fillers[row % self.fillers.len()] };
            ids.extend(tokens[piece.offset..piece.offset + piece.len].iter().chain(pad.clone()).take(len));
        }
        Ok(Tensor::from_vec(ids, (batching.batch, len), &Device::Cpu)?.to_device(device)?)
    }
}

/// Compares one pass's ops with the reference's, into `result` (each op's largest ULP distance
/// so far; the first op that differs) and `differs` (per reference op, whether any pass's part
/// differed). `run` is the batching, the pass's piece and the sequence's length. Returns the
/// sequence's part of the pass's logits, or `None` when they cannot be cut from it.
fn compare_pass(
    reference: &[GraphNode],
    pass: &[GraphNode],
    run: Run,
    result: &mut BatchingResult,
    differs: &mut [bool],
) -> Result<Option<Vec<u8>>, RecordError> {
    let mut logits = None;
    // The pass's ops with no counterpart; the report keeps the longest such list of any pass
    // (a run in pieces names its ops anew in every pass).
    let mut unmatched = Vec::new();
    for pair in pair_ops(reference, pass, run)? {
        let (column, node) = match pair {
            Pairing::Both(column, node) => (column, node),
            Pairing::PassOnly(node) => {
                unmatched.push(node.name.clone());
                continue;
            }
        };
        let is_root = column == reference.len() - 1;
        let Some((expected, got)) = cut(&reference[column].tensor, &node.tensor, run)? else {
            unmatched.push(node.name.clone());
            continue;
        };
        let dtype = trace_dtype(got.dtype())?;
        let expected = with_canonical_bytes(&expected, <[u8]>::to_vec)?;
        let metrics = with_canonical_bytes(&got, |bytes| {
            if is_root {
                logits = Some(bytes.to_vec());
            }
            compare(dtype, &expected, bytes)
        })?;
        let ulp = &mut result.op_max_ulp[column];
        *ulp = Some(ulp.unwrap_or(0).max(metrics.max_ulp));
        differs[column] |= metrics.mismatched > 0;
        if metrics.mismatched > 0 && result.first_op.is_none() {
            result.first_op = Some(OpDifference {
                name: reference[column].name.clone(),
                position: node.position,
                dtype,
                shape: got.dims().iter().map(|&d| d as u64).collect(),
                metrics,
                at_token: (run.batching.chunk > 0).then_some(run.piece.offset),
            });
        }
    }
    if unmatched.len() > result.unmatched.len() {
        result.unmatched = unmatched;
    }
    Ok(logits)
}

/// How an op of a pass lines up with the reference's.
enum Pairing<'p> {
    /// The reference op at this index (a column of the report) and the pass's.
    Both(usize, &'p GraphNode),
    /// An op the reference has no counterpart for.
    PassOnly(&'p GraphNode),
}

/// The part of a node's name that says where it was made: its scope path (`h[0]/attn` of
/// `h[0]/attn#3`), or the variable or node it follows (`w` of `w+2`).
fn scope_of(node: &GraphNode) -> &str {
    node.name.split(['#', '+']).next().unwrap_or_default()
}

/// Pairs the ops of a pass with the reference's: the roots with each other, the rest by an
/// alignment of the two sequences (ops keep their order) that pairs as many ops as it can, and
/// among those pairings prefers ops whose parts are bit-identical. Two ops can pair when they
/// were made in the same place (`scope_of`), have the same dtype and shapes that `cut_plan` can
/// match. A pass can have ops the reference has not (a KV cache's concatenation) and lack some
/// (a copy that a one-token tensor does not need); shapes alone are ambiguous when a piece is
/// one token long, which is what the preference for identical parts settles. A model without
/// scopes names its ops after the variable before them in the graph's order, which the older
/// nodes a KV cache links in can shift: such ops are left unpaired (not compared) rather than
/// paired with the wrong op.
fn pair_ops<'p>(reference: &[GraphNode], pass: &'p [GraphNode], run: Run) -> Result<Vec<Pairing<'p>>, RecordError> {
    let (Some((_, ref_body)), Some((pass_root, pass_body))) = (reference.split_last(), pass.split_last()) else {
        return Ok(Vec::new());
    };
    // The usual case (a batch or a padding: the same graph, only larger): op k pairs with op k,
    // as the alignment below would find, without reading every candidate pair's values.
    let same_graph = reference.len() == pass.len()
        && reference.iter().zip(pass).all(|(r, p)| {
            r.name == p.name
                && r.tensor.dtype() == p.tensor.dtype()
                && cut_plan(r.tensor.dims(), p.tensor.dims(), run).is_some()
        });
    if same_graph {
        return Ok(pass.iter().enumerate().map(|(k, p)| Pairing::Both(k, p)).collect());
    }
    // A pair is worth more than every identical-pair bonus together (one each): the most pairs
    // first, then the most identical ones.
    let pair_worth = ref_body.len().min(pass_body.len()) as u64 + 1;
    let score = |r: &GraphNode, p: &GraphNode| -> Result<Option<u64>, RecordError> {
        if scope_of(r) != scope_of(p) || r.tensor.dtype() != p.tensor.dtype() {
            return Ok(None);
        }
        let Some((a, b)) = cut(&r.tensor, &p.tensor, run)? else {
            return Ok(None);
        };
        let a = with_canonical_bytes(&a, <[u8]>::to_vec)?;
        Ok(Some(pair_worth + u64::from(with_canonical_bytes(&b, |b| b == a.as_slice())?)))
    };
    let (rows, cols) = (ref_body.len(), pass_body.len());
    let mut best = vec![vec![0u64; cols + 1]; rows + 1];
    let mut pair_score = vec![vec![None; cols]; rows];
    for i in 1..=rows {
        for j in 1..=cols {
            pair_score[i - 1][j - 1] = score(&ref_body[i - 1], &pass_body[j - 1])?;
            let diagonal = pair_score[i - 1][j - 1].map(|s| best[i - 1][j - 1] + s);
            best[i][j] = diagonal.unwrap_or(0).max(best[i - 1][j]).max(best[i][j - 1]);
        }
    }
    // Back from the end: a pair where it made the best score, else skip a reference op, else
    // a pass op (the pass's skipped ops are its own).
    let mut pairs = Vec::with_capacity(cols + 1);
    let (mut i, mut j) = (rows, cols);
    while j > 0 {
        if i > 0 && pair_score[i - 1][j - 1].is_some_and(|s| best[i - 1][j - 1] + s == best[i][j]) {
            pairs.push(Pairing::Both(i - 1, &pass_body[j - 1]));
            i -= 1;
            j -= 1;
        } else if i > 0 && best[i - 1][j] == best[i][j] {
            i -= 1;
        } else {
            pairs.push(Pairing::PassOnly(&pass_body[j - 1]));
            j -= 1;
        }
    }
    pairs.reverse();
    pairs.push(Pairing::Both(reference.len() - 1, pass_root));
    Ok(pairs)
}

/// How a pass relates to the reference: its batching, its piece, the sequence's length.
#[derive(Debug, Clone, Copy)]
struct Run {
    batching: Batching,
    piece: Piece,
    tokens: usize,
}

/// One dimension's cut: a range of the reference's (`alone`) or of the pass's (`other`).
#[derive(Debug, Clone, Copy, PartialEq)]
enum DimCut {
    Keep,
    Alone { start: usize, len: usize },
    Other { start: usize, len: usize },
    Both { start: usize, len: usize },
}

/// How to cut an op of the reference run (dims `a`) and of a pass (dims `o`) to the same
/// elements: the sequence's part; `None` when the shapes differ in a way none of these
/// explains. Per dimension, where the sizes differ:
/// - batch: `o` is the batch size times `a`: the pass's at the sequence's row (once);
/// - padding: `a` is the sequence's length T and `o` T + padding: the pass's first T;
/// - a piece at tokens `offset..offset + n`: `a` is T and `o` n (the new tokens: the
///   reference's at those) or offset + n (every token so far, as keys: the reference's first
///   offset + n); or `o` is longer than offset + n, up to T: keys padded past the tokens seen
///   (the tensor-core product pads K with zeros to a multiple of 8), where the reference holds
///   later tokens: both their first offset + n. (A dimension of T that is not the tokens', in
///   a sequence as long as the model's width, say, is then compared on its first offset + n
///   only: less compared, never a false difference.)
fn cut_plan(a: &[usize], o: &[usize], run: Run) -> Option<Vec<DimCut>> {
    let Run { batching, piece, tokens } = run;
    if a.len() != o.len() {
        return None;
    }
    let seen = piece.offset + piece.len;
    let mut batch_cut = false;
    a.iter()
        .zip(o)
        .map(|(&a, &o)| {
            if batching.chunk > 0 && a == tokens && seen < o && o <= tokens {
                Some(DimCut::Both { start: 0, len: seen })
            } else if a == o {
                Some(DimCut::Keep)
            } else if batching.batch > 1 && !batch_cut && o == a * batching.batch {
                batch_cut = true;
                Some(DimCut::Other { start: batching.position * a, len: a })
            } else if batching.padding > 0 && a == tokens && o == tokens + batching.padding {
                Some(DimCut::Other { start: 0, len: tokens })
            } else if batching.chunk > 0 && a == tokens && o == piece.len {
                Some(DimCut::Alone { start: piece.offset, len: piece.len })
            } else if batching.chunk > 0 && a == tokens && o == piece.offset + piece.len {
                Some(DimCut::Alone { start: 0, len: piece.offset + piece.len })
            } else {
                None
            }
        })
        .collect()
}

/// The reference's and the pass's op cut to the sequence's part (see `cut_plan`).
fn cut(alone: &Tensor, other: &Tensor, run: Run) -> Result<Option<(Tensor, Tensor)>, RecordError> {
    let Some(plan) = cut_plan(alone.dims(), other.dims(), run) else {
        return Ok(None);
    };
    let (mut alone, mut other) = (alone.clone(), other.clone());
    for (d, c) in plan.into_iter().enumerate() {
        match c {
            DimCut::Keep => {}
            DimCut::Alone { start, len } => alone = alone.narrow(d, start, len)?,
            DimCut::Other { start, len } => other = other.narrow(d, start, len)?,
            DimCut::Both { start, len } => {
                alone = alone.narrow(d, start, len)?;
                other = other.narrow(d, start, len)?;
            }
        }
    }
    Ok(Some((alone.contiguous()?, other.contiguous()?)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::scope;
    use candle_core::{DType, Module, D};
    use candle_nn::{VarBuilder, VarMap};

    /// Where the planted op changes its rounding.
    #[derive(Clone, Copy, PartialEq)]
    enum Plant {
        Nowhere,
        FromBatch4,
        OneTokenPasses,
        /// Not a rounding: the model fails on a piece of several tokens after the first.
        FailingChunks,
    }

    /// A tiny model: an embedding, then (in scope `planted`) a row sum that, where `plant` says,
    /// sums the row scaled by 3 and divides by 3 afterwards: the same ops, the same graph, other
    /// rounding, as a kernel choosing its variant by problem size does; then a linear head.
    fn planted(plant: Plant, chunks: &[usize]) -> Result<InvarianceReport, RecordError> {
        planted_with(plant, chunks, None)
    }

    /// `planted`; with `graph_fails_from: Some(b)`, the graph-keeping pass fails (as out of
    /// memory) at batch b and above, and a plain pass gives the logits.
    fn planted_with(
        plant: Plant,
        chunks: &[usize],
        graph_fails_from: Option<usize>,
    ) -> Result<InvarianceReport, RecordError> {
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
        let embedding = candle_nn::embedding(256, 64, vb.pp("embed"))?;
        let head = candle_nn::linear(1, 8, vb.pp("head"))?;
        let capture = ModelCapture::new(&varmap);
        let run = |tokens: &Tensor, offset: usize| -> Result<Tensor, RecordError> {
            let x = scope("embed", || embedding.forward(tokens))?;
            let (batch, len) = tokens.dims2()?;
            if plant == Plant::FailingChunks && offset > 0 && len > 1 {
                return Err(RecordError::Unsupported("dtype mismatch in cat".into()));
            }
            let sum = scope("planted", || -> candle_core::Result<Tensor> {
                let varies = match plant {
                    Plant::Nowhere | Plant::FailingChunks => false,
                    Plant::FromBatch4 => batch >= 4,
                    Plant::OneTokenPasses => len == 1,
                };
                let scale = if varies { 3.0 } else { 1.0 };
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
            chunks: chunks.to_vec(),
            subject: "planted".into(),
            device_label: "cpu".into(),
        };
        let mut forward = |tokens: &Tensor, offset: usize| match graph_fails_from {
            Some(b) if tokens.dim(0)? >= b => Err(RecordError::Unsupported("out of memory".into())),
            _ => run(tokens, offset),
        };
        match graph_fails_from {
            Some(_) => check.run_with_plain(&Device::Cpu, &mut forward, &mut |t, o| run(&t.clone(), o)),
            None => check.run(&Device::Cpu, &mut forward),
        }
    }

    #[test]
    fn batchings_whose_graph_does_not_fit_still_compare_their_logits() {
        let report = planted_with(Plant::FromBatch4, &[], Some(8)).unwrap();
        let at = |batch: usize| report.results.iter().find(|r| r.batching.batch == batch).unwrap();
        // Batch 8's graph "ran out of memory": its ops were not compared, its logits were, and
        // they differ (the planted reduction rounds otherwise from batch 4).
        let eight = at(8);
        assert!(eight.error.is_none(), "{:?}", eight.error);
        assert!(eight.ops_skipped.as_deref().unwrap().contains("out of memory"));
        assert_eq!((eight.ops_compared, eight.first_op.is_none()), (0, true));
        assert!(!eight.logits_identical && eight.logits.is_some());
        // Below it, ops compared as usual, and the cause found.
        let four = at(4);
        assert!(four.ops_skipped.is_none() && four.ops_compared > 0);
        assert!(four.first_op.as_ref().unwrap().name.starts_with("planted"), "{four:?}");
        assert!(at(2).logits_identical && at(2).ops_compared > 0);
        assert_eq!(report.failed(), 0, "no batching failed");
    }

    #[test]
    fn ops_are_cut_to_the_batch_row_the_sequence_s_positions_and_the_piece() {
        let t = |dims: &[usize]| {
            let n: usize = dims.iter().product();
            Tensor::arange(0f32, n as f32, &Device::Cpu).unwrap().reshape(dims).unwrap()
        };
        let whole = Piece { offset: 0, len: 6 };
        let run = |batching| Run { batching, piece: whole, tokens: 6 };
        let dims = |c: Option<(Tensor, Tensor)>| c.map(|(a, o)| (a.dims().to_vec(), o.dims().to_vec()));
        let padded = run(Batching { padding: 2, ..Batching::ALONE });
        // Attention scores [1, heads, T+P, T+P] against [1, heads, T, T], T = 6: both cut to T.
        let scores = cut(&t(&[1, 4, 6, 6]), &t(&[1, 4, 8, 8]), padded).unwrap();
        assert_eq!(dims(scores.clone()), Some((vec![1, 4, 6, 6], vec![1, 4, 6, 6])));
        let (_, other) = scores.unwrap();
        assert_eq!(other.get(0).unwrap().get(0).unwrap().get(1).unwrap().to_vec1::<f32>().unwrap()[0], 8.0);
        // Tokens flattened with the batch, [T+P, C]: the first T rows.
        assert_eq!(dims(cut(&t(&[6, 12]), &t(&[8, 12]), padded).unwrap()), Some((vec![6, 12], vec![6, 12])));
        // Row 2 of a batch of 3, [3·T, C].
        let row = run(Batching { batch: 3, position: 2, ..Batching::ALONE });
        let (_, rows) = cut(&t(&[6, 2]), &t(&[18, 2]), row).unwrap().unwrap();
        assert_eq!(rows.to_vec2::<f32>().unwrap()[0], [24.0, 25.0]);
        // Decoding token 4: scores [1, heads, 1, 5] against the reference's rows 4, columns 0..5.
        let decode =
            Run { batching: Batching { chunk: 1, ..Batching::ALONE }, piece: Piece { offset: 4, len: 1 }, tokens: 6 };
        let (alone, _) = cut(&t(&[1, 4, 6, 6]), &t(&[1, 4, 1, 5]), decode).unwrap().unwrap();
        assert_eq!(alone.dims(), [1, 4, 1, 5]);
        assert_eq!(alone.flatten_all().unwrap().to_vec1::<f32>().unwrap()[..5], [24.0, 25.0, 26.0, 27.0, 28.0]);
        // Keys padded past the tokens seen (decoding token 4 of 6; K padded to 6 or to 8 in a
        // sequence of 8): both cut to the 5 seen, the padding left out.
        let (alone, other) = cut(&t(&[4, 6, 2]), &t(&[4, 6, 2]), decode).unwrap().unwrap();
        assert_eq!((alone.dims(), other.dims()), ([4, 5, 2].as_slice(), [4, 5, 2].as_slice()));
        let longer = Run { tokens: 8, ..decode };
        assert_eq!(dims(cut(&t(&[8, 3]), &t(&[6, 3]), longer).unwrap()), Some((vec![5, 3], vec![5, 3])));
        assert_eq!(dims(cut(&t(&[8, 3]), &t(&[8, 3]), longer).unwrap()), Some((vec![5, 3], vec![5, 3])));
        // The last token's pass has seen them all: nothing is padding.
        let last = Run { piece: Piece { offset: 5, len: 1 }, ..decode };
        assert_eq!(dims(cut(&t(&[4, 6, 2]), &t(&[4, 6, 2]), last).unwrap()), Some((vec![4, 6, 2], vec![4, 6, 2])));
        // A shape change that none explains is not compared.
        assert!(cut(&t(&[6, 12]), &t(&[7, 12]), padded).unwrap().is_none());
        assert!(cut(&t(&[6, 12]), &t(&[6, 13]), row).unwrap().is_none());
        assert!(cut(&t(&[6, 12]), &t(&[3, 12]), decode).unwrap().is_none());
    }

    #[test]
    fn a_planted_batch_dependent_reduction_is_found_named_and_classed() {
        let report = planted(Plant::FromBatch4, &[]).unwrap();
        assert!(!report.invariant());
        let b = |batch, position| Batching { batch, position, ..Batching::ALONE };
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
        let fixed = planted(Plant::Nowhere, &[1, 4]).unwrap();
        assert!(fixed.invariant(), "{:?}", fixed.results);
        assert_eq!(fixed.classes.len(), 1);
        assert!(fixed.results.iter().all(|r| r.ops_compared > 0 && r.ops_differing == 0));
    }

    #[test]
    fn a_planted_op_that_rounds_otherwise_for_one_token_is_found_when_decoding() {
        let report = planted(Plant::OneTokenPasses, &[1, 4, 5]).unwrap();
        let by_chunk = |c| report.results.iter().find(|r| r.batching.chunk == c).unwrap();
        let decode = by_chunk(1);
        assert!(!decode.logits_identical);
        let op = decode.first_op.as_ref().expect("found");
        assert!(op.name.starts_with("planted#"), "{}", op.name);
        assert_eq!(op.at_token, Some(0), "the first one-token pass already differs");
        // Chunks of 4 and 5 (the last one of a single token) cover all 16 tokens.
        assert!(by_chunk(4).logits_identical && by_chunk(4).first_op.is_none());
        let five = by_chunk(5);
        assert_eq!(five.first_op.as_ref().and_then(|op| op.at_token), Some(15), "{five:?}");
        assert!(report.results.iter().filter(|r| r.batching.batch > 1).all(|r| r.logits_identical));
    }

    #[test]
    fn a_batching_the_model_cannot_run_fails_alone() {
        let report = planted(Plant::FailingChunks, &[1, 4]).unwrap();
        assert_eq!(report.failed(), 1);
        let chunked = report.results.iter().find(|r| r.batching.chunk == 4).unwrap();
        let error = chunked.error.as_deref().expect("recorded");
        assert!(error.contains("from token 4") && error.contains("dtype mismatch"), "{error}");
        assert!(!chunked.logits_identical);
        // Every other batching still ran and compared.
        assert!(report
            .results
            .iter()
            .filter(|r| r.batching.chunk != 4)
            .all(|r| r.logits_identical && r.error.is_none()));
        assert!(!report.classes.iter().flatten().any(|b| b.chunk == 4), "no logits, no class");
    }
}
