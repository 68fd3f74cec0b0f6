//! The records a trace holds, as serde types. Each is written as a msgpack map with field
//! names as keys and a `type` key naming the record (`header`, `step`, `footer`).

use crate::dtype::DType;
use crate::format::FormatVersion;
use crate::hash::{DataHash, TensorHash};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// One record of the record file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Record {
    /// The first record: what ran, where, and what was captured.
    Header(Box<Header>),
    /// One training step's tensors.
    Step(StepRecord),
    /// The last record of a complete trace.
    Footer(Footer),
}

/// What ran, where, and what was captured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Header {
    /// Format version of this trace (also in the file preamble).
    pub format: FormatVersion,
    /// The program that wrote the trace, e.g. `repro 0.1.0`.
    pub producer: String,
    /// The training configuration: two runs with equal configs are meant to compute the same.
    pub run: RunConfig,
    /// Where the run happened: versions, device, threads, numerics-relevant variables.
    pub environment: Environment,
    /// Which tensors were stored in full.
    pub capture: CapturePolicy,
    /// For one rank's stream of a data-parallel run (format 1.3): which rank, of how many, and
    /// the collective that summed their gradients. Absent (the key omitted) for a run on one
    /// device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distributed: Option<Distributed>,
    /// How every tensor's inner data hash is computed (format 2.0); `blake3`, the default, is
    /// omitted, as a 1.x trace has it.
    #[serde(default, skip_serializing_if = "DataHash::is_blake3", deserialize_with = "nil_is_blake3")]
    pub data_hash: DataHash,
}

/// A header's `data_hash`, nil read as absent (`blake3`), as nil is for other optional keys.
fn nil_is_blake3<'de, D: serde::Deserializer<'de>>(d: D) -> Result<DataHash, D::Error> {
    Ok(Option::<DataHash>::deserialize(d)?.unwrap_or_default())
}

impl Header {
    /// The header of a trace in the current format by `producer`, of a run on one device with
    /// an unnamed workload, an unknown environment and the default capture policy.
    pub fn of_producer(producer: impl Into<String>) -> Header {
        Header {
            format: crate::format::CURRENT_FORMAT,
            producer: producer.into(),
            run: RunConfig::default(),
            environment: Environment::default(),
            capture: CapturePolicy::default(),
            distributed: None,
            data_hash: DataHash::Blake3,
        }
    }

    /// How many ranks the run has (1: one device, with or without `distributed`).
    pub fn world_size(&self) -> u64 {
        self.distributed.as_ref().map_or(1, |d| d.world_size)
    }

    /// Whether the Python writer wrote the trace (`repro-py VERSION`, python/repro/writer.py):
    /// a PyTorch program's, whose graph nodes are the module and op outputs its recorder chose
    /// to watch, and whose recorder can keep the values of named tensors alone.
    pub fn written_by_python(&self) -> bool {
        self.producer.starts_with("repro-py")
    }
}

/// One rank's place in a data-parallel run (format 1.3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Distributed {
    /// This stream's rank, from 0.
    pub rank: u64,
    /// Number of ranks.
    pub world_size: u64,
    /// What carried the collectives: `nccl` on GPUs, `file` for the stand-in that CPU ranks
    /// use (section 10 of the format document).
    pub backend: String,
    /// The backend's version, e.g. `2.28.3` for NCCL; empty when it has none.
    pub backend_version: String,
}

/// The training configuration.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct RunConfig {
    /// Workload name (`adder`, or any name a library user picks).
    pub workload: String,
    /// Total steps the run intends to record, if known.
    pub steps: Option<u64>,
    /// Every other setting, as text, sorted by key.
    pub params: BTreeMap<String, String>,
}

