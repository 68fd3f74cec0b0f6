//! Built-in training workloads. Each trains with candle and records itself through the same
//! `Recorder` API that users' own training loops use.

mod adder;
pub mod seeded;

pub use adder::{AdderConfig, Formulation};

/// Names of the built-in workloads.
pub const WORKLOADS: &[&str] = &["adder"];
