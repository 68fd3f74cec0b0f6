//! Checking repro's GPU code on a real device (CUDA builds; `repro gpu-check` shows it):
//!
//! 1. For every dtype, sizes around BLAKE3's 1024-byte chunk, and offset, transposed, broadcast
//!    and permuted views, the hash computed on the GPU (all cases in one batch, and each alone)
//!    must equal the one computed on the host.
//! 2. Recording while the GPU lags far behind the host: a small gpt recorded with a queue of
//!    long matrix products launched at the start of every step must give the same trace as
//!    without, which holds only if the recorder's reads run after the training thread's kernels
//!    that computed what they read and before its in-place updates.
//! 3. Recording steps of several GiB: three steps of a recorder (its trace writer on its own
//!    thread, as in every recording) whose hashes need a device arena far larger than the pool
//!    keeps must record, and every hash must equal the host's.
//! 4. Throughput of GPU hashing at 1 MiB, 64 MiB and 1 GiB, and of a step's worth of 64 MiB
//!    tensors in one batch, beside the device's memory bandwidth measured in the same run (a
//!    plain read kernel), as a table.
//! 5. The batch-invariant bf16 product on tensor cores: each row of a batch of 256 and of 4096
//!    (and of a batched product with another layout) bit-identical to the row alone, every
//!    kernel the product may take giving the same bits, results within bf16 rounding of an f32
//!    product, and its TFLOPS beside cuBLAS's (candle's bf16 matmul); the invariant softmax in
//!    one kernel giving the bits of its ops.

use crate::cuda::read_all;
use crate::hash::data_hash as host_data_hash;
use crate::record::device::{data_hash as gpu_data_hash, DeviceBatch, Resolved};
use candle_core::{DType, Device, Tensor};
use std::time::Instant;

/// What the check says as it goes: a line of its report, or a mismatch (a failed check).
pub enum Finding {
    /// A line of the report (a result, or a table row).
    Line(String),
    /// What did not match.
    Mismatch(String),
}

/// Which parts to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuParts {
    /// GPU hashing against the host's, and its throughput (1 to 4).
    pub hashing: bool,
    /// The batch-invariant bf16 product on tensor cores (5).
    pub tensor_core: bool,
}

/// Runs the checks and benchmarks of `parts` on `device`, telling `report` each finding as it
/// comes (the whole check takes minutes); returns the number of checks that failed.
pub fn gpu_check(
    device: &Device,
    parts: GpuParts,
    report: &mut dyn FnMut(Finding),
) -> Result<usize, Box<dyn std::error::Error>> {
    let mut failures = 0;
    if parts.hashing {
        failures += check(device, report)? + check_lagging(device, report)? + check_large_steps(device, report)?;
        bench(device, report)?;
    }
    if parts.tensor_core {
        failures += check_tensor_core(device, report)?;
        bench_tensor_core(device, report)?;
    }
    Ok(failures)
}

