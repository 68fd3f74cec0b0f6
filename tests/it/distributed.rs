//! Data-parallel runs on CPU ranks (the file stand-in for NCCL): rank processes, per-rank
//! streams, replica checks, and diffs within and across world sizes.

use crate::util::{example, json, record_small_gpt, repro, s};
use std::path::{Path, PathBuf};

/// The small gpt of `record_small_gpt` (batch 2), data-parallel on two CPU ranks.
fn two_ranks(dir: &Path, name: &str, extra: &[&str]) -> PathBuf {
    let mut args = vec!["--devices", "cpu,cpu"];
    args.extend_from_slice(extra);
    record_small_gpt(dir, name, "all", &args)
}

#[test]
fn two_rank_runs_write_a_stream_per_rank_that_stay_replicas_and_reproduce() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (two_ranks(dir.path(), "a", &[]), two_ranks(dir.path(), "b", &[]));
    for rank in 0..2 {
        let summary = json(&repro(&["inspect", s(&a.join(format!("rank-{rank}"))), "--json"]).stdout);
        let tokens = summary["tensors"].as_array().unwrap().iter().find(|t| t["name"] == "tokens").unwrap().clone();
        assert_eq!(tokens["shape"], serde_json::json!([1, 16]), "each rank trains on half of the batch of 2");
    }
    let run = repro(&["diff", s(&a), s(&b)]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("compared rank by rank"), "{}", run.stdout);
    assert_eq!(
        run.stdout.matches("kept identical parameters and gradient sums on all 2 ranks at all 3 steps").count(),
        2
    );
    assert!(run.stdout.contains("IDENTICAL  3 steps"), "{}", run.stdout);
    // The diff's figures are the shown rank's own; totals over the ranks stand apart.
    let v = json(&repro(&["diff", s(&a), s(&b), "--json"]).stdout);
    let shown = v["diff"]["tensors_compared"].as_u64().unwrap();
    let history: u64 =
        v["diff"]["tensors"].as_array().unwrap().iter().map(|t| t["steps_compared"].as_u64().unwrap()).sum();
    assert_eq!(shown, history, "the count agrees with the shown rank's per-tensor histories");
    assert_eq!(v["all_ranks"]["ranks"], 2);
    assert_eq!(v["all_ranks"]["tensors_compared"].as_u64(), Some(2 * shown), "two ranks of the same layout");
    assert!(run.stdout.contains(&format!("over all 2 ranks: 0 of {} tensors differ", 2 * shown)), "{}", run.stdout);

    let inspect = repro(&["inspect", s(&a), "--verify"]);
    assert_eq!(inspect.code, 0, "{}", inspect.stderr);
    assert!(inspect.stderr.contains("rank-1: 3 steps"), "{}", inspect.stderr);
    let run = json(&repro(&["inspect", s(&a), "--json"]).stdout);
    assert_eq!(run["verdict"], "identical");
    assert_eq!(run["ranks"].as_array().unwrap().len(), 2);
    assert!(run["replicas"]["tensors_checked"].as_u64().unwrap() > 100);
}

#[test]
fn a_rank_cut_short_makes_the_run_unfinished_for_diff_and_inspect() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (two_ranks(dir.path(), "a", &[]), two_ranks(dir.path(), "b", &[]));
    // Rank 1 of B loses its last 100 bytes (a killed rank), rank 0 is whole.
    let records = b.join("rank-1/records.rpr");
    let len = std::fs::metadata(&records).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&records).unwrap().set_len(len - 100).unwrap();
    let run = repro(&["diff", s(&a), s(&b)]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout.contains("UNFINISHED RANK") && run.stdout.contains("rank 1 holds 2 of the 3 steps"),
        "{}",
        run.stdout
    );
    assert!(!run.stdout.contains("IDENTICAL "), "{}", run.stdout);
    let diff = json(&repro(&["diff", s(&a), s(&b), "--json"]).stdout);
    assert_eq!(diff["verdict"], "diverged", "rank 1's streams do not match: {diff}");
    // The same damage on both sides: every rank pair agrees, and still no IDENTICAL.
    let c = dir.path().join("c");
    copy_dir(&b, &c);
    let run = repro(&["diff", s(&b), s(&c)]);
    assert_eq!(run.code, 1, "{}", run.stdout);
    assert!(run.stdout.contains("INCOMPLETE"), "{}", run.stdout);
    assert_eq!(json(&repro(&["diff", s(&b), s(&c), "--json"]).stdout)["verdict"], "incomplete");
    let inspect = repro(&["inspect", s(&b), "--verify"]);
    assert_eq!(inspect.code, 1, "{}{}", inspect.stdout, inspect.stderr);
    assert_eq!(json(&repro(&["inspect", s(&b), "--json"]).stdout)["verdict"], "incomplete");
}