/// The environment fingerprint: what can change numerics between otherwise equal runs.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Environment {
    /// repro's version.
    pub repro_version: String,
    /// candle-core's version.
    pub candle_version: String,
    /// Device the run computed on: `cpu` or `cuda:N`.
    pub device: String,
    /// Human name of the device (CPU model or GPU name).
    pub device_name: String,
    /// CPU model of the host.
    pub cpu_model: String,
    /// Operating system and architecture.
    pub os: String,
    /// rustc that built the producer.
    pub rustc: String,
    /// Worker threads candle's CPU backend uses.
    pub threads: u64,
    /// Environment variables that change numerics, as set for the run (unset ones are absent).
    pub env: BTreeMap<String, String>,
}

/// What one step recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    /// Step number; strictly increasing within a trace.
    pub step: u64,
    /// Relative path of the safetensors file with this step's full tensors, if any.
    pub payload: Option<String>,
    /// Tensors in the order they were recorded; names are unique within a step.
    pub tensors: Vec<TensorRecord>,
    /// Trainable parameters that received no gradient at this step (format 1.2), sorted: the
    /// loss does not depend on them, or an op without a backward pass cut them off.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub no_gradient: Vec<String>,
}

/// One recorded tensor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorRecord {
    /// Name, unique within the step (`weight`, `block2.conv1.matmul`, `bias.grad`).
    pub name: String,
    /// What the tensor is.
    pub kind: TensorKind,
    /// Element type.
    pub dtype: DType,
    /// Dimensions, outermost first.
    pub shape: Vec<u64>,
    /// Canonical hash (see `crate::hash`).
    pub hash: TensorHash,
    /// Element bytes of a small tensor, stored in the record itself.
    #[serde(with = "serde_bytes", default, skip_serializing_if = "Option::is_none")]
    pub inline: Option<Vec<u8>>,
    /// Whether the step's payload file holds this tensor.
    #[serde(default)]
    pub in_payload: bool,
    /// Which part of the training step produced it (format 1.1; absent: not said).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// Names of the tensors of the same step it was computed from, recorded before it (format
    /// 1.1). Root-cause analysis follows these edges.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inputs: Vec<String>,
    /// For a node of an automatically captured graph (format 1.2): its position in the graph's
    /// topological order (leaves first). Such records carry no `inputs`; root-cause analysis
    /// uses the leaf rule instead (docs/diff.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<u64>,
    /// For the result of a collective across the ranks of a data-parallel run (format 1.3):
    /// which one (`all_reduce_sum`). Its single input is this rank's contribution; every rank
    /// records its own under the same name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collective: Option<String>,
    /// For a node of an automatically captured graph (format 1.4): where in the source the
    /// scope it was created in was opened, `FILE:LINE` (`repro::capture::scope` at the user's
    /// call, or a `tracing` span's callsite).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// For a node of an automatically captured graph that reads an earlier tensor's memory
    /// (format 1.5): which tensor, and through which layout. Its hash is then derived from that
    /// tensor's (`crate::view`), and it stores no values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub view: Option<ViewOf>,
    /// For one rank's shard of a tensor sharded across the ranks of a run (format 1.7): the
    /// whole tensor's shape and where this block sits in it. The record's name, kind and dtype
    /// are the whole tensor's; its shape, hash and values are the block's (`crate::shard`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<ShardOf>,
    /// For a shard that is this rank's block of a sum across the ranks (format 1.8; FSDP's
    /// reduce-scatter of gradients): the reduction, `sum`. Its single input is this rank's
    /// contribution to the whole sum, of the whole's shape; every rank records its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reduce_scatter: Option<String>,
}

impl TensorRecord {
    /// The name of this rank's contribution when the record is a sum across the ranks: the
    /// whole sum (`collective`) or this rank's block of it (`reduce_scatter`).
    pub fn summed_from(&self) -> Option<&str> {
        if self.collective.is_none() && self.reduce_scatter.is_none() {
            return None;
        }
        self.inputs.first().map(String::as_str)
    }
}

/// Where a shard sits in its whole tensor: the block of the record's own shape whose first
/// element is at `offset` (one index per dimension) of a tensor of shape `whole`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardOf {
    /// The whole tensor's dimensions, outermost first.
    pub whole: Vec<u64>,
    /// The block's first index along each dimension of `whole`.
    pub offset: Vec<u64>,
}

