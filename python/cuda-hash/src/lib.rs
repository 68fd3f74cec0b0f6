//! `librepro_cuda_hash.so`: what the PyTorch recorder does natively, through a C ABI that
//! `python/repro/torch` loads with ctypes. Two parts, one module each:
//!
//! - `gpu` (with the `cuda` feature, which `make cuda` builds): repro's GPU hashing for CUDA
//!   memory another program owns, its C ABI described there;
//! - `records` (always): a step's hashed records packed as the trace format's step record
//!   holds them, for the Python trace writer (`python/repro/writer.py`), in one call a step.
//!
//! The workspace's CPU build makes the library with `records` alone, which the Python tests load.
//! With the `python` feature (the wheel, `make wheel`) the same library is also the Python
//! extension module `repro._native`: `import repro._native` finds it, and `repro.torch` loads its
//! C ABI from the module's file, so the wheel needs no path set.

#[cfg(feature = "cuda")]
mod gpu;
mod records;

/// The extension module `repro._native`: its C ABI is what Python calls (through ctypes, on the
/// module's file); the module itself tells what the library was built with.
#[cfg(feature = "python")]
#[pyo3::pymodule]
#[pyo3(name = "_native")]
mod native {
    /// Whether this build hashes on a GPU (`cuda` feature) or only packs records.
    #[pymodule_export]
    const HASHES_ON_GPU: bool = cfg!(feature = "cuda");
    /// The version of the Rust workspace the library was built from.
    #[pymodule_export]
    const VERSION: &str = env!("CARGO_PKG_VERSION");
}