/// Copies a directory tree (a data-parallel run).
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[test]
fn one_device_against_two_ranks_compares_the_replicated_state_and_names_the_batch_split() {
    let dir = tempfile::tempdir().unwrap();
    let one = record_small_gpt(dir.path(), "one", "all", &[]);
    let two = two_ranks(dir.path(), "two", &[]);
    let run = repro(&["diff", s(&one), s(&two)]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("A on 1 device, B on 2 ranks"), "{}", run.stdout);
    assert!(run.stdout.contains("world_size: 1 | 2"), "{}", run.stdout);
    // Parameters agree at step 0; the first difference is a summed gradient, never the batch.
    let first = run.stdout.lines().find(|l| l.starts_with("DIVERGED")).unwrap();
    assert!(first.contains("at step 0") && first.contains(".grad` (gradient)"), "{first}");
    assert!(run.stdout.contains("cause: the batch split"), "{}", run.stdout);

    let j = json(&repro(&["diff", s(&one), s(&two), "--json"]).stdout);
    assert_eq!(j["schema"], "repro.run-diff.v1");
    assert_eq!((j["world_size_a"].as_u64(), j["world_size_b"].as_u64()), (Some(1), Some(2)));
    assert_eq!(j["cause"]["type"], "batch_split");

    // Issue 45, item 10: two ranks of another batch size differ by the batch setting, and the
    // cause names it rather than the split.
    let wide = dir.path().join("wide");
    let args = [
        "record",
        "--workload",
        "gpt",
        "--steps",
        "3",
        "--batch",
        "4",
        "--context",
        "16",
        "--width",
        "32",
        "--heads",
        "2",
        "--capture",
        "all",
        "--devices",
        "cpu,cpu",
        "--out",
        s(&wide),
    ];
    let run = repro(&args);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let run = repro(&["diff", s(&one), s(&wide)]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("cause: the batch setting (batch 2 in A, 4 in B)"), "{}", run.stdout);
}

#[test]
fn a_rank_that_fails_stops_the_others_and_the_error_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    // Rank 1 cannot open its device in a CPU build; rank 0 would wait for it forever.
    let run = repro(&["record", "--workload", "mlp", "--steps", "2", "--devices", "cpu,cuda:0", "--out", s(&out)]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    let error = run.stderr.lines().find(|l| l.starts_with("error:")).unwrap();
    assert!(error.contains("rank 1 (cuda:0) failed: exit code 2"), "{error}");
    assert!(error.contains("CUDA support"), "{error}");
    assert!(run.stderr.contains("[rank 1] error:"), "{}", run.stderr);
}

#[test]
fn bad_device_lists_and_occupied_directories_are_refused_before_any_rank_starts() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let record = |devices: &str, out: &Path, extra: &[&str]| {
        let mut args = vec!["record", "--workload", "mlp", "--steps", "1", "--devices", devices, "--out", s(out)];
        args.extend_from_slice(extra);
        repro(&args)
    };
    let run = record("cuda:0,cuda:0", &out, &[]);
    assert!(run.code == 2 && run.stderr.contains("lists cuda:0 twice"), "{}", run.stderr);
    // A workload that does not train data-parallel is refused by the parent: no rank starts,
    // nothing is written.
    let adder = dir.path().join("adder");
    let refused = [
        repro(&["record", "--workload", "adder", "--steps", "1", "--devices", "cpu,cpu", "--out", s(&adder)]),
        repro(&["overhead", "--workload", "adder", "--steps", "1", "--devices", "cpu,cpu"]),
    ];
    for run in refused {
        assert!(run.code == 2 && run.stderr.contains("adder does not train data-parallel"), "{}", run.stderr);
        assert!(!run.stderr.contains("[rank"), "no rank started: {}", run.stderr);
    }
    assert!(!adder.exists(), "a refused run leaves no directory");
    let run = record("cpu,cpu,cpu", &out, &["--batch", "64"]);
    assert!(
        run.code == 2 && run.stderr.contains("batch (64) must be a positive multiple of the number of ranks (3)"),
        "{}",
        run.stderr
    );
    // A single-device trace is not overwritten by a run of ranks, even with --force.
    let single = dir.path().join("single");
    assert_eq!(repro(&["record", "--workload", "adder", "--steps", "2", "--out", s(&single)]).code, 0);
    let run = record("cpu,cpu", &single, &["--force"]);
    assert!(run.code == 2 && run.stderr.contains("holds a single-device trace"), "{}", run.stderr);
    assert!(single.join("records.rpr").exists());
    // A run of ranks is replaced only with --force.
    assert_eq!(record("cpu,cpu", &out, &[]).code, 0);
    let run = record("cpu,cpu", &out, &[]);
    assert!(run.code == 2 && run.stderr.contains("already holds a data-parallel run"), "{}", run.stderr);
    assert_eq!(record("cpu,cpu", &out, &["--force"]).code, 0);
}