/// What a view reads: element `offset + sum(index[i] * strides[i])` of `of`'s elements in
/// row-major order, for each index of the view's own shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ViewOf {
    /// The tensor of the same step whose elements it reads, recorded before it; not a view.
    pub of: String,
    /// Index of the view's first element among `of`'s elements.
    pub offset: u64,
    /// Elements of `of` between neighbours along each of the view's dimensions (0 along a
    /// broadcast one), outermost first.
    pub strides: Vec<u64>,
}

impl TensorRecord {
    /// The record of a tensor of `bytes` (row-major, little-endian), hashed canonically, that
    /// says nothing more: no inline values, no payload, phase, inputs, graph node, collective,
    /// source, view or shard. Set those with struct update syntax where they apply.
    pub fn of_bytes(name: impl Into<String>, kind: TensorKind, dtype: DType, shape: Vec<u64>, bytes: &[u8]) -> Self {
        TensorRecord {
            name: name.into(),
            kind,
            dtype,
            hash: crate::hash::tensor_hash(dtype, &shape, bytes),
            shape,
            inline: None,
            in_payload: false,
            phase: None,
            inputs: Vec::new(),
            node: None,
            collective: None,
            source: None,
            view: None,
            shard: None,
            reduce_scatter: None,
        }
    }

    /// Number of elements.
    pub fn numel(&self) -> u64 {
        self.shape.iter().product()
    }
}

/// What a recorded tensor is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TensorKind {
    /// A trainable parameter, before the step's update.
    Weight,
    /// A gradient of the loss.
    Gradient,
    /// A model output.
    Prediction,
    /// A loss value.
    Loss,
    /// An intermediate activation.
    Activation,
    /// The output of one recorded op.
    OpOutput,
    /// Data fed to the model: a batch of inputs or labels (format 1.1).
    Input,
    /// A module's registered buffer (format 1.9): state the model holds besides its trainable
    /// parameters, such as BatchNorm's running statistics, before the step (`NAME`) and after it
    /// (`NAME.updated`).
    Buffer,
    /// An optimizer's state after the step's update (format 1.10 and 2.1): a parameter's
    /// momentum buffer or Adam's moments and step count (`NAME.exp_avg`, ...), the learning rate
    /// each parameter group applied, a gradient scaler's scale.
    OptimizerState,
    /// A fingerprint of a random number generator's state at the step's start (format 1.10 and
    /// 2.1): the bytes of its state (`rng.cpu`, `rng.cuda:0`), so that randomness two runs draw
    /// differently is named by the state that differs.
    RngState,
    /// A kind this version of repro does not know (written by a newer minor version).
    #[serde(other)]
    Other,
}

impl TensorKind {
    /// Every kind, in the order `name` lists them.
    pub const ALL: [TensorKind; 11] = [
        TensorKind::Weight,
        TensorKind::Gradient,
        TensorKind::Prediction,
        TensorKind::Loss,
        TensorKind::Activation,
        TensorKind::OpOutput,
        TensorKind::Input,
        TensorKind::Buffer,
        TensorKind::OptimizerState,
        TensorKind::RngState,
        TensorKind::Other,
    ];

    /// The kind named `name` (as `name` writes it).
    pub fn from_name(name: &str) -> Option<TensorKind> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }

    /// The name used in traces and output.
    pub fn name(self) -> &'static str {
        match self {
            TensorKind::Weight => "weight",
            TensorKind::Gradient => "gradient",
            TensorKind::Prediction => "prediction",
            TensorKind::Loss => "loss",
            TensorKind::Activation => "activation",
            TensorKind::OpOutput => "op_output",
            TensorKind::Input => "input",
            TensorKind::Buffer => "buffer",
            TensorKind::OptimizerState => "optimizer_state",
            TensorKind::RngState => "rng_state",
            TensorKind::Other => "other",
        }
    }
}

impl fmt::Display for TensorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The part of a training step a tensor belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// The forward pass (and the loss).
    Forward,
    /// Backpropagation: gradients.
    Backward,
    /// The optimizer's update of the parameters.
    Update,
}

