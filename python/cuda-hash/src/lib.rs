//! `librepro_cuda_hash.so`: what the PyTorch recorder does natively, through a C ABI that
//! `python/repro_torch` loads with ctypes. Two parts, one module each:
//!
//! - `gpu` (with the `cuda` feature, which `make cuda` builds): repro's GPU hashing for CUDA
//!   memory another program owns, its C ABI described there;
//! - `records` (always): a step's hashed records packed as the trace format's step record
//!   holds them, for the Python trace writer (`python/repro_writer.py`), in one call a step.
//!
//! The workspace's CPU build makes the library with `records` alone, which the Python tests load.

#[cfg(feature = "cuda")]
mod gpu;
mod records;
