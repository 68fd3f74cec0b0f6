//! CUDA's stream-ordered memory pool, from which candle allocates every tensor: keeping what it
//! frees between steps, and reading its peak.

use candle_core::cuda_backend::{CudaDevice, WrapErr};
use candle_core::{Error, Result};

/// Makes CUDA's stream-ordered pool of `dev` keep the memory that candle frees, instead of
/// handing it back to the driver. candle allocates every tensor with `cuMemAllocAsync` from
/// the device's default pool, whose release threshold is 0: at every synchronization (a
/// `to_scalar`, an event wait) the pool returns all freed memory, and the next step maps it
/// again, which costs more than a small model's step. With the threshold at its maximum the
/// pool keeps what a step freed for the next one, as PyTorch's caching allocator does; the
/// process's reserved memory then stays at its peak. Once per device and process;
/// `REPRO_CUDA_POOL=release` leaves the pool as CUDA sets it.
pub fn keep_freed_memory(dev: &CudaDevice) -> Result<()> {
    use candle_core::cuda_backend::cudarc::driver::sys;
    static DONE: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());
    // Called for every step's batch: the devices already seen return before anything else.
    let ctx = dev.cuda_stream().context().clone();
    let mut done = DONE.lock().map_err(|_| Error::Msg("memory pool registry poisoned".into()))?;
    if done.contains(&ctx.ordinal()) {
        return Ok(());
    }
    if !ctx.has_async_alloc() || std::env::var("REPRO_CUDA_POOL").is_ok_and(|v| v == "release") {
        done.push(ctx.ordinal());
        return Ok(());
    }
    ctx.bind_to_thread().w()?;
    let mut pool = std::ptr::null_mut();
    let mut threshold = u64::MAX;
    // SAFETY: the pool handle comes from the driver for this context's device and is only
    // passed back to it; the attribute's value is a u64, as CU_MEMPOOL_ATTR_RELEASE_THRESHOLD takes.
    unsafe {
        sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()).result().w()?;
        sys::cuMemPoolSetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold as *mut u64).cast(),
        )
        .result()
        .w()?;
    }
    done.push(ctx.ordinal());
    Ok(())
}

/// The most device memory that tensors and the recorder's buffers (everything allocated from
/// the device's stream-ordered pool, which candle uses) have held at once since the last call,
/// and starts the next such span. One driver call per attribute: call it on the thread that
/// trains, with the device drained.
pub fn take_peak_memory(dev: &CudaDevice) -> Result<u64> {
    use candle_core::cuda_backend::cudarc::driver::sys;
    let ctx = dev.cuda_stream().context().clone();
    ctx.bind_to_thread().w()?;
    let mut pool = std::ptr::null_mut();
    let mut peak = 0u64;
    let mut reset = 0u64;
    // SAFETY: the pool handle comes from the driver for this context's device; both attributes
    // are u64s, and USED_MEM_HIGH may only be set to 0 (which restarts it from what is in use).
    unsafe {
        sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()).result().w()?;
        let high = sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH;
        sys::cuMemPoolGetAttribute(pool, high, (&mut peak as *mut u64).cast()).result().w()?;
        sys::cuMemPoolSetAttribute(pool, high, (&mut reset as *mut u64).cast()).result().w()?;
    }
    Ok(peak)
}