impl Phase {
    /// The name used in traces and output.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::Update => "update",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The last record of a complete trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Footer {
    /// Number of step records before the footer.
    pub steps: u64,
    /// Why the run stopped before the steps its header announced, when it did on purpose
    /// (format 1.2): such a trace is finished but not complete.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
}

/// Which steps store full tensors. Hashes are recorded at every step regardless, and tensors of
/// at most `inline_max_bytes` bytes are always stored inline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CapturePolicy {
    /// Steps whose tensors go to a payload file.
    pub full: FullCapture,
    /// Tensors this small (in bytes) are stored inline at every step.
    pub inline_max_bytes: u64,
    /// The capture ladder's `modules` level (format 1.9): the steps at which every module's
    /// output is recorded, where the producer records by levels (PyTorch's recorder). `None`:
    /// the producer does not say (its nodes, if any, are recorded at every step).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modules: Option<FullCapture>,
    /// The capture ladder's `ops` level (format 1.9): the steps at which every op's output
    /// inside the step is recorded (PyTorch's aten ops). `None`: the producer does not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ops: Option<FullCapture>,
}

impl Default for CapturePolicy {
    fn default() -> Self {
        CapturePolicy { full: FullCapture::FirstAndLast, inline_max_bytes: 256, modules: None, ops: None }
    }
}

impl CapturePolicy {
    /// Whether `step` stores full tensors, given the run's total step count if known (without
    /// it, `first-and-last` stores only the first step).
    pub fn wants_full(&self, step: u64, first_step: u64, total_steps: Option<u64>) -> bool {
        self.full.names(step, first_step, total_steps)
    }

    /// The capture ladder's levels that differ from `other`'s, as `(level, this, other)`:
    /// `modules` or `ops`, each policy as written (`(unset)` where the header does not say).
    pub fn level_differences(&self, other: &CapturePolicy) -> Vec<(&'static str, String, String)> {
        let text = |p: &Option<FullCapture>| p.as_ref().map_or("(unset)".to_string(), FullCapture::to_string);
        [("modules", &self.modules, &other.modules), ("ops", &self.ops, &other.ops)]
            .into_iter()
            .filter(|(_, a, b)| a != b)
            .map(|(level, a, b)| (level, text(a), text(b)))
            .collect()
    }
}

impl FullCapture {
    /// Whether the policy names `step`, of a run whose first recorded step is `first_step` and
    /// whose step count is `total_steps` if known (without it, `first-and-last` names only the
    /// first step).
    pub fn names(&self, step: u64, first_step: u64, total_steps: Option<u64>) -> bool {
        match self {
            FullCapture::None => false,
            FullCapture::All => true,
            FullCapture::First => step == first_step,
            FullCapture::FirstAndLast => {
                step == first_step || total_steps.is_some_and(|n| n > 0 && step == first_step.saturating_add(n - 1))
            }
            FullCapture::Every(n) => step.is_multiple_of(*n),
            FullCapture::Steps(steps) => steps.contains(&step),
        }
    }
}

/// Which steps store full tensors (or record a level of the capture ladder); written as text:
/// `none`, `all`, `first` (1.9), `first-and-last`, `every:N`, or `steps:A,B,C`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FullCapture {
    /// Hashes only (plus small inline tensors).
    None,
    /// Every step.
    All,
    /// The first step recorded (format 1.9).
    First,
    /// The first and the last step (the default).
    FirstAndLast,
    /// Every N-th step (N > 0): the steps divisible by N.
    Every(u64),
    /// The listed steps (sorted, deduplicated).
    Steps(Vec<u64>),
}

/// The error for a capture policy that does not parse.
#[derive(Debug, thiserror::Error)]
#[error("invalid capture policy `{0}`: expected none, all, first, first-and-last, every:N (N > 0) or steps:A,B,...")]
pub struct BadCapture(pub String);

