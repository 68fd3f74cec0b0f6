//! Integration tests: each drives the real `repro` binary on real traces.

mod util;

/// Automatic graph capture: the gpt workload, named nodes, the leaf rule, missing gradients.
mod capture;
/// Data-parallel runs on CPU ranks: rank processes, replicas, world sizes.
mod distributed;
/// The determinism gate and baselines.
mod gate;
/// Traces recorded on a GPU, read and compared on the CPU.
mod gpu_fixtures;
/// The canonical hash against the checked-in test vectors.
mod hash_vectors;
/// Bad input: missing, truncated, corrupted, foreign and newer traces; bad arguments.
mod hostile;
/// Batch invariance: a sequence alone and in batches, op by op.
mod invariance;
/// A user's own program: record -- CMD through the environment contract, and bisect.
mod own_program;
/// Killed recorders, flipped bytes, concurrent recorders.
mod robustness;
/// Per-op recording: root cause, structural alignment, online comparison.
mod root_cause;
/// The multi-run studies (noise, devices, cost) and the classifier workloads.
mod study;
/// Stopping a program run with -- CMD: every process it started, and nothing else.
#[cfg(target_os = "linux")]
mod supervise;
/// record → diff → matrix → inspect on good traces.
mod workflow;
