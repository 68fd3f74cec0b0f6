//! Batch-invariant ops: a matrix product and a row sum whose every output element is summed in
//! an order fixed by the reduction index alone, so that a row's result depends on that row's
//! values only: not on how many other rows share the batch, not on where the row sits, not on
//! zeros appended to it (a padded softmax row, a KV cache shorter than the prompt). The
//! product gives each element one thread that adds k = 0, 1, ..., K-1 in order; the row sum
//! adds left to right on the CPU, and on the GPU gives column c to lane c mod 32 of a warp,
//! then combines the lanes in a fixed tree. Default kernels choose their split of the
//! reduction by problem size (cuBLAS's split-K, a block reduction sized by the row), which is
//! what makes a sequence's logits depend on its batch.
//!
//! F32 and BF16, CPU and CUDA, with backward passes made of the same ops (so gradients are
//! batch-invariant too). BF16 products run on the GPU's tensor cores (kernels/matmul_bf16.cu;
//! on Hopper kernels/matmul_bf16_hopper.cu): f32 accumulators take the tensor core's 16-deep
//! steps over K in order, with no split of K whatever the problem's size, and round to bf16
//! once. On the CPU a bf16 product adds in f32,
//! k in order, and rounds once (the products of two bf16 values are exact in f32).

use super::MatmulPlan;
use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, CustomOp2, DType, Error, Layout, Result, Shape, Tensor, D};
use rayon::prelude::*;

/// `a @ b` over the last two dimensions, batch-invariant. `a` is `[..., M, K]`; `b` is
/// `[K, N]` (shared by every matrix of `a`) or has `a`'s leading dimensions.
pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let a_dims = a.dims();
    if a_dims.len() < 2 || !(b.rank() == 2 || b.dims()[..b.rank() - 2] == a_dims[..a_dims.len() - 2]) {
        return Err(Error::Msg(format!(
            "batch-invariant matmul needs [..., M, K] and [K, N] or [..., K, N] with the same leading dims, got {:?} and {:?}",
            a_dims,
            b.dims()
        )));
    }
    let lead = &a_dims[..a_dims.len() - 2];
    let batch: usize = lead.iter().product();
    let (a3, b3) = (as3(a, batch)?, if b.rank() == 2 { b.unsqueeze(0)? } else { as3(b, batch)? });
    let (a3, b3) =
        if a.dtype() == DType::BF16 && a.device().is_cuda() { tensor_core_operands(&a3, &b3)? } else { (a3, b3) };
    let out = a3.apply_op2(&b3, FixedMatmul)?;
    let mut dims = lead.to_vec();
    dims.extend([a.dim(D::Minus2)?, b.dim(D::Minus1)?]);
    out.reshape(dims)
}

/// `t` as `[batch, rows, cols]`: a view with its strides where it has no leading dimensions or
/// one, else a reshape (which copies a strided tensor).
fn as3(t: &Tensor, batch: usize) -> Result<Tensor> {
    match t.rank() {
        2 => t.unsqueeze(0),
        3 => Ok(t.clone()),
        _ => t.reshape((batch, t.dim(D::Minus2)?, t.dim(D::Minus1)?)),
    }
}

