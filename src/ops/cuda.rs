//! The CUDA launchers of repro's custom ops: the sums in their two modes, the batch-invariant
//! products (f32 and, on tensor cores, bf16) and row sum. Kernels come from `crate::cuda`.

use super::tensor_core::{HOPPER_VARIANTS, TC_TILE, TENSOR_CORE_VARIANTS};
use super::Reductions;
use crate::cuda::kernels::{f32_view, grid, ptx, tensor_core_ptx, MODULE, TENSOR_CORE_MODULE};
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView, DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::CudaDevice;
use candle_core::cuda_backend::WrapErr;
use candle_core::{CudaStorage, Error, Layout, Result, Storage, Tensor};

/// The sum of a contiguous F32 tensor as a one-element device buffer.
fn sum_f32(storage: &CudaStorage, layout: &Layout, mode: Reductions) -> Result<CudaStorage> {
    let dev = storage.device().clone();
    let (x, n) = f32_view(storage, layout, "sum")?;
    let out = match mode {
        Reductions::Atomic => {
            let mut out = dev.alloc_zeros::<f32>(1)?;
            let f = dev.get_or_load_custom_func("sum_f32_atomic", MODULE, ptx()?)?;
            let mut b = f.builder();
            b.arg(&x);
            b.arg(&n);
            b.arg(&mut out);
            unsafe { b.launch(grid(n, 256)) }.w()?;
            out
        }
        _ => {
            // Two passes with a block count fixed by n: the same tree for the same length.
            let blocks = n.div_ceil(4096).clamp(1, 1024);
            let mut partials = dev.alloc_zeros::<f32>(blocks as usize)?;
            let f = dev.get_or_load_custom_func("sum_f32_ordered", MODULE, ptx()?)?;
            let cfg = LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
            let mut b = f.builder();
            b.arg(&x);
            b.arg(&n);
            b.arg(&mut partials);
            unsafe { b.launch(cfg) }.w()?;
            let mut out = dev.alloc_zeros::<f32>(1)?;
            let one = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
            let mut b = f.builder();
            b.arg(&partials);
            b.arg(&blocks);
            b.arg(&mut out);
            unsafe { b.launch(one) }.w()?;
            out
        }
    };
    Ok(CudaStorage::wrap_cuda_slice(out, dev))
}

/// Threads the column-sum kernels aim for: segments of rows are sized so that
/// `segments * cols` is about this many (and a segment never has fewer than 8 rows).
const ROW_SUM_THREADS: u64 = 1 << 16;

/// Rows per segment of the column sums of a `[rows, cols]` matrix: a function of the shape
/// only, so the ordered sum's tree is the same in every run.
fn segment_rows(rows: u64, cols: u64) -> u64 {
    let segments = (ROW_SUM_THREADS / cols.max(1)).clamp(1, rows.div_ceil(8).max(1));
    rows.div_ceil(segments).max(1)
}

/// Column sums of a contiguous F32 `[rows, cols]` matrix, as a new `[cols]` device buffer.
pub fn sum_rows_f32(
    storage: &CudaStorage,
    layout: &Layout,
    rows: usize,
    cols: usize,
    mode: Reductions,
) -> Result<CudaStorage> {
    if cols == 1 {
        // One column: the whole-tensor sum kernels, which spread one sum over the whole GPU.
        return sum_f32(storage, layout, mode);
    }
    let dev = storage.device().clone();
    let (x, _) = f32_view(storage, layout, "sum_rows")?;
    let (rows, cols) = (rows as u64, cols as u64);
    let seg_rows = segment_rows(rows, cols);
    let segments = rows.div_ceil(seg_rows);
    let mut out = dev.alloc_zeros::<f32>(cols as usize)?;
    match mode {
        Reductions::Atomic => {
            let f = dev.get_or_load_custom_func("sum_rows_f32_atomic", MODULE, ptx()?)?;
            let mut b = f.builder();
            b.arg(&x);
            b.arg(&rows);
            b.arg(&cols);
            b.arg(&seg_rows);
            b.arg(&mut out);
            unsafe { b.launch(grid(segments * cols, 256)) }.w()?;
        }
        _ => {
            let f = dev.get_or_load_custom_func("sum_rows_f32_segments", MODULE, ptx()?)?;
            let mut partials = dev.alloc_zeros::<f32>((segments * cols) as usize)?;
            let mut b = f.builder();
            b.arg(&x);
            b.arg(&rows);
            b.arg(&cols);
            b.arg(&seg_rows);
            b.arg(&mut partials);
            unsafe { b.launch(grid(segments * cols, 256)) }.w()?;
            // The partials' column sums, each column's segments added in order by one thread.
            let mut b = f.builder();
            b.arg(&partials);
            b.arg(&segments);
            b.arg(&cols);
            b.arg(&segments);
            b.arg(&mut out);
            unsafe { b.launch(grid(cols, 256)) }.w()?;
        }
    }
    Ok(CudaStorage::wrap_cuda_slice(out, dev))
}

