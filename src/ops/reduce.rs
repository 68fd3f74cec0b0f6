//! Sums with a chosen accumulation order, as candle custom ops with backward.
//!
//! - `Reductions::Atomic`: partial sums are added into one accumulator in whatever order the
//!   hardware finishes them: float `atomicAdd` on the GPU, racing threads on a shared
//!   accumulator on the CPU. Float addition is not associative, so results can change from run
//!   to run, the way TensorFlow's `reduce_sum` did.
//! - `Reductions::Ordered`: a fixed tree whose shape depends only on the element count:
//!   bit-reproducible.
//! - `Reductions::Candle`: candle's own reduction kernels (deterministic on CPU and CUDA).
//!
//! Only F32 is supported.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, Error, Layout, Result, Shape, Tensor};
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

/// How reductions accumulate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reductions {
    /// candle's built-in reductions.
    #[default]
    Candle,
    /// Float atomics: accumulation order decided by timing.
    Atomic,
    /// A fixed-order tree: bit-reproducible.
    Ordered,
}

impl fmt::Display for Reductions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Reductions::Candle => "candle",
            Reductions::Atomic => "atomic",
            Reductions::Ordered => "ordered",
        })
    }
}

impl FromStr for Reductions {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s {
            "candle" => Ok(Reductions::Candle),
            "atomic" => Ok(Reductions::Atomic),
            "ordered" => Ok(Reductions::Ordered),
            _ => Err(format!("unknown reductions `{s}`: expected candle, atomic or ordered")),
        }
    }
}

/// The sum of all elements of `x` as a scalar, accumulated as `mode` says. Its gradient is the
/// incoming gradient broadcast back to `x`'s shape.
pub fn sum_all(x: &Tensor, mode: Reductions) -> Result<Tensor> {
    match mode {
        Reductions::Candle => x.sum_all(),
        mode => sum_rows(&x.flatten_all()?.unsqueeze(1)?, mode)?.reshape(()),
    }
}

/// `value` (one element) broadcast to a vector of `n` elements. Its gradient is the incoming
/// gradient summed with `mode`: this is how a bias added over a batch gets its gradient.
pub fn expand(value: &Tensor, n: usize, mode: Reductions) -> Result<Tensor> {
    match mode {
        // Not `expand_rows`: its `[n, 1]` view makes candle's backward sum the gradient in
        // another order, which would change the adder's recorded numbers.
        Reductions::Candle => value.reshape(())?.broadcast_as(n),
        mode => expand_rows(&value.reshape(1)?, n, mode)?.reshape(n),
    }
}

/// Column sums of a `[rows, cols]` matrix: a `[cols]` vector, each column accumulated as `mode`
/// says. This is the reduction over a batch (bias gradients, batch-norm statistics, partial
/// weight gradients). Its gradient broadcasts the incoming one back over the rows.
pub fn sum_rows(x: &Tensor, mode: Reductions) -> Result<Tensor> {
    match mode {
        Reductions::Candle => x.sum(0),
        mode => x.contiguous()?.apply_op1(SumRows { mode }),
    }
}

/// A `[cols]` vector repeated as the `rows` rows of a `[rows, cols]` matrix. Its gradient is the
/// incoming gradient's column sums, accumulated as `mode` says (see `sum_rows`).
pub fn expand_rows(value: &Tensor, rows: usize, mode: Reductions) -> Result<Tensor> {
    match mode {
        Reductions::Candle => value.unsqueeze(0)?.broadcast_as((rows, value.elem_count())),
        mode => value.contiguous()?.apply_op1(ExpandRows { rows, mode }),
    }
}

struct SumRows {
    mode: Reductions,
}

struct ExpandRows {
    rows: usize,
    mode: Reductions,
}

/// The values of a contiguous F32 CPU tensor.
pub(super) fn f32_input<'a>(op: &str, storage: &'a CpuStorage, layout: &Layout) -> Result<&'a [f32]> {
    let CpuStorage::F32(values) = storage else {
        return Err(Error::Msg(format!("{op} supports F32 only, got {:?}", storage.dtype())));
    };
    let (start, end) =
        layout.contiguous_offsets().ok_or_else(|| Error::Msg(format!("{op} needs a contiguous input")))?;
    Ok(&values[start..end])
}

fn matrix_dims(op: &str, layout: &Layout) -> Result<(usize, usize)> {
    match layout.dims() {
        &[rows, cols] => Ok((rows, cols)),
        dims => Err(Error::Msg(format!("{op} needs a [rows, cols] matrix, got shape {dims:?}"))),
    }
}

