//! The environment fingerprint written into every trace header, and device selection.

use super::error::RecordError;
use crate::trace::Environment;
use candle_core::Device;
use std::collections::BTreeMap;

/// Environment variables that change numerics (thread counts, cuBLAS workspaces, TF32, NCCL's
/// algorithm and protocol) and
/// are therefore recorded when set.
pub const NUMERICS_ENV_VARS: &[&str] = &[
    "CANDLE_GRAD_DO_NOT_DETACH",
    "CANDLE_NUM_THREADS",
    "CUBLAS_WORKSPACE_CONFIG",
    "CUDA_LAUNCH_BLOCKING",
    "CUDA_VISIBLE_DEVICES",
    // NCCL's reduction order and data paths (data-parallel runs).
    "NCCL_ALGO",
    "NCCL_BUFFSIZE",
    "NCCL_COLLNET_ENABLE",
    "NCCL_IB_DISABLE",
    "NCCL_MAX_CTAS",
    "NCCL_MAX_NCHANNELS",
    "NCCL_MIN_CTAS",
    "NCCL_MIN_NCHANNELS",
    "NCCL_NTHREADS",
    "NCCL_NVLS_ENABLE",
    "NCCL_P2P_DISABLE",
    "NCCL_PROTO",
    "NCCL_SHM_DISABLE",
    "NVIDIA_TF32_OVERRIDE",
    "OMP_NUM_THREADS",
    "RAYON_NUM_THREADS",
    TF32_ENV,
];

/// The variable candle's CPU backend takes its thread count from.
const RAYON_THREADS_ENV: &str = "RAYON_NUM_THREADS";

/// Whether this process set `RAYON_NUM_THREADS` itself (`pin_cpu_threads`).
static PINNED_RAYON_THREADS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Sets `RAYON_NUM_THREADS` to the thread count candle picks, when the user has not set it.
/// Without it, candle's CPU matrix product recomputes that count on every call, reading
/// `/proc/cpuinfo`: 435 times a step for a 24-layer gpt, which then records 1.6 to 1.9x slower.
/// Nothing else changes:
/// - candle's thread count is the value it would compute;
/// - rayon's global pool (repro's host hashing), which sizes itself from the same variable, is
///   built first, at its own default size;
/// - trace headers leave the variable out (`environment`);
/// - child processes get it removed (`user_environment`).
///
/// Call it first thing in `main`, before the process starts any thread.
pub fn pin_cpu_threads() {
    if std::env::var_os(RAYON_THREADS_ENV).is_some() {
        return;
    }
    let _ = rayon::current_num_threads();
    let threads = candle_core::utils::get_num_threads();
    // SAFETY: called at the start of `main`, before any thread that could read the environment
    // exists; rayon's pool threads, just started, never read it.
    unsafe { std::env::set_var(RAYON_THREADS_ENV, threads.to_string()) };
    PINNED_RAYON_THREADS.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Gives a child process the user's environment back where `pin_cpu_threads` changed it.
pub fn user_environment(command: &mut std::process::Command) {
    if PINNED_RAYON_THREADS.load(std::sync::atomic::Ordering::Relaxed) {
        command.env_remove(RAYON_THREADS_ENV);
    }
}

/// Set to `1` to let candle run f32 matrix products on tensor cores in TF32 (10-bit mantissa
/// inputs, f32 accumulation) on CUDA devices; anything else, or unset, keeps full f32. Recorded
/// in the trace's environment like the variables above, so `repro diff` shows it.
pub const TF32_ENV: &str = "REPRO_TF32";

/// Whether `REPRO_TF32` asks for TF32 matrix products.
pub fn tf32_requested() -> bool {
    std::env::var(TF32_ENV).is_ok_and(|v| v == "1")
}

/// The most memory the device's tensors (and the recorder's device buffers) held at once since
/// the last call, which starts the next span; `None` on the CPU. Drains nothing: call it with
/// the device synchronized for a figure that covers all the work queued so far.
pub fn take_peak_device_memory(device: &Device) -> Result<Option<u64>, RecordError> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(dev) = device {
        let peak = crate::cuda::take_peak_memory(dev)
            .map_err(|e| RecordError::Unsupported(format!("cannot read {device:?}'s peak memory: {e}")))?;
        return Ok(Some(peak));
    }
    let _ = device;
    Ok(None)
}

