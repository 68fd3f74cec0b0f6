//! Measuring repro itself: what recording costs a training run (`overhead`) and, with the
//! `cuda` feature, whether its GPU code computes what the host does and how fast (`gpu`), as
//! reports for the command line (`repro overhead`, `repro gpu-check`) or a library caller.

#[cfg(feature = "cuda")]
pub mod gpu;
pub mod overhead;