impl CustomOp1 for SumRows {
    fn name(&self) -> &'static str {
        match self.mode {
            Reductions::Atomic => "repro-sum-rows-atomic",
            _ => "repro-sum-rows-ordered",
        }
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let (rows, cols) = matrix_dims(self.name(), layout)?;
        let x = f32_input(self.name(), storage, layout)?;
        let sums = match self.mode {
            Reductions::Atomic => cpu_sum_rows_atomic(x, rows, cols),
            _ => cpu_sum_rows_ordered(x, cols),
        };
        Ok((CpuStorage::F32(sums), Shape::from(cols)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        storage: &candle_core::CudaStorage,
        layout: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (rows, cols) = matrix_dims(self.name(), layout)?;
        let out = super::cuda::sum_rows_f32(storage, layout, rows, cols, self.mode)?;
        Ok((out, Shape::from(cols)))
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(grad_res.unsqueeze(0)?.broadcast_as(arg.shape())?.contiguous()?))
    }
}

impl CustomOp1 for ExpandRows {
    fn name(&self) -> &'static str {
        "repro-expand-rows"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = f32_input(self.name(), storage, layout)?;
        Ok((CpuStorage::F32(x.repeat(self.rows)), Shape::from((self.rows, x.len()))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        storage: &candle_core::CudaStorage,
        layout: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let cols = layout.shape().elem_count();
        let out = super::cuda::expand_rows_f32(storage, layout, self.rows)?;
        Ok((out, Shape::from((self.rows, cols))))
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(sum_rows(grad_res, self.mode)?.reshape(arg.shape())?))
    }
}

/// Rows per block of the ordered CPU sum; each block's rows are added in order, then the
/// block sums are combined in a pairwise tree.
const ORDERED_BLOCK: usize = 256;

fn cpu_sum_rows_ordered(x: &[f32], cols: usize) -> Vec<f32> {
    if cols == 0 {
        return Vec::new();
    }
    let block_sum = |block: &[f32]| {
        let mut acc = vec![0.0f32; cols];
        for row in block.chunks(cols) {
            acc.iter_mut().zip(row).for_each(|(a, v)| *a += v);
        }
        acc
    };
    let mut level: Vec<Vec<f32>> = x.chunks(ORDERED_BLOCK * cols).map(block_sum).collect();
    while level.len() > 1 {
        level = level
            .chunks(2)
            .map(|pair| match pair {
                [a, b] => a.iter().zip(b).map(|(a, b)| a + b).collect(),
                [a] => a.clone(),
                _ => unreachable!("chunks(2) yields one or two"),
            })
            .collect();
    }
    level.pop().unwrap_or_else(|| vec![0.0; cols])
}

/// Threads racing on the atomic CPU sum; more than the cores so scheduling reorders them.
const ATOMIC_THREADS: usize = 8;
/// Elements each thread claims at a time (rounded up to whole rows).
const ATOMIC_CHUNK: usize = 16;

