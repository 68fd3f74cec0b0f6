//! `make bench`: throughput and overhead figures for the core, printed as a Markdown table
//! (and written to target/bench/core.md). Not a test: numbers vary by machine.
//!
//! 1. Canonical hashing vs the blake3 crate's own multi-threaded hashing of the same bytes.
//! 2. Recording overhead: adder steps recording hashes only vs the same steps un-instrumented.
//! 3. Diff throughput on full-tensor traces, and the diff process's peak memory for a short and
//!    a long trace (it must not grow with trace length).
//! 4. Verifying a step of thousands of stored tensors.
//! 5. Writing full-value steps: the trace writer against the same bytes written to plain files
//!    and synced, which is what this machine's disk allows.

use repro::dtype::DType;
use repro::hash::tensor_hash;
use repro::record::{RecordOptions, Recorder};
use repro::trace::{
    CapturePolicy, Environment, FullCapture, Header, Payload, RunConfig, StepTensor, TensorKind, TensorRecord,
    TraceWriter, CURRENT_FORMAT,
};
use repro::workloads::{AdderConfig, Training};
use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

fn best_of<T>(runs: usize, mut f: impl FnMut() -> T) -> Duration {
    (0..runs)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(f());
            t.elapsed()
        })
        .min()
        .unwrap()
}

fn gbps(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e9
}

