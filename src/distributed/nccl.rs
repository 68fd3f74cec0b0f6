//! The NCCL collective (feature `nccl`): sums on the GPUs with `ncclAllReduce`, through the NCCL
//! bindings of cudarc that candle's `nccl` feature turns on, on candle's own stream so the sum is
//! ordered with the kernels around it. Rank 0 makes NCCL's unique id and writes it to the
//! rendezvous directory; the other ranks read it there.

use super::Collective;
use crate::record::RecordError;
use crate::trace::Distributed;
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::nccl::{result, Comm, Id, ReduceOp};
use candle_core::{CudaStorage, DType, Device, Layout, Shape, Tensor};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A new NCCL unique id, as the bytes rank 0 shares with the others.
pub fn new_id() -> Result<Vec<u8>, RecordError> {
    let id = Id::new().map_err(|e| nccl_error(0, "unique id", e))?;
    Ok(id.internal().iter().map(|&c| c as u8).collect())
}

/// A rank of an NCCL communicator on one CUDA device.
pub struct NcclCollective {
    comm: Arc<SharedComm>,
    rank: usize,
    world_size: usize,
    version: String,
}

/// NCCL's communicator, shared with the op that runs the sum. A rank drives it from one thread,
/// in program order, which is what NCCL asks.
struct SharedComm(Comm);
// SAFETY: the communicator is only used from the training thread (see above); the op holding it
// must be `Send + Sync` for candle, not because it is used concurrently.
unsafe impl Send for SharedComm {}
unsafe impl Sync for SharedComm {}

fn nccl_error(rank: usize, what: &str, e: impl std::fmt::Debug) -> RecordError {
    RecordError::Collective(format!("rank {rank}: NCCL {what} failed: {e:?}"))
}

impl NcclCollective {
    /// Joins the communicator of `world_size` ranks as `rank`, on `device` (a CUDA device),
    /// rank 0 sharing the unique id through the `rendezvous` directory.
    /// A rank other than 0 waits at most `timeout` for the id.
    pub fn join(
        device: &Device,
        rendezvous: &Path,
        rank: usize,
        world_size: usize,
        timeout: Duration,
    ) -> Result<Self, RecordError> {
        let id_path = rendezvous.join("nccl-id");
        let bytes = if rank == 0 {
            let bytes = new_id()?;
            let tmp = id_path.with_extension("tmp");
            std::fs::write(&tmp, &bytes)
                .and_then(|()| std::fs::rename(&tmp, &id_path))
                .map_err(|e| RecordError::Collective(format!("rank 0: cannot write {}: {e}", id_path.display())))?;
            bytes
        } else {
            let started = Instant::now();
            loop {
                match std::fs::read(&id_path) {
                    Ok(bytes) => break bytes,
                    Err(_) if started.elapsed() < timeout => std::thread::sleep(Duration::from_millis(5)),
                    Err(e) => {
                        return Err(RecordError::Collective(format!(
                            "rank {rank}: no NCCL id from rank 0 in {} after {} s: {e}",
                            id_path.display(),
                            timeout.as_secs()
                        )))
                    }
                }
            }
        };
        Self::with_id(device, rank, world_size, &bytes)
    }

    /// Joins the communicator of `world_size` ranks as `rank`, on `device` (a CUDA device), with
    /// the unique id rank 0 made (`new_id`) and shared.
    pub fn with_id(device: &Device, rank: usize, world_size: usize, id: &[u8]) -> Result<Self, RecordError> {
        let Device::Cuda(cuda) = device else {
            return Err(RecordError::Unsupported("NCCL needs a CUDA device".into()));
        };
        let internal: [std::ffi::c_char; 128] = id
            .iter()
            .map(|&b| b as std::ffi::c_char)
            .collect::<Vec<_>>()
            .try_into()
            .map_err(|_| RecordError::Collective(format!("rank {rank}: {} bytes are not an NCCL id", id.len())))?;
        let comm = Comm::from_rank(cuda.cuda_stream(), rank, world_size, Id::uninit(internal))
            .map_err(|e| nccl_error(rank, "communicator setup", e))?;
        let v = result::get_nccl_version().map_err(|e| nccl_error(rank, "version", e))?;
        let version = format!("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100);
        Ok(NcclCollective { comm: Arc::new(SharedComm(comm)), rank, world_size, version })
    }
}

impl Collective for NcclCollective {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn all_reduce_sum(&mut self, tensor: &Tensor) -> Result<Tensor, RecordError> {
        let op = AllReduceSum { comm: self.comm.clone() };
        Ok(tensor.contiguous()?.apply_op1_no_bwd(&op)?)
    }

    fn describe(&self) -> Distributed {
        Distributed {
            rank: self.rank as u64,
            world_size: self.world_size as u64,
            backend: "nccl".into(),
            backend_version: self.version.clone(),
        }
    }
}

/// `ncclAllReduce` with `ncclSum` as a candle op, into a new buffer.
struct AllReduceSum {
    comm: Arc<SharedComm>,
}

impl candle_core::CustomOp1 for AllReduceSum {
    fn name(&self) -> &'static str {
        "nccl-all-reduce-sum"
    }

    fn cpu_fwd(
        &self,
        _: &candle_core::CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<(candle_core::CpuStorage, Shape)> {
        candle_core::bail!("the NCCL sum runs on CUDA devices only")
    }

    fn cuda_fwd(&self, storage: &CudaStorage, layout: &Layout) -> candle_core::Result<(CudaStorage, Shape)> {
        let n = layout.shape().elem_count();
        if layout.contiguous_offsets() != Some((0, n)) {
            candle_core::bail!("the NCCL sum needs a contiguous tensor at offset 0");
        }
        let device = storage.device().clone();
        let comm = &self.comm.0;
        macro_rules! sum {
            ($t:ty) => {{
                let src = storage.as_cuda_slice::<$t>()?;
                // SAFETY: NCCL writes every element before anything reads the buffer.
                let mut dst = unsafe { device.alloc::<$t>(n) }?;
                comm.all_reduce(&src.slice(..n), &mut dst, &ReduceOp::Sum)
                    .map_err(|e| candle_core::Error::Msg(format!("ncclAllReduce failed: {e:?}")))?;
                CudaStorage::wrap_cuda_slice(dst, device)
            }};
        }
        let out = match storage.dtype() {
            DType::F32 => sum!(f32),
            DType::F64 => sum!(f64),
            DType::BF16 => sum!(half::bf16),
            DType::F16 => sum!(half::f16),
            other => candle_core::bail!("the NCCL sum takes float tensors, not {other:?}"),
        };
        Ok((out, layout.shape().clone()))
    }
}
