//! Page-locked host buffers, pooled (`buffer_pool`), for copies that never wait for the device
//! to drain, and the pool entries of device buffers.

use super::buffer_pool::{size_class, Buffer, BufferPool};
use candle_core::cuda_backend::cudarc::driver::{
    CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, PinnedHostSlice,
};
use candle_core::cuda_backend::{CudaDevice, DeviceId, WrapErr};
use candle_core::Result;

/// A page-locked host buffer with its address, read and written without the driver calls
/// (an event's wait, and the event's record after each copy) that cudarc's accessors make,
/// since the recorder orders its copies itself, with `PendingRead`'s event.
pub(crate) struct Pinned<T> {
    buffer: PinnedHostSlice<T>,
    address: *mut T,
}

// SAFETY: the address points into `buffer`, which is `Send`, and is used only through `&self`
// (reads) and `&mut self` (writes and copies), as the buffer would be.
unsafe impl<T: Send> Send for Pinned<T> {}

/// A page-locked buffer of at least `len` elements (its size class) from `pool`, or a new one.
pub(crate) fn take_pinned<T>(pool: &BufferPool<DeviceId, Pinned<T>>, dev: &CudaDevice, len: usize) -> Result<Pinned<T>>
where
    T: candle_core::cuda_backend::cudarc::driver::DeviceRepr
        + candle_core::cuda_backend::cudarc::driver::ValidAsZeroBits,
{
    // Rounded up to its size class: a PyTorch program's flushes differ in size from one module
    // to the next, and a page-locked allocation, and above all its release (which waits for
    // the whole device), costs far more than the copy it serves.
    let len = size_class(len);
    // SAFETY: every element is written (by a copy, or by the host) before anything reads it.
    pool.take(&dev.id(), len, || {
        Pinned::new(unsafe { dev.cuda_stream().context().alloc_pinned_with_flags::<T>(len, 0) }.w()?)
    })
}

impl<T> Buffer for Pinned<T> {
    fn len(&self) -> usize {
        self.buffer.len()
    }
    fn bytes(&self) -> usize {
        self.buffer.num_bytes()
    }
}

impl Buffer for CudaSlice<u8> {
    fn len(&self) -> usize {
        CudaSlice::len(self)
    }
    fn bytes(&self) -> usize {
        CudaSlice::len(self)
    }
}

impl<
        T: candle_core::cuda_backend::cudarc::driver::DeviceRepr
            + candle_core::cuda_backend::cudarc::driver::ValidAsZeroBits,
    > Pinned<T>
{
    pub(crate) fn new(mut buffer: PinnedHostSlice<T>) -> Result<Self> {
        // Synchronizes the buffer's event, which nothing has recorded: returns at once.
        let address = buffer.as_mut_ptr().w()?;
        Ok(Pinned { buffer, address })
    }

    /// The elements; valid once every copy into the buffer has landed.
    pub(crate) fn as_slice(&self) -> &[T] {
        // SAFETY: the buffer holds `len` elements at `address` for as long as it lives.
        unsafe { std::slice::from_raw_parts(self.address, self.buffer.len()) }
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [T] {
        // SAFETY: as in `as_slice`, borrowed mutably.
        unsafe { std::slice::from_raw_parts_mut(self.address, self.buffer.len()) }
    }

    /// Queues the copy of the buffer to `dst` (as long as the buffer) on `stream`.
    ///
    /// # Safety
    /// The buffer must stay alive and unchanged until the copy has run.
    pub(crate) unsafe fn upload(&self, dst: &mut CudaViewMut<'_, T>, stream: &CudaStream) -> Result<()> {
        use candle_core::cuda_backend::cudarc::driver::{result, DevicePtrMut};
        let (address, _sync) = dst.device_ptr_mut(stream);
        unsafe { result::memcpy_htod_async(address, self.as_slice(), stream.cu_stream()) }.w()
    }

    /// Queues the copy of `src` (at most as long as the buffer) into the buffer's first
    /// elements on `stream`.
    ///
    /// # Safety
    /// The buffer must stay alive, and unread, until the copy has landed.
    pub(crate) unsafe fn download(&mut self, src: &CudaView<'_, T>, stream: &CudaStream) -> Result<()> {
        use candle_core::cuda_backend::cudarc::driver::result;
        let (address, _sync) = src.device_ptr(stream);
        let stream = stream.cu_stream();
        let Some(into) = self.as_mut_slice().get_mut(..src.len()) else {
            return Err(candle_core::Error::Msg(format!(
                "{} elements do not fit a buffer of {}",
                src.len(),
                self.len()
            )));
        };
        unsafe { result::memcpy_dtoh_async(into, address, stream) }.w()
    }
}
