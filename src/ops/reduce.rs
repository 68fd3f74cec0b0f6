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
        mode => x.contiguous()?.apply_op1(SumAll { mode }),
    }
}

/// `value` (one element) broadcast to a vector of `n` elements. Its gradient is the incoming
/// gradient summed with `mode`: this is how a bias added over a batch gets its gradient.
pub fn expand(value: &Tensor, n: usize, mode: Reductions) -> Result<Tensor> {
    match mode {
        Reductions::Candle => value.reshape(())?.broadcast_as(n),
        mode => value.contiguous()?.apply_op1(Expand { n, mode }),
    }
}

struct SumAll {
    mode: Reductions,
}

struct Expand {
    n: usize,
    mode: Reductions,
}

fn f32_input<'a>(op: &str, storage: &'a CpuStorage, layout: &Layout) -> Result<&'a [f32]> {
    let CpuStorage::F32(values) = storage else {
        return Err(Error::Msg(format!("{op} supports F32 only, got {:?}", storage.dtype())));
    };
    let (start, end) =
        layout.contiguous_offsets().ok_or_else(|| Error::Msg(format!("{op} needs a contiguous input")))?;
    Ok(&values[start..end])
}

impl CustomOp1 for SumAll {
    fn name(&self) -> &'static str {
        match self.mode {
            Reductions::Atomic => "repro-sum-atomic",
            _ => "repro-sum-ordered",
        }
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = f32_input(self.name(), storage, layout)?;
        let sum = match self.mode {
            Reductions::Atomic => cpu_sum_atomic(x),
            _ => cpu_sum_ordered(x),
        };
        Ok((CpuStorage::F32(vec![sum]), Shape::from(())))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        storage: &candle_core::CudaStorage,
        layout: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let out = super::cuda::sum_f32(storage, layout, self.mode)?;
        Ok((out, Shape::from(())))
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(grad_res.broadcast_as(arg.shape())?.contiguous()?))
    }
}

impl CustomOp1 for Expand {
    fn name(&self) -> &'static str {
        "repro-expand"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = f32_input(self.name(), storage, layout)?;
        let &[value] = x else {
            return Err(Error::Msg(format!("expand needs one element, got {}", x.len())));
        };
        Ok((CpuStorage::F32(vec![value; self.n]), Shape::from(self.n)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        storage: &candle_core::CudaStorage,
        layout: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let out = super::cuda::expand_f32(storage, layout, self.n)?;
        Ok((out, Shape::from(self.n)))
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(sum_all(grad_res, self.mode)?.reshape(arg.shape())?))
    }
}

/// Elements per block of the ordered CPU sum; blocks are summed sequentially, then combined in
/// a pairwise tree.
const ORDERED_BLOCK: usize = 256;

fn cpu_sum_ordered(x: &[f32]) -> f32 {
    let mut level: Vec<f32> = x.chunks(ORDERED_BLOCK).map(|c| c.iter().sum()).collect();
    while level.len() > 1 {
        level = level.chunks(2).map(|p| p.iter().sum()).collect();
    }
    level.first().copied().unwrap_or(0.0)
}

/// Threads racing on the atomic CPU sum; more than the cores so scheduling reorders them.
const ATOMIC_THREADS: usize = 8;
/// Elements each thread claims at a time.
const ATOMIC_CHUNK: usize = 16;

fn cpu_sum_atomic(x: &[f32]) -> f32 {
    let accumulator = AtomicU32::new(0.0f32.to_bits());
    let next = AtomicUsize::new(0);
    // All threads start together, so they really race for chunks.
    let start_line = std::sync::Barrier::new(ATOMIC_THREADS);
    std::thread::scope(|scope| {
        for _ in 0..ATOMIC_THREADS {
            scope.spawn(|| {
                start_line.wait();
                loop {
                    let start = next.fetch_add(ATOMIC_CHUNK, Ordering::Relaxed);
                    if start >= x.len() {
                        break;
                    }
                    let partial: f32 = x[start..(start + ATOMIC_CHUNK).min(x.len())].iter().sum();
                    // Let the scheduler interleave the threads between claiming a chunk and
                    // adding it, as warps interleave on a GPU.
                    std::thread::yield_now();
                    // A float atomicAdd: whichever thread gets here first adds first.
                    let _ = accumulator.fetch_update(Ordering::AcqRel, Ordering::Acquire, |bits| {
                        Some((f32::from_bits(bits) + partial).to_bits())
                    });
                }
            });
        }
    });
    f32::from_bits(accumulator.into_inner())
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
