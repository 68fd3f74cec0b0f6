//! Recording: turning candle tensors into trace records. This crate's modules all build on
//! candle (recording, capture, ops, workloads, distributed training, invariance, studies); the
//! trace and diff crates never do, so reading and comparing traces needs no model code.

pub(crate) mod device;
mod env;
mod environment;
mod error;
mod fill;
mod online;
mod options;
mod payload_stream;
mod perturb;
mod probe;
pub(crate) mod profile;
mod recorder;
mod step_records;
mod tensor_bytes;
mod worker;
mod writer_thread;

pub use env::{RecordEnv, AGAINST_ENV, CAPTURE_ENV, KEEP_GOING_ENV, PERTURB_ENV, REPLACE_ENV, TRACE_DIR_ENV};
pub use environment::{
    device_label, environment, open_device, pin_cpu_threads, take_peak_device_memory, user_environment,
    NUMERICS_ENV_VARS,
};
pub use error::RecordError;
pub use online::OnlineComparison;
pub use options::{RecordOptions, StepCallback, StepProgress, StepSelector};
pub use perturb::Perturbation;
pub use recorder::{Recorder, StepRecorder};
pub(crate) use step_records::Described;
pub use tensor_bytes::{trace_dtype, with_canonical_bytes};

/// What the GPU hashing library for the PyTorch recorder (`python/cuda-hash`) uses of the
/// device side: the kernels made ready on a device, a batch of reads hashed by them, foreign
/// memory to read, the leaf pass of the data hash `xxh3-1k`, and the results on their way and
/// landed. The rest of `device` stays the
/// recorder's own.
#[cfg(feature = "cuda")]
pub mod gpu_hashing {
    pub use super::device::{
        launch_leaves, launch_leaves_of, leaf_count, prepare, DeviceBatch, ForeignBytes, LeafPiece, PendingRead,
        Resolved,
    };
}
