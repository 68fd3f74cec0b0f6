//! A rank started by the cluster's launcher instead of by repro: its place in the run as the
//! launcher passes it through the environment.
//!
//! | launcher | rank | world size | local rank |
//! |---|---|---|---|
//! | torchrun (and anything that sets the same) | `RANK` | `WORLD_SIZE` | `LOCAL_RANK` |
//! | Slurm's `srun` | `SLURM_PROCID` | `SLURM_NTASKS` | `SLURM_LOCALID` |
//! | Open MPI's `mpirun` | `OMPI_COMM_WORLD_RANK` | `OMPI_COMM_WORLD_SIZE` | `OMPI_COMM_WORLD_LOCAL_RANK` |
//!
//! The ranks meet at `MASTER_ADDR:MASTER_PORT` (torchrun sets them; a Slurm or MPI job script
//! exports them, docs/distributed.md), where rank 0 listens (`tcp`). Under torchrun, whose own
//! store holds `MASTER_PORT`, they meet at the next port; `REPRO_MASTER_PORT` chooses another.
//! With `REPRO_RENDEZVOUS_DIR`, a directory every rank reaches (a shared file system), they meet
//! there instead, through files, and need no address.

use crate::record::RecordError;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

/// How long ranks wait for each other at the rendezvous, unless `REPRO_RENDEZVOUS_TIMEOUT`
/// (seconds) says otherwise.
pub const RENDEZVOUS_TIMEOUT: Duration = Duration::from_secs(300);

/// One rank's place in a run, from its launcher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchedRank {
    /// This rank, from 0.
    pub rank: usize,
    /// Number of ranks.
    pub world_size: usize,
    /// This rank's index on its node: which GPU it takes.
    pub local_rank: usize,
    /// Where rank 0 listens, `HOST:PORT` (empty when the ranks meet in `rendezvous_dir`).
    pub master: String,
    /// A directory every rank reaches, where the ranks meet through files instead of TCP.
    pub rendezvous_dir: Option<std::path::PathBuf>,
    /// Which launcher's variables gave it (`torchrun`, `slurm`, `mpirun`).
    pub launcher: &'static str,
    /// How long to wait for the other ranks.
    pub timeout: Duration,
}

