//! A trace's summary for `repro inspect`: header, completeness, steps, tensors and sizes.

use crate::dtype::DType;
use crate::error::TraceError;
use crate::format::FormatVersion;
use crate::reader::{Completeness, TraceReader};
use crate::schema::{Header, Phase, StepRecord, TensorKind};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

/// What `repro inspect` shows.
#[derive(Debug, Clone, Serialize)]
pub struct TraceSummary {
    /// The trace directory.
    pub path: String,
    /// Format version of the trace.
    pub format: FormatVersion,
    /// The header record.
    pub header: Header,
    /// Whether the trace has its footer.
    pub complete: bool,
    /// Why not, if not.
    pub incomplete_reason: Option<String>,
    /// Number of step records.
    pub steps: u64,
    /// First step number.
    pub first_step: Option<u64>,
    /// Last step number.
    pub last_step: Option<u64>,
    /// Steps whose full tensors are stored in a payload file.
    pub full_steps: Vec<u64>,
    /// Tensors of the first step, in recording order.
    pub tensors: Vec<TensorInfo>,
    /// Size of the record file in bytes.
    pub records_bytes: u64,
    /// Total size of the payload files in bytes.
    pub payload_bytes: u64,
    /// Trainable parameters that received no gradient at some step, by name.
    pub no_gradient: Vec<MissingGradient>,
}

/// A trainable parameter that received no gradient, and at which steps.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MissingGradient {
    /// The parameter's name.
    pub name: String,
    /// At how many steps it had no gradient.
    pub steps: u64,
    /// The first such step.
    pub first_step: u64,
    /// The last such step.
    pub last_step: u64,
}

/// Collects, over the steps of a trace, the parameters that received no gradient.
#[derive(Debug, Default)]
pub struct MissingGradients(BTreeMap<String, MissingGradient>);

impl MissingGradients {
    /// Notes the parameters `step` lists as without a gradient.
    pub fn observe(&mut self, step: &StepRecord) {
        for name in &step.no_gradient {
            let entry = self.0.entry(name.clone()).or_insert(MissingGradient {
                name: name.clone(),
                steps: 0,
                first_step: step.step,
                last_step: step.step,
            });
            entry.steps += 1;
            entry.last_step = step.step;
        }
    }

    /// The parameters, sorted by name.
    pub fn finish(self) -> Vec<MissingGradient> {
        self.0.into_values().collect()
    }
}

/// One tensor as recorded at the first step.
#[derive(Debug, Clone, Serialize)]
pub struct TensorInfo {
    /// Name.
    pub name: String,
    /// Kind.
    pub kind: TensorKind,
    /// Phase that produced it, if recorded.
    pub phase: Option<Phase>,
    /// Names of the tensors it was computed from.
    pub inputs: Vec<String>,
    /// Position in the captured graph, for a node of one.
    pub node: Option<u64>,
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<u64>,
    /// Size of its values in bytes.
    pub bytes: u64,
    /// For a view (format 1.5): the tensor whose memory it reads.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub view_of: Option<String>,
    /// For one rank's block of a sharded tensor (format 1.7): the whole's shape and the block's
    /// offset in it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shard: Option<crate::ShardOf>,
    /// For a block that is this rank's part of a sum across the ranks (format 1.8): `sum`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reduce_scatter: Option<String>,
    /// Where in the program it comes from (format 1.4): a captured node's scope's opening
    /// line, or (1.6) the line that recorded a hand-recorded op.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

/// A byte count with a binary unit (`1.5 MiB`), as reports and the recorder's messages print
/// sizes.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Reads a whole trace (records only, not payload contents) and summarizes it.
pub fn summarize(dir: &Path) -> Result<TraceSummary, TraceError> {
    let mut reader = TraceReader::open(dir)?;
    let mut summary = TraceSummary {
        path: dir.display().to_string(),
        format: reader.version(),
        header: reader.header().clone(),
        complete: false,
        incomplete_reason: None,
        steps: 0,
        first_step: None,
        last_step: None,
        full_steps: Vec::new(),
        tensors: Vec::new(),
        records_bytes: file_size(reader.records_path())?,
        payload_bytes: 0,
        no_gradient: Vec::new(),
    };
    let mut missing = MissingGradients::default();
    while let Some(step) = reader.next_step()? {
        missing.observe(&step);
        summary.steps += 1;
        summary.first_step.get_or_insert(step.step);
        summary.last_step = Some(step.step);
        if summary.tensors.is_empty() {
            summary.tensors = step
                .tensors
                .iter()
                .map(|t| TensorInfo {
                    name: t.name.clone(),
                    kind: t.kind,
                    phase: t.phase,
                    inputs: t.inputs.clone(),
                    node: t.node,
                    dtype: t.dtype,
                    shape: t.shape.clone(),
                    bytes: t.numel() * t.dtype.size_in_bytes() as u64,
                    view_of: t.view.as_ref().map(|v| v.of.clone()),
                    shard: t.shard.clone(),
                    reduce_scatter: t.reduce_scatter.clone(),
                    source: t.source.clone(),
                })
                .collect();
        }
        // A lone record file (a baseline) keeps hashes only: its payload references lead nowhere.
        if let Some(payload) = step.payload.as_ref().filter(|_| !reader.records_only()) {
            summary.full_steps.push(step.step);
            summary.payload_bytes += file_size(&reader.dir().join(payload))?;
        }
    }
    summary.no_gradient = missing.finish();
    match reader.completeness() {
        Some(Completeness::Complete) => summary.complete = true,
        Some(Completeness::Incomplete(why)) => summary.incomplete_reason = Some(why.clone()),
        None => {}
    }
    Ok(summary)
}

fn file_size(path: &Path) -> Result<u64, TraceError> {
    std::fs::metadata(path).map(|m| m.len()).map_err(TraceError::io(path))
}

/// What `verify` checked.
#[derive(Debug, Clone, Serialize)]
pub struct Verification {
    /// Step records read.
    pub steps: u64,
    /// Tensor records read.
    pub tensors: u64,
    /// Stored values (inline or in payloads) checked against their hashes.
    pub values_checked: u64,
    /// Whether the trace has its footer.
    pub complete: bool,
    /// Values stored in payload files that could not be checked because the trace was opened
    /// as a lone record file (a baseline), which has no payloads.
    pub values_elsewhere: u64,
}

/// Reads a whole trace and checks every stored value against its recorded hash: the check
/// for a trace that was copied, shared or attached to a bug report. Any damage is an error
/// naming the file and the step.
pub fn verify(path: &Path) -> Result<Verification, TraceError> {
    let mut reader = TraceReader::open(path)?;
    let mut v = Verification { steps: 0, tensors: 0, values_checked: 0, complete: false, values_elsewhere: 0 };
    while let Some(step) = reader.next_step()? {
        v.steps += 1;
        for tensor in &step.tensors {
            v.tensors += 1;
            if tensor.view.is_some() {
                // A view holds no values of its own: the reader checked its hash against its owner's.
                continue;
            }
            if reader.values(&step, tensor)?.is_some() {
                v.values_checked += 1;
            } else if tensor.in_payload {
                v.values_elsewhere += 1;
            }
        }
    }
    v.complete = matches!(reader.completeness(), Some(Completeness::Complete));
    Ok(v)
}
