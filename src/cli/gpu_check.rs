//! `repro gpu-check` (CUDA builds only): the checks and benchmarks of `repro::measure::gpu`
//! (GPU hashing against the host's, recording while the GPU lags and at steps of several GiB,
//! the tensor-core product's invariance, and their throughput), printed as they come.

use super::error::CliError;
use super::exit::Exit;
use clap::Args;
use repro::measure::gpu::{gpu_check, Finding, GpuParts};

#[derive(Debug, Args)]
pub struct GpuCheckArgs {
    /// The GPU to check.
    #[arg(long, default_value = "cuda:0")]
    device: String,
    /// Only the checks and benchmarks of one part: hashing (1 to 4) or the tensor-core
    /// product (5) [default: both].
    #[arg(long, value_enum)]
    only: Option<Part>,
}

/// A part of the GPU check.
#[derive(Debug, Clone, Copy, PartialEq, clap::ValueEnum)]
enum Part {
    /// GPU hashing against the host's, and its throughput.
    Hash,
    /// The batch-invariant bf16 product on tensor cores.
    TensorCore,
}

pub fn run(args: GpuCheckArgs) -> Result<Exit, CliError> {
    let device = repro::record::open_device(&args.device)?;
    let parts = GpuParts { hashing: args.only != Some(Part::TensorCore), tensor_core: args.only != Some(Part::Hash) };
    let failures = gpu_check(&device, parts, &mut |finding| match finding {
        Finding::Line(line) => super::output::line(&line),
        Finding::Mismatch(what) => eprintln!("MISMATCH {what}"),
    })?;
    match failures {
        0 => Ok(Exit::Same),
        failures => {
            Err(format!("{failures} GPU checks failed (hashes against the host's, or the invariant product)").into())
        }
    }
}
