//! Starting and supervising the rank processes of a data-parallel recording: one `repro record`
//! per device, each writing `OUT/rank-N`. Their messages come through prefixed `[rank N]`; if
//! one fails or is killed, the others are stopped and the error names the rank and its cause.
//! Also the options that make a command data-parallel, shared by `record` and `overhead`.

use super::error::CliError;
use super::workload_args::WorkloadArgs;
use candle_core::Device;
use clap::Args;
use repro::distributed::{self, DataParallel, LaunchedRank, RunSettings};
use repro::trace::{rank_dir, CapturePolicy, RunConfig};
use repro::workloads::WorkloadRun;
use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// The options that make a command data-parallel: the devices, and, set by the process that
/// starts the ranks, the run's settings. A rank learns its place as a launcher's rank does,
/// from the environment (`RANK`, `WORLD_SIZE`, `REPRO_RENDEZVOUS_DIR`): `--devices` is the
/// one-host launcher, on the same path as torchrun's or Slurm's.
#[derive(Debug, Args)]
pub struct RankArgs {
    /// Train data-parallel, one rank process per device: cuda:0,cuda:1 sums gradients with NCCL;
    /// cpu,cpu with a file stand-in (for trying it out and for tests). A recording's --out then
    /// holds one trace per rank, rank-0, rank-1, ... (--device is not used).
    #[arg(long, value_delimiter = ',', value_name = "DEVICES")]
    pub devices: Vec<String>,
    /// Set by the process that starts the ranks: the run's settings (a trace header's `run`, as
    /// JSON), which every rank trains from.
    #[arg(long, hide = true)]
    pub settings: Option<PathBuf>,
}

impl RankArgs {
    /// Whether this process is to start the ranks: several devices, and no rank of its own.
    pub fn starts_ranks(&self) -> bool {
        self.devices.len() > 1 && LaunchedRank::from_env().ok().flatten().is_none()
    }

    /// The device this process trains on: its rank's, else the one listed, else `default`; a
    /// rank a launcher started takes `cuda` as its local rank's GPU (`cuda:LOCAL_RANK`).
    pub fn device(&self, default: &str) -> Result<String, CliError> {
        match self.launched()? {
            // A rank of `--devices`: its own device of the list.
            Some(place) if !self.devices.is_empty() => self
                .devices
                .get(place.rank)
                .cloned()
                .ok_or_else(|| format!("rank {} has no device in --devices", place.rank))
                .map_err(CliError::from),
            Some(place) if default == "cuda" => Ok(format!("cuda:{}", place.local_rank)),
            _ => Ok(self.devices.first().map_or(default, String::as_str).to_string()),
        }
    }

    /// This process's place in a run a launcher started: `--devices`, torchrun, srun or mpirun
    /// (`distributed::LaunchedRank`).
    pub fn launched(&self) -> Result<Option<LaunchedRank>, CliError> {
        Ok(LaunchedRank::from_env()?)
    }