#[test]
fn the_gate_and_the_matrix_take_data_parallel_runs() {
    let dir = tempfile::tempdir().unwrap();
    let gate = repro(&["gate", "--workload", "mlp", "--steps", "3", "--devices", "cpu,cpu"]);
    assert_eq!(gate.code, 0, "{}{}", gate.stdout, gate.stderr);
    assert!(
        gate.stdout.contains("on 2 ranks (cpu, cpu)") && gate.stdout.contains("PASS  bit-exact"),
        "{}",
        gate.stdout
    );

    let (a, b) = (two_ranks(dir.path(), "a", &[]), two_ranks(dir.path(), "b", &["--seed", "1"]));
    let one = record_small_gpt(dir.path(), "one", "all", &[]);
    let m = json(&repro(&["matrix", s(&a), s(&b), s(&one), "--tensor", "wte.weight", "--step", "0", "--json"]).stdout);
    let cells = &m["matrices"].as_array().unwrap().iter().find(|m| m["tensor"] == "wte.weight").unwrap()["values"];
    assert_eq!(cells[0][2], 0.0, "step-0 weights: the same seed on 1 and 2 devices");
    assert!(cells[0][1].as_f64().unwrap() > 0.0, "another seed");
}

#[test]
fn a_users_own_data_parallel_loop_records_ranks_that_read_as_one_run() {
    let example = example("data_parallel");
    let dir = tempfile::tempdir().unwrap();
    for name in ["a", "b"] {
        let status = std::process::Command::new(&example).arg(dir.path().join(name)).status().unwrap();
        assert!(status.success());
    }
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let inspect = repro(&["inspect", s(&a), "--verify"]);
    assert_eq!(inspect.code, 0, "{}{}", inspect.stdout, inspect.stderr);
    assert!(inspect.stdout.contains("on all 2 ranks at all 10 steps"), "{}", inspect.stdout);
    let run = repro(&["diff", s(&a), s(&b)]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("IDENTICAL  10 steps"), "{}", run.stdout);
}

/// The pids of the rank processes recording into `out` (Linux: /proc): their command line names
/// `out` and the settings file the supervisor gives its ranks.
fn rank_processes(out: &Path) -> Vec<u32> {
    let mut pids = Vec::new();
    let out = out.display().to_string();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let cmdline = String::from_utf8_lossy(&cmdline);
        if cmdline.contains(&out) && cmdline.contains("--settings") && pid != std::process::id() {
            pids.push(pid);
        }
    }
    pids
}

