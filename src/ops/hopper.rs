//! The batch-invariant bf16 product on Hopper GPUs (compute capability 9.0): the launcher of
//! kernels/matmul_bf16_hopper.cu, which reads both operands through TMA tensor maps made here,
//! and its choice of tile (`tensor_core::choose_hopper_kernel`). Every kernel gives the same
//! bits, so the choice, made by the problem's shape for speed, never shows in a result.

use super::tensor_core::{choose_hopper_kernel, HopperKernel, HOPPER_SLICE};
use super::MatmulPlan;
use crate::cuda::kernels::{hopper_ptx, HOPPER_MODULE};
use candle_core::cuda_backend::cudarc::driver::{
    sys, CudaSlice, CudaView, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::{CudaDevice, DeviceId, WrapErr};
use candle_core::{Error, Result};
use std::sync::Mutex;

/// What the launcher asks of a device, once: whether it runs the Hopper kernels (compute
/// capability 9.0: H100, H200) and its number of SMs.
#[derive(Clone, Copy)]
struct DeviceFacts {
    hopper: bool,
    sms: usize,
}

fn facts(dev: &CudaDevice) -> Result<DeviceFacts> {
    static KNOWN: Mutex<Vec<(DeviceId, DeviceFacts)>> = Mutex::new(Vec::new());
    let id = dev.id();
    let mut known = KNOWN.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&(_, facts)) = known.iter().find(|(d, _)| *d == id) {
        return Ok(facts);
    }
    let context = dev.cuda_stream().context().clone();
    let capability = context.compute_capability().w()?;
    let sms = context.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT).w()? as usize;
    let facts = DeviceFacts { hopper: capability == (9, 0), sms };
    known.push((id, facts));
    Ok(facts)
}

/// Whether `dev` runs the Hopper kernels (compute capability 9.0: H100, H200).
pub(crate) fn is_hopper(dev: &CudaDevice) -> Result<bool> {
    Ok(facts(dev)?.hopper)
}

/// The kernel a product of `batch` x `m` x `n` outputs takes on `dev`
/// (`tensor_core::choose_hopper_kernel`); None where `dev` does not run the Hopper kernels.
pub(crate) fn kernel_for(dev: &CudaDevice, batch: usize, m: usize, n: usize) -> Result<Option<&'static HopperKernel>> {
    let facts = facts(dev)?;
    Ok(facts.hopper.then(|| choose_hopper_kernel(facts.sms, batch, m, n)))
}

/// A TMA tensor map, as the kernels take it by value (the driver's `CUtensorMap`: 128 bytes,
/// 64-byte aligned).
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct TensorMap([u64; 16]);

// SAFETY: plain bytes, laid out as the kernel's `TensorMap` parameter.
unsafe impl DeviceRepr for TensorMap {}

/// The tensor map of a bf16 operand read as `[batch, rows, k]` with k contiguous, from
/// `address` with these element strides, in boxes of `HOPPER_SLICE` x `box_rows` (128-byte
/// swizzled, as wgmma reads them); past the end, zeros.
fn tensor_map(
    address: u64,
    k: usize,
    rows: usize,
    batch: usize,
    row_stride: usize,
    batch_stride: usize,
    box_rows: usize,
) -> Result<TensorMap> {
    // A dimension of one is never stepped over: any stride the unit accepts does.
    let row_stride = if rows == 1 { k.next_multiple_of(8) } else { row_stride };
    let batch_stride = if batch == 1 { rows * row_stride } else { batch_stride };
    let dims = [k as u64, rows as u64, batch as u64];
    let strides = [2 * row_stride as u64, 2 * batch_stride as u64];
    let boxes = [HOPPER_SLICE as u32, box_rows as u32, 1];
    let steps = [1u32; 3];
    let mut map = std::mem::MaybeUninit::<sys::CUtensorMap>::uninit();
    // SAFETY: every array is as long as the rank (3; strides one shorter), and the map is written
    // by the call before it is read.
    let status = unsafe {
        sys::cuTensorMapEncodeTiled(
            map.as_mut_ptr(),
            sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            3,
            address as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            steps.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    if status != sys::CUresult::CUDA_SUCCESS {
        return Err(Error::Msg(format!(
            "the Hopper product could not describe an operand of {batch} x {rows} x {k} bf16 (element strides {batch_stride}, \
             {row_stride}) to the TMA unit: {status:?}"
        )));
    }
    // SAFETY: written by the successful call above.
    let map = unsafe { map.assume_init() };
    Ok(TensorMap(map.opaque))
}

/// `c[z] = a[z] @ b[z]` into a new contiguous `[batch, m, n]` buffer, by `kernel`; the operands
/// as `tensor_core::matmul_bf16_fixed` takes them (K contiguous, a multiple of 8, rows 16-byte
/// aligned), already sliced to their first element.
pub(crate) fn matmul(
    dev: &CudaDevice,
    a: &CudaView<'_, half::bf16>,
    b: &CudaView<'_, half::bf16>,
    shape: &MatmulPlan,
    kernel: &HopperKernel,
) -> Result<CudaSlice<half::bf16>> {
    let elements = shape.batch * shape.m * shape.n;
    if shape.k == 0 || elements == 0 {
        return dev.alloc_zeros::<half::bf16>(elements);
    }
    let [a_z, a_m, _] = shape.a_strides;
    let [b_z, _, b_n] = shape.b_strides;
    let stream = dev.cuda_stream();
    let (a_address, b_address) = (a.device_ptr(&stream).0, b.device_ptr(&stream).0);
    let b_batch = if b_z == 0 { 1 } else { shape.batch };
    let a_map = tensor_map(a_address, shape.k, shape.m, shape.batch, a_m, a_z, kernel.rows)?;
    let b_map = tensor_map(b_address, shape.k, shape.n, b_batch, b_n, b_z, kernel.cols)?;
    // Every element is written by the kernel.
    let mut out = unsafe { dev.alloc::<half::bf16>(elements) }?;
    let func = dev.get_or_load_custom_func(kernel.name, HOPPER_MODULE, hopper_ptx()?)?.into_cuda_function();
    // Once per kernel and device: more shared memory than a launch gets by default.
    static ALLOWED: Mutex<Vec<(DeviceId, &str)>> = Mutex::new(Vec::new());
    let mut allowed = ALLOWED.lock().unwrap_or_else(|e| e.into_inner());
    if !allowed.contains(&(dev.id(), kernel.name)) {
        func.set_attribute(
            sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            kernel.shared_bytes as i32,
        )
        .w()?;
        allowed.push((dev.id(), kernel.name));
    }
    drop(allowed);
    let cfg = LaunchConfig {
        grid_dim: (shape.n.div_ceil(kernel.cols) as u32, shape.m.div_ceil(kernel.rows) as u32, shape.batch as u32),
        block_dim: (kernel.threads as u32, 1, 1),
        shared_mem_bytes: kernel.shared_bytes as u32,
    };
    let (m, n, k) = (shape.m as u64, shape.n as u64, shape.k as u64);
    let b_batched = i32::from(b_z != 0);
    let mut l = stream.launch_builder(&func);
    l.arg(&a_map);
    l.arg(&b_map);
    l.arg(&mut out);
    l.arg(&m);
    l.arg(&n);
    l.arg(&k);
    l.arg(&b_batched);
    // SAFETY: the maps describe memory of `a` and `b`, alive and unchanged until the kernel is
    // done (candle's stream orders their reuse after it), and `out` holds batch x m x n.
    unsafe { l.launch(cfg) }.w()?;
    Ok(out)
}