fn main() {
    // `core --peak-rss CMD ARGS...`: run CMD and print its peak RSS in MiB. The bench calls
    // itself this way so each measured process has a parent of its own.
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--peak-rss") {
        let status = Command::new(&args[2]).args(&args[3..]).stdout(std::process::Stdio::null()).status().unwrap();
        println!("{} {}", children_peak_rss_mib(), status.code().unwrap_or(-1));
        return;
    }
    let mut table = String::new();
    let threads = rayon::current_num_threads();
    writeln!(table, "| benchmark | size | repro | reference | ratio |").unwrap();
    writeln!(table, "|---|---|---|---|---|").unwrap();

    // 1. Hashing.
    for mib in [1usize, 64, 256] {
        let bytes: Vec<u8> = (0..mib << 20).map(|i| (i * 31 + 7) as u8).collect();
        let shape = [(bytes.len() / 4) as u64];
        let runs = if mib < 64 { 50 } else { 5 };
        let ours = best_of(runs, || tensor_hash(DType::F32, &shape, &bytes));
        let reference = best_of(runs, || blake3::Hasher::new().update_rayon(&bytes).finalize());
        let (a, b) = (gbps(bytes.len() as u64, ours), gbps(bytes.len() as u64, reference));
        writeln!(
            table,
            "| canonical hash vs blake3 update_rayon ({threads} threads) | {mib} MiB | {a:.2} GB/s | {b:.2} GB/s | {:.0}% |",
            100.0 * a / b
        )
        .unwrap();
    }

    // 2. Recording overhead on the adder (CPU).
    let config = AdderConfig { steps: 200, ..AdderConfig::default() };
    let dir = tempfile::tempdir().unwrap();
    let dir = if std::env::var_os("REPRO_BENCH_KEEP").is_some() { dir.keep() } else { dir.path().to_path_buf() };
    // Alternate the two, so warm-up and machine noise hit both alike; the fastest of each counts.
    let (mut plain, mut recorded) = (Duration::MAX, Duration::MAX);
    for _ in 0..5 {
        plain = plain
            .min(best_of(1, || config.run(Training::on(&candle_core::Device::Cpu, &mut Recorder::discard())).unwrap()));
        recorded = recorded.min(best_of(1, || {
            let capture = CapturePolicy { full: FullCapture::None, ..CapturePolicy::default() };
            let mut r = Recorder::create(
                dir.join("t"),
                config.run_config(),
                &candle_core::Device::Cpu,
                RecordOptions::capture(capture).replacing(true),
            )
            .unwrap();
            config.run(Training::on(&candle_core::Device::Cpu, &mut r)).unwrap();
            r.finish().unwrap()
        }));
    }
    let per_step = |d: Duration| d.as_secs_f64() * 1e3 / config.steps as f64;
    writeln!(
        table,
        "| adder step, per-op hashes-only recording vs un-instrumented | batch {} | {:.3} ms/step | {:.3} ms/step | {:+.1}% |",
        config.batch,
        per_step(recorded),
        per_step(plain),
        100.0 * (recorded.as_secs_f64() / plain.as_secs_f64() - 1.0)
    )
    .unwrap();

    // 3. Diff throughput and memory.
    let repro = env!("CARGO_BIN_EXE_repro");
    // REPRO_BENCH_HUGE=1 (`make bench-huge`) adds traces of 5 GiB of full tensors each.
    let mut lengths = vec![4u64, 16];
    if std::env::var_os("REPRO_BENCH_HUGE").is_some() {
        lengths.push(80);
    }
    for steps in lengths {
        let tensor_mib = 64;
        let a = dir.join(format!("big-a-{steps}"));
        let b = dir.join(format!("big-b-{steps}"));
        write_big_trace(&a, steps, tensor_mib, 0);
        write_big_trace(&b, steps, tensor_mib, 1);
        let started = Instant::now();
        let out = Command::new(std::env::current_exe().unwrap())
            .args(["--peak-rss", repro, "diff", a.to_str().unwrap(), b.to_str().unwrap()])
            .output()
            .unwrap();
        let elapsed = started.elapsed();
        let text = String::from_utf8_lossy(&out.stdout);
        let (rss, code) = text.trim().split_once(' ').expect("peak RSS and exit code");
        assert_eq!(code, "1", "diff should find the planted difference");
        let bytes = steps * (tensor_mib << 20) as u64 * 2;
        writeln!(
            table,
            "| diff, every element 1 ULP apart ({steps} steps x {tensor_mib} MiB each side) | {} MiB read | {:.2} GB/s | peak RSS {} MiB | |",
            bytes >> 20,
            gbps(bytes, elapsed),
            rss
        )
        .unwrap();
        if std::env::var_os("REPRO_BENCH_KEEP").is_none() {
            std::fs::remove_dir_all(&a).unwrap();
            std::fs::remove_dir_all(&b).unwrap();
        } else {
            eprintln!("kept {} and {}", a.display(), b.display());
        }
    }

    // 4. Reading a step of thousands of stored tensors: a 24-layer gpt whose two steps keep
    // every graph node (2,964 tensors a step), verified value by value. The payload's header is
    // parsed once per file (it once was once per tensor: 8.4 s for this trace).
    let many = dir.join("many-tensors");
    let recorded = Command::new(repro)
        .args(["record", "--workload", "gpt", "--layers", "24", "--width", "64", "--heads", "2", "--context", "32"])
        .args(["--batch", "4", "--steps", "2", "--capture", "all", "--force", "--out", many.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(recorded.status.success(), "{}", String::from_utf8_lossy(&recorded.stderr));
    let payload_bytes: u64 =
        std::fs::read_dir(many.join("tensors")).unwrap().map(|e| e.unwrap().metadata().unwrap().len()).sum();
    let started = Instant::now();
    let verified = Command::new(repro).args(["inspect", many.to_str().unwrap(), "--verify"]).output().unwrap();
    let elapsed = started.elapsed();
    assert!(verified.status.success(), "{}", String::from_utf8_lossy(&verified.stderr));
    writeln!(
        table,
        "| inspect --verify, 2 steps x 2,964 stored tensors (24-layer gpt) | {} MiB | {:.2} GB/s | {:.2} s | |",
        payload_bytes >> 20,
        gbps(payload_bytes, elapsed),
        elapsed.as_secs_f64()
    )
    .unwrap();

    // 5. Writing full-value steps (payloads synced step by step) against the disk.
    let (steps, mib) = (8u64, 128usize);
    let values: Vec<Vec<u8>> = (0..steps).map(|step| big_values(mib, step, 0)).collect();
    let bytes = steps * (mib << 20) as u64;
    // Alternated, best of five each: the speed of a disk that flushes earlier writes drifts.
    let (traced, plain) = (dir.join("writer"), dir.join("plain"));
    let (mut writer, mut disk) = (Duration::MAX, Duration::MAX);
    for _ in 0..5 {
        let stored: Vec<StepTensor> = values.iter().cloned().map(stored_step).collect();
        let started = Instant::now();
        write_steps(&traced, stored);
        writer = writer.min(started.elapsed());
        std::fs::remove_dir_all(&traced).unwrap();
        std::fs::create_dir_all(&plain).unwrap();
        let started = Instant::now();
        for (step, v) in values.iter().enumerate() {
            use std::io::Write as _;
            let mut file = std::fs::File::create(plain.join(format!("step-{step}"))).unwrap();
            file.write_all(v).unwrap();
            file.sync_all().unwrap();
        }
        disk = disk.min(started.elapsed());
        std::fs::remove_dir_all(&plain).unwrap();
    }
    writeln!(
        table,
        "| trace writer vs plain synced files, full values ({steps} steps x {mib} MiB) | {} MiB | {:.2} GB/s | {:.2} GB/s | {:.0}% |",
        bytes >> 20,
        gbps(bytes, writer),
        gbps(bytes, disk),
        100.0 * disk.as_secs_f64() / writer.as_secs_f64()
    )
    .unwrap();

    print!("{table}");
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("core.md"), &table).unwrap();
}

