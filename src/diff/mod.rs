//! Comparing traces: the diff of two runs, error metrics, and N-run error matrices. Plain data
//! in, plain data out: no printing, no candle.

mod align;
mod error;
mod gate;
mod matrix;
mod metrics;
mod online;
mod root_cause;
mod traces;

pub use error::DiffError;
pub use gate::{likely_causes, GateReport};
pub use matrix::{error_matrices, ErrorMatrix, MatrixReport, Metric, StepSelector};
pub use metrics::{compare, TensorMetrics};
pub use online::{OnlineDivergence, ReferenceCheck};
pub use root_cause::{Consequence, RootCause};
pub use traces::{
    diff_traces, header_differences, Divergence, FieldDifference, StepMetrics, StructuralDifference, TensorHistory,
    TraceDiff, TraceSide,
};
