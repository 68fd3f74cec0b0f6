//! Reading a candle tensor's elements as canonical bytes (contiguous, row-major,
//! little-endian), without copying when the tensor already lives contiguously on the CPU.

use super::error::RecordError;
use super::payload_stream::PayloadStream;
use crate::dtype::DType;
use candle_core::{CpuStorage, Device, Storage, Tensor};
use std::sync::Arc;

#[cfg(target_endian = "big")]
compile_error!("repro's canonical encoding is little-endian; big-endian hosts are not supported");

/// The trace dtype of a candle dtype.
pub fn trace_dtype(dtype: candle_core::DType) -> Result<DType, RecordError> {
    use candle_core::DType as C;
    Ok(match dtype {
        C::U8 => DType::U8,
        C::U32 => DType::U32,
        C::I16 => DType::I16,
        C::I32 => DType::I32,
        C::I64 => DType::I64,
        C::F16 => DType::F16,
        C::BF16 => DType::BF16,
        C::F32 => DType::F32,
        C::F64 => DType::F64,
        other => return Err(RecordError::Unsupported(format!("cannot record tensors of dtype {other:?}"))),
    })
}

/// What a tensor on a GPU resolves to at the end of a step (see `DeviceQueue`).
// Only CUDA builds queue anything.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub enum DeviceResult {
    /// Its canonical bytes.
    Bytes(Vec<u8>),
    /// BLAKE3 of its canonical bytes, computed on the device.
    DataHash([u8; 32]),
    /// Its canonical bytes went to the step's payload file, at these bytes of its data
    /// (`payload_stream`), which also has their hash.
    InFile(std::ops::Range<u64>),
}

/// Tensors of one step that live on a GPU, queued so that they are hashed on the device in a
/// few batched launches and their hashes (and the values that must be stored) reach the host
/// together at the end of the step. On CPU-only builds, and for CPU tensors, nothing is queued.
pub struct DeviceQueue {
    /// The step the tensors belong to, named in errors.
    step: u64,
    /// Where the values the step stores go as they are read back (see `payload_stream`).
    #[cfg(feature = "cuda")]
    stream: Option<Arc<PayloadStream>>,
    #[cfg(feature = "cuda")]
    batch: Option<crate::record::device::DeviceBatch>,
}

impl DeviceQueue {
    /// An empty queue for `step`'s tensors, whose stored values go to `stream` as they are read
    /// back, if there is one.
    pub fn new(step: u64, stream: Option<Arc<PayloadStream>>) -> Self {
        #[cfg(not(feature = "cuda"))]
        let _ = stream;
        DeviceQueue {
            step,
            #[cfg(feature = "cuda")]
            stream,
            #[cfg(feature = "cuda")]
            batch: None,
        }
    }

    /// The step the queue's tensors belong to.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// Gets `device` ready to hash: on a GPU, compiles and loads the hashing kernels (tens of
    /// milliseconds, seconds on a machine whose driver has not compiled them before), so that
    /// a recorder pays for it when it is created rather than in its first step; any
    /// compilation error is reported here. Nothing to do on the CPU.
    pub fn prepare(device: &Device) -> Result<(), RecordError> {
        #[cfg(feature = "cuda")]
        if let Device::Cuda(dev) = device {
            crate::record::device::prepare(dev)?;
        }
        let _ = device;
        Ok(())
    }

    /// Queues `tensor` if it lives on a GPU: its data hash when `hash` (values not needed),
    /// otherwise its bytes; with `snapshot`, a device copy of it taken now (for a tensor that
    /// changes in place before the queue is flushed). Returns a ticket for `resolve`, or `None`
    /// for a CPU tensor.
    pub fn push(&mut self, tensor: &Tensor, hash: bool, snapshot: bool) -> Result<Option<usize>, RecordError> {
        #[cfg(feature = "cuda")]
        if let Device::Cuda(dev) = tensor.device() {
            let stream = &self.stream;
            let batch = self.batch.get_or_insert_with(|| {
                crate::record::device::DeviceBatch::new(dev.clone()).streaming_to(stream.clone())
            });
            if batch.device().id() != dev.id() {
                return Err(RecordError::Unsupported(
                    "recording tensors of one step from several GPUs is not supported yet".into(),
                ));
            }
            return batch.push(tensor, hash, snapshot).map(Some).map_err(failed_at(self.step));
        }
        let _ = (tensor, hash, snapshot);
        Ok(None)
    }

