//! A divergence: one tensor whose bits differ between two runs at one step, with what it is and,
//! when both runs stored its values, by how much. The diff, the root-cause analysis and the
//! online check all speak in these.

use crate::metrics::TensorMetrics;
use repro_trace::dtype::DType;
use repro_trace::{Phase, TensorKind, TensorRecord};
use serde::Serialize;

/// One tensor that differs at one step.
#[derive(Debug, Clone, Serialize)]
pub struct Divergence {
    /// The step.
    pub step: u64,
    /// The tensor's name.
    pub tensor: String,
    /// What the tensor is.
    pub kind: TensorKind,
    /// Which part of the step produced it, if recorded.
    pub phase: Option<Phase>,
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<u64>,
    /// Exact metrics, when both traces stored the values; `None` when only hashes exist.
    pub metrics: Option<TensorMetrics>,
    /// B's dtype and shape, when they differ from A's (then there are no metrics).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub b_layout: Option<(DType, Vec<u64>)>,
    /// Where in A's source it comes from (`FILE:LINE`): for a captured node, where its scope
    /// was opened; for a hand-recorded op, the op's line (format 1.6).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Whether `source` is where a captured node's scope was opened (rather than its own line).
    #[serde(skip)]
    pub source_opens_scope: bool,
    /// B's name for the tensor, where B names it otherwise: a captured node numbered otherwise
    /// because its scope's graph changed before it, or a tensor paired by its place.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tensor_b: Option<String>,
}

impl Divergence {
    /// `tensor` (as A recorded it) differing at `step`, with exact metrics where both runs
    /// stored its values.
    pub fn of(tensor: &TensorRecord, step: u64, metrics: Option<TensorMetrics>) -> Self {
        Divergence {
            step,
            tensor: tensor.name.clone(),
            kind: tensor.kind,
            phase: tensor.phase,
            dtype: tensor.dtype,
            shape: tensor.shape.clone(),
            metrics,
            b_layout: None,
            source: tensor.source.clone(),
            source_opens_scope: tensor.node.is_some(),
            tensor_b: None,
        }
    }

    /// `a` (as A recorded it) differing at `step` from `b`, B's tensor paired with it.
    pub fn between(a: &TensorRecord, b: &TensorRecord, step: u64, metrics: Option<TensorMetrics>) -> Self {
        Divergence { tensor_b: (a.name != b.name).then(|| b.name.clone()), ..Divergence::of(a, step, metrics) }
    }
}