    /// What this process trains: a rank's settings file, read as a trace header is
    /// (`WorkloadRun::from_run_config`), else the command line's workload.
    pub fn workload_run(&self, train: &WorkloadArgs) -> Result<WorkloadRun, CliError> {
        let Some(file) = &self.settings else { return train.workload_run() };
        let text = std::fs::read_to_string(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
        let run: RunConfig =
            serde_json::from_str(&text).map_err(|e| format!("{} is not a run's settings: {e}", file.display()))?;
        WorkloadRun::from_run_config(&run).map_err(|e| CliError::from(format!("{}: {e}", file.display())))
    }

    /// This rank's side of data-parallel training on `device`, when this process is a rank
    /// (started by `--devices` or by a launcher), meeting the others with the `planned` run's
    /// settings, which every rank must share.
    pub fn data_parallel(&self, device: &Device, planned: &RunSettings) -> Result<Option<DataParallel>, CliError> {
        match self.launched()? {
            Some(place) => Ok(Some(DataParallel::new(distributed::join_launched(device, &place, planned)?))),
            None => Ok(None),
        }
    }
}

/// Records a data-parallel run into `out`: one `repro record` process per device, each training
/// `workload` and storing full values at the steps `capture` names, supervised until all
/// finish. The workload, the devices and the batch against the number of ranks are checked
/// before any rank starts.
pub fn record_ranks(
    devices: &[String],
    out: &Path,
    force: bool,
    capture: &CapturePolicy,
    workload: &WorkloadRun,
) -> Result<(), CliError> {
    check_devices(devices)?;
    workload.workload.check_data_parallel()?;
    let run = workload.run_config();
    // Said before any rank starts, rather than by each rank, leaving partial streams behind.
    let batch = run.params.get("batch").and_then(|b| b.parse::<usize>().ok());
    if let Some(batch) = batch.filter(|b| !b.is_multiple_of(devices.len())) {
        return Err(format!(
            "the batch ({batch}) must be a positive multiple of the number of ranks ({}): each rank trains on an equal share",
            devices.len()
        ).into());
    }
    prepare_run_dir(out, force)?;
    let mut args = vec![
        "--capture".to_string(),
        capture.full.to_string(),
        "--inline-max-bytes".to_string(),
        capture.inline_max_bytes.to_string(),
    ];
    if force {
        args.push("--force".into());
    }
    supervise("record", devices, Some(out), &args, &run)
}

/// Checks a device list for data-parallel training: at least two, and no GPU twice.
pub fn check_devices(devices: &[String]) -> Result<(), CliError> {
    if devices.len() < 2 {
        return Err(
            format!("--devices needs at least two devices for data-parallel training, got {}", devices.len()).into()
        );
    }
    for (i, d) in devices.iter().enumerate() {
        if d != "cpu" && devices[..i].contains(d) {
            return Err(format!("--devices lists {d} twice: NCCL runs one rank per GPU").into());
        }
    }
    Ok(())
}

/// Checks the `--out` of a rank its launcher started, before it writes `out/rank-N` there: `out`
/// may hold other ranks' directories of the run, which arrive beside this one, but no trace of
/// its own and nothing else.
pub fn check_launched_out(out: &Path) -> Result<(), CliError> {
    if out.join("records.rpr").exists() {
        return Err(format!(
            "{} holds a single-device trace; a launched rank writes a rank-N trace of a run: choose another --out",
            out.display()
        )
        .into());
    }
    let Ok(entries) = std::fs::read_dir(out) else { return Ok(()) };
    let foreign = entries.filter_map(Result::ok).map(|e| e.file_name()).find(|name| {
        let name = name.to_string_lossy();
        name.strip_prefix("rank-").is_none_or(|r| r.parse::<u64>().is_err())
    });
    match foreign {
        Some(name) => Err(format!(
            "{} holds files that are not a repro run ({}); repro writes only into a new or empty directory",
            out.display(),
            name.to_string_lossy()
        )
        .into()),
        None => Ok(()),
    }
}

/// Prepares `out` for a run of rank directories: it must be new, empty, or (with `force`) hold
/// an earlier data-parallel run, whose rank streams the ranks then replace.
fn prepare_run_dir(out: &Path, force: bool) -> Result<(), CliError> {
    if out.join("records.rpr").exists() {
        return Err(format!(
            "{} holds a single-device trace; a data-parallel run is a directory of rank-N traces: choose another --out",
            out.display()
        )
        .into());
    }
    if out.is_dir() {
        let records = std::fs::metadata(rank_dir(out, 0).join("records.rpr")).ok();
        // Rank 0's record file too short for a preamble: an earlier start failed before
        // recording anything (a full disk), and its directories are replaced like an empty one.
        let holds_run = records.as_ref().is_some_and(|m| m.len() >= repro::trace::format::PREAMBLE_LEN as u64);
        let failed_start = records.is_some() && !holds_run;
        let empty = std::fs::read_dir(out).map_err(|e| format!("cannot read {}: {e}", out.display()))?.next().is_none();
        if holds_run && !force {
            return Err(format!("{} already holds a data-parallel run; --force replaces it", out.display()).into());
        }
        if !holds_run && !failed_start && !empty {
            return Err(format!(
                "{} holds files that are not a repro run; repro writes only into a new or empty directory",
                out.display()
            )
            .into());
        }
    }
    Ok(std::fs::create_dir_all(out).map_err(|e| format!("cannot create {}: {e}", out.display()))?)
}

/// Runs `repro COMMAND` once per device with `args` and the rank options, each training what
/// `settings` say (a file beside the rendezvous), and waits for all of them; with `out`, each
/// writes its rank directory of it (`--out OUT/rank-N`).
pub fn supervise(
    command_name: &str,
    devices: &[String],
    out: Option<&Path>,
    args: &[String],
    settings: &RunConfig,
) -> Result<(), CliError> {
    let ranks_dir = tempfile::Builder::new()
        .prefix("repro-ranks-")
        .tempdir()
        .map_err(|e| format!("cannot create a rendezvous directory: {e}"))?;
    // The ranks meet in an empty directory of their own, beside the settings.
    let rendezvous = ranks_dir.path().join("rendezvous");
    std::fs::create_dir(&rendezvous).map_err(|e| format!("cannot create {}: {e}", rendezvous.display()))?;
    let settings_file = ranks_dir.path().join("settings.json");
    let json = serde_json::to_string_pretty(settings).map_err(|e| format!("cannot encode the run's settings: {e}"))?;
    std::fs::write(&settings_file, json).map_err(|e| format!("cannot write {}: {e}", settings_file.display()))?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the repro executable: {e}"))?;
    let mut ranks = Vec::new();
    for rank in 0..devices.len() {
        let mut command = Command::new(&exe);
        repro::record::user_environment(&mut command);
        command.arg(command_name);
        // Each rank writes its own `OUT/rank-N`, as a launched rank does.
        if let Some(out) = out {
            command.arg("--out").arg(out);
        }
        // Each rank learns its place as a launcher's rank does: from the environment, meeting the
        // others in the rendezvous directory. Other launchers' variables are left out.
        for var in LAUNCHER_VARS {
            command.env_remove(var);
        }
        command
            .args(args)
            .arg("--devices")
            .arg(devices.join(","))
            .arg("--settings")
            .arg(&settings_file)
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", devices.len().to_string())
            .env("REPRO_RENDEZVOUS_DIR", &rendezvous)
            .stdin(Stdio::null())
            .stdout(Stdio::inherit())
            .stderr(Stdio::piped());
        super::supervise::die_with_this_process(&mut command);
        match command.spawn() {
            Ok(child) => ranks.push(RankProcess::watch(rank, child)),
            Err(e) => {
                stop_all(&mut ranks);
                return Err(format!("cannot start rank {rank} ({}): {e}", exe.display()).into());
            }
        }
    }
    let mut failure = None;
    while failure.is_none() && ranks.iter().any(|r| r.status.is_none()) {
        for rank in ranks.iter_mut().filter(|r| r.status.is_none()) {
            match rank.child.try_wait() {
                Ok(Some(status)) => {
                    rank.status = Some(status);
                    if !status.success() {
                        failure = Some(rank.rank);
                        break;
                    }
                }
                Ok(None) => {}
                Err(e) => return Err(format!("cannot watch rank {}: {e}", rank.rank).into()),
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let stopped: Vec<usize> = ranks.iter().filter(|r| r.status.is_none()).map(|r| r.rank).collect();
    stop_all(&mut ranks);
    let Some(failed) = failure else { return Ok(()) };
    let rank = &ranks[failed];
    let cause = rank.last_lines.lock().expect("rank output").iter().rev().find(|l| !l.trim().is_empty()).cloned();
    let mut message = format!("rank {failed} ({}) failed: {}", devices[failed], describe(rank.status.expect("exited")));
    if let Some(cause) = cause {
        message.push_str(&format!(": {}", cause.trim_start_matches("error: ")));
    }
    if !stopped.is_empty() {
        let list: Vec<String> = stopped.iter().map(usize::to_string).collect();
        message.push_str(&format!("; stopped rank(s) {}", list.join(", ")));
    }
    if let Some(out) = out {
        message.push_str(&format!("; the partial streams in {} are marked incomplete", out.display()));
    }
    Err(message.into())
}

fn describe(status: ExitStatus) -> String {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            return format!("killed by signal {signal}");
        }
    }
    match status.code() {
        Some(code) => format!("exit code {code}"),
        None => status.to_string(),
    }
}

/// Kills the ranks still running, waits for every rank, and lets their output drain.
fn stop_all(ranks: &mut [RankProcess]) {
    for rank in ranks.iter_mut() {
        if rank.status.is_none() {
            let _ = rank.child.kill();
        }
    }
    for rank in ranks.iter_mut() {
        if let Ok(status) = rank.child.wait() {
            rank.status.get_or_insert(status);
        }
        if let Some(forward) = rank.forward.take() {
            let _ = forward.join();
        }
    }
}

/// A running rank: its process, its exit once known, and its last lines of output.
struct RankProcess {
    rank: usize,
    child: Child,
    status: Option<ExitStatus>,
    last_lines: Arc<Mutex<VecDeque<String>>>,
    forward: Option<JoinHandle<()>>,
}

impl RankProcess {
    /// Forwards the child's stderr, line by line and prefixed with its rank, keeping the last
    /// lines for the error message should it fail.
    fn watch(rank: usize, mut child: Child) -> Self {
        let last_lines = Arc::new(Mutex::new(VecDeque::new()));
        let stderr = child.stderr.take().expect("piped stderr");
        let keep = last_lines.clone();
        let forward = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[rank {rank}] {line}");
                let mut keep = keep.lock().expect("rank output");
                if keep.len() == 8 {
                    keep.pop_front();
                }
                keep.push_back(line);
            }
        });
        RankProcess { rank, child, status: None, last_lines, forward: Some(forward) }
    }
}

/// The variables launchers set, which a rank process of `--devices` must not inherit.
const LAUNCHER_VARS: [&str; 13] = [
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "REPRO_MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
];

/// What every rank of a launched run must share: the workload's settings, the capture policy and
/// the trace format (a rank of another build of repro writes another).
pub fn run_settings(run: &RunConfig, capture: &CapturePolicy) -> RunSettings {
    let extra = [("capture", capture.full.to_string()), ("inline_max_bytes", capture.inline_max_bytes.to_string())];
    distributed::run_settings(run, &extra)
}