/// Hashes on the GPU and on the host; returns the number of mismatches. Every case goes into
/// one batch, as a recording step's tensors do, and each is also hashed alone.
fn check(dev: &Device, report: &mut dyn FnMut(Finding)) -> Result<usize, Box<dyn std::error::Error>> {
    let Device::Cuda(cuda) = dev else { return Err("gpu-check needs a CUDA device".into()) };
    let dtypes =
        [DType::U8, DType::U32, DType::I16, DType::I32, DType::I64, DType::F16, DType::BF16, DType::F32, DType::F64];
    let byte_sizes = [0usize, 8, 1016, 1024, 1032, 2048, 2056, 3072, 4096 + 8, 65_536, 1_048_576 + 8, (64 << 20) + 24];
    // Above 64 MiB, for one narrow and one wide dtype (all dtypes would take GiBs).
    let large = [(DType::BF16, (160usize << 20) + 24), (DType::F32, (320 << 20) + 8)];
    let mut cases: Vec<(String, Tensor)> = Vec::new();
    for dtype in dtypes {
        let size = dtype.size_in_bytes();
        for bytes in byte_sizes {
            let n = bytes / size;
            let data: Vec<u8> = (0..n * size).map(|i| (i.wrapping_mul(2654435761) >> 7) as u8).collect();
            let gpu = Tensor::from_raw_buffer(&data, dtype, &[n], &Device::Cpu)?.to_device(dev)?;
            // The whole tensor, and a view starting one element in (unaligned for small dtypes).
            cases.push((format!("{dtype:?} {bytes} B"), gpu.clone()));
            cases.push((format!("{dtype:?} {bytes} B from element 1"), gpu.narrow(0, n.min(1), n - n.min(1))?));
        }
        // Views read through their strides: transposed, broadcast, narrowed columns, permuted.
        // Cast on the host: candle's CUDA casts do not cover every pair of dtypes.
        let m = Tensor::arange(0u32, 96 * 80, &Device::Cpu)?.to_dtype(dtype)?.reshape((96, 80))?.to_device(dev)?;
        cases.push((format!("{dtype:?} [96, 80] transposed"), m.t()?));
        cases.push((format!("{dtype:?} row broadcast to [64, 80]"), m.narrow(0, 3, 1)?.broadcast_as((64, 80))?));
        cases.push((format!("{dtype:?} columns 7..57"), m.narrow(1, 7, 50)?));
        cases.push((format!("{dtype:?} [8, 12, 80] permuted"), m.reshape((8, 12, 80))?.permute((2, 0, 1))?));
    }
    for (dtype, bytes) in large {
        let n = bytes / dtype.size_in_bytes();
        let t = Tensor::rand(0f32, 1f32, n, dev)?.to_dtype(dtype)?;
        cases.push((format!("{dtype:?} {} MiB", bytes >> 20), t.clone()));
        cases.push((format!("{dtype:?} {} MiB from element 1", bytes >> 20), t.narrow(0, 1, n - 1)?));
    }
    let mut batch = DeviceBatch::new(cuda.clone());
    for (_, tensor) in &cases {
        batch.push(tensor, true, false)?;
    }
    let batched = batch.resolve()?;
    let mut failures = 0;
    for ((label, tensor), in_batch) in cases.iter().zip(batched) {
        let expected = crate::record::with_canonical_bytes(tensor, host_data_hash)?;
        let in_batch = match in_batch {
            Resolved::DataHash(h) => h,
            Resolved::Bytes(bytes) => host_data_hash(&bytes),
            // This batch streams nothing: a value sent to a payload file counts as a mismatch.
            Resolved::InFile(_) => [0; 32],
        };
        let alone = gpu_data_hash(tensor)?;
        if in_batch != expected || alone != expected {
            failures += 1;
            report(Finding::Mismatch(format!(
                "{label} (in a batch: {}, alone: {})",
                in_batch == expected,
                alone == expected
            )));
        }
    }
    report(Finding::Line(format!(
        "GPU hash check: {} cases in one batch and alone, {failures} mismatches (all dtypes 0 B to 64 MiB, bf16 and \
         f32 to 320 MiB; aligned, offset, transposed, broadcast, narrowed and permuted views)",
        cases.len()
    )));
    Ok(failures)
}