/// Writes a trace of `steps` steps, each with one F32 tensor of `mib` MiB stored in full;
/// `offset` ULPs are added to every element, so two traces with different offsets differ in
/// every element.
fn write_big_trace(dir: &Path, steps: u64, mib: usize, offset: u32) {
    write_trace(dir, (0..steps).map(|step| big_values(mib, step, offset)).collect());
}

/// `mib` MiB of F32 values for step `step`, each moved `offset` ULPs.
fn big_values(mib: usize, step: u64, offset: u32) -> Vec<u8> {
    (0..(mib << 20) / 4)
        .flat_map(|i| f32::from_bits(((i as f32 + step as f32) * 0.001 + 1.0).to_bits() + offset).to_le_bytes())
        .collect()
}

/// Writes a trace whose step k stores `steps[k]` in full, as one F32 tensor.
fn write_trace(dir: &Path, steps: Vec<Vec<u8>>) {
    write_steps(dir, steps.into_iter().map(stored_step).collect());
}

/// One step's tensor record (its hash computed) with its values as the payload.
fn stored_step(values: Vec<u8>) -> StepTensor {
    let shape = vec![values.len() as u64 / 4];
    let record = TensorRecord::of_bytes("activations", TensorKind::Activation, DType::F32, shape, &values);
    StepTensor { record, payload: Some(Payload::Bytes(values)) }
}

/// Writes a trace whose step k is `steps[k]`.
fn write_steps(dir: &Path, steps: Vec<StepTensor>) {
    let header = Header {
        format: CURRENT_FORMAT,
        producer: "repro bench".into(),
        run: RunConfig { workload: "bench".into(), steps: Some(steps.len() as u64), params: Default::default() },
        environment: Environment::default(),
        capture: CapturePolicy { full: FullCapture::All, inline_max_bytes: 0, ..CapturePolicy::default() },
        distributed: None,
        data_hash: Default::default(),
    };
    let mut w = TraceWriter::create(dir, &header, true).unwrap();
    for (step, tensor) in steps.into_iter().enumerate() {
        w.write_step(step as u64, vec![tensor]).unwrap();
    }
    w.finish().unwrap();
}

/// Peak resident set size of the largest finished child process, in MiB.
fn children_peak_rss_mib() -> u64 {
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) };
    usage.ru_maxrss as u64 / 1024
}
