//! The trace: a directory holding one run's records, and the only code that reads or writes
//! it. Nothing here depends on candle; `docs/trace-format.md` is the specification.

mod check;
mod error;
pub mod format;
pub mod frame;
mod reader;
mod schema;
mod summary;
mod writer;

pub use check::{StepCheck, StepVerdict};
pub use error::TraceError;
pub use format::{FormatVersion, CURRENT_FORMAT};
pub use reader::{Completeness, TensorValues, TraceReader};
pub use schema::{
    BadCapture, CapturePolicy, Environment, Footer, FullCapture, Header, Phase, Record, RunConfig, StepRecord,
    TensorKind, TensorRecord,
};
pub use summary::{summarize, verify, TensorInfo, TraceSummary, Verification};
pub use writer::{StepTensor, TraceWriter};