/// Records a small gpt twice, once with the GPU held about 20 ms behind the host at every step;
/// returns the number of tensors whose hashes differ between the two traces.
fn check_lagging(dev: &Device, report: &mut dyn FnMut(Finding)) -> Result<usize, Box<dyn std::error::Error>> {
    use crate::record::{RecordOptions, Recorder};
    use crate::trace::{CapturePolicy, FullCapture, TraceReader};
    let config = crate::workloads::GptConfig { steps: 6, ..Default::default() };
    let dir = tempfile::tempdir()?;
    let capture = CapturePolicy { full: FullCapture::None, ..CapturePolicy::default() };
    let mut traces = Vec::new();
    for lag in [false, true] {
        let path = dir.path().join(if lag { "lagging" } else { "steady" });
        let mut options = RecordOptions::capture(capture.clone());
        if lag {
            // Asked at the start of every step, on the training thread: queues ~20 ms of work
            // ahead of the step's own kernels.
            let m = Tensor::ones((2048, 2048), DType::F32, dev)?;
            options = options.recording_only(move |_| {
                for _ in 0..64 {
                    let _ = m.matmul(&m);
                }
                true
            });
        }
        let mut recorder = Recorder::create(&path, config.run_config(), dev, options)?;
        config.run(crate::workloads::Training::on(dev, &mut recorder))?;
        recorder.finish()?;
        let mut reader = TraceReader::open(&path)?;
        let mut hashes = Vec::new();
        while let Some(step) = reader.next_step()? {
            hashes.extend(step.tensors.into_iter().map(|t| (step.step, t.name, t.hash)));
        }
        traces.push(hashes);
    }
    let (steady, lagging) = (&traces[0], &traces[1]);
    let mut differing = steady.iter().zip(lagging).filter(|(a, b)| a != b).count();
    differing += steady.len().abs_diff(lagging.len());
    if let Some((a, _)) = steady.iter().zip(lagging).find(|(a, b)| a != b) {
        report(Finding::Mismatch(format!("while the GPU lags: first at step {}, tensor `{}`", a.0, a.1)));
    }
    report(Finding::Line(format!(
        "Recording while the GPU lags behind the host: {} tensors of a {}-step gpt, {differing} differ from a steady run",
        steady.len(),
        config.steps
    )));
    Ok(differing)
}

/// Records three steps of `STEP_GIB` GiB of tensors each (hashes only) through a recorder,
/// whose trace writer gives the step's device buffers back on its own thread; returns the
/// number of recorded hashes that differ from the host's (or fails, as recording did when a
/// buffer larger than the pool keeps was freed on that thread).
fn check_large_steps(dev: &Device, report: &mut dyn FnMut(Finding)) -> Result<usize, Box<dyn std::error::Error>> {
    use crate::record::{RecordOptions, Recorder};
    use crate::trace::{CapturePolicy, FullCapture, RunConfig, TensorKind, TraceReader};
    const STEP_GIB: usize = 3;
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("large");
    let capture = CapturePolicy { full: FullCapture::None, ..CapturePolicy::default() };
    let run = RunConfig { workload: "gpu-check".into(), steps: Some(3), params: Default::default() };
    let mut recorder = Recorder::create(&path, run, dev, RecordOptions::capture(capture))?;
    let mut expected = Vec::new();
    for step in 0..3u64 {
        let mut s = recorder.step(step);
        for k in 0..STEP_GIB {
            // 1 GiB a tensor, a different one every step.
            let t = (Tensor::rand(0f32, 1f32, 1usize << 28, dev)? + step as f64)?;
            s.record(&format!("t{k}"), TensorKind::Activation, &t)?;
            let host = t.to_device(&Device::Cpu)?;
            expected.push(crate::record::with_canonical_bytes(&host, |b| {
                crate::hash::tensor_hash(crate::dtype::DType::F32, &[1u64 << 28], b)
            })?);
        }
        s.finish()?;
    }
    recorder.finish()?;
    let mut reader = TraceReader::open(&path)?;
    let mut recorded = Vec::new();
    while let Some(step) = reader.next_step()? {
        recorded.extend(step.tensors.into_iter().map(|t| t.hash));
    }
    let differing =
        expected.iter().zip(&recorded).filter(|(a, b)| a != b).count() + expected.len().abs_diff(recorded.len());
    report(Finding::Line(format!(
        "Recording steps of {STEP_GIB} GiB: {} tensors in 3 steps, {differing} hashes differ from the host's",
        expected.len()
    )));
    Ok(differing)
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

fn bench(dev: &Device, report: &mut dyn FnMut(Finding)) -> Result<(), Box<dyn std::error::Error>> {
    report(Finding::Line(
        "\n| tensor | GPU BLAKE3 (canonical hash) | device memory read | hash / read | host BLAKE3, same bytes |"
            .to_string(),
    ));
    report(Finding::Line("|---|---|---|---|---|".to_string()));
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
        report(Finding::Line(format!(
            "| {label} | {:.0} GB/s | {:.0} GB/s | {:.0}% | {:.1} GB/s |",
            gb(hash, bytes),
            gb(read, bytes),
            100.0 * read / hash,
            gb(host, bytes)
        )));
    }
    // A step's worth of 64 MiB tensors (a large model's weight matrices and activations),
    // hashed in one batch as the recorder does.
    let (count, bytes) = (16usize, 64usize << 20);
    let tensors =
        (0..count).map(|_| Tensor::rand(0f32, 1f32, bytes / 4, dev)).collect::<candle_core::Result<Vec<_>>>()?;
    let Device::Cuda(cuda) = dev else { return Err("gpu-check needs a CUDA device".into()) };
    let hash = median_seconds(dev, 21, || {
        let mut batch = DeviceBatch::new(cuda.clone());
        for t in &tensors {
            batch.push(t, true, false)?;
        }
        batch.resolve().map(|_| ())
    })?;
    let read = median_seconds(dev, 21, || tensors.iter().try_for_each(read_all))?;
    let total = count * bytes;
    report(Finding::Line(format!(
        "| {count} x 64 MiB, one batch | {:.0} GB/s | {:.0} GB/s | {:.0}% | |",
        total as f64 / hash / 1e9,
        total as f64 / read / 1e9,
        100.0 * read / hash
    )));
    Ok(())
}