fn cpu_sum_rows_atomic(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let accumulators: Vec<AtomicU32> = (0..cols).map(|_| AtomicU32::new(0.0f32.to_bits())).collect();
    let rows_per_claim = ATOMIC_CHUNK.div_ceil(cols.max(1));
    let next = AtomicUsize::new(0);
    // All threads start together, so they really race for chunks.
    let start_line = std::sync::Barrier::new(ATOMIC_THREADS);
    std::thread::scope(|scope| {
        for _ in 0..ATOMIC_THREADS {
            scope.spawn(|| {
                start_line.wait();
                loop {
                    let first = next.fetch_add(rows_per_claim, Ordering::Relaxed);
                    if first >= rows {
                        break;
                    }
                    let mut partial = vec![0.0f32; cols];
                    for row in x[first * cols..(first + rows_per_claim).min(rows) * cols].chunks(cols) {
                        partial.iter_mut().zip(row).for_each(|(a, v)| *a += v);
                    }
                    // Let the scheduler interleave the threads between claiming rows and adding
                    // them, as warps interleave on a GPU.
                    std::thread::yield_now();
                    // Float atomicAdds: whichever thread gets here first adds first.
                    for (acc, p) in accumulators.iter().zip(partial) {
                        let _ = acc.fetch_update(Ordering::AcqRel, Ordering::Acquire, |bits| {
                            Some((f32::from_bits(bits) + p).to_bits())
                        });
                    }
                }
            });
        }
    });
    accumulators.into_iter().map(|a| f32::from_bits(a.into_inner())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    fn data(n: usize) -> Vec<f32> {
        (0..n).map(|i| ((i * 2654435761usize) % 1000) as f32 * 1e-3 + 0.1).collect()
    }

    #[test]
    fn all_modes_sum_close_to_the_exact_value() {
        let v = data(10_000);
        let exact: f64 = v.iter().map(|&x| x as f64).sum();
        let t = Tensor::new(v.as_slice(), &Device::Cpu).unwrap();
        for mode in [Reductions::Candle, Reductions::Atomic, Reductions::Ordered] {
            let s = sum_all(&t, mode).unwrap().to_scalar::<f32>().unwrap() as f64;
            assert!((s - exact).abs() / exact < 1e-5, "{mode}: {s} vs {exact}");
        }
    }

    #[test]
    fn ordered_sum_is_bit_reproducible() {
        let t = Tensor::new(data(12_345).as_slice(), &Device::Cpu).unwrap();
        let first = sum_all(&t, Reductions::Ordered).unwrap().to_scalar::<f32>().unwrap();
        for _ in 0..20 {
            let again = sum_all(&t, Reductions::Ordered).unwrap().to_scalar::<f32>().unwrap();
            assert_eq!(first.to_bits(), again.to_bits());
        }
    }

    #[test]
    fn atomic_sum_order_really_varies() {
        // Values of very different magnitudes make the order visible in the rounding.
        let v: Vec<f32> = (0..20_000).map(|i| if i % 7 == 0 { 1e4 } else { 1.0 + i as f32 * 1e-4 }).collect();
        let t = Tensor::new(v.as_slice(), &Device::Cpu).unwrap();
        let results: std::collections::BTreeSet<u32> =
            (0..200).map(|_| sum_all(&t, Reductions::Atomic).unwrap().to_scalar::<f32>().unwrap().to_bits()).collect();
        assert!(results.len() > 1, "200 racing sums all gave the same bits");
    }

    #[test]
    fn column_sums_agree_across_modes_and_ordered_ones_repeat() {
        let (rows, cols) = (1000, 7);
        let v = data(rows * cols);
        let t = Tensor::from_vec(v.clone(), (rows, cols), &Device::Cpu).unwrap();
        let exact: Vec<f64> = (0..cols).map(|c| (0..rows).map(|r| v[r * cols + c] as f64).sum()).collect();
        for mode in [Reductions::Candle, Reductions::Atomic, Reductions::Ordered] {
            let sums: Vec<f32> = sum_rows(&t, mode).unwrap().to_vec1().unwrap();
            for (s, e) in sums.iter().zip(&exact) {
                assert!((*s as f64 - e).abs() / e < 1e-5, "{mode}: {s} vs {e}");
            }
        }
        let first: Vec<f32> = sum_rows(&t, Reductions::Ordered).unwrap().to_vec1().unwrap();
        for _ in 0..10 {
            let again: Vec<f32> = sum_rows(&t, Reductions::Ordered).unwrap().to_vec1().unwrap();
            assert_eq!(
                first.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                again.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn atomic_column_sums_vary_between_calls() {
        let (rows, cols) = (4000, 3);
        let v: Vec<f32> = (0..rows * cols).map(|i| if i % 11 == 0 { 1e4 } else { 1.0 + i as f32 * 1e-4 }).collect();
        let t = Tensor::from_vec(v, (rows, cols), &Device::Cpu).unwrap();
        let results: std::collections::BTreeSet<Vec<u32>> = (0..200)
            .map(|_| {
                let s: Vec<f32> = sum_rows(&t, Reductions::Atomic).unwrap().to_vec1().unwrap();
                s.iter().map(|x| x.to_bits()).collect()
            })
            .collect();
        assert!(results.len() > 1, "200 racing column sums all gave the same bits");
    }

    #[test]
    fn gradients_flow_through_row_expansion_and_column_sums() {
        for mode in [Reductions::Atomic, Reductions::Ordered, Reductions::Candle] {
            let b = Var::new(&[0.5f32, -1.0], &Device::Cpu).unwrap();
            let x = Tensor::new(&[[1.0f32, 2.0], [3.0, 4.0], [5.0, 6.0]], &Device::Cpu).unwrap();
            let y = (x + expand_rows(b.as_tensor(), 3, mode).unwrap()).unwrap();
            let col = sum_rows(&y.sqr().unwrap(), mode).unwrap();
            let loss = sum_all(&col, mode).unwrap();
            let grads = loss.backward().unwrap();
            // d/db_c sum_r (x_rc + b_c)^2 = 2 * sum_r (x_rc + b_c)
            let gb: Vec<f32> = grads.get(&b).unwrap().to_vec1().unwrap();
            assert_eq!(gb, vec![2.0 * (9.0 + 1.5), 2.0 * (12.0 - 3.0)], "{mode}");
        }
    }

    #[test]
    fn gradients_flow_through_sum_and_expand() {
        for mode in [Reductions::Atomic, Reductions::Ordered, Reductions::Candle] {
            let b = Var::new(&[0.5f32], &Device::Cpu).unwrap();
            let x = Tensor::new(&[1.0f32, 2.0, 3.0], &Device::Cpu).unwrap();
            let y = (x + expand(b.as_tensor(), 3, mode).unwrap()).unwrap();
            let loss = sum_all(&y.sqr().unwrap(), mode).unwrap();
            let grads = loss.backward().unwrap();
            // d/db sum((x + b)^2) = 2 * sum(x + b) = 2 * 7.5
            let gb: Vec<f32> = grads.get(&b).unwrap().to_vec1().unwrap();
            assert_eq!(gb, vec![15.0], "{mode}");
            assert_eq!(loss.to_scalar::<f32>().unwrap(), 1.5 * 1.5 + 2.5 * 2.5 + 3.5 * 3.5, "{mode}");
        }
    }
}
