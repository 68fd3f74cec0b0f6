//! repro: make neural-network training bit-exact reproducible, or show exactly where it is not.
//!
//! Data flows one way, and the modules follow it:
//!
//! - [`workloads`] train models with candle (using [`ops`] where repro controls the numerics)
//!   and hand their tensors to a [`record::Recorder`];
//! - [`record`] hashes tensors ([`hash`]) and writes them as a [`trace`];
//! - [`diff`] compares traces, and [`report`] renders the comparison.
//!
//! `trace`, `hash`, `diff` and `report` never touch candle: reading and comparing traces needs
//! no model code and no GPU. The trace format is specified in `docs/trace-format.md`.
#![deny(missing_docs)]

pub mod diff;
pub mod dtype;
pub mod hash;
pub mod ops;
pub mod record;
pub mod report;
pub mod study;
pub mod trace;
pub mod workloads;
