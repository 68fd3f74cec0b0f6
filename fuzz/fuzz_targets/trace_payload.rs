//! Fuzzes the safetensors payload files: a valid trace whose step 0 stores three tensors in
//! full is written once, then each input replaces its payload file and every tensor of the
//! trace is read back (`inspect --verify`) and diffed against the intact trace. The tensor
//! values must be rejected (dtype, shape, bounds or hash) unless the input is the true payload.
#![no_main]

use libfuzzer_sys::fuzz_target;
use repro_trace::dtype::DType;
use repro_trace::hash::tensor_hash;
use repro_trace::{
    format::payload_name, CapturePolicy, Environment, FullCapture, Header, Payload, RunConfig, StepTensor, TensorKind,
    TensorRecord, TraceReader, TraceWriter, CURRENT_FORMAT,
};
use std::path::PathBuf;
use std::sync::OnceLock;

struct Traces {
    _root: tempfile::TempDir,
    intact: PathBuf,
    fuzzed: PathBuf,
    payload: PathBuf,
}

fn write_trace(dir: &std::path::Path) {
    let header = Header {
        format: CURRENT_FORMAT,
        producer: "repro fuzz".into(),
        run: RunConfig { workload: "fuzz".into(), steps: Some(1), params: Default::default() },
        environment: Environment::default(),
        capture: CapturePolicy { full: FullCapture::All, inline_max_bytes: 0, ..CapturePolicy::default() },
        distributed: None,
        data_hash: Default::default(),
    };
    let mut writer = TraceWriter::create(dir, &header, true).expect("creating the fuzz trace");
    let tensors = [
        ("weight", DType::F32, vec![3u64, 4], (0..48u8).collect::<Vec<u8>>()),
        ("labels", DType::U8, vec![5], vec![1, 2, 3, 4, 5]),
        ("half", DType::BF16, vec![2, 2], vec![0, 63, 128, 63, 0, 64, 0, 192]),
    ];
    let step = tensors
        .into_iter()
        .map(|(name, dtype, shape, bytes)| StepTensor {
            record: TensorRecord::of_bytes(name, TensorKind::Weight, dtype, shape, &bytes),
            payload: Some(Payload::Bytes(bytes)),
        })
        .collect();
    writer.write_step(0, step).expect("writing the fuzz trace");
    writer.finish().expect("finishing the fuzz trace");
}

fn traces() -> &'static Traces {
    static TRACES: OnceLock<Traces> = OnceLock::new();
    TRACES.get_or_init(|| {
        let root = tempfile::tempdir().expect("a scratch directory");
        let (intact, fuzzed) = (root.path().join("intact"), root.path().join("fuzzed"));
        write_trace(&intact);
        write_trace(&fuzzed);
        let payload = fuzzed.join(payload_name(0));
        // `make fuzz` seeds the corpus with the true payload this way.
        if let Ok(dir) = std::env::var("REPRO_FUZZ_SEED_DIR") {
            std::fs::copy(&payload, PathBuf::from(dir).join("seed-valid")).expect("writing the seed");
        }
        Traces { _root: root, intact, fuzzed, payload }
    })
}

fuzz_target!(|data: &[u8]| {
    let t = traces();
    std::fs::write(&t.payload, data).expect("writing the fuzzed payload");
    let verified = repro_trace::verify(&t.fuzzed);
    let original = std::fs::read(t.intact.join(payload_name(0))).expect("reading the intact payload");
    if data != original.as_slice() {
        // Any other bytes may still decode to the same tensors (e.g. reordered JSON header), but
        // then every value must hash to its record; a verify that passed on wrong values is a bug.
        if verified.is_ok() {
            let mut reader = TraceReader::open(&t.fuzzed).expect("the record file is intact");
            let step = reader.next_step().expect("step 0 reads").expect("step 0 exists");
            // (A view's hash is derived from its owner's: its owner's values are checked.)
            for tensor in step.tensors.iter().filter(|t| t.view.is_none()) {
                let values = reader.values(&step, tensor).expect("verify passed").expect("stored in full");
                assert_eq!(tensor_hash(values.dtype, &values.shape, &values.bytes), tensor.hash);
            }
        }
    }
    if let (Ok(mut a), Ok(mut b)) = (TraceReader::open(&t.intact), TraceReader::open(&t.fuzzed)) {
        let _ = repro_diff::diff_traces(&mut a, &mut b);
    }
});
