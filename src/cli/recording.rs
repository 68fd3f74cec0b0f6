//! A built-in workload recorded the way `gate` and `baseline write` compare runs: hashes at every
//! step, small tensors' values, full values where asked, on one device or on ranks of several.
//! Shared by those commands, which do not import each other.

use super::error::CliError;
use repro::record::{open_device, RecordOptions, Recorder};
use repro::trace::{CapturePolicy, FullCapture};
use repro::workloads::{Training, WorkloadRun};
use std::path::Path;

/// Records one run of a built-in workload into `dir` the way a gate compares runs: hashes at
/// every step, small tensors' values, and full values at the steps `full` names. With several
/// `devices`, the run is data-parallel, one rank per device; else it trains on `device`.
pub fn record_for_gate(
    planned: &WorkloadRun,
    dir: &Path,
    full: &FullCapture,
    devices: &[String],
    device: &str,
) -> Result<(), CliError> {
    let capture = CapturePolicy { full: full.clone(), ..CapturePolicy::default() };
    if devices.len() > 1 {
        return super::ranks::record_ranks(devices, dir, true, &capture, planned);
    }
    let device = open_device(devices.first().map_or(device, String::as_str))?;
    let options =
        RecordOptions { perturbation: planned.perturbation.clone(), ..RecordOptions::capture(capture).replacing(true) };
    let mut recorder = Recorder::create(dir, planned.run_config(), &device, options)?;
    planned.workload.run(Training::on(&device, &mut recorder))?;
    recorder.finish()?;
    Ok(())
}
