//! One step's records as they are collected, in order: each tensor's record, with its hash (or
//! values) computed on the host at once, or queued to be read on the device. A step recorder
//! fills one; a job on the recorder's worker thread (a captured graph, see `worker`) fills one
//! of its own, merged into the step's at the place the job was asked for.

use super::error::RecordError;
use super::payload_stream::PayloadStream;
use super::profile;
use super::tensor_bytes::{trace_dtype, with_canonical_bytes, DeviceQueue};
use crate::hash::{tensor_hash, TensorHash, CHUNK_LEN};
use crate::trace::payload::header_room_bound;
use crate::trace::{dtype::DType, Payload, Phase, StepTensor, TensorKind, TensorRecord, ViewOf};
use candle_core::Tensor;
use std::sync::Arc;

/// What a recorded tensor is, apart from its values.
pub(crate) struct Described<'a> {
    pub name: String,
    pub kind: TensorKind,
    pub phase: Option<Phase>,
    pub inputs: &'a [&'a str],
    pub node: Option<u64>,
    pub collective: Option<&'a str>,
    /// A captured node's scope's `FILE:LINE`.
    pub source: Option<String>,
}

impl Described<'_> {
    /// Its record, of `dtype` and `shape`, with `hash`; no values, and no view (set those with
    /// struct update syntax where they apply).
    fn record(self, dtype: DType, shape: Vec<u64>, hash: TensorHash) -> TensorRecord {
        TensorRecord {
            name: self.name,
            kind: self.kind,
            dtype,
            shape,
            hash,
            inline: None,
            in_payload: false,
            phase: self.phase,
            inputs: self.inputs.iter().map(|s| s.to_string()).collect(),
            node: self.node,
            collective: self.collective.map(str::to_string),
            source: self.source,
            view: None,
            shard: None,
            reduce_scatter: None,
        }
    }
}

/// Records of one step, or of one part of it.
pub(crate) struct StepRecords {
    /// Whether the step stores full values.
    pub(crate) full: bool,
    /// Values this small are stored inline at every step.
    inline_max: u64,
    pub(crate) tensors: Vec<StepTensor>,
    /// GPU tensors' results, resolved in one copy when the step finishes.
    pub(crate) device: DeviceQueue,
    /// (index into `tensors`, ticket in `device`) of records still waiting for those results.
    pub(crate) deferred: Vec<(usize, usize)>,
    /// Where the step's payload values go as they are read back from a GPU, if they do.
    pub(crate) stream: Option<Arc<PayloadStream>>,
}

impl StepRecords {
    /// Records of step `step`; `stream` takes the values it stores as they come back from a GPU.
    pub(crate) fn new(step: u64, full: bool, inline_max: u64, stream: Option<Arc<PayloadStream>>) -> Self {
        StepRecords {
            full,
            inline_max,
            tensors: Vec::new(),
            device: DeviceQueue::new(step, stream.clone()),
            deferred: Vec::new(),
            stream,
        }
    }

    /// An empty part of the same step (same full-value settings, same stream).
    pub(crate) fn part(&self) -> Self {
        Self::new(self.device.step(), self.full, self.inline_max, self.stream.clone())
    }

    /// Records `tensor` as `what`: its canonical hash always, its values when the step stores
    /// them or they fit inline. GPU tensors are queued (their hash made on the device unless
    /// the values are kept); with `snapshot`, a device copy is taken now, for a tensor that
    /// changes in place before the queue is read.
    pub(crate) fn push(&mut self, what: Described<'_>, tensor: &Tensor, snapshot: bool) -> Result<(), RecordError> {
        profile::time(profile::Phase::Queue, || {
            let dtype = trace_dtype(tensor.dtype())?;
            let shape: Vec<u64> = tensor.dims().iter().map(|&d| d as u64).collect();
            let (inline_max, full) = (self.inline_max, self.full);
            let byte_len = tensor.elem_count() as u64 * dtype.size_in_bytes() as u64;
            let keep_values = byte_len <= inline_max || full;
            let hash_on_device = !keep_values && byte_len > CHUNK_LEN as u64;
            let deferred = self.device.push(tensor, hash_on_device, snapshot)?;
            let (hash, inline, bytes) = match deferred {
                Some(_) => (TensorHash([0; 32]), None, None),
                None => with_canonical_bytes(tensor, |bytes| {
                    let hash = tensor_hash(dtype, &shape, bytes);
                    if bytes.len() as u64 <= inline_max {
                        (hash, Some(bytes.to_vec()), None)
                    } else if full {
                        (hash, None, Some(bytes.to_vec()))
                    } else {
                        (hash, None, None)
                    }
                })?,
            };
            if let Some(ticket) = deferred {
                self.deferred.push((self.tensors.len(), ticket));
            }
            self.tensors.push(StepTensor {
                record: TensorRecord { inline, ..what.record(dtype, shape, hash) },
                payload: bytes.map(Payload::Bytes),
            });
            Ok(())
        })
    }

    /// Records `tensor` as `what`, a view of a tensor recorded earlier in the step (format 1.5):
    /// nothing is read, and its hash is derived from that tensor's when the step is filled in
    /// (`fill::fill_records`). The caller has checked that `view` lies within that tensor and
    /// that both are read in the same flush, so the relation holds of the values recorded.
    pub(crate) fn push_view(&mut self, what: Described<'_>, tensor: &Tensor, view: ViewOf) -> Result<(), RecordError> {
        let dtype = trace_dtype(tensor.dtype())?;
        let shape: Vec<u64> = tensor.dims().iter().map(|&d| d as u64).collect();
        let record = TensorRecord { view: Some(view), ..what.record(dtype, shape, TensorHash([0; 32])) };
        self.tensors.push(StepTensor { record, payload: None });
        Ok(())
    }

    /// Whether a view of `bytes` bytes is recorded as a view (`push_view`) rather than by its
    /// values: when it is larger than what every step stores inline. The same at every step,
    /// whether or not it stores full values, so that a view hashes alike in any two steps.
    pub(crate) fn derives_view_of(&self, bytes: u64) -> bool {
        bytes > self.inline_max
    }

    /// Header room enough for the payload file of a step like this one: for its records that a
    /// step storing full values puts there (neither views nor inline), in any order.
    pub(crate) fn header_room(&self) -> u64 {
        let stored = self.tensors.iter().map(|t| &t.record).filter(|r| {
            r.view.is_none() && r.shape.iter().product::<u64>() * r.dtype.size_in_bytes() as u64 > self.inline_max
        });
        header_room_bound(stored.map(|r| (r.name.as_str(), r.shape.as_slice())))
    }

    /// Launches the device reads of everything queued so far (see `StepRecorder::read_now`).
    pub(crate) fn read_now(&mut self) -> Result<(), RecordError> {
        self.device.flush()
    }

    /// Puts `part`'s records at index `at` of this step's. Its device reads join this step's
    /// (without launching what is still queued here, whose tickets move up past them).
    pub(crate) fn merge(&mut self, at: usize, part: StepRecords) -> Result<(), RecordError> {
        let tickets = self.device.absorb(part.device)?;
        let added = part.tensors.len();
        for (index, ticket) in &mut self.deferred {
            if *index >= at {
                *index += added;
            }
            if *ticket >= tickets.start {
                *ticket += tickets.len();
            }
        }
        let first = tickets.start;
        self.deferred.extend(part.deferred.into_iter().map(|(index, ticket)| (index + at, ticket + first)));
        self.tensors.splice(at..at, part.tensors);
        Ok(())
    }
}