    /// Reads everything queued so far on the device (launches the hashing and copy kernels);
    /// the results stay there until `resolve`.
    pub fn flush(&mut self) -> Result<(), RecordError> {
        #[cfg(feature = "cuda")]
        if let Some(batch) = self.batch.as_mut() {
            let flushed = super::profile::time(super::profile::Phase::Launch, || batch.flush());
            flushed.map_err(failed_at(self.step))?;
        }
        Ok(())
    }

    /// Takes over `other`'s device work (on the same GPU), placed after what was read here and
    /// before what is still queued. Returns the tickets `other`'s results have here: they
    /// begin at the first ticket of the tensors still queued here, whose tickets move up by as
    /// many.
    pub fn absorb(&mut self, other: DeviceQueue) -> Result<std::ops::Range<usize>, RecordError> {
        #[cfg(feature = "cuda")]
        if let Some(mut theirs) = other.batch {
            let Some(mine) = self.batch.as_mut() else {
                // Nothing of this step is on a GPU yet: its tickets are the other's.
                theirs.flush().map_err(failed_at(self.step))?;
                let tickets = theirs.tickets();
                self.batch = Some(theirs);
                return Ok(0..tickets);
            };
            if mine.device().id() != theirs.device().id() {
                return Err(RecordError::Unsupported(
                    "recording tensors of one step from several GPUs is not supported yet".into(),
                ));
            }
            let absorbed = super::profile::time(super::profile::Phase::Launch, || mine.absorb(theirs));
            return absorbed.map_err(failed_at(self.step));
        }
        let _ = other;
        Ok(0..0)
    }

    /// Plans the device reads of everything queued so far, on the host, without a driver call
    /// (see `record::device::DeviceBatch::plan`): the recorder's worker thread does this for a
    /// captured graph, and the training thread launches the plan when it takes the graph's
    /// records over.
    pub fn plan(&mut self) -> Result<(), RecordError> {
        #[cfg(feature = "cuda")]
        if let Some(batch) = self.batch.as_mut() {
            let planned = super::profile::time(super::profile::Phase::Plan, || batch.plan());
            planned.map_err(failed_at(self.step))?;
        }
        Ok(())
    }

    /// Launches what is still queued and starts bringing every result to the host, without
    /// waiting for it (see `DeviceRead`).
    pub fn start_read(self) -> Result<DeviceRead, RecordError> {
        #[cfg(feature = "cuda")]
        if let Some(batch) = self.batch {
            let read = super::profile::time(super::profile::Phase::Launch, || batch.start_read());
            let read = read.map_err(failed_at(self.step))?;
            return Ok(DeviceRead { step: self.step, read: Some(read) });
        }
        Ok(DeviceRead::default())
    }
}

/// A step's GPU results on their way to the host: the copy runs behind the step's kernels, so
/// the host can queue the next step before it waits for them.
#[derive(Default)]
pub struct DeviceRead {
    /// The step, named in errors.
    #[cfg(feature = "cuda")]
    step: u64,
    #[cfg(feature = "cuda")]
    read: Option<crate::record::device::PendingRead>,
}

impl DeviceRead {
    /// Whether results are on their way from a GPU (otherwise `wait` returns at once).
    pub fn is_pending(&self) -> bool {
        #[cfg(feature = "cuda")]
        return self.read.is_some();
        #[cfg(not(feature = "cuda"))]
        false
    }

    /// Waits for the results (for the step's work, not for anything queued after it). A
    /// driver call, for the thread that trains; what it returns is read on any thread.
    pub fn wait(self) -> Result<DeviceResults, RecordError> {
        #[cfg(feature = "cuda")]
        if let Some(read) = self.read {
            let landed = read.wait().map_err(failed_at(self.step))?;
            return Ok(DeviceResults { landed: Some(landed) });
        }
        Ok(DeviceResults::default())
    }
}