/// The tensor-core product's batch invariance and accuracy; returns the number of failures.
fn check_tensor_core(dev: &Device, report: &mut dyn FnMut(Finding)) -> Result<usize, Box<dyn std::error::Error>> {
    use crate::ops::invariant::matmul;
    let bf16 = |dims: &[usize], seed: f64| -> candle_core::Result<Tensor> {
        let n: usize = dims.iter().product();
        let v: Vec<f32> = (0..n).map(|i| ((i as f64 * 0.618 + seed).fract() * 2.0 - 1.0) as f32).collect();
        Tensor::from_vec(v, dims, &Device::Cpu)?.to_dtype(DType::BF16)?.to_device(dev)
    };
    let bits = |t: &Tensor| -> candle_core::Result<Vec<u16>> {
        Ok(t.flatten_all()?.to_vec1::<half::bf16>()?.iter().map(|v| v.to_bits()).collect())
    };
    let mut failures = 0;
    // A linear layer's product (K not a multiple of 8 or of the tile), rows alone and in a
    // batch: of 256, and of 4096, enough rows for tiles of two warpgroups (on Hopper, a product
    // of few rows takes tiles of one). Then batched, with the second operand's N contiguous (attention's
    // values): every batch entry alone against the batch of 8.
    let (k, n) = (1000, 1030);
    let w = bf16(&[n, k], 0.1)?;
    let (x, tall) = (bf16(&[256, k], 0.3)?, bf16(&[4096, k], 0.9)?);
    let (q, v) = (bf16(&[8, 70, 136], 0.5)?, bf16(&[8, 136, 64], 0.7)?);
    let cases: [(&Tensor, &Tensor, &[usize], &str); 3] = [
        (&x, &w.t()?, &[0, 1, 127, 128, 200, 255], "row {} of a batch of 256"),
        (&tall, &w.t()?, &[0, 1, 127, 128, 2049, 4095], "row {} of a batch of 4096"),
        (&q, &v, &[0, 3, 7], "batch entry {} of 8"),
    ];
    for (a, b, parts, what) in cases {
        let all = matmul(a, b)?;
        for &p in parts {
            // Batched operands are taken entry by entry, a shared one whole.
            let b_part = if b.rank() == 3 { b.narrow(0, p, 1)? } else { b.clone() };
            let alone = matmul(&a.narrow(0, p, 1)?, &b_part)?;
            if bits(&alone)? != bits(&all.narrow(0, p, 1)?)? {
                failures += 1;
                let what = what.replace("{}", &p.to_string());
                report(Finding::Mismatch(format!("tensor-core product: {what} differs from it alone")));
            }
        }
    }
    // The invariant softmax in one kernel (a pass that keeps no graph) against its ops, with
    // masked (-inf) entries, rows shorter and longer than a warp, in f32 and bf16.
    let mut softmax_differs = 0;
    for cols in [1usize, 7, 32, 33, 100, 1000, 2048] {
        let rows = 37;
        let v: Vec<f32> = (0..rows * cols)
            .map(|i| {
                if i % 11 == 5 && i % cols != 0 {
                    f32::NEG_INFINITY
                } else {
                    ((i as f64 * 0.618).fract() * 16.0 - 8.0) as f32
                }
            })
            .collect();
        let x = Tensor::from_vec(v, (rows, cols), &Device::Cpu)?.to_device(dev)?;
        for dtype in [DType::F32, DType::BF16] {
            let x = x.to_dtype(dtype)?;
            let as_bits = |t: &Tensor| -> candle_core::Result<Vec<u32>> {
                Ok(t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?.iter().map(|v| v.to_bits()).collect())
            };
            let fused = crate::ops::invariant::softmax_last_dim(&x)?;
            if as_bits(&fused)? != as_bits(&crate::ops::invariant::softmax_last_dim_ops(&x)?)? {
                softmax_differs += 1;
                failures += 1;
                report(Finding::Mismatch(format!(
                    "invariant softmax: one kernel gives other bits than its ops ({dtype:?}, {rows} x {cols})"
                )));
            }
        }
    }
    report(Finding::Line(format!(
        "Invariant softmax in one kernel: the same bits as its ops in f32 and bf16, rows of 1 to 2048: {}",
        if softmax_differs == 0 { "yes" } else { "NO" }
    )));
    // Within bf16 rounding of the product computed in f32.
    for (a, b, label) in [(&x, &w.t()?, "linear"), (&tall, &w.t()?, "linear, 4096 rows"), (&q, &v, "batched")] {
        let ours = matmul(a, b)?.to_dtype(DType::F32)?;
        let exact = a.to_dtype(DType::F32)?.matmul(&b.to_dtype(DType::F32)?)?;
        let err = (&ours - &exact)?.abs()?.max_all()?.to_scalar::<f32>()?;
        let scale = exact.abs()?.max_all()?.to_scalar::<f32>()?;
        let ok = err <= scale * 2f32.powi(-7);
        failures += usize::from(!ok);
        report(Finding::Line(format!(
            "Tensor-core product ({label}): max |error| {err:.3e} against an f32 product of largest magnitude {scale:.3e} ({})",
            if ok { "within bf16 rounding" } else { "MISMATCH: beyond bf16 rounding" }
        )));
    }
    // Every kernel the product may take on this GPU (other tiles, another depth of K slice in
    // shared memory): the same sums, so the same bits.
    let kernels = crate::ops::matmul_bf16_variants(dev)?;
    for (m, k, n) in [(1, 4096, 4096), (64, 4096, 4096), (300, 1016, 1030), (4096, 4096, 4096)] {
        let (a, w) = (bf16(&[m, k], 0.2)?, bf16(&[n, k], 0.4)?);
        let ours: Vec<Vec<u16>> = (0..kernels.len())
            .map(|v| bits(&crate::ops::matmul_bf16_variant(&a, &w.t()?, v)?))
            .collect::<candle_core::Result<_>>()?;
        if let Some(v) = ours.iter().position(|b| b != &ours[0]) {
            failures += 1;
            report(Finding::Mismatch(format!(
                "tensor-core product {m} x {k} x {n}: {} gives other bits than {}",
                kernels[v], kernels[0]
            )));
        }
    }
    report(Finding::Line(format!(
        "Tensor-core product: rows of batches of 256 and 4096 and entries of a batch of 8 bit-identical to each \
         alone, and the same bits from every kernel ({}): {}",
        kernels.join(", "),
        if failures == 0 { "yes" } else { "NO" }
    )));
    Ok(failures)
}