/// A contiguous F32 vector repeated as the `rows` rows of a new device matrix.
pub fn expand_rows_f32(storage: &CudaStorage, layout: &Layout, rows: usize) -> Result<CudaStorage> {
    let dev = storage.device().clone();
    let (value, cols) = f32_view(storage, layout, "expand_rows")?;
    let rows = rows as u64;
    let mut out = unsafe { dev.alloc::<f32>((rows * cols) as usize) }?;
    let f = dev.get_or_load_custom_func("expand_rows_f32", MODULE, ptx()?)?;
    let mut b = f.builder();
    b.arg(&value);
    b.arg(&rows);
    b.arg(&cols);
    b.arg(&mut out);
    unsafe { b.launch(grid(rows * cols, 256)) }.w()?;
    Ok(CudaStorage::wrap_cuda_slice(out, dev))
}

/// The batch-invariant matrix product (`matmul_f32_fixed_*` in kernels/matmul_f32.cu) into a new
/// contiguous `[batch, m, n]` device buffer.
pub(crate) fn matmul_f32_fixed(
    a: &CudaStorage,
    a_layout: &Layout,
    b: &CudaStorage,
    b_layout: &Layout,
    shape: &super::MatmulPlan,
) -> Result<CudaStorage> {
    let dev = a.device().clone();
    let a = a.as_cuda_slice::<f32>()?.slice(a_layout.start_offset()..);
    let b = b.as_cuda_slice::<f32>()?.slice(b_layout.start_offset()..);
    // Every element is written by the kernel.
    let mut out = unsafe { dev.alloc::<f32>(shape.batch * shape.m * shape.n) }?;
    // The largest tiles that still give about every SM (132 on an H100) a block. The tile size
    // changes which thread computes an element, never the order of its sum.
    let tiles_of = |tile: usize| shape.m.div_ceil(tile) * shape.n.div_ceil(tile) * shape.batch;
    let (tile, name) = if tiles_of(128) >= 128 {
        (128, "matmul_f32_fixed_128")
    } else if tiles_of(64) >= 128 {
        (64, "matmul_f32_fixed_64")
    } else {
        (32, "matmul_f32_fixed_32")
    };
    let f = dev.get_or_load_custom_func(name, MODULE, ptx()?)?;
    let tiles = |x: usize| x.div_ceil(tile) as u32;
    let cfg = LaunchConfig {
        grid_dim: (tiles(shape.n), tiles(shape.m), shape.batch as u32),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let dims = [shape.m, shape.n, shape.k].map(|d| d as u64);
    let [a_z, a_m, a_k] = shape.a_strides.map(|s| s as u64);
    let [b_z, b_k, b_n] = shape.b_strides.map(|s| s as u64);
    let mut l = f.builder();
    l.arg(&a);
    l.arg(&b);
    l.arg(&mut out);
    for d in &dims {
        l.arg(d);
    }
    for s in [&a_z, &a_m, &a_k, &b_z, &b_k, &b_n] {
        l.arg(s);
    }
    unsafe { l.launch(cfg) }.w()?;
    Ok(CudaStorage::wrap_cuda_slice(out, dev))
}

/// The names of the tensor-core product's kernels on `dev`: the Hopper kernels on a GPU of
/// compute capability 9.0, else those of kernels/matmul_bf16.cu. A product takes one of them;
/// every one must give the same bits (gpu-check).
pub fn matmul_bf16_variants(dev: &candle_core::Device) -> Result<Vec<&'static str>> {
    Ok(if super::hopper::is_hopper(cuda_device(dev)?)? {
        HOPPER_VARIANTS.iter().map(|k| k.name).collect()
    } else {
        TENSOR_CORE_VARIANTS.iter().map(|&(name, _)| name).collect()
    })
}

