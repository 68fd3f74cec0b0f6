//! repro-trace: the trace format. A trace is a directory holding one run's records; this crate is
//! the only code that reads or writes one, and it owns what a record means: the element types
//! ([`dtype`]), the canonical tensor hash ([`hash`]), the framing ([`frame`]) and the schema.
//!
//! No candle and no model code: anything that reads, verifies or writes traces (the `repro`
//! binary, the diff, the fuzz targets, another tool) depends on this crate alone.
//! `docs/trace-format.md` is the specification.
#![deny(missing_docs)]

mod check;
pub mod dtype;
mod error;
pub mod format;
pub mod frame;
pub mod hash;
mod paging;
pub mod payload;
mod printable;
mod progress;
mod ranks;
mod reader;
mod schema;
pub mod shard;
mod summary;
pub mod view;
mod writer;

pub use check::{StepCheck, StepVerdict};
pub use error::TraceError;
pub use format::{is_ranked_run, rank_dir};
pub use format::{FormatVersion, CURRENT_FORMAT, XXH3_FORMAT};
pub use hash::DataHash;
pub use paging::WINDOW_BYTES;
pub use payload::{safetensors_dtype, PayloadFile};
pub use progress::{read_progress, Progress, ProgressPoint, MAX_PROGRESS_BYTES};
pub use ranks::rank_streams;
pub use reader::{Completeness, TensorValues, TraceReader};
pub use schema::{
    BadCapture, CapturePolicy, Distributed, Environment, Footer, FullCapture, Header, Phase, Record, RunConfig,
    ShardOf, StepRecord, TensorKind, TensorRecord, ViewOf,
};
pub use summary::{
    bytes, summarize, verify, MissingGradient, MissingGradients, TensorInfo, TraceSummary, Verification,
};
pub use writer::{Payload, StepTensor, TraceWriter};
