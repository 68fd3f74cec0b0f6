//! The CUDA plumbing that repro's GPU features share: compiling and loading the kernels of
//! `kernels/` (`kernels`), pools of device and page-locked buffers that keep their allocations
//! between steps (`buffer_pool`, `pinned`), and CUDA's memory pool, which candle allocates from
//! (`memory`). The custom ops (`ops`) and the recorder's device hashing (`record::device`) are
//! built on it.

#[cfg(any(feature = "cuda", test))]
pub(crate) mod buffer_pool;
#[cfg(feature = "cuda")]
pub(crate) mod kernels;
#[cfg(feature = "cuda")]
pub(crate) mod memory;
#[cfg(feature = "cuda")]
pub(crate) mod pinned;

#[cfg(feature = "cuda")]
pub use kernels::read_all;
#[cfg(feature = "cuda")]
pub use memory::{keep_freed_memory, take_peak_memory};