#[cfg(target_os = "linux")]
#[test]
fn killing_the_supervisor_kills_every_rank() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("long-run");
    let mut supervisor = std::process::Command::new(env!("CARGO_BIN_EXE_repro"))
        .args(["record", "--workload", "mlp", "--devices", "cpu,cpu", "--steps", "100000000", "--capture", "none"])
        .arg("--out")
        .arg(&out)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wait for both ranks to be training.
    let started = std::time::Instant::now();
    while rank_processes(&out).len() < 2 || !out.join("rank-1/records.rpr").exists() {
        assert!(started.elapsed() < std::time::Duration::from_secs(60), "the ranks never started");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // SIGKILL, as a cancelled CI job sends: the supervisor cannot clean up.
    supervisor.kill().unwrap();
    supervisor.wait().unwrap();
    let killed = std::time::Instant::now();
    while !rank_processes(&out).is_empty() {
        assert!(
            killed.elapsed() < std::time::Duration::from_secs(10),
            "ranks outlived their supervisor: {:?}",
            rank_processes(&out)
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// A free TCP port on this host, for a rendezvous.
fn free_port() -> String {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string()
}

/// Ranks started by a launcher (issue 36): each process is given its place through the
/// environment, as torchrun gives it, and the ranks meet over TCP; `run` is its command line.
fn launch(ranks: &[(usize, &[&str])], world: usize, extra_env: &[(&str, &str)]) -> Vec<crate::util::Run> {
    let port = free_port();
    let handles: Vec<_> = ranks
        .iter()
        .map(|(rank, args)| {
            let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
            let mut env: Vec<(String, String)> = vec![
                ("RANK".into(), rank.to_string()),
                ("WORLD_SIZE".into(), world.to_string()),
                ("MASTER_ADDR".into(), "127.0.0.1".into()),
                ("MASTER_PORT".into(), port.clone()),
            ];
            env.extend(extra_env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
            std::thread::spawn(move || {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                crate::util::repro_with_env(&args, &env)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn ranks_a_launcher_starts_meet_over_tcp_and_match_a_devices_run() {
    let dir = tempfile::tempdir().unwrap();
    let (launched, local) = (dir.path().join("launched"), dir.path().join("local"));
    let args = ["record", "--workload", "mlp", "--steps", "4", "--out", s(&launched)];
    let runs = launch(&[(0, &args), (1, &args)], 2, &[]);
    for run in &runs {
        assert_eq!(run.code, 0, "{}", run.stderr);
    }
    let run = repro(&["record", "--workload", "mlp", "--steps", "4", "--devices", "cpu,cpu", "--out", s(&local)]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    // The TCP stand-in adds the ranks' parts in rank order, as the file stand-in does.
    let diff = repro(&["diff", s(&local), s(&launched)]);
    assert_eq!(diff.code, 0, "{}{}", diff.stdout, diff.stderr);
    let inspect = repro(&["inspect", s(&launched), "--json"]);
    let v = json(&inspect.stdout);
    assert_eq!(v["ranks"].as_array().unwrap().len(), 2, "{v}");
    assert_eq!(v["ranks"][1]["header"]["distributed"]["backend"], "tcp", "{v}");
}

#[test]
fn a_launched_rank_that_never_arrives_or_runs_other_settings_ends_the_run_with_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let args = ["record", "--workload", "mlp", "--steps", "4", "--out", s(&out)];
    // Rank 1 of 3 arrives, rank 2 never does: both get an error naming it and the address.
    let runs = launch(&[(0, &args), (1, &args)], 3, &[("REPRO_RENDEZVOUS_TIMEOUT", "2")]);
    assert_eq!(runs[0].code, 2);
    assert!(runs[0].stderr.contains("rank(s) 2 never arrived at 127.0.0.1:"), "{}", runs[0].stderr);
    assert!(runs[1].stderr.contains("rank 0 ended the run: rank(s) 2 never arrived"), "{}", runs[1].stderr);
    // Another seed on rank 1: refused at the rendezvous, before any training, naming the setting.
    let other = ["record", "--workload", "mlp", "--steps", "4", "--seed", "1", "--out", s(&out)];
    let runs = launch(&[(0, &args), (1, &other)], 2, &[]);
    assert_eq!((runs[0].code, runs[1].code), (2, 2));
    assert!(
        runs[0].stderr.contains("rank 1 runs other settings than rank 0 (")
            && runs[0].stderr.contains("init_seed 0 vs 1"),
        "{}",
        runs[0].stderr
    );
    // A missing meeting point is said before anything else.
    let run = crate::util::repro_with_env(&args, &[("RANK", "0"), ("WORLD_SIZE", "2")]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("MASTER_ADDR and MASTER_PORT"), "{}", run.stderr);
}

/// Issue 36: a run whose ranks each node wrote to its own disk is read as one run, its
/// directories joined with `:`; every rank must be in exactly one of them.
#[test]
fn a_run_whose_ranks_lie_in_several_directories_is_read_whole() {
    let dir = tempfile::tempdir().unwrap();
    let (node0, node1, local) = (dir.path().join("node0"), dir.path().join("node1"), dir.path().join("local"));
    let on = |node: &Path| ["record", "--workload", "mlp", "--steps", "3", "--out", s(node)].map(str::to_string);
    let (args0, args1) = (on(&node0), on(&node1));
    let (args0, args1): (Vec<&str>, Vec<&str>) =
        (args0.iter().map(String::as_str).collect(), args1.iter().map(String::as_str).collect());
    for run in launch(&[(0, &args0), (1, &args1)], 2, &[]) {
        assert_eq!(run.code, 0, "{}", run.stderr);
    }
    let run = repro(&["record", "--workload", "mlp", "--steps", "3", "--devices", "cpu,cpu", "--out", s(&local)]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let whole = format!("{}:{}", s(&node0), s(&node1));
    let diff = repro(&["diff", s(&local), &whole]);
    assert_eq!(diff.code, 0, "{}{}", diff.stdout, diff.stderr);
    assert!(diff.stdout.contains("IDENTICAL"), "{}", diff.stdout);
    let inspect = repro(&["inspect", &whole, "--verify"]);
    assert_eq!(inspect.code, 0, "{}{}", inspect.stdout, inspect.stderr);
    // One node's directory alone lacks a rank; the same directory twice holds one twice.
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let half = format!("{}:{}", s(&node0), s(&empty));
    let run = repro(&["inspect", &half]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("rank 1 of its 2 ranks is in none of"), "{}", run.stderr);
    let twice = format!("{}:{}:{}", s(&node0), s(&node1), s(&node0));
    let run = repro(&["diff", s(&local), &twice]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("rank 0 is in two places"), "{}", run.stderr);

    // Issue 45, item 14: a rank beyond the world size is refused in one directory as in several.
    copy_dir(&local.join("rank-1"), &local.join("rank-2"));
    let run = repro(&["inspect", s(&local)]);
    assert_eq!(run.code, 2, "{}", run.stdout);
    assert!(run.stderr.contains("it is rank 2, beyond the world size 2"), "{}", run.stderr);
    // A launched rank refuses an --out that holds other things than a run's rank directories.
    let notes = dir.path().join("notes");
    std::fs::create_dir(&notes).unwrap();
    std::fs::write(notes.join("mine.txt"), "keep").unwrap();
    let args = ["record", "--workload", "mlp", "--steps", "3", "--out", s(&notes)].map(str::to_string);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    for run in launch(&[(0, &args), (1, &args)], 2, &[]) {
        assert_eq!(run.code, 2, "{}", run.stderr);
        assert!(run.stderr.contains("holds files that are not a repro run"), "{}", run.stderr);
    }
    assert_eq!(std::fs::read_to_string(notes.join("mine.txt")).unwrap(), "keep");
}

/// Issue 36: a training loop of your own joins a launched run through the library
/// (`distributed::join_from_env`), with no repro-specific launcher, and matches the same loop's
/// ranks run as threads through the file stand-in.
#[test]
fn your_own_loop_joins_a_launched_run_through_the_library() {
    let dir = tempfile::tempdir().unwrap();
    let (launched, threads) = (dir.path().join("launched"), dir.path().join("threads"));
    let port = free_port();
    let ranks: Vec<_> = (0..2)
        .map(|rank| {
            let mut command = std::process::Command::new(example("data_parallel"));
            launched_as(command.arg(&launched), rank, &port).spawn().expect("the example starts")
        })
        .collect();
    for rank in ranks {
        let out = rank.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let status = std::process::Command::new(example("data_parallel")).arg(&threads).status().unwrap();
    assert!(status.success());
    let diff = repro(&["diff", s(&threads), s(&launched)]);
    assert_eq!(diff.code, 0, "{}{}", diff.stdout, diff.stderr);
    let v = json(&repro(&["inspect", s(&launched), "--json"]).stdout);
    assert_eq!(v["ranks"][0]["header"]["distributed"]["backend"], "tcp", "{v}");
}

/// Issue 36: a launched rank that dies mid-run ends the others with an error naming it, never a
/// hang in a collective.
#[test]
fn a_launched_rank_that_dies_ends_the_others_with_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let port = free_port();
    let start = |rank: usize| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_repro"));
        command.args(["record", "--workload", "mlp", "--epochs", "100000", "--capture", "none", "--out", s(&out)]);
        launched_as(&mut command, rank, &port).spawn().expect("repro starts")
    };
    let (rank0, mut rank1) = (start(0), start(1));
    // Killed once both train: rank 0's trace holds steps.
    let records = out.join("rank-0").join("records.rpr");
    let started = std::time::Instant::now();
    while std::fs::metadata(&records).map_or(0, |m| m.len()) < 20_000 {
        assert!(started.elapsed().as_secs() < 120, "the ranks never started training");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    rank1.kill().unwrap();
    let _ = rank1.wait();
    let out0 = rank0.wait_with_output().unwrap();
    assert_eq!(out0.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out0.stderr);
    assert!(err.contains("rank 1 stopped answering during sum"), "{err}");
    assert!(err.contains("marked incomplete"), "{err}");
}

/// Issue 36: launched ranks may meet in a directory every rank reaches (REPRO_RENDEZVOUS_DIR)
/// instead of over TCP; a rank that never arrives there is named.
#[test]
fn launched_ranks_may_meet_in_a_shared_directory() {
    let dir = tempfile::tempdir().unwrap();
    let (out, local, meet) = (dir.path().join("run"), dir.path().join("local"), dir.path().join("meet"));
    let args = ["record", "--workload", "mlp", "--steps", "3", "--out", s(&out)];
    let handles: Vec<_> = (0..2)
        .map(|rank: usize| {
            let meet = meet.clone();
            let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
            std::thread::spawn(move || {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                let rank = rank.to_string();
                let env = [("RANK", rank.as_str()), ("WORLD_SIZE", "2"), ("REPRO_RENDEZVOUS_DIR", s(&meet))];
                crate::util::repro_with_env(&args, &env)
            })
        })
        .collect();
    for h in handles {
        let run = h.join().unwrap();
        assert_eq!(run.code, 0, "{}", run.stderr);
    }
    let run = repro(&["record", "--workload", "mlp", "--steps", "3", "--devices", "cpu,cpu", "--out", s(&local)]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let diff = repro(&["diff", s(&local), s(&out)]);
    assert_eq!(diff.code, 0, "{}{}", diff.stdout, diff.stderr);
    // Alone in a fresh directory, rank 0 names the rank that never came.
    let other = dir.path().join("meet-again");
    let env =
        [("RANK", "0"), ("WORLD_SIZE", "2"), ("REPRO_RENDEZVOUS_DIR", s(&other)), ("REPRO_RENDEZVOUS_TIMEOUT", "1")];
    let run = crate::util::repro_with_env(
        &["record", "--workload", "mlp", "--steps", "3", "--out", s(&dir.path().join("x"))],
        &env,
    );
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("rank(s) 1 never arrived in"), "{}", run.stderr);
}

/// `command` as torchrun starts rank `rank` of two, meeting at 127.0.0.1:`port`, its errors kept.
fn launched_as<'c>(command: &'c mut std::process::Command, rank: usize, port: &str) -> &'c mut std::process::Command {
    command
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", "2")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port)
        .stderr(std::process::Stdio::piped())
}

/// Writes, in `dir`, a run of `world` ranks (one stream when 1) of one step: each rank's rows of
/// the 8 x 4 weight `w` (values 0..32) as a shard (a whole tensor on one device). Values are
/// kept when `stored`; `rank1_first` moves rank 1's first row.
fn sharded_run(dir: &Path, world: u64, stored: bool, rank1_first: Option<u64>) -> PathBuf {
    use repro::trace::{dtype::DType, Distributed, ShardOf, StepTensor, TensorKind, TensorRecord, TraceWriter};
    let values: Vec<u8> = (0..32).flat_map(|v| (v as f32).to_le_bytes()).collect();
    let rows = 8 / world;
    for rank in 0..world {
        let first = if rank == 1 { rank1_first.unwrap_or(rows) } else { rank * rows };
        let mut header = crate::util::test_header("synthetic", 1);
        header.distributed = (world > 1).then(|| Distributed {
            rank,
            world_size: world,
            backend: "file".into(),
            backend_version: String::new(),
        });
        let stream = if world > 1 { dir.join(format!("rank-{rank}")) } else { dir.to_path_buf() };
        let mut writer = TraceWriter::create(&stream, &header, false).unwrap();
        let bytes = &values[(first * 16) as usize..((first + rows) * 16) as usize];
        let shard = (world > 1).then(|| ShardOf { whole: vec![8, 4], offset: vec![first, 0] });
        let inline = stored.then(|| bytes.to_vec());
        let record = TensorRecord {
            shard,
            inline,
            ..TensorRecord::of_bytes("w", TensorKind::Weight, DType::F32, vec![rows, 4], bytes)
        };
        writer.write_step(0, vec![StepTensor { record, payload: None }]).unwrap();
        writer.finish().unwrap();
    }
    dir.to_path_buf()
}

#[test]
fn sharded_runs_tile_their_tensors_and_compare_whole_only_where_values_were_kept() {
    let dir = tempfile::tempdir().unwrap();
    let one = sharded_run(&dir.path().join("one"), 1, true, None);
    let two = sharded_run(&dir.path().join("two"), 2, true, None);
    let run = repro(&["inspect", s(&two), "--verify"]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("1 sharded tensors tiled by their ranks' shards"), "{}", run.stdout);
    let run = repro(&["diff", s(&one), s(&two)]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("(1 assembled)") && run.stdout.contains("IDENTICAL"), "{}", run.stdout);
    // A rank's block says where it sits, in inspect (text and JSON) and in show (issue 66, item 10).
    let rank1 = two.join("rank-1");
    let run = repro(&["inspect", s(&rank1)]);
    assert!(run.stdout.contains("block at [4, 0] of [8, 4]"), "{}", run.stdout);
    let run = repro(&["inspect", s(&rank1), "--json"]);
    assert!(run.stdout.contains("\"whole\": [") && run.stdout.contains("\"offset\": ["), "{}", run.stdout);
    let run = repro(&["show", s(&rank1), "--step", "0", "--tensor", "w"]);
    assert!(
        run.stdout.contains("a shard: this rank's block at [4, 0] of the whole [8, 4]"),
        "{}{}",
        run.stdout,
        run.stderr
    );
    // Rank 1's rows start one row early: an overlap, named, and the run is not whole.
    let skewed = sharded_run(&dir.path().join("skewed"), 2, true, Some(3));
    let run = repro(&["inspect", s(&skewed), "--verify"]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("SHARD GAP") && run.stdout.contains("at step 0, `w` (weight)"), "{}", run.stdout);
    let run = repro(&["diff", s(&two), s(&skewed)]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    // The text's verdict is the exit code's: two skewed runs whose streams agree stream by
    // stream are not a run that is identical.
    let again = sharded_run(&dir.path().join("skewed-again"), 2, true, Some(3));
    let run = repro(&["diff", s(&skewed), s(&again)]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("SHARD GAP") && !run.stdout.contains("IDENTICAL"), "{}", run.stdout);
    assert!(run.stdout.contains("DIVERGED  the streams compared agree bit for bit, but"), "{}", run.stdout);
    let run = repro(&["diff", s(&skewed), s(&again), "--json"]);
    assert!(run.stdout.contains("\"verdict\": \"diverged\""), "{}", run.stdout);
    // Against one device, the untiled run is refused for what it is, not for want of values.
    let run = repro(&["diff", s(&one), s(&skewed)]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout.contains("SHARD GAP") && !run.stderr.contains("keep only hashes"),
        "{}{}",
        run.stdout,
        run.stderr
    );
    // Hashes only, sharded against whole: nothing can be compared, and that is an error, not
    // IDENTICAL.
    let hashes = sharded_run(&dir.path().join("hashes"), 2, false, None);
    let run = repro(&["diff", s(&one), s(&hashes)]);
    assert_eq!(run.code, 2, "{}{}", run.stdout, run.stderr);
    assert!(run.stderr.contains("nothing could be compared") && !run.stdout.contains("IDENTICAL"), "{}", run.stderr);
}

/// Writes, in `dir`, a trace of one device of one step: the 8 x 4 weight `w` whole, of `dtype`
/// with values 0..32 (stored), and beside it a bias `b` of 4 values.
fn one_device_run(dir: &Path, dtype: repro::trace::dtype::DType) -> PathBuf {
    use repro::trace::{StepTensor, TensorKind, TensorRecord, TraceWriter};
    let header = crate::util::test_header("synthetic", 1);
    let mut writer = TraceWriter::create(dir, &header, false).unwrap();
    let w: Vec<u8> = (0..32u32).flat_map(|v| (v as f32).to_le_bytes()).take(32 * dtype.size_in_bytes()).collect();
    let b: Vec<u8> = [1f32, 2., 3., 4.].iter().flat_map(|v| v.to_le_bytes()).collect();
    let tensors = vec![
        StepTensor { record: TensorRecord::of_bytes("w", TensorKind::Weight, dtype, vec![8, 4], &w), payload: None },
        StepTensor {
            record: TensorRecord::of_bytes("b", TensorKind::Weight, repro::trace::dtype::DType::F32, vec![4], &b),
            payload: None,
        },
    ];
    writer.write_step(0, tensors).unwrap();
    writer.finish().unwrap();
    dir.to_path_buf()
}

/// `sharded_run` of two ranks keeping hashes only, with the bias of `one_device_run` on each rank.
fn sharded_hashes_with_bias(dir: &Path) -> PathBuf {
    use repro::trace::{dtype::DType, StepTensor, TensorKind, TensorRecord, TraceReader, TraceWriter};
    let sharded = sharded_run(&dir.join("plain"), 2, false, None);
    let b: Vec<u8> = [1f32, 2., 3., 4.].iter().flat_map(|v| v.to_le_bytes()).collect();
    for rank in 0..2 {
        let mut reader = TraceReader::open(sharded.join(format!("rank-{rank}"))).unwrap();
        let header = reader.header().clone();
        let step = reader.next_step().unwrap().unwrap();
        let mut writer = TraceWriter::create(&dir.join(format!("rank-{rank}")), &header, false).unwrap();
        let mut tensors: Vec<StepTensor> =
            step.tensors.into_iter().map(|record| StepTensor { record, payload: None }).collect();
        let bias = TensorRecord::of_bytes("b", TensorKind::Weight, DType::F32, vec![4], &b);
        tensors.push(StepTensor { record: bias, payload: None });
        writer.write_step(0, tensors).unwrap();
        writer.finish().unwrap();
    }
    std::fs::remove_dir_all(dir.join("plain")).unwrap();
    dir.to_path_buf()
}

/// Issue 66, item 1: a sharded tensor left out of a comparison (hashes only, sharded against
/// whole) is never IDENTICAL, and a whole of another dtype or shape is a divergence the records
/// alone show.
#[test]
fn a_tensor_that_could_not_be_compared_is_never_identical() {
    use repro::trace::dtype::DType;
    let dir = tempfile::tempdir().unwrap();
    let one = one_device_run(&dir.path().join("one"), DType::F32);
    let sharded = sharded_hashes_with_bias(&dir.path().join("sharded"));
    let run = repro(&["diff", s(&one), s(&sharded)]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("UNVERIFIED") && !run.stdout.contains("IDENTICAL"), "{}", run.stdout);
    let run = repro(&["diff", s(&one), s(&sharded), "--json"]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout.contains("\"verdict\": \"unverified\"") && run.stdout.contains("\"not_compared\": 1"),
        "{}",
        run.stdout
    );
    // The whole's dtype differs: found from the records, without values.
    let bf16 = one_device_run(&dir.path().join("bf16"), DType::BF16);
    let run = repro(&["diff", s(&bf16), s(&sharded)]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("DIVERGED") && run.stdout.contains("`w`"), "{}", run.stdout);
    assert!(run.stdout.contains("BF16 [8, 4]") && run.stdout.contains("F32 [8, 4]"), "{}", run.stdout);
}

/// Issue 66, item 9: `matrix` over a sharded run and a one-device run compares the sharded
/// tensor whole where every block's values were kept, and says what it could not compare
/// otherwise (never agreeing on it).
#[test]
fn a_matrix_compares_sharded_and_one_device_runs_on_whole_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let one = sharded_run(&dir.path().join("one"), 1, true, None);
    let two = sharded_run(&dir.path().join("two"), 2, true, None);
    let run = repro(&["matrix", s(&one), s(&two), s(&one), "--json"]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let report = json(&run.stdout);
    assert_eq!(report["matrices"][0]["tensor"], "w");
    assert_eq!(report["matrices"][0]["bit_identical"], true);
    // Hash-only blocks: the whole cannot be had, so `w` is left out, named, and never agrees.
    let hashes = sharded_run(&dir.path().join("hashes"), 2, false, None);
    let run = repro(&["matrix", s(&one), s(&hashes)]);
    assert_eq!(run.code, 2, "nothing else to compare: {}{}", run.stdout, run.stderr);
    assert!(run.stderr.contains("no tensor could be compared: w sharded otherwise"), "{}", run.stderr);
    let with_bias = sharded_hashes_with_bias(&dir.path().join("with-bias"));
    let one_with_bias = one_device_run(&dir.path().join("one-with-bias"), repro::trace::dtype::DType::F32);
    let run = repro(&["matrix", s(&one_with_bias), s(&with_bias)]);
    assert_eq!(run.code, 2, "{}{}", run.stdout, run.stderr);
    assert!(
        run.stderr.contains("holds only hashes") && run.stderr.contains("(w also sharded otherwise"),
        "{}",
        run.stderr
    );
}
