//! `Recorder`: the library API a candle training loop uses to record itself.
//!
//! ```no_run
//! use candle_core::{Device, Tensor};
//! use repro::record::Recorder;
//! use repro::trace::{CapturePolicy, RunConfig, TensorKind};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let device = Device::Cpu;
//! let run = RunConfig { workload: "my-model".into(), steps: Some(10), ..Default::default() };
//! let mut recorder = Recorder::create("runs/mine", run, &device, CapturePolicy::default())?;
//! for step in 0..10 {
//!     let loss = Tensor::new(1.0f32 / (step as f32 + 1.0), &device)?;
//!     let mut s = recorder.step(step);
//!     s.record("loss", TensorKind::Loss, &loss)?;
//!     s.finish()?;
//! }
//! recorder.finish()?;
//! # Ok(()) }
//! ```

use super::environment::environment;
use super::error::RecordError;
use super::tensor_bytes::{device_data_hash, trace_dtype, with_canonical_bytes};
use crate::hash::{combine, tensor_hash};
use crate::trace::{
    CapturePolicy, Header, RunConfig, StepTensor, TensorKind, TensorRecord, TraceWriter, CURRENT_FORMAT,
};
use candle_core::{Device, Tensor};
use std::path::Path;

/// Records a run into a trace directory.
pub struct Recorder {
    /// `None` for a recorder that discards everything (see `Recorder::discard`).
    writer: Option<TraceWriter>,
    capture: CapturePolicy,
    total_steps: Option<u64>,
    first_step: Option<u64>,
}

impl Recorder {
    /// Starts recording into `dir`, which must not already hold a trace.
    pub fn create(
        dir: impl AsRef<Path>,
        run: RunConfig,
        device: &Device,
        capture: CapturePolicy,
    ) -> Result<Self, RecordError> {
        Self::create_with(dir, run, device, capture, false)
    }

    /// Starts recording into `dir`; with `replace`, an existing trace there is deleted first.
    pub fn create_with(
        dir: impl AsRef<Path>,
        run: RunConfig,
        device: &Device,
        capture: CapturePolicy,
        replace: bool,
    ) -> Result<Self, RecordError> {
        let total_steps = run.steps;
        let header = Header {
            format: CURRENT_FORMAT,
            producer: format!("repro {}", env!("CARGO_PKG_VERSION")),
            run,
            environment: environment(device),
            capture: capture.clone(),
        };
        let writer = TraceWriter::create(dir.as_ref(), &header, replace)?;
        Ok(Recorder {
            writer: Some(writer),
            capture,
            total_steps,
            first_step: None,
        })
    }

    /// A recorder that hashes nothing and writes nothing: the un-instrumented baseline that
    /// recording overhead is measured against.
    pub fn discard() -> Self {
        Recorder {
            writer: None,
            capture: CapturePolicy::default(),
            total_steps: None,
            first_step: None,
        }
    }

    /// The trace directory (`None` for a discarding recorder).
    pub fn dir(&self) -> Option<&Path> {
        self.writer.as_ref().map(TraceWriter::dir)
    }

    /// Begins recording step `step`. Record its tensors on the returned value, then `finish` it.
    pub fn step(&mut self, step: u64) -> StepRecorder<'_> {
        let first = *self.first_step.get_or_insert(step);
        let full = self.capture.wants_full(step, first, self.total_steps);
        StepRecorder {
            recorder: self,
            step,
            full,
            tensors: Vec::new(),
        }
    }

    /// Marks the trace complete and syncs it to disk; returns the number of steps recorded.
    pub fn finish(self) -> Result<u64, RecordError> {
        match self.writer {
            Some(writer) => Ok(writer.finish()?),
            None => Ok(0),
        }
    }
}

/// Collects one step's tensors; nothing reaches the trace until `finish`.
pub struct StepRecorder<'a> {
    recorder: &'a mut Recorder,
    step: u64,
    full: bool,
    tensors: Vec<StepTensor>,
}

impl StepRecorder<'_> {
    /// The step being recorded.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// Whether this step stores full tensors under the capture policy.
    pub fn stores_full_tensors(&self) -> bool {
        self.full
    }

    /// Records `tensor` under `name`: its canonical hash always, its values when the capture
    /// policy asks for this step or when it is small enough to store inline.
    pub fn record(&mut self, name: &str, kind: TensorKind, tensor: &Tensor) -> Result<(), RecordError> {
        if self.recorder.writer.is_none() {
            return Ok(());
        }
        let dtype = trace_dtype(tensor.dtype())?;
        let shape: Vec<u64> = tensor.dims().iter().map(|&d| d as u64).collect();
        let inline_max = self.recorder.capture.inline_max_bytes;
        let full = self.full;
        let byte_len = tensor.elem_count() as u64 * dtype.size_in_bytes() as u64;
        let keep_values = byte_len <= inline_max || full;
        // Hash-only tensors on a GPU are hashed there: 32 bytes cross to the host, not the tensor.
        let on_device = if keep_values { None } else { device_data_hash(tensor)? };
        let (hash, inline, payload) = match on_device {
            Some(data_hash) => (combine(dtype, &shape, &data_hash), None, None),
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
        self.tensors.push(StepTensor {
            record: TensorRecord {
                name: name.to_string(),
                kind,
                dtype,
                shape,
                hash,
                inline,
                in_payload: false,
            },
            payload,
        });
        Ok(())
    }

    /// Writes the step to the trace.
    pub fn finish(self) -> Result<(), RecordError> {
        match &mut self.recorder.writer {
            Some(writer) => Ok(writer.write_step(self.step, self.tensors)?),
            None => Ok(()),
        }
    }
}
