//! Helpers to run the binary and make traces.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

pub fn repro(args: &[&str]) -> Run {
    repro_with_env(args, &[])
}

/// Runs repro with extra environment variables.
pub fn repro_with_env(args: &[&str], env: &[(&str, &str)]) -> Run {
    let out: Output = Command::new(env!("CARGO_BIN_EXE_repro"))
        .args(args)
        .envs(env.iter().copied())
        .env_remove("GITHUB_STEP_SUMMARY")
        .output()
        .expect("repro runs");
    Run {
        code: out.status.code().expect("repro exits normally, not by a signal"),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Records a small adder run (20 steps, batch 500) into `dir/name` with extra arguments.
pub fn record(dir: &Path, name: &str, extra: &[&str]) -> PathBuf {
    let out = dir.join(name);
    let out_s = out.to_str().unwrap().to_string();
    let mut args = vec!["record", "--workload", "adder", "--steps", "20", "--batch", "500", "--out", &out_s];
    args.extend_from_slice(extra);
    let run = repro(&args);
    assert_eq!(run.code, 0, "record failed: {}", run.stderr);
    out
}

/// Records a small gpt run (2 layers, width 32, 2 heads, context 16, batch 2, 3 steps) into
/// `dir/name` with full values at the steps `capture` names, plus extra arguments. The
/// configuration of the committed H100 gpt fixture.
pub fn record_small_gpt(dir: &Path, name: &str, capture: &str, extra: &[&str]) -> PathBuf {
    record_small_gpt_of_batch(dir, name, 2, capture, extra)
}

/// `record_small_gpt` with a batch of `batch` sequences.
pub fn record_small_gpt_of_batch(dir: &Path, name: &str, batch: usize, capture: &str, extra: &[&str]) -> PathBuf {
    let out = dir.join(name);
    let (out_s, batch) = (out.to_str().unwrap().to_string(), batch.to_string());
    let mut args = vec![
        "record",
        "--workload",
        "gpt",
        "--steps",
        "3",
        "--batch",
        &batch,
        "--context",
        "16",
        "--width",
        "32",
        "--heads",
        "2",
        "--capture",
        capture,
        "--out",
        &out_s,
    ];
    args.extend_from_slice(extra);
    let run = repro(&args);
    assert_eq!(run.code, 0, "record failed: {}", run.stderr);
    out
}

/// The example program `name`, which `cargo test` builds next to the binary's directory.
pub fn example(name: &str) -> PathBuf {
    let bin = Path::new(env!("CARGO_BIN_EXE_repro"));
    let example = bin.parent().unwrap().join("examples").join(name);
    assert!(example.exists(), "example not built at {}", example.display());
    example
}

pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

pub fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// The header of a trace a test writes by hand: `workload`, `steps`, default capture policy.
pub fn test_header(workload: &str, steps: u64) -> repro::trace::Header {
    repro::trace::Header {
        format: repro::trace::CURRENT_FORMAT,
        producer: "test".into(),
        run: repro::trace::RunConfig { workload: workload.into(), steps: Some(steps), params: Default::default() },
        environment: Default::default(),
        capture: repro::trace::CapturePolicy::default(),
        distributed: None,
        data_hash: Default::default(),
    }
}