/// Opens a device from its name: `cpu`, `cuda` or `cuda:N`.
pub fn open_device(name: &str) -> Result<Device, RecordError> {
    if name == "cpu" {
        return Ok(Device::Cpu);
    }
    let ordinal = match name {
        "cuda" => Some(0),
        _ => name.strip_prefix("cuda:").and_then(|n| n.parse::<usize>().ok()),
    };
    let Some(ordinal) = ordinal else {
        return Err(RecordError::Unsupported(format!("unknown device `{name}`: expected cpu, cuda or cuda:N")));
    };
    if !candle_core::utils::cuda_is_available() {
        return Err(RecordError::Unsupported(format!(
            "device `{name}` needs a repro built with CUDA support (`make cuda`); this build is CPU-only"
        )));
    }
    let device = Device::new_cuda(ordinal).map_err(|e| RecordError::Unsupported(format!("cannot open {name}: {e}")))?;
    // candle's switch is process-wide; set it either way, so the variable alone decides.
    candle_core::cuda::set_gemm_reduced_precision_f32(tf32_requested());
    #[cfg(feature = "cuda")]
    if let Device::Cuda(dev) = &device {
        crate::cuda::keep_freed_memory(dev)
            .map_err(|e| RecordError::Unsupported(format!("cannot configure {name}'s memory pool: {e}")))?;
    }
    Ok(device)
}

/// The name a device is recorded under: `cpu` or `cuda:N`.
pub fn device_label(device: &Device) -> String {
    match device.location() {
        candle_core::DeviceLocation::Cpu => "cpu".into(),
        candle_core::DeviceLocation::Cuda { gpu_id } => format!("cuda:{gpu_id}"),
        candle_core::DeviceLocation::Metal { gpu_id } => format!("metal:{gpu_id}"),
    }
}

/// Collects the fingerprint of this process's environment for a run on `device`.
pub fn environment(device: &Device) -> Environment {
    let cpu_model = cpu_model();
    let device_name = match device {
        Device::Cpu => cpu_model.clone(),
        #[cfg(feature = "cuda")]
        Device::Cuda(cuda) => cuda
            .cuda_stream()
            .context()
            .name()
            .unwrap_or_else(|e| format!("{} (name unavailable: {e})", device_label(device))),
        _ => device_label(device),
    };
    // The user's environment: not the variable `pin_cpu_threads` set.
    let pinned = PINNED_RAYON_THREADS.load(std::sync::atomic::Ordering::Relaxed);
    let env: BTreeMap<String, String> = NUMERICS_ENV_VARS
        .iter()
        .filter(|&&k| !(pinned && k == RAYON_THREADS_ENV))
        .filter_map(|&k| std::env::var(k).ok().map(|v| (k.to_string(), printable(v))))
        .collect();
    Environment {
        repro_version: env!("CARGO_PKG_VERSION").into(),
        candle_version: env!("REPRO_CANDLE_VERSION").into(),
        device: device_label(device),
        device_name: printable(device_name),
        cpu_model: printable(cpu_model),
        os: format!("{} {}", std::env::consts::OS, std::env::consts::ARCH),
        rustc: env!("REPRO_RUSTC_VERSION").into(),
        threads: candle_core::utils::get_num_threads() as u64,
        env,
    }
}

/// `s` with any control character escaped (`\t`, `\u{1b}`): a trace holds printable strings
/// only (docs/trace-format.md), and what the machine reports is not ours to refuse.
fn printable(s: String) -> String {
    if s.chars().any(char::is_control) {
        s.escape_debug().to_string()
    } else {
        s
    }
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names_parse_or_explain() {
        assert!(matches!(open_device("cpu"), Ok(Device::Cpu)));
        let err = open_device("tpu").unwrap_err().to_string();
        assert!(err.contains("expected cpu, cuda or cuda:N"), "{err}");
        if !candle_core::utils::cuda_is_available() {
            let err = open_device("cuda:0").unwrap_err().to_string();
            assert!(err.contains("make cuda"), "{err}");
        }
    }

    #[test]
    fn fingerprint_records_set_numerics_variables_only() {
        let env = environment(&Device::Cpu);
        assert_eq!(env.device, "cpu");
        assert!(env.threads >= 1);
        for key in env.env.keys() {
            assert!(NUMERICS_ENV_VARS.contains(&key.as_str()));
        }
    }
}
