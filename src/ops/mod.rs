//! Custom candle ops whose numerics repro controls: the reductions that frameworks make
//! non-deterministic in practice, each in an `atomic` and an `ordered` mode; a batch-invariant
//! matrix product and row sum (`invariant`); and (with the `cuda` feature) their launchers.

pub mod invariant;
mod reduce;
mod tensor_core;

#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
mod hopper;

/// One of the tensor-core product's kernels run on a 2-d product (for gpu-check, which checks
/// that they give the same bits).
#[cfg(feature = "cuda")]
pub use cuda::{matmul_bf16_chosen, matmul_bf16_variant, matmul_bf16_variants};
pub use tensor_core::{choose_hopper_kernel, HopperKernel, HOPPER_VARIANTS, TENSOR_CORE_VARIANTS};

pub use reduce::{expand, expand_rows, sum_all, sum_rows, Reductions};

/// `batch` products of `[m, k]` by `[k, n]`, each operand read through (batch, row, column)
/// strides in elements.
pub(crate) struct MatmulPlan {
    pub(crate) batch: usize,
    pub(crate) m: usize,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) a_strides: [usize; 3],
    pub(crate) b_strides: [usize; 3],
}