/// The launchers' variable names: (launcher, rank, world size, local rank).
const LAUNCHERS: [(&str, &str, &str, &str); 3] = [
    ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"),
    ("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
    ("mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
];

impl LaunchedRank {
    /// This process's place, when a launcher started it (`None` otherwise).
    pub fn from_env() -> Result<Option<Self>, RecordError> {
        Self::from_vars(|name| std::env::var_os(name))
    }

    /// The place the variables `var` gives: the first launcher whose rank and world size are
    /// both set decides; a value that does not parse, a rank outside the world, or a missing
    /// meeting point is an error naming the variable.
    pub fn from_vars(var: impl Fn(&str) -> Option<OsString>) -> Result<Option<Self>, RecordError> {
        let text = |name: &str| var(name).map(|v| v.to_string_lossy().into_owned()).filter(|v| !v.is_empty());
        let number = |name: &str| -> Result<Option<usize>, RecordError> {
            match text(name) {
                None => Ok(None),
                Some(v) => v.trim().parse().map(Some).map_err(|_| {
                    RecordError::Unsupported(format!("{name}={v} is not a rank or a count: expected a whole number"))
                }),
            }
        };
        for (launcher, rank_var, world_var, local_var) in LAUNCHERS {
            let (Some(rank), Some(world_size)) = (number(rank_var)?, number(world_var)?) else { continue };
            if world_size == 0 || rank >= world_size {
                return Err(RecordError::Unsupported(format!(
                    "{rank_var}={rank} is not a rank of {world_var}={world_size} ranks"
                )));
            }
            let timeout = match number("REPRO_RENDEZVOUS_TIMEOUT")? {
                Some(seconds) => Duration::from_secs(seconds as u64),
                None => RENDEZVOUS_TIMEOUT,
            };
            let local_rank = number(local_var)?.unwrap_or(0);
            if let Some(dir) = text("REPRO_RENDEZVOUS_DIR") {
                return Ok(Some(LaunchedRank {
                    rank,
                    world_size,
                    local_rank,
                    master: String::new(),
                    rendezvous_dir: Some(dir.into()),
                    launcher,
                    timeout,
                }));
            }
            let (addr, port) = (text("MASTER_ADDR"), text("MASTER_PORT"));
            let (Some(addr), Some(port)) = (addr, port) else {
                return Err(RecordError::Unsupported(format!(
                    "{launcher} started this rank ({rank_var}={rank}), but MASTER_ADDR and MASTER_PORT do not say \
                     where the ranks meet: export them in the job script, or REPRO_RENDEZVOUS_DIR, a directory \
                     every rank reaches (docs/distributed.md)"
                )));
            };
            let port: u16 = port
                .trim()
                .parse()
                .map_err(|_| RecordError::Unsupported(format!("MASTER_PORT={port} is not a port number")))?;
            // torchrun's agent keeps its own store on MASTER_PORT: meet beside it.
            let port = match text("REPRO_MASTER_PORT") {
                Some(p) => p
                    .trim()
                    .parse()
                    .map_err(|_| RecordError::Unsupported(format!("REPRO_MASTER_PORT={p} is not a port number")))?,
                None if text("TORCHELASTIC_RUN_ID").is_some() => port.checked_add(1).ok_or_else(|| {
                    RecordError::Unsupported(format!(
                        "MASTER_PORT={port}: under torchrun repro meets on the next port; set REPRO_MASTER_PORT"
                    ))
                })?,
                None => port,
            };
            return Ok(Some(LaunchedRank {
                rank,
                world_size,
                local_rank,
                master: format!("{addr}:{port}"),
                rendezvous_dir: None,
                launcher,
                timeout,
            }));
        }
        Ok(None)
    }
}

/// The settings every rank must share, by name (workload settings, capture policy, format).
pub type RunSettings = BTreeMap<String, String>;

/// The settings in which `theirs` differ from `mine`, as `key mine vs theirs` (`(unset)` where
/// one has none), for the error that refuses a rank.
pub(crate) fn settings_differences(mine: &RunSettings, theirs: &RunSettings) -> String {
    let keys: std::collections::BTreeSet<&String> = mine.keys().chain(theirs.keys()).collect();
    let show = |v: Option<&String>| v.map_or("(unset)", String::as_str).to_string();
    let differ: Vec<String> = keys
        .into_iter()
        .filter(|k| mine.get(*k) != theirs.get(*k))
        .map(|k| format!("{k} {} vs {}", show(mine.get(k)), show(theirs.get(k))))
        .collect();
    differ.join(", ")
}

/// Meets the other ranks of `place`'s run in `dir` (`REPRO_RENDEZVOUS_DIR`, new and empty for
/// each run): each rank leaves its settings there, waits for every other rank's, and refuses
/// the run when any differ, naming the rank and the settings.
pub(crate) fn meet_in_dir(dir: &Path, place: &LaunchedRank, settings: &RunSettings) -> Result<(), RecordError> {
    let fail = |what: String| RecordError::Collective(format!("rank {}: {what}", place.rank));
    std::fs::create_dir_all(dir).map_err(|e| fail(format!("cannot create {}: {e}", dir.display())))?;
    let file = |rank: usize| dir.join(format!("settings.rank-{rank}.json"));
    let tmp = dir.join(format!("settings.rank-{}.json.tmp", place.rank));
    let mine = serde_json::to_vec(settings).map_err(|e| fail(format!("cannot encode its settings: {e}")))?;
    std::fs::write(&tmp, &mine)
        .and_then(|()| std::fs::rename(&tmp, file(place.rank)))
        .map_err(|e| fail(format!("cannot write {}: {e}", file(place.rank).display())))?;
    let started = std::time::Instant::now();
    for rank in 0..place.world_size {
        let theirs = loop {
            match std::fs::read(file(rank)) {
                Ok(bytes) => break bytes,
                Err(_) if started.elapsed() < place.timeout => std::thread::sleep(Duration::from_millis(20)),
                Err(_) => {
                    let missing: Vec<String> =
                        (0..place.world_size).filter(|&r| !file(r).exists()).map(|r| r.to_string()).collect();
                    return Err(fail(format!(
                        "rank(s) {} never arrived in {} within {} s (world size {})",
                        missing.join(", "),
                        dir.display(),
                        place.timeout.as_secs(),
                        place.world_size
                    )));
                }
            }
        };
        let theirs: RunSettings = serde_json::from_slice(&theirs)
            .map_err(|e| fail(format!("{} is not a rank's settings: {e}", file(rank).display())))?;
        if &theirs != settings {
            return Err(fail(format!(
                "rank {rank} runs other settings ({}); every rank must run the same command",
                settings_differences(settings, &theirs)
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place(vars: &[(&str, &str)]) -> Result<Option<LaunchedRank>, RecordError> {
        LaunchedRank::from_vars(|name| vars.iter().find(|(n, _)| *n == name).map(|(_, v)| OsString::from(v)))
    }

    #[test]
    fn each_launcher_s_variables_give_the_rank_s_place() {
        let master = [("MASTER_ADDR", "10.0.0.1"), ("MASTER_PORT", "29500")];
        let torchrun = [&[("RANK", "3"), ("WORLD_SIZE", "8"), ("LOCAL_RANK", "1")][..], &master].concat();
        let r = place(&torchrun).unwrap().unwrap();
        assert_eq!(
            (r.rank, r.world_size, r.local_rank, r.master.as_str(), r.launcher),
            (3, 8, 1, "10.0.0.1:29500", "torchrun")
        );
        let slurm = [&[("SLURM_PROCID", "5"), ("SLURM_NTASKS", "6"), ("SLURM_LOCALID", "2")][..], &master].concat();
        assert_eq!(place(&slurm).unwrap().unwrap().launcher, "slurm");
        let mpi = [&[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "2")][..], &master].concat();
        let r = place(&mpi).unwrap().unwrap();
        assert_eq!((r.rank, r.local_rank, r.launcher), (0, 0, "mpirun"));
        assert_eq!(place(&master).unwrap(), None, "no launcher");
        // Under torchrun, beside its own store; REPRO_MASTER_PORT chooses.
        let torchrun = [&torchrun[..], &[("TORCHELASTIC_RUN_ID", "none")]].concat();
        assert_eq!(place(&torchrun).unwrap().unwrap().master, "10.0.0.1:29501");
        let chosen = [&torchrun[..], &[("REPRO_MASTER_PORT", "40000")]].concat();
        assert_eq!(place(&chosen).unwrap().unwrap().master, "10.0.0.1:40000");
        // A shared directory instead of an address.
        let shared =
            place(&[("RANK", "1"), ("WORLD_SIZE", "2"), ("REPRO_RENDEZVOUS_DIR", "/shared/meet")]).unwrap().unwrap();
        assert_eq!(shared.rendezvous_dir.as_deref(), Some(std::path::Path::new("/shared/meet")));
    }

    #[test]
    fn a_bad_place_is_refused_naming_the_variable() {
        let e = place(&[("RANK", "2"), ("WORLD_SIZE", "2")]).unwrap_err().to_string();
        assert!(e.contains("RANK=2 is not a rank of WORLD_SIZE=2"), "{e}");
        let e = place(&[("RANK", "0"), ("WORLD_SIZE", "2")]).unwrap_err().to_string();
        assert!(e.contains("MASTER_ADDR and MASTER_PORT"), "{e}");
        let e = place(&[("RANK", "x"), ("WORLD_SIZE", "2")]).unwrap_err().to_string();
        assert!(e.contains("RANK=x is not a rank"), "{e}");
        let e = place(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "99999")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("MASTER_PORT=99999"), "{e}");
    }
}
