//! Opt-in timing of the recorder's own work (`REPRO_PROFILE=1`): how long recording spends
//! walking captured graphs, queueing tensors, launching the device's hashing, waiting for its
//! results and writing the trace, summed over the run and printed to stderr when the recorder
//! finishes. Work on the recorder's worker thread (a captured graph's walk, queueing and
//! planning) is counted too, although it runs beside training; the training thread's wait for
//! it is its own phase. For finding where a recorded step's extra time goes; off, it costs one
//! flag check per phase.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

/// A part of the recorder's work.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Phase {
    /// Walking a captured graph and naming its nodes.
    Graph,
    /// Queueing tensors: host hashing, device hash jobs, host copies.
    Queue,
    /// Planning the device's hashing of queued tensors (host arithmetic, on any thread).
    Plan,
    /// Launching the device's hashing kernels and the copy of their results.
    Launch,
    /// Running the queued device work and reading its results back.
    Resolve,
    /// Putting a step's device results into its records (hashing the values read back).
    Fill,
    /// Validating, encoding and writing a step's records and payloads.
    Write,
    /// The training thread waiting for the step's work on the recorder's worker thread.
    Join,
    /// Everything the calling (training) thread spends inside recording calls, the phases
    /// above that run on it included: the host time recording takes from training.
    Calls,
}

const PHASES: [(Phase, &str); 9] = [
    (Phase::Graph, "graph walk"),
    (Phase::Queue, "queue"),
    (Phase::Plan, "plan"),
    (Phase::Launch, "launch"),
    (Phase::Resolve, "device resolve"),
    (Phase::Fill, "fill"),
    (Phase::Write, "write"),
    (Phase::Join, "waiting for the worker"),
    (Phase::Calls, "training thread in recording calls (all of its phases)"),
];

static NANOS: [AtomicU64; 9] = [const { AtomicU64::new(0) }; 9];

fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("REPRO_PROFILE").is_some_and(|v| v != "0"))
}

/// Runs `f`, adding its wall time to `phase` when profiling is on.
pub(crate) fn time<R>(phase: Phase, f: impl FnOnce() -> R) -> R {
    if !enabled() {
        return f();
    }
    let started = Instant::now();
    let result = f();
    NANOS[phase as usize].fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
    result
}

/// Prints and resets the totals, per step of `steps`, when profiling is on.
pub(crate) fn report(steps: u64) {
    if !enabled() || steps == 0 {
        return;
    }
    let parts: Vec<String> = PHASES
        .iter()
        .map(|(phase, name)| {
            let nanos = NANOS[*phase as usize].swap(0, Ordering::Relaxed);
            format!("{name} {:.3} ms", nanos as f64 / 1e6 / steps as f64)
        })
        .collect();
    eprintln!("repro profile, per step over {steps} steps: {}", parts.join(", "));
}