/// A step's GPU results, arrived in host memory.
#[derive(Default)]
pub struct DeviceResults {
    #[cfg(feature = "cuda")]
    landed: Option<crate::record::device::LandedRead>,
}

impl DeviceResults {
    /// The results, in ticket order.
    pub fn into_results(self) -> Vec<DeviceResult> {
        #[cfg(feature = "cuda")]
        if let Some(landed) = self.landed {
            use crate::record::device::Resolved;
            return landed
                .results()
                .into_iter()
                .map(|r| match r {
                    Resolved::Bytes(b) => DeviceResult::Bytes(b),
                    Resolved::DataHash(h) => DeviceResult::DataHash(h),
                    Resolved::InFile(data) => DeviceResult::InFile(data),
                })
                .collect();
        }
        Vec::new()
    }
}

/// A failed device call of `step`'s recording, as the error that says so.
#[cfg(feature = "cuda")]
fn failed_at(step: u64) -> impl FnOnce(candle_core::Error) -> RecordError {
    move |source| RecordError::Device { step, source }
}

/// Calls `f` with the tensor's canonical element bytes.
pub fn with_canonical_bytes<R>(tensor: &Tensor, f: impl FnOnce(&[u8]) -> R) -> Result<R, RecordError> {
    trace_dtype(tensor.dtype())?;
    {
        let (storage, layout) = tensor.storage_and_layout();
        if let (Storage::Cpu(cpu), Some((start, end))) = (&*storage, layout.contiguous_offsets()) {
            if let Some(bytes) = cpu_bytes(cpu, start, end) {
                return Ok(f(bytes));
            }
        }
    }
    // Not contiguous, or not on the CPU: make a contiguous host copy first.
    let host = tensor.to_device(&Device::Cpu)?.contiguous()?;
    let (storage, layout) = host.storage_and_layout();
    match (&*storage, layout.contiguous_offsets()) {
        (Storage::Cpu(cpu), Some((start, end))) => cpu_bytes(cpu, start, end)
            .map(f)
            .ok_or_else(|| RecordError::Unsupported(format!("cannot read tensors of dtype {:?}", tensor.dtype()))),
        _ => Err(RecordError::Unsupported("tensor did not arrive contiguously on the host".into())),
    }
}

fn cpu_bytes(cpu: &CpuStorage, start: usize, end: usize) -> Option<&[u8]> {
    Some(match cpu {
        CpuStorage::U8(v) => &v[start..end],
        CpuStorage::U32(v) => bytemuck::cast_slice(&v[start..end]),
        CpuStorage::I16(v) => bytemuck::cast_slice(&v[start..end]),
        CpuStorage::I32(v) => bytemuck::cast_slice(&v[start..end]),
        CpuStorage::I64(v) => bytemuck::cast_slice(&v[start..end]),
        CpuStorage::F16(v) => bytemuck::cast_slice(&v[start..end]),
        CpuStorage::BF16(v) => bytemuck::cast_slice(&v[start..end]),
        CpuStorage::F32(v) => bytemuck::cast_slice(&v[start..end]),
        CpuStorage::F64(v) => bytemuck::cast_slice(&v[start..end]),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transposed_view_gives_row_major_bytes() {
        let t = Tensor::new(&[[1f32, 2.0], [3.0, 4.0]], &Device::Cpu).unwrap();
        let tt = t.t().unwrap();
        let bytes = with_canonical_bytes(&tt, |b| b.to_vec()).unwrap();
        let values: Vec<f32> = bytes.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
        assert_eq!(values, vec![1.0, 3.0, 2.0, 4.0]);
    }

    #[test]
    fn narrowed_view_reads_only_its_window() {
        let t = Tensor::arange(0u32, 10, &Device::Cpu).unwrap().narrow(0, 3, 4).unwrap();
        let bytes = with_canonical_bytes(&t, |b| b.to_vec()).unwrap();
        let values: Vec<u32> = bytes.chunks(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
        assert_eq!(values, vec![3, 4, 5, 6]);
    }
}