/// The kernel of `matmul_bf16_variants` a product of `m` x `n` outputs takes on `dev`.
pub fn matmul_bf16_chosen(dev: &candle_core::Device, m: usize, n: usize) -> Result<&'static str> {
    let hopper = super::hopper::kernel_for(cuda_device(dev)?, 1, m, n)?;
    Ok(hopper.map_or(TENSOR_CORE_VARIANTS[0].0, |k| k.name))
}

fn cuda_device(dev: &candle_core::Device) -> Result<&CudaDevice> {
    match dev {
        candle_core::Device::Cuda(cuda) => Ok(cuda),
        _ => Err(Error::Msg("the tensor-core product's kernels run on CUDA devices".into())),
    }
}

/// `a @ wt` for 2-d bf16 `a` `[M, K]` and `wt` `[K, N]` with K contiguous in both (a linear
/// layer's transposed weight), by kernel `variant` of `matmul_bf16_variants`: for gpu-check's
/// comparison of the kernels' bits.
pub fn matmul_bf16_variant(a: &Tensor, wt: &Tensor, variant: usize) -> Result<Tensor> {
    let (m, k) = a.dims2()?;
    let (_, n) = wt.dims2()?;
    let plan = super::MatmulPlan {
        batch: 1,
        m,
        n,
        k,
        a_strides: [0, a.stride()[0], a.stride()[1]],
        b_strides: [0, wt.stride()[0], wt.stride()[1]],
    };
    let (sa, la) = a.storage_and_layout();
    let (sb, lb) = wt.storage_and_layout();
    let (Storage::Cuda(sa), Storage::Cuda(sb)) = (&*sa, &*sb) else {
        return Err(Error::Msg("matmul_bf16_variant needs CUDA tensors".into()));
    };
    let out = matmul_bf16_fixed(sa, la, sb, lb, &plan, Some(variant))?;
    Ok(Tensor::from_storage(Storage::Cuda(out), (m, n), candle_core::op::BackpropOp::none(), false))
}

/// The batch-invariant bf16 product on tensor cores (`matmul_bf16_fixed`) into a new
/// contiguous `[batch, m, n]` device buffer. Both operands must have K contiguous (a_k and
/// b_k of 1), K a multiple of 8, and every row 16-byte aligned: `ops::invariant::matmul`
/// prepares them so. `variant` indexes `matmul_bf16_variants`; None for products: on Hopper the
/// kernel whose tiles suit the problem, else the first.
pub(crate) fn matmul_bf16_fixed(
    a: &CudaStorage,
    a_layout: &Layout,
    b: &CudaStorage,
    b_layout: &Layout,
    shape: &super::MatmulPlan,
    variant: Option<usize>,
) -> Result<CudaStorage> {
    let [a_z, a_m, a_k] = shape.a_strides;
    let [b_z, b_k, b_n] = shape.b_strides;
    let aligned = |x: usize| x.is_multiple_of(8);
    if a_k != 1
        || b_k != 1
        || !aligned(shape.k)
        || ![a_z, a_m, b_z, b_n, a_layout.start_offset(), b_layout.start_offset()].into_iter().all(aligned)
    {
        return Err(Error::Msg(format!(
            "the tensor-core matmul needs K contiguous, a multiple of 8, and 16-byte aligned rows; got K {} and strides {:?}, {:?}",
            shape.k, shape.a_strides, shape.b_strides
        )));
    }
    let dev = a.device().clone();
    let a = a.as_cuda_slice::<half::bf16>()?.slice(a_layout.start_offset()..);
    let b = b.as_cuda_slice::<half::bf16>()?.slice(b_layout.start_offset()..);
    if let Some(chosen) = super::hopper::kernel_for(&dev, shape.batch, shape.m, shape.n)? {
        let kernel = variant.map_or(chosen, |v| &HOPPER_VARIANTS[v]);
        let out = super::hopper::matmul(&dev, &a, &b, shape, kernel)?;
        return Ok(CudaStorage::wrap_cuda_slice(out, dev));
    }
    let (kernel, shared_bytes) = TENSOR_CORE_VARIANTS[variant.unwrap_or(0)];
    // Every element is written by the kernel.
    let mut out = unsafe { dev.alloc::<half::bf16>(shape.batch * shape.m * shape.n) }?;
    let func = dev.get_or_load_custom_func(kernel, TENSOR_CORE_MODULE, tensor_core_ptx()?)?;
    let stream = dev.cuda_stream();
    let func = func.into_cuda_function();
    func.set_attribute(
        candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        shared_bytes as i32,
    )
    .w()?;
    let tiles = |x: usize| x.div_ceil(TC_TILE) as u32;
    let cfg = LaunchConfig {
        grid_dim: (tiles(shape.n), tiles(shape.m), shape.batch as u32),
        block_dim: (256, 1, 1),
        shared_mem_bytes: shared_bytes as u32,
    };
    let args = [shape.m, shape.n, shape.k, a_z, a_m, b_z, b_n].map(|d| d as u64);
    let mut l = stream.launch_builder(&func);
    l.arg(&a);
    l.arg(&b);
    l.arg(&mut out);
    for d in &args {
        l.arg(d);
    }
    unsafe { l.launch(cfg) }.w()?;
    Ok(CudaStorage::wrap_cuda_slice(out, dev))
}