/// 3-d operands laid out as the tensor-core kernel reads them, with the same product: K padded
/// with zeros to a multiple of 8 (the padding depends on K alone, so on no batch), `a` with K
/// contiguous, `b` with K contiguous (a linear layer's transposed weight already is), and
/// rows starting 16-byte aligned.
fn tensor_core_operands(a: &Tensor, b: &Tensor) -> Result<(Tensor, Tensor)> {
    let k = a.dim(D::Minus1)?;
    let pad = k.next_multiple_of(8) - k;
    let (mut a, mut b) = (a.clone(), b.clone());
    if pad > 0 {
        a = a.pad_with_zeros(D::Minus1, 0, pad)?;
        b = b.pad_with_zeros(D::Minus2, 0, pad)?;
    }
    // A dimension of one is never stepped over, whatever its stride (candle gives such a
    // dimension any stride: a weight's transposed view unsqueezed has stride 1 there). One
    // longer than one that is broadcast, stride 0, is copied: the Hopper kernels' TMA unit does
    // not read it.
    let aligned = |t: &Tensor, k_dim: usize| {
        let (start, strides, dims) = (t.layout().start_offset(), t.stride(), t.dims());
        strides[k_dim] == 1
            && start % 8 == 0
            && strides.iter().zip(dims).enumerate().all(|(d, (&s, &n))| d == k_dim || n == 1 || (s % 8 == 0 && s > 0))
    };
    let (a_k, b_k) = (a.rank() - 1, b.rank() - 2);
    if !aligned(&a, a_k) {
        a = a.copy()?.contiguous()?;
    }
    if !aligned(&b, b_k) {
        // Stored as bᵀ, K contiguous; read back through a transposed view.
        b = b.transpose(D::Minus1, D::Minus2)?.contiguous()?.copy()?.transpose(D::Minus1, D::Minus2)?;
    }
    Ok((a, b))
}

/// Sums over the last dimension, keeping it (size 1), each row added left to right.
pub fn sum_last_keepdim(x: &Tensor) -> Result<Tensor> {
    x.contiguous()?.apply_op1(FixedRowSum)
}

/// Softmax over the last dimension with the row sum of `sum_last_keepdim` (the maximum is
/// exact in any order). Other dtypes than F32 are computed in F32 and rounded back. On a GPU,
/// an F32 or BF16 tensor that keeps no graph (a forward pass without gradients) takes one
/// kernel that does these same operations in the same order (`FixedSoftmax`, the same bits:
/// `repro gpu-check` compares them); everything else takes `softmax_last_dim_ops`.
pub fn softmax_last_dim(x: &Tensor) -> Result<Tensor> {
    if x.device().is_cuda() && !x.track_op() && matches!(x.dtype(), DType::F32 | DType::BF16) {
        return x.contiguous()?.apply_op1(FixedSoftmax);
    }
    softmax_last_dim_ops(x)
}

/// `softmax_last_dim` as separate ops (each with its backward pass): the maximum, the
/// subtraction, `exp`, `sum_last_keepdim` and the division, in F32.
pub fn softmax_last_dim_ops(x: &Tensor) -> Result<Tensor> {
    if x.dtype() != DType::F32 {
        return softmax_last_dim_ops(&x.to_dtype(DType::F32)?)?.to_dtype(x.dtype());
    }
    let max = x.max_keepdim(D::Minus1)?;
    let e = x.broadcast_sub(&max)?.exp()?;
    e.broadcast_div(&sum_last_keepdim(&e)?)
}

/// `softmax_last_dim_ops` in one GPU kernel, for tensors that keep no graph (so it has no
/// backward pass); never run on the CPU.
struct FixedSoftmax;

impl CustomOp1 for FixedSoftmax {
    fn name(&self) -> &'static str {
        "repro-softmax-last-fixed"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        Err(Error::Msg(format!("{} runs on a GPU only (softmax_last_dim_ops on the CPU)", self.name())))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        storage: &candle_core::CudaStorage,
        layout: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (rows, cols) = rows_cols(layout);
        Ok((super::cuda::softmax_last_fixed(storage, layout, rows, cols)?, layout.shape().clone()))
    }
}

/// The product of `[Z, M, K]` by `[Z or 1, K, N]` into a contiguous `[Z, M, N]`.
struct FixedMatmul;

