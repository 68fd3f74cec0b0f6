//! Recording on the GPU: what a step's tensors need of the device, planned on the host
//! (`plan`: views, output slots, which tensors are read whole) and run by the batched hashing
//! kernels (`batch`, with the `cuda` feature).

#[cfg(feature = "cuda")]
mod batch;
#[cfg(any(feature = "cuda", test))]
pub(crate) mod plan;

#[cfg(feature = "cuda")]
pub use batch::{data_hash, prepare, DeviceBatch, ForeignBytes, LandedRead, PendingRead, Resolved};
