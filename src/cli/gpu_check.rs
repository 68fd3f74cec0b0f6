//! `repro gpu-check` (CUDA builds only): GPU hashing against the CPU, and its throughput.
//!
//! 1. For every dtype and for sizes around BLAKE3's 1024-byte chunk (and offset views), the
//!    canonical hash computed on the GPU must equal the one computed on the host.
//! 2. Throughput of GPU hashing at 1 MiB, 64 MiB and 1 GiB, beside the device's memory bandwidth
//!    measured in the same run (a plain read kernel), as a table.

use super::Exit;
use candle_core::{DType, Device, Tensor};
use clap::Args;
use repro::hash::data_hash as host_data_hash;
use repro::ops::cuda::{data_hash as gpu_data_hash, read_all};
use std::time::Instant;

#[derive(Debug, Args)]
pub struct GpuCheckArgs {
    /// The GPU to check.
    #[arg(long, default_value = "cuda:0")]
    device: String,
}

pub fn run(args: GpuCheckArgs) -> Result<Exit, String> {
    let inner = || -> Result<usize, Box<dyn std::error::Error>> {
        let dev = repro::record::open_device(&args.device)?;
        let failures = check(&dev)?;
        bench(&dev)?;
        Ok(failures)
    };
    match inner().map_err(|e| e.to_string())? {
        0 => Ok(Exit::Same),
        failures => Err(format!("{failures} GPU/CPU hash mismatches")),
    }
}

/// Hashes on the GPU and on the host; returns the number of mismatches.
fn check(dev: &Device) -> Result<usize, Box<dyn std::error::Error>> {
    let dtypes =
        [DType::U8, DType::U32, DType::I16, DType::I32, DType::I64, DType::F16, DType::BF16, DType::F32, DType::F64];
    let byte_sizes = [0usize, 8, 1016, 1024, 1032, 2048, 2056, 3072, 4096 + 8, 65_536, 1_048_576 + 8, (64 << 20) + 24];
    let (mut checked, mut failures) = (0, 0);
    for dtype in dtypes {
        let size = dtype.size_in_bytes();
        for bytes in byte_sizes {
            let n = bytes / size;
            let data: Vec<u8> = (0..n * size).map(|i| (i.wrapping_mul(2654435761) >> 7) as u8).collect();
            let host = Tensor::from_raw_buffer(&data, dtype, &[n], &Device::Cpu)?;
            let gpu = host.to_device(dev)?;
            // The whole tensor, and a view starting one element in (unaligned for small dtypes).
            let cases =
                [(gpu.clone(), data.as_slice()), (gpu.narrow(0, n.min(1), n - n.min(1))?, &data[size * n.min(1)..])];
            for (tensor, expected_bytes) in cases {
                let expected = host_data_hash(expected_bytes);
                let got = gpu_data_hash(&tensor)?;
                checked += 1;
                match got {
                    Some(h) if h != expected => {
                        failures += 1;
                        eprintln!("MISMATCH {dtype:?} {} bytes", expected_bytes.len());
                    }
                    None if expected_bytes.len() > 1024 => {
                        failures += 1;
                        eprintln!("NOT HASHED ON GPU {dtype:?} {} bytes", expected_bytes.len());
                    }
                    _ => {}
                }
            }
        }
    }
    super::output::line(&format!(
        "GPU hash check: {checked} cases, {failures} mismatches (all dtypes; 0 B to 64 MiB; aligned and offset views)"
    ));
    Ok(failures)
}

fn median_seconds(
    dev: &Device,
    reps: usize,
    mut f: impl FnMut() -> candle_core::Result<()>,
) -> candle_core::Result<f64> {
    f()?; // warm-up: NVRTC compile, module load, allocator
    dev.synchronize()?;
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        f()?;
        dev.synchronize()?;
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    Ok(times[reps / 2])
}

fn bench(dev: &Device) -> Result<(), Box<dyn std::error::Error>> {
    super::output::line(
        "\n| tensor | GPU BLAKE3 (canonical hash) | device memory read | hash / read | host BLAKE3, same bytes |",
    );
    super::output::line("|---|---|---|---|---|");
    for (label, bytes) in [("1 MiB", 1usize << 20), ("64 MiB", 64 << 20), ("1 GiB", 1 << 30)] {
        let n = bytes / 4;
        let t = Tensor::rand(0f32, 1f32, n, dev)?;
        let gb = |secs: f64, moved: usize| moved as f64 / secs / 1e9;
        let reps = if bytes >= 1 << 30 { 11 } else { 51 };
        let hash = median_seconds(dev, reps, || gpu_data_hash(&t).map(|_| ()))?;
        let read = median_seconds(dev, reps, || read_all(&t))?;
        let host_bytes = t.to_device(&Device::Cpu)?.to_vec1::<f32>()?;
        let host_bytes: &[u8] = bytemuck::cast_slice(&host_bytes);
        let t0 = Instant::now();
        let _ = host_data_hash(host_bytes);
        let host = t0.elapsed().as_secs_f64();
        super::output::line(&format!(
            "| {label} | {:.0} GB/s | {:.0} GB/s | {:.0}% | {:.1} GB/s |",
            gb(hash, bytes),
            gb(read, bytes),
            100.0 * read / hash,
            gb(host, bytes)
        ));
    }
    Ok(())
}
