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

fn write_one_value(dir: &Path, value: f32, params: &[(&str, &str)], device: &str, keep_values: bool) -> PathBuf {
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
    };
    header.environment.device = device.into();
    let mut w = TraceWriter::create(dir, &header, false).unwrap();
    let bytes = value.to_le_bytes().to_vec();
    let record = TensorRecord {
        inline: keep_values.then(|| bytes.clone()),
        ..TensorRecord::of_bytes("loss", TensorKind::Loss, DType::F32, vec![1], &bytes)
    };
    w.write_step(0, vec![StepTensor { record, payload: None }]).unwrap();
    w.finish().unwrap();
    dir.to_path_buf()
}