/// The softmax over the last dimension of a contiguous F32 or BF16 `[rows, cols]` matrix, each
/// row by one warp in one kernel (`softmax_last_*_fixed`: the bits of `invariant`'s unfused
/// softmax), as a new buffer of its dtype.
pub fn softmax_last_fixed(storage: &CudaStorage, layout: &Layout, rows: usize, cols: usize) -> Result<CudaStorage> {
    match storage.dtype() {
        candle_core::DType::F32 => softmax_rows::<f32>(storage, layout, rows, cols, "softmax_last_f32_fixed"),
        candle_core::DType::BF16 => softmax_rows::<half::bf16>(storage, layout, rows, cols, "softmax_last_bf16_fixed"),
        other => Err(Error::Msg(format!("the fixed softmax takes F32 or BF16, got {other:?}"))),
    }
}

fn softmax_rows<T: candle_core::cuda_backend::CudaDType + DeviceRepr>(
    storage: &CudaStorage,
    layout: &Layout,
    rows: usize,
    cols: usize,
    kernel: &str,
) -> Result<CudaStorage> {
    let (start, end) =
        layout.contiguous_offsets().ok_or_else(|| Error::Msg("the fixed softmax needs a contiguous input".into()))?;
    let x = storage.as_cuda_slice::<T>()?.slice(start..end);
    let out = warp_per_row::<T, T>(storage.device(), kernel, &x, rows, cols, rows * cols)?;
    Ok(CudaStorage::wrap_cuda_slice(out, storage.device().clone()))
}

/// Launches `kernel(x, rows, cols, out)`, one warp (32 threads) a row of the `[rows, cols]`
/// matrix `x`, into a new buffer of `out_len` elements, which the kernel writes whole.
fn warp_per_row<T: DeviceRepr, O: DeviceRepr>(
    dev: &CudaDevice,
    kernel: &str,
    x: &CudaView<'_, T>,
    rows: usize,
    cols: usize,
    out_len: usize,
) -> Result<CudaSlice<O>> {
    // Every element is written by the kernel.
    let mut out = unsafe { dev.alloc::<O>(out_len) }?;
    let f = dev.get_or_load_custom_func(kernel, MODULE, ptx()?)?;
    let (rows, cols) = (rows as u64, cols as u64);
    let mut b = f.builder();
    b.arg(x);
    b.arg(&rows);
    b.arg(&cols);
    b.arg(&mut out);
    unsafe { b.launch(grid(rows * 32, 256)) }.w()?;
    Ok(out)
}

/// Row sums of a contiguous F32 `[rows, cols]` matrix, each row by one warp in an order fixed
/// by its columns (`sum_last_f32_fixed`), as a new `[rows]` device buffer.
pub fn sum_last_f32_fixed(storage: &CudaStorage, layout: &Layout, rows: usize, cols: usize) -> Result<CudaStorage> {
    let (x, _) = f32_view(storage, layout, "sum_last")?;
    let out = warp_per_row::<f32, f32>(storage.device(), "sum_last_f32_fixed", &x, rows, cols, rows)?;
    Ok(CudaStorage::wrap_cuda_slice(out, storage.device().clone()))
}
