//! Recording on the GPU: what a step's tensors need of the device, planned on the host
//! (`plan`: views, output slots, which tensors are read whole), queued with the tickets of
//! their results (`queue`), and run by the batched hashing kernels (`batch`, with the `cuda`
//! feature); the leaf pass of the data hash `xxh3-1k` (`leaves`).

#[cfg(feature = "cuda")]
mod batch;
#[cfg(feature = "cuda")]
mod leaves;
#[cfg(any(feature = "cuda", test))]
pub(crate) mod plan;
#[cfg(any(feature = "cuda", test))]
pub(crate) mod queue;

#[cfg(feature = "cuda")]
pub use batch::{data_hash, prepare, DeviceBatch, ForeignBytes, LandedRead, PendingRead};
#[cfg(feature = "cuda")]
pub use leaves::{launch_leaves, launch_leaves_of, leaf_count, LeafPiece};
#[cfg(feature = "cuda")]
pub use queue::Resolved;
