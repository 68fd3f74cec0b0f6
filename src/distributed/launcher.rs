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

/// The most ranks a run may have: more than any cluster repro records on, and few enough that
/// what a rank keeps per rank stays small. A larger `WORLD_SIZE` is refused, not allocated.
pub const MAX_WORLD_SIZE: usize = 1 << 16;

/// The longest `REPRO_RENDEZVOUS_TIMEOUT` accepted: a week, in seconds.
pub const MAX_RENDEZVOUS_TIMEOUT_SECONDS: u64 = 7 * 24 * 3600;

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
    /// The launcher's id of this run (`TORCHELASTIC_RUN_ID`, `SLURM_JOB_ID`, ...; empty when it
    /// gives none), which every rank shares and a stranger does not: part of the TCP meeting's
    /// token.
    pub run_id: String,
}

/// Variables that name a launched run, in the order they are asked.
const RUN_IDS: [&str; 4] = ["REPRO_RUN_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "OMPI_MCA_orte_ess_jobid"];

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
            if world_size > MAX_WORLD_SIZE {
                return Err(RecordError::Unsupported(format!(
                    "{world_var}={world_size}: repro records runs of at most {MAX_WORLD_SIZE} ranks"
                )));
            }
            if world_size == 0 || rank >= world_size {
                return Err(RecordError::Unsupported(format!(
                    "{rank_var}={rank} is not a rank of {world_var}={world_size} ranks"
                )));
            }
            let timeout = match number("REPRO_RENDEZVOUS_TIMEOUT")? {
                Some(0) => {
                    return Err(RecordError::Unsupported("REPRO_RENDEZVOUS_TIMEOUT=0: give seconds, 1 or more".into()))
                }
                Some(seconds) if seconds as u64 > MAX_RENDEZVOUS_TIMEOUT_SECONDS => {
                    return Err(RecordError::Unsupported(format!(
                        "REPRO_RENDEZVOUS_TIMEOUT={seconds}: at most {MAX_RENDEZVOUS_TIMEOUT_SECONDS} seconds (a week)"
                    )))
                }
                Some(seconds) => Duration::from_secs(seconds as u64),
                None => RENDEZVOUS_TIMEOUT,
            };
            let local_rank = number(local_var)?.unwrap_or(0);
            let run_id = RUN_IDS.iter().find_map(|name| text(name)).unwrap_or_default();
            if let Some(dir) = text("REPRO_RENDEZVOUS_DIR") {
                return Ok(Some(LaunchedRank {
                    rank,
                    world_size,
                    local_rank,
                    master: String::new(),
                    rendezvous_dir: Some(dir.into()),
                    launcher,
                    timeout,
                    run_id,
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
            let port: u16 = port.trim().parse().ok().filter(|&p| p != 0).ok_or_else(|| {
                RecordError::Unsupported(format!("MASTER_PORT={port} is not a port number (1 to 65535)"))
            })?;
            // torchrun's agent keeps its own store on MASTER_PORT: meet beside it.
            let port = match text("REPRO_MASTER_PORT") {
                Some(p) => p.trim().parse().ok().filter(|&p: &u16| p != 0).ok_or_else(|| {
                    RecordError::Unsupported(format!("REPRO_MASTER_PORT={p} is not a port number (1 to 65535)"))
                })?,
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
                run_id,
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
/// each run): each rank leaves its settings and the world size there, waits for every other
/// rank's, and refuses the run when any differ, naming the rank and the settings. A directory
/// holding an earlier run's files, a rank that arrives twice and a rank outside the world are
/// refused too, so that no rank runs on with stale or foreign peers.
pub(crate) fn meet_in_dir(dir: &Path, place: &LaunchedRank, settings: &RunSettings) -> Result<(), RecordError> {
    let fail = |what: String| RecordError::Collective(format!("rank {}: {what}", place.rank));
    std::fs::create_dir_all(dir).map_err(|e| fail(format!("cannot create {}: {e}", dir.display())))?;
    let file = |rank: usize| dir.join(format!("settings.rank-{rank}.json"));
    // Sums are written only once every rank has arrived: any here are an earlier run's.
    let listing = || -> Result<Vec<String>, RecordError> {
        let entries = std::fs::read_dir(dir).map_err(|e| fail(format!("cannot list {}: {e}", dir.display())))?;
        Ok(entries.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
    };
    if let Some(stale) = listing()?.into_iter().find(|name| name.starts_with("sum-") || name.starts_with("nccl")) {
        return Err(fail(format!(
            "{} holds an earlier run's files ({stale}): give each run a new, empty REPRO_RENDEZVOUS_DIR",
            dir.display()
        )));
    }
    let mut mine = settings.clone();
    mine.insert("world_size".into(), place.world_size.to_string());
    let encoded = serde_json::to_vec(&mine).map_err(|e| fail(format!("cannot encode its settings: {e}")))?;
    let tmp = dir.join(format!("settings.rank-{}.json.{}.tmp", place.rank, std::process::id()));
    std::fs::write(&tmp, &encoded).map_err(|e| fail(format!("cannot write {}: {e}", tmp.display())))?;
    // A link fails where the name exists: a second rank of this number, or an earlier run's.
    let linked = std::fs::hard_link(&tmp, file(place.rank));
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(fail(format!(
                "{} already holds rank {}'s settings: two ranks of that number, or an earlier run's files (give \
                 each run a new, empty REPRO_RENDEZVOUS_DIR)",
                dir.display(),
                place.rank
            )))
        }
        Err(e) => return Err(fail(format!("cannot write {}: {e}", file(place.rank).display()))),
    }
    let started = std::time::Instant::now();
    for rank in 0..place.world_size {
        let theirs = loop {
            match std::fs::read(file(rank)) {
                Ok(bytes) => break bytes,
                Err(_) if started.elapsed() < place.timeout => std::thread::sleep(Duration::from_millis(20)),
                Err(_) => {
                    let missing = super::rank_list((0..place.world_size).filter(|&r| !file(r).exists()));
                    return Err(fail(format!(
                        "rank(s) {} never arrived in {} within {} s (world size {})",
                        missing,
                        dir.display(),
                        place.timeout.as_secs(),
                        place.world_size
                    )));
                }
            }
        };
        let theirs: RunSettings = serde_json::from_slice(&theirs)
            .map_err(|e| fail(format!("{} is not a rank's settings: {e}", file(rank).display())))?;
        if theirs != mine {
            return Err(fail(format!(
                "rank {rank} runs other settings ({}); every rank must run the same command",
                settings_differences(&mine, &theirs)
            )));
        }
    }
    let outside = listing()?.into_iter().find_map(|name| {
        let rank: usize = name.strip_prefix("settings.rank-")?.strip_suffix(".json")?.parse().ok()?;
        (rank >= place.world_size).then_some(rank)
    });
    if let Some(rank) = outside {
        return Err(fail(format!(
            "a rank {rank} arrived in {}, outside the world of {} ranks: every rank must be started with the same \
             world size",
            dir.display(),
            place.world_size
        )));
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
        // Hostile sizes are refused with the variable named, never allocated or overflowed.
        for huge in ["4611686018427387904", "18446744073709551615", "100000000"] {
            let e = place(&[("RANK", "1"), ("WORLD_SIZE", huge), ("REPRO_RENDEZVOUS_DIR", "/m")]).unwrap_err();
            assert!(e.to_string().contains(&format!("WORLD_SIZE={huge}")), "{e}");
        }
        for timeout in ["18446744073709551615", "0", "-1"] {
            let vars = [
                ("RANK", "1"),
                ("WORLD_SIZE", "2"),
                ("REPRO_RENDEZVOUS_DIR", "/m"),
                ("REPRO_RENDEZVOUS_TIMEOUT", timeout),
            ];
            let e = place(&vars).unwrap_err().to_string();
            assert!(e.contains("REPRO_RENDEZVOUS_TIMEOUT"), "{e}");
        }
        let e = place(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "0")]).unwrap_err();
        assert!(e.to_string().contains("MASTER_PORT=0 is not a port number"), "{e}");
        let e = place(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "99999")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("MASTER_PORT=99999"), "{e}");
    }

    fn in_dir(dir: &Path, rank: usize, world_size: usize, seconds: u64) -> LaunchedRank {
        LaunchedRank {
            rank,
            world_size,
            local_rank: 0,
            master: String::new(),
            rendezvous_dir: Some(dir.to_path_buf()),
            launcher: "torchrun",
            timeout: Duration::from_secs(seconds),
            run_id: String::new(),
        }
    }

    /// Issue 45, item 11: the directory rendezvous checks what the TCP one does, honours the
    /// timeout, and refuses a directory an earlier run left files in.
    #[test]
    fn a_rendezvous_directory_refuses_stale_files_duplicate_ranks_and_other_world_sizes() {
        let settings = RunSettings::from([("workload".to_string(), "gpt".to_string())]);
        // An earlier run's sums: refused before anything is written.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("sum-00000003.rank-0"), b"").unwrap();
        let e = meet_in_dir(dir.path(), &in_dir(dir.path(), 0, 2, 5), &settings).unwrap_err().to_string();
        assert!(e.contains("holds an earlier run's files (sum-00000003.rank-0)"), "{e}");

        // A rank that never comes: the wait ends at the timeout asked for, naming it.
        let dir = tempfile::tempdir().unwrap();
        let started = std::time::Instant::now();
        let e = meet_in_dir(dir.path(), &in_dir(dir.path(), 0, 2, 1), &settings).unwrap_err().to_string();
        assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
        assert!(e.contains("rank(s) 1 never arrived") && e.contains("within 1 s"), "{e}");
        // The same rank again (or a rerun in the same directory): refused, not read as a peer.
        let e = meet_in_dir(dir.path(), &in_dir(dir.path(), 0, 2, 1), &settings).unwrap_err().to_string();
        assert!(e.contains("already holds rank 0's settings"), "{e}");

        // Ranks started with other world sizes: named as a setting that differs.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        let (s1, p1) = (settings.clone(), path.clone());
        let other = std::thread::spawn(move || meet_in_dir(&p1, &in_dir(&p1, 1, 3, 5), &s1));
        let e = meet_in_dir(&path, &in_dir(&path, 0, 2, 5), &settings).unwrap_err().to_string();
        assert!(e.contains("world_size 2 vs 3"), "{e}");
        assert!(other.join().unwrap().is_err());
    }
}