/// TFLOPS of the tensor-core product beside cuBLAS's, on square products, a large model's
/// linear layers (GPT-2-medium's width at 64 sequences of 1,024 tokens) and few rows (decoding);
/// then of every kernel the product may take, on the shapes where the choice matters.
fn bench_tensor_core(dev: &Device, report: &mut dyn FnMut(Finding)) -> Result<(), Box<dyn std::error::Error>> {
    use crate::ops::invariant::matmul;
    let operands = |m: usize, k: usize, n: usize| -> candle_core::Result<(Tensor, Tensor)> {
        let a = Tensor::rand(-1f32, 1f32, (m, k), dev)?.to_dtype(DType::BF16)?;
        let w = Tensor::rand(-1f32, 1f32, (n, k), dev)?.to_dtype(DType::BF16)?;
        Ok((a, w))
    };
    let reps = 21;
    report(Finding::Line(
        "\n| bf16 product (M x K x N) | batch-invariant (tensor cores) | its kernel | cuBLAS | invariant / cuBLAS time |"
            .to_string(),
    ));
    report(Finding::Line("|---|---|---|---|---|".to_string()));
    for (m, k, n) in [
        (4096, 4096, 4096),
        (8192, 8192, 8192),
        (65_536, 1024, 4096),
        (65_536, 4096, 1024),
        (1024, 4096, 4096),
        (256, 4096, 4096),
        (64, 4096, 4096),
        (1, 4096, 4096),
        (1, 2048, 8192),
    ] {
        let (a, w) = operands(m, k, n)?;
        let wt = w.t()?;
        let ours = median_seconds(dev, reps, || matmul(&a, &wt).map(|_| ()))?;
        let cublas = median_seconds(dev, reps, || a.matmul(&wt).map(|_| ()))?;
        report(Finding::Line(format!(
            "| {m} x {k} x {n} | {} | {} | {} | {:.2}x |",
            rate(m, k, n, ours),
            crate::ops::matmul_bf16_chosen(dev, m, n)?,
            rate(m, k, n, cublas),
            ours / cublas
        )));
    }
    let kernels = crate::ops::matmul_bf16_variants(dev)?;
    report(Finding::Line(format!("\n| bf16 product (M x K x N) | {} |", kernels.join(" | "))));
    report(Finding::Line(format!("|---|{}", "---|".repeat(kernels.len()))));
    for (m, k, n) in [(1, 4096, 4096), (64, 4096, 4096), (256, 4096, 4096), (1024, 4096, 4096), (4096, 4096, 4096)] {
        let (a, w) = operands(m, k, n)?;
        let wt = w.t()?;
        let mut row = format!("| {m} x {k} x {n} |");
        for v in 0..kernels.len() {
            let secs = median_seconds(dev, reps, || crate::ops::matmul_bf16_variant(&a, &wt, v).map(|_| ()))?;
            row += &format!(" {} |", rate(m, k, n, secs));
        }
        report(Finding::Line(row));
    }
    Ok(())
}

/// A product's rate, and its time where that says more (a product of few rows).
fn rate(m: usize, k: usize, n: usize, secs: f64) -> String {
    let tflops = 2.0 * (m * k * n) as f64 / secs / 1e12;
    if tflops < 10.0 {
        format!("{tflops:.2} TFLOPS ({:.1} us)", secs * 1e6)
    } else {
        format!("{tflops:.0} TFLOPS")
    }
}