/// What the kernels need of the two operands: sizes and strides, b's batch stride 0 when it
/// is shared.
fn matmul_shape(a: &Layout, b: &Layout) -> Result<MatmulPlan> {
    let (&[batch, m, k], &[b_batch, k2, n]) = (a.dims(), b.dims()) else {
        return Err(Error::Msg("batch-invariant matmul takes 3-d operands".into()));
    };
    if k != k2 || !(b_batch == batch || b_batch == 1) {
        return Err(Error::Msg(format!("batch-invariant matmul: {:?} by {:?}", a.dims(), b.dims())));
    }
    // A dimension of one (but K, which the tensor-core operands pad) is never stepped over: its
    // stride is 0 here, whatever the layout's (candle gives such a dimension any stride, which
    // the kernels' alignment checks would read).
    let stride = |s: usize, dim: usize| if dim == 1 { 0 } else { s };
    let (sa, sb) = (a.stride(), b.stride());
    Ok(MatmulPlan {
        batch,
        m,
        n,
        k,
        a_strides: [stride(sa[0], batch), stride(sa[1], m), sa[2]],
        b_strides: [stride(sb[0], b_batch), sb[1], stride(sb[2], n)],
    })
}

/// The product on the CPU: one output row per task, each element's sum over k in order (how
/// rows are spread over threads never changes a row's sums).
fn cpu_matmul(p: &MatmulPlan, a: &[f32], b: &[f32]) -> Vec<f32> {
    let [a_z, a_m, a_k] = p.a_strides;
    let [b_z, b_k, b_n] = p.b_strides;
    let mut out = vec![0f32; p.batch * p.m * p.n];
    out.par_chunks_mut(p.n.max(1)).enumerate().for_each(|(row, c)| {
        let (z, i) = (row / p.m, row % p.m);
        for k in 0..p.k {
            let aik = a[z * a_z + i * a_m + k * a_k];
            let b_row = z * b_z + k * b_k;
            for (j, c) in c.iter_mut().enumerate() {
                *c += aik * b[b_row + j * b_n];
            }
        }
    });
    out
}