impl FromStr for FullCapture {
    type Err = BadCapture;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || BadCapture(s.to_string());
        match s {
            "none" | "hashes" => return Ok(FullCapture::None),
            "all" => return Ok(FullCapture::All),
            "first" => return Ok(FullCapture::First),
            "first-and-last" | "default" => return Ok(FullCapture::FirstAndLast),
            _ => {}
        }
        if let Some(n) = s.strip_prefix("every:") {
            let n: u64 = n.parse().map_err(|_| bad())?;
            return if n == 0 { Err(bad()) } else { Ok(FullCapture::Every(n)) };
        }
        if let Some(list) = s.strip_prefix("steps:") {
            if list.is_empty() {
                return Ok(FullCapture::Steps(Vec::new()));
            }
            let mut steps =
                list.split(',').map(|x| x.trim().parse::<u64>()).collect::<Result<Vec<_>, _>>().map_err(|_| bad())?;
            steps.sort_unstable();
            steps.dedup();
            return Ok(FullCapture::Steps(steps));
        }
        Err(bad())
    }
}

impl fmt::Display for FullCapture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FullCapture::None => f.write_str("none"),
            FullCapture::All => f.write_str("all"),
            FullCapture::First => f.write_str("first"),
            FullCapture::FirstAndLast => f.write_str("first-and-last"),
            FullCapture::Every(n) => write!(f, "every:{n}"),
            FullCapture::Steps(steps) => {
                let list: Vec<String> = steps.iter().map(u64::to_string).collect();
                write!(f, "steps:{}", list.join(","))
            }
        }
    }
}

impl Serialize for FullCapture {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for FullCapture {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capture_policies_parse_and_print_back() {
        for text in ["none", "all", "first", "first-and-last", "every:5", "steps:1,5,9"] {
            let parsed: FullCapture = text.parse().unwrap();
            assert_eq!(parsed.to_string(), text);
        }
        assert_eq!("steps:9,1,9".parse::<FullCapture>().unwrap().to_string(), "steps:1,9");
        assert_eq!("steps:".parse::<FullCapture>().unwrap(), FullCapture::Steps(vec![]));
        for bad in ["every:0", "every:x", "steps:1,,2", "sometimes"] {
            assert!(bad.parse::<FullCapture>().is_err(), "{bad}");
        }
    }

    #[test]
    fn every_kind_reads_back_by_its_name_and_an_unknown_one_as_other() {
        for kind in TensorKind::ALL {
            assert_eq!(TensorKind::from_name(kind.name()), Some(kind));
            let written = rmp_serde::to_vec_named(&kind).unwrap();
            assert_eq!(written, rmp_serde::to_vec_named(kind.name()).unwrap(), "{kind} is written by its name");
            assert_eq!(rmp_serde::from_slice::<TensorKind>(&written).unwrap(), kind);
        }
        assert_eq!(TensorKind::from_name("buffer"), Some(TensorKind::Buffer));
        assert_eq!(TensorKind::from_name("optimizer_state"), Some(TensorKind::OptimizerState));
        let unknown = rmp_serde::to_vec_named("scheduler_state").unwrap();
        assert_eq!(rmp_serde::from_slice::<TensorKind>(&unknown).unwrap(), TensorKind::Other);
    }

    #[test]
    fn default_policy_stores_first_and_last_step() {
        let p = CapturePolicy::default();
        let full: Vec<u64> = (0..10).filter(|&s| p.wants_full(s, 0, Some(10))).collect();
        assert_eq!(full, vec![0, 9]);
        let unknown: Vec<u64> = (0..10).filter(|&s| p.wants_full(s, 0, None)).collect();
        assert_eq!(unknown, vec![0]);
        let from_one: Vec<u64> = (1..=10).filter(|&s| p.wants_full(s, 1, Some(10))).collect();
        assert_eq!(from_one, vec![1, 10]);
        let every_zero = CapturePolicy { full: FullCapture::Every(0), inline_max_bytes: 0, ..CapturePolicy::default() };
        assert!(!every_zero.wants_full(3, 0, None));
    }
}
