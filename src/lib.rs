//! repro: make neural-network training bit-exact reproducible, or show exactly where it is not.
//!
//! Data flows one way, and the modules follow it:
//!
//! - [`workloads`] train models with candle (using [`ops`] where repro controls the numerics)
//!   and hand their tensors to a [`record::Recorder`], op by op or through [`capture`], which
//!   records any candle model's parameters, forward graph and gradients with no per-op code;
//! - [`record`] hashes tensors ([`hash`]) and writes them as a [`trace`]; [`gated`] joins it
//!   with [`diff`]'s online comparison when a repro command runs the program;
//! - [`diff`] compares traces, and [`report`] renders the comparison;
//! - [`distributed`] trains data-parallel across ranks (NCCL on GPUs), each rank recording its
//!   own stream;
//! - [`invariance`] runs a model's forward pass under different batchings and finds the first
//!   captured op whose result for one sequence depends on its batch;
//! - [`measure`] measures repro itself: what recording costs a training run;
//! - [`study`] runs the research seeds' experiments (seeds, devices, reductions, cost) as
//!   commands, recording each run and comparing them.
//!
//! `trace` (with `hash` and `dtype`) is the `repro-trace` crate, `diff` the `repro-diff` crate
//! and `report` the `repro-report` crate, re-exported here under the names the library has
//! always used. None depends on candle, so the compiler keeps the layering: reading, comparing
//! and reporting traces needs no model code and no GPU. The trace format is specified in `docs/trace-format.md`.
#![deny(missing_docs)]

pub mod capture;
pub mod cuda;
pub mod distributed;
pub mod gated;
pub mod invariance;
pub mod measure;
pub mod ops;
pub mod record;
pub mod study;
pub mod workloads;

pub use repro_diff as diff;
pub use repro_report as report;
pub use repro_trace as trace;
pub use repro_trace::{dtype, hash};