impl CustomOp2 for FixedMatmul {
    fn name(&self) -> &'static str {
        "repro-matmul-fixed"
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Result<(CpuStorage, Shape)> {
        let p = matmul_shape(l1, l2)?;
        let out = match (s1, s2) {
            (CpuStorage::F32(a), CpuStorage::F32(b)) => {
                CpuStorage::F32(cpu_matmul(&p, &a[l1.start_offset()..], &b[l2.start_offset()..]))
            }
            (CpuStorage::BF16(a), CpuStorage::BF16(b)) => {
                let widen = |v: &[half::bf16]| v.iter().map(|x| x.to_f32()).collect::<Vec<f32>>();
                let (a, b) = (widen(&a[l1.start_offset()..]), widen(&b[l2.start_offset()..]));
                CpuStorage::BF16(cpu_matmul(&p, &a, &b).into_iter().map(half::bf16::from_f32).collect())
            }
            (a, b) => {
                return Err(Error::Msg(format!(
                    "{} supports F32 and BF16 operands of one dtype, got {:?} and {:?}",
                    self.name(),
                    a.dtype(),
                    b.dtype()
                )))
            }
        };
        Ok((out, Shape::from((p.batch, p.m, p.n))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let p = matmul_shape(l1, l2)?;
        let out = match (s1.dtype(), s2.dtype()) {
            (DType::F32, DType::F32) => super::cuda::matmul_f32_fixed(s1, l1, s2, l2, &p)?,
            (DType::BF16, DType::BF16) => super::cuda::matmul_bf16_fixed(s1, l1, s2, l2, &p, None)?,
            (a, b) => {
                return Err(Error::Msg(format!(
                    "{} supports F32 and BF16 operands of one dtype, got {a:?} and {b:?}",
                    self.name()
                )))
            }
        };
        Ok((out, Shape::from((p.batch, p.m, p.n))))
    }

    /// The same product again: `da = g @ bᵀ`, `db = aᵀ @ g`, summed over the batch where `b`
    /// is shared.
    fn bwd(&self, a: &Tensor, b: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let shared = b.dim(0)? == 1 && a.dim(0)? > 1;
        let b_t = b.transpose(1, 2)?;
        let grad_a = matmul(grad, &if shared { b_t.squeeze(0)? } else { b_t })?;
        let grad_b = if shared {
            let (k, n) = (a.dim(2)?, grad.dim(2)?);
            matmul(&a.reshape(((), k))?.t()?, &grad.reshape(((), n))?)?.unsqueeze(0)?
        } else {
            matmul(&a.transpose(1, 2)?, grad)?
        };
        Ok((Some(grad_a), Some(grad_b)))
    }
}

/// Row sums over the last dimension of a contiguous tensor, keeping it.
struct FixedRowSum;

fn rows_cols(layout: &Layout) -> (usize, usize) {
    let cols = layout.dims().last().copied().unwrap_or(1);
    (layout.shape().elem_count() / cols.max(1), cols)
}

fn keepdim_shape(layout: &Layout) -> Shape {
    let mut dims = layout.dims().to_vec();
    if let Some(last) = dims.last_mut() {
        *last = 1;
    }
    Shape::from(dims)
}

impl CustomOp1 for FixedRowSum {
    fn name(&self) -> &'static str {
        "repro-sum-last-fixed"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = super::reduce::f32_input(self.name(), storage, layout)?;
        let (_, cols) = rows_cols(layout);
        let sums = x.chunks(cols.max(1)).map(|row| row.iter().fold(0f32, |acc, v| acc + v)).collect();
        Ok((CpuStorage::F32(sums), keepdim_shape(layout)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        storage: &candle_core::CudaStorage,
        layout: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (rows, cols) = rows_cols(layout);
        Ok((super::cuda::sum_last_f32_fixed(storage, layout, rows, cols)?, keepdim_shape(layout)))
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(grad_res.broadcast_as(arg.shape())?.contiguous()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n).map(|i| (((i + seed) * 2654435761usize) % 2001) as f32 * 1e-3 - 1.0).collect()
    }

    fn bits(t: &Tensor) -> Vec<u32> {
        t.flatten_all().unwrap().to_vec1::<f32>().unwrap().iter().map(|v| v.to_bits()).collect()
    }

    /// A linear layer's weight, transposed and unsqueezed (candle gives the new dimension of one
    /// the stride 1), and a decoding step's single column of keys: operands the tensor-core
    /// kernels read as they are, with no copy, their dimensions of one given the stride 0.
    #[test]
    fn dimensions_of_one_neither_copy_an_operand_nor_reach_the_kernels_with_their_stride() -> Result<()> {
        let w = Tensor::new(values(64 * 16, 1), &Device::Cpu)?.reshape((16, 64))?.to_dtype(DType::BF16)?;
        let x = Tensor::new(values(3 * 64, 2), &Device::Cpu)?.reshape((1, 3, 64))?.to_dtype(DType::BF16)?;
        let wt = w.t()?.unsqueeze(0)?;
        assert_eq!(wt.stride(), &[1, 1, 64]);
        let (a, b) = tensor_core_operands(&x, &wt)?;
        assert_eq!((a.stride(), b.stride()), (x.stride(), wt.stride()), "copied");
        let plan = matmul_shape(a.layout(), b.layout())?;
        assert_eq!((plan.a_strides, plan.b_strides), ([0, 64, 1], [0, 1, 64]));
        // Attention's scores against one cached key: [Z, 1, K] by [Z, K, 1], N of stride 1.
        let (q, key) = (x.reshape((3, 1, 64))?, x.reshape((3, 64, 1))?);
        assert_eq!(key.stride(), &[64, 1, 1]);
        let (a, b) = tensor_core_operands(&q, &key)?;
        assert_eq!(b.stride(), key.stride(), "copied");
        let plan = matmul_shape(a.layout(), b.layout())?;
        assert_eq!((plan.a_strides, plan.b_strides), ([64, 0, 1], [64, 1, 0]));
        // A broadcast dimension longer than one is copied (the TMA unit reads no stride 0).
        let repeated = w.t()?.unsqueeze(0)?.broadcast_as((2, 64, 16))?;
        let (_, b) = tensor_core_operands(&x.broadcast_as((2, 3, 64))?, &repeated)?;
        assert_ne!(b.stride()[0], 0);
        Ok(())
    }

    #[test]
    fn the_product_matches_candle_s_within_rounding() {
        let dev = Device::Cpu;
        let a = Tensor::from_vec(values(3 * 5 * 37, 1), (3, 5, 37), &dev).unwrap();
        let w = Tensor::from_vec(values(11 * 37, 2), (11, 37), &dev).unwrap();
        // A transposed (strided) weight, shared by the batch, as a linear layer uses it.
        let ours = matmul(&a, &w.t().unwrap()).unwrap();
        let theirs = a.broadcast_matmul(&w.t().unwrap()).unwrap();
        assert_eq!(ours.dims(), [3, 5, 11]);
        let diff = (ours - theirs).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        assert!(diff < 1e-5, "{diff}");
    }

    #[test]
    fn a_row_s_product_does_not_depend_on_its_batch_or_on_appended_zeros() {
        let dev = Device::Cpu;
        let (k, n) = (300, 7);
        let b = Tensor::from_vec(values(k * n, 5), (k, n), &dev).unwrap();
        let row = values(k, 9);
        let alone = matmul(&Tensor::from_vec(row.clone(), (1, k), &dev).unwrap(), &b).unwrap();
        for batch in [2, 5, 64] {
            let mut rows = values((batch - 1) * k, batch);
            rows.extend(&row);
            let batched = matmul(&Tensor::from_vec(rows, (batch, k), &dev).unwrap(), &b).unwrap();
            assert_eq!(bits(&batched.get(batch - 1).unwrap()), bits(&alone), "batch {batch}");
        }
        // Zeros appended to the reduction (padding keys with zero weight) change nothing.
        let mut padded_row = row.clone();
        padded_row.extend([0.0; 20]);
        let mut padded_b = values(k * n, 5);
        padded_b.extend(values(20 * n, 3));
        let padded = matmul(
            &Tensor::from_vec(padded_row, (1, k + 20), &dev).unwrap(),
            &Tensor::from_vec(padded_b, (k + 20, n), &dev).unwrap(),
        )
        .unwrap();
        assert_eq!(bits(&padded), bits(&alone));
        let sums = |v: Vec<f32>, cols| sum_last_keepdim(&Tensor::from_vec(v, (1, cols), &dev).unwrap()).unwrap();
        let mut zeros_after = row.clone();
        zeros_after.extend([0.0; 13]);
        assert_eq!(bits(&sums(row.clone(), k)), bits(&sums(zeros_after, k + 13)));
    }

    #[test]
    fn a_bf16_row_s_product_does_not_depend_on_its_batch_and_rounds_once() {
        let dev = Device::Cpu;
        let (k, n) = (77, 9);
        let bf16 = |v: Vec<f32>, shape: (usize, usize)| {
            Tensor::from_vec(v, shape, &dev).unwrap().to_dtype(DType::BF16).unwrap()
        };
        let w = bf16(values(n * k, 3), (n, k));
        let row = values(k, 8);
        let alone = matmul(&bf16(row.clone(), (1, k)), &w.t().unwrap()).unwrap();
        assert_eq!(alone.dtype(), DType::BF16);
        let as_bits = |t: &Tensor| {
            t.flatten_all().unwrap().to_vec1::<half::bf16>().unwrap().iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        };
        for batch in [3, 64] {
            let mut rows = values((batch - 1) * k, batch);
            rows.extend(&row);
            let batched = matmul(&bf16(rows, (batch, k)), &w.t().unwrap()).unwrap();
            assert_eq!(as_bits(&batched.get(batch - 1).unwrap()), as_bits(&alone.get(0).unwrap()), "batch {batch}");
        }
        // One rounding of the f32 sum: the f32 product of the same (bf16-exact) values, rounded.
        let f32 = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
        let exact = matmul(&f32(&bf16(row, (1, k))), &f32(&w).t().unwrap()).unwrap();
        assert_eq!(as_bits(&exact.to_dtype(DType::BF16).unwrap()), as_bits(&alone));
        // Softmax in bf16 goes through f32 and keeps the dtype.
        let s = softmax_last_dim(&alone).unwrap();
        assert_eq!(s.dtype(), DType::BF16);
        let total = s.to_dtype(DType::F32).unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap();
        assert!((total - 1.0).abs() < 0.02, "{total}");
    }

    #[test]
    fn tensor_core_operands_have_k_contiguous_padded_and_aligned_and_the_same_product() {
        let dev = Device::Cpu;
        let (z, m, k, n) = (2, 5, 13, 6);
        let a = Tensor::from_vec(values(z * m * k, 1), (z, m, k), &dev).unwrap().to_dtype(DType::BF16).unwrap();
        // b with N contiguous (as attention's values are): it must be stored transposed.
        let b = Tensor::from_vec(values(z * k * n, 2), (z, k, n), &dev).unwrap().to_dtype(DType::BF16).unwrap();
        let (pa, pb) = tensor_core_operands(&a.narrow(1, 1, 4).unwrap(), &b).unwrap();
        assert_eq!((pa.dims(), pb.dims()), (&[z, 4, 16][..], &[z, 16, n][..]), "K padded to a multiple of 8");
        assert_eq!(pa.stride()[2], 1);
        assert_eq!(pb.stride()[1], 1, "b's K contiguous");
        for t in [&pa, &pb] {
            assert_eq!(t.layout().start_offset() % 8, 0);
        }
        let bits = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<half::bf16>().unwrap();
        let product = |x: &Tensor, y: &Tensor| x.apply_op2(y, FixedMatmul).unwrap();
        let expected = product(&a.narrow(1, 1, 4).unwrap(), &b);
        assert_eq!(bits(&product(&pa, &pb)), bits(&expected), "appended zeros change nothing");
        // A linear layer's transposed weight is taken as it is.
        let w = Tensor::from_vec(values(n * 16, 4), (n, 16), &dev).unwrap().to_dtype(DType::BF16).unwrap();
        let wt = w.t().unwrap().unsqueeze(0).unwrap();
        let (_, pw) = tensor_core_operands(&pa, &wt).unwrap();
        assert_eq!(pw.stride(), wt.stride());
    }

    #[test]
    fn gradients_match_candle_s() {
        let dev = Device::Cpu;
        let a = Var::from_vec(values(2 * 4 * 6, 1), (2, 4, 6), &dev).unwrap();
        let w = Var::from_vec(values(6 * 3, 2), (6, 3), &dev).unwrap();
        let x = Var::from_vec(values(2 * 4 * 5, 7), (2, 4, 5), &dev).unwrap();
        let target = Tensor::from_vec(values(2 * 4 * 3, 4), (2, 4, 3), &dev).unwrap();
        let loss = |mm: &dyn Fn(&Tensor, &Tensor) -> Tensor, softmax: &dyn Fn(&Tensor) -> Tensor| {
            let y = mm(a.as_tensor(), w.as_tensor());
            // A batched product with both operands tracked, as attention's scores are.
            let s = softmax(&mm(x.as_tensor(), &x.as_tensor().transpose(1, 2).unwrap()));
            let z = mm(&s, a.as_tensor());
            let l = ((y - &target).unwrap().sqr().unwrap().sum_all().unwrap() + z.sum_all().unwrap()).unwrap();
            let grads = l.backward().unwrap();
            [a.as_tensor(), w.as_tensor(), x.as_tensor()].map(|v| grads.get(v).unwrap().clone())
        };
        let ours = loss(&|p, q| matmul(p, q).unwrap(), &|s| softmax_last_dim(s).unwrap());
        let theirs = loss(&|p, q| p.broadcast_matmul(q).unwrap(), &|s| candle_nn::ops::softmax(s, D::Minus1).unwrap());
        for (o, t) in ours.iter().zip(&theirs) {
            assert_eq!(o.dims(), t.dims());
            let diff = (o - t).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
            assert!(diff < 1e-4, "{diff}");
        }
    }
}
