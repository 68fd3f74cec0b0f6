//! Test-only: tiny traces written with repro-trace's writer, for the unit tests of this crate.

use repro_trace::dtype::DType;
use repro_trace::{
    CapturePolicy, Header, RunConfig, StepTensor, TensorKind, TensorRecord, TraceWriter, CURRENT_FORMAT,
};
use std::path::{Path, PathBuf};

/// Writes into `dir` a one-step trace of one F32 tensor `loss` holding `value`'s bits, with
/// `params` as its run settings and `device` as its environment's device.
pub(crate) fn one_value_trace(dir: &Path, value: f32, params: &[(&str, &str)], device: &str) -> PathBuf {
    write_one_value(dir, value, params, device, true)
}

/// As [`one_value_trace`], but the trace keeps only the tensor's hash, no values.
pub(crate) fn one_hash_trace(dir: &Path, value: f32) -> PathBuf {
    write_one_value(dir, value, &[], "cpu", false)
}

/// Writes into `dir` a trace of one step holding `tensors`.
pub(crate) fn one_step_trace(dir: &Path, tensors: Vec<StepTensor>) -> PathBuf {
    one_step_trace_with(dir, tensors, |_| {})
}

/// `one_step_trace`, its header changed by `change` first.
pub(crate) fn one_step_trace_with(dir: &Path, tensors: Vec<StepTensor>, change: impl FnOnce(&mut Header)) -> PathBuf {
    let mut header = header(&[], "cpu");
    change(&mut header);
    let mut w = TraceWriter::create(dir, &header, false).unwrap();
    w.write_step(0, tensors).unwrap();
    w.finish().unwrap();
    dir.to_path_buf()
}

/// A record of F32 `values` of `shape`, its values in the step's payload file when `stored`.
pub(crate) fn f32_tensor(name: &str, kind: TensorKind, shape: Vec<u64>, values: &[f32], stored: bool) -> StepTensor {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let record = TensorRecord { in_payload: stored, ..TensorRecord::of_bytes(name, kind, DType::F32, shape, &bytes) };
    StepTensor { record, payload: stored.then_some(repro_trace::Payload::Bytes(bytes)) }
}

fn header(params: &[(&str, &str)], device: &str) -> Header {
    let mut header = Header {
        format: CURRENT_FORMAT,
        producer: "test".into(),
        run: RunConfig {
            workload: "synthetic".into(),
            steps: Some(1),
            params: params.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        },
        environment: Default::default(),
        capture: CapturePolicy::default(),
        distributed: None,
        data_hash: Default::default(),
    };
    header.environment.device = device.into();
    header
}

fn write_one_value(dir: &Path, value: f32, params: &[(&str, &str)], device: &str, keep_values: bool) -> PathBuf {
    let mut w = TraceWriter::create(dir, &header(params, device), false).unwrap();
    let bytes = value.to_le_bytes().to_vec();
    let record = TensorRecord {
        inline: keep_values.then(|| bytes.clone()),
        ..TensorRecord::of_bytes("loss", TensorKind::Loss, DType::F32, vec![1], &bytes)
    };
    w.write_step(0, vec![StepTensor { record, payload: None }]).unwrap();
    w.finish().unwrap();
    dir.to_path_buf()
}
