//! The determinism gate: pass, fail and error, with their exit codes and reports.

use crate::util::{example, json, repro, repro_with_env, s};
use std::fs;

const SMALL: [&str; 4] = ["--steps", "12", "--batch", "300"];

fn gate(extra: &[&str]) -> crate::util::Run {
    repro(&[&["gate"][..], &SMALL, extra].concat())
}

/// The human report with the machine-specific parts (temporary paths) replaced.
fn redact(text: &str, dir: &std::path::Path) -> String {
    text.replace(s(dir), "[DIR]")
}

#[test]
fn identical_runs_pass() {
    let run = gate(&[]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    insta::assert_snapshot!("gate_pass", run.stdout);
}

#[test]
fn a_planted_change_fails_against_the_baseline_with_a_report() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.rpr");
    let written = repro(&[&["baseline", "write"][..], &SMALL, &["--out", s(&base)]].concat());
    assert_eq!(written.code, 0, "{}", written.stderr);
    assert_eq!(gate(&["--baseline", s(&base)]).code, 0, "the same code passes against its baseline");

    let junit = dir.path().join("gate.xml");
    let markdown = dir.path().join("gate.md");
    let run = gate(&[
        "--baseline",
        s(&base),
        "--perturb",
        "4:linear.matmul:3",
        "--junit",
        s(&junit),
        "--markdown",
        s(&markdown),
    ]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    insta::assert_snapshot!("gate_fail", redact(&run.stdout, dir.path()));

    let xml = fs::read_to_string(&junit).unwrap();
    let doc = roxmltree::Document::parse(&xml).unwrap();
    let suite = doc.descendants().find(|n| n.has_tag_name("testsuite")).unwrap();
    assert_eq!(suite.attribute("tests"), Some("1"));
    assert_eq!(suite.attribute("failures"), Some("1"));
    let failure = doc.descendants().find(|n| n.has_tag_name("failure")).unwrap();
    assert!(failure.attribute("message").unwrap().contains("step 4, `linear.matmul`"), "{xml}");
    assert!(failure.text().unwrap().contains("root cause: `linear.matmul`"), "{xml}");

    let md = fs::read_to_string(&markdown).unwrap();
    assert!(md.contains("❌ FAIL"), "{md}");
    assert!(md.contains("| run 0 | first differs at step 4"), "{md}");

    let v = json(&gate(&["--baseline", s(&base), "--perturb", "4:linear.matmul:3", "--json"]).stdout);
    assert_eq!(v["schema"], "repro.gate.v2");
    assert_eq!(
        (v["comparisons"][0]["run"].as_str(), v["comparisons"][0]["passed"].as_bool()),
        (Some("run 0"), Some(false))
    );
    assert_eq!(v["comparisons"][0]["diff"]["first_divergence"]["step"], 4);
}

#[test]
fn a_corrupt_or_mismatched_baseline_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.rpr");
    assert_eq!(repro(&[&["baseline", "write"][..], &SMALL, &["--out", s(&base)]].concat()).code, 0);

    let keep = dir.path().join("kept");
    let run = gate(&["--baseline", s(&base), "--seed", "7", "--keep", s(&keep)]);
    assert_eq!(run.code, 2, "{}", run.stdout);
    assert!(run.stderr.contains("was written for another configuration (seed 0 vs 7)"), "{}", run.stderr);
    // Refused before anything was trained or recorded.
    assert!(!keep.exists(), "the gate recorded runs before checking the baseline");

    let mut bytes = fs::read(&base).unwrap();
    let n = bytes.len();
    bytes[n / 2] ^= 0x40;
    let corrupt = dir.path().join("corrupt.rpr");
    fs::write(&corrupt, bytes).unwrap();
    let run = gate(&["--baseline", s(&corrupt)]);
    assert_eq!(run.code, 2, "{}", run.stdout);
    assert!(run.stderr.contains("corrupt.rpr is corrupt"), "{}", run.stderr);

    let run = gate(&["--baseline", s(&dir.path().join("missing.rpr"))]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("missing.rpr"), "{}", run.stderr);
}

#[test]
fn a_users_own_program_is_gated_through_the_environment() {
    let example = example("own_training_loop");
    let run = repro(&["gate", "--runs", "3", "--", s(&example)]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("run 2: identical (50 steps"), "{}", run.stdout);
    let run = repro(&["gate", "--", "false"]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("`false` failed"), "{}", run.stderr);
    let run = repro(&["gate", "--", "true"]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("recorded nothing"), "{}", run.stderr);
}

#[test]
fn a_baseline_from_another_environment_names_the_likely_causes() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.rpr");
    let env = [("RAYON_NUM_THREADS", "1"), ("CUBLAS_WORKSPACE_CONFIG", ":4096:8"), ("REPRO_TF32", "1")];
    let written = repro_with_env(&[&["baseline", "write"][..], &SMALL, &["--out", s(&base)]].concat(), &env);
    assert_eq!(written.code, 0, "{}", written.stderr);
    let run = repro_with_env(
        &[&["gate"][..], &SMALL, &["--baseline", s(&base), "--perturb", "2:loss:1", "--json"]].concat(),
        &[("RAYON_NUM_THREADS", "2")],
    );
    assert_eq!(run.code, 1, "{}", run.stderr);
    let causes: Vec<String> = json(&run.stdout)["likely_causes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_string())
        .collect();
    assert!(causes.iter().any(|c| c.starts_with("RAYON_NUM_THREADS=1 vs 2")), "{causes:?}");
    assert!(causes.iter().any(|c| c.starts_with("CUBLAS_WORKSPACE_CONFIG=:4096:8 vs (unset)")), "{causes:?}");
    // repro's own switch for TF32 matrix products is recorded like the others.
    assert!(causes.iter().any(|c| c.starts_with("REPRO_TF32=1 vs (unset)")), "{causes:?}");
    let human = repro_with_env(
        &[&["gate"][..], &SMALL, &["--baseline", s(&base), "--perturb", "2:loss:1"]].concat(),
        &[("RAYON_NUM_THREADS", "2")],
    );
    assert!(human.stdout.contains("the reference was recorded elsewhere; likely causes:"), "{}", human.stdout);
}

/// repro sets `RAYON_NUM_THREADS` for itself when the user has not (candle's CPU matrix product
/// otherwise rereads /proc/cpuinfo on every call), but a trace's environment, and that of a
/// program repro launches, stay the user's.
#[test]
fn the_thread_count_repro_pins_stays_out_of_traces_and_launched_programs() {
    let dir = tempfile::tempdir().unwrap();
    let recorded_env = |rayon: Option<&str>| {
        let out = dir.path().join(format!("t-{}", rayon.unwrap_or("unset")));
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_repro"));
        command.args(["record", "--workload", "adder", "--steps", "2", "--batch", "50", "--out", s(&out)]);
        match rayon {
            Some(threads) => command.env("RAYON_NUM_THREADS", threads),
            None => command.env_remove("RAYON_NUM_THREADS"),
        };
        assert!(command.status().unwrap().success());
        let inspected = repro(&["inspect", "--json", s(&out)]);
        json(&inspected.stdout)["header"]["environment"]["env"].clone()
    };
    assert_eq!(recorded_env(None).get("RAYON_NUM_THREADS"), None);
    assert_eq!(recorded_env(Some("1"))["RAYON_NUM_THREADS"], "1", "the user's own setting is recorded");
    // A launched program sees the variable as the user left it (it records nothing: exit 2).
    let seen = dir.path().join("seen");
    let script = format!("echo \"${{RAYON_NUM_THREADS-unset}}\" > {}", s(&seen));
    let launched = std::process::Command::new(env!("CARGO_BIN_EXE_repro"))
        .args(["record", "--out", s(&dir.path().join("p")), "--", "sh", "-c", &script])
        .env_remove("RAYON_NUM_THREADS")
        .output()
        .unwrap();
    assert_eq!(launched.status.code(), Some(2), "{}", String::from_utf8_lossy(&launched.stderr));
    assert_eq!(fs::read_to_string(&seen).unwrap().trim(), "unset");
}

/// Issue 72, item 10: a fault planted through the environment in a gate of fresh runs reaches
/// every run alike; the gate says so, and against a baseline written without it the fault fails.
#[test]
fn a_fault_planted_in_every_fresh_run_is_named_and_caught_against_a_baseline() {
    use crate::util::repro_with_env;
    let example = example("any_model");
    let dir = tempfile::tempdir().unwrap();
    let fault = [("REPRO_PERTURB", "2:head.bias:1")];
    let run = repro_with_env(&["gate", "--keep", s(&dir.path().join("kept")), "--", s(&example)], &fault);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(
        run.stderr.contains("gate: warning: REPRO_PERTURB=2:head.bias:1 plants the same fault in every run"),
        "{}",
        run.stderr
    );
    // Each run's header keeps the fault it was recorded with.
    let inspect = repro(&["inspect", s(&dir.path().join("kept/run-1"))]);
    assert!(inspect.stdout.contains("2:head.bias:1"), "{}", inspect.stdout);
    let base = dir.path().join("base.rpr");
    let run = repro(&["baseline", "write", "--out", s(&base), "--", s(&example)]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let run = repro_with_env(&["gate", "--baseline", s(&base), "--", s(&example)], &fault);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    assert!(!run.stderr.contains("plants the same fault"), "{}", run.stderr);
    let run = repro(&["gate", "--", s(&example)]);
    assert!(!run.stderr.contains("warning"), "{}", run.stderr);
}

#[test]
fn a_baseline_of_a_users_own_program_is_written_and_gated() {
    let example = example("any_model");
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("own.rpr");
    let run = repro(&["baseline", "write", "--out", s(&base), "--", s(&example)]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stderr.contains(&format!("-- {}", s(&example))), "the advice names the program: {}", run.stderr);
    let run = repro(&["inspect", s(&base)]);
    assert!(run.stdout.contains("workload       any-model"), "{}", run.stdout);

    let run = repro(&["gate", "--baseline", s(&base), "--", s(&example)]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("PASS"), "{}", run.stdout);
    // Another program is not what the baseline was written for.
    let other = crate::util::example("own_training_loop");
    let run = repro(&["gate", "--baseline", s(&base), "--", s(&other)]);
    assert_eq!(run.code, 2, "{}{}", run.stdout, run.stderr);
    assert!(run.stderr.contains("written by a run of other settings (workload any-model vs own-mlp"), "{}", run.stderr);
    // The advice is about the program's arguments, not repro's options.
    assert!(run.stderr.contains("run the program with the arguments that wrote the baseline"), "{}", run.stderr);
    assert!(!run.stderr.contains("leave out the options"), "{}", run.stderr);
}

#[test]
fn the_gate_keeps_full_values_where_capture_asks_also_in_a_users_program() {
    let dir = tempfile::tempdir().unwrap();
    let keep = dir.path().join("kept");
    let run = gate(&["--capture", "steps:2", "--keep", s(&keep)]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let inspect = repro(&["inspect", s(&keep.join("run-1"))]);
    assert!(inspect.stdout.contains("full steps 2"), "{}", inspect.stdout);

    let example = example("any_model");
    let own = dir.path().join("own");
    let run = repro(&["gate", "--capture", "steps:3", "--keep", s(&own), "--", s(&example)]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let inspect = repro(&["inspect", s(&own.join("run-0"))]);
    assert!(inspect.stdout.contains("full steps 3"), "{}", inspect.stdout);
}

#[test]
fn a_gate_with_a_tolerance_passes_small_differences_and_fails_large_ones() {
    // A program whose second run differs from its first by a planted 1-ULP fault.
    let dir = tempfile::tempdir().unwrap();
    let flag = dir.path().join("ran-once");
    let bin = env!("CARGO_BIN_EXE_repro");
    let script = format!(
        "if [ -e {flag} ]; then p='--perturb 3:predictions:1'; else p=''; touch {flag}; fi; \
         {bin} record --steps 6 --batch 200 --capture all --force --out \"$REPRO_TRACE_DIR\" $p",
        flag = flag.display()
    );
    let gate_with = |tolerance: &str| {
        let _ = std::fs::remove_file(&flag);
        repro(&["gate", "--tolerance", tolerance, "--", "sh", "-c", &script])
    };
    let loose = gate_with("abs:1e-2");
    assert_eq!(loose.code, 0, "{}{}", loose.stdout, loose.stderr);
    assert!(loose.stdout.contains("PASS  within abs:1e-2"), "{}", loose.stdout);
    assert!(loose.stdout.contains("differ within it"), "{}", loose.stdout);
    let strict = gate_with("ulp:0");
    assert_eq!(strict.code, 1, "{}{}", strict.stdout, strict.stderr);
    assert!(strict.stdout.contains("first differs at step 3"), "{}", strict.stdout);
}

#[test]
fn a_budget_cut_is_reported_and_kept_runs_are_never_overwritten() {
    let run = repro(&["gate", "--steps", "300", "--batch", "2000", "--runs", "5", "--budget", "0"]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("(--budget 0s stopped it after 2 of 5 runs)"), "{}", run.stdout);

    let dir = tempfile::tempdir().unwrap();
    let keep = dir.path().join("kept");
    assert_eq!(gate(&["--keep", s(&keep)]).code, 0);
    let again = gate(&["--keep", s(&keep)]);
    assert_eq!(again.code, 2);
    assert!(again.stderr.contains("is not empty: --keep needs a new or empty directory"), "{}", again.stderr);
}

#[test]
fn a_baseline_s_settings_are_the_gate_s_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.rpr");
    let written = repro(&["baseline", "write", "--steps", "7", "--batch", "200", "--seed", "3", "--out", s(&base)]);
    assert_eq!(written.code, 0, "{}", written.stderr);
    // No workload options: the baseline's steps, batch and seed (not the defaults 1000, 10000, 0).
    let run = repro(&["gate", "--baseline", s(&base), "--json"]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert_eq!(json(&run.stdout)["verdict"], "pass");
    // An option given still counts, and one that contradicts the baseline is refused.
    let run = repro(&["gate", "--baseline", s(&base), "--steps", "8"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("steps 7 vs 8") && run.stderr.contains("leave out the options"), "{}", run.stderr);
}

/// Issue 66, item 9: `record -- CMD` interrupted while its program runs exits as the signal
/// says (143), never as a program that failed ("signal 9", exit 2): the program died because
/// repro stopped it. Repeated, since the two used to race.
#[test]
fn an_interrupted_record_of_a_program_exits_with_the_signal_s_code() {
    for _ in 0..5 {
        let tmp = tempfile::tempdir().unwrap();
        let marker = tmp.path().join("started");
        let script = format!("touch '{}'; exec sleep 30", marker.display());
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_repro"))
            .args(["record", "--out"])
            .arg(tmp.path().join("run"))
            .args(["--", "sh", "-c", &script])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let started = std::time::Instant::now();
        while !marker.exists() {
            assert!(started.elapsed().as_secs() < 30, "the program never started");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        // SAFETY: kill(2) with a child's pid and a signal number has no memory effects.
        assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(143), "{}", String::from_utf8_lossy(&out.stderr));
    }
}

#[test]
fn an_interrupted_gate_removes_its_temporary_traces() {
    // Each signal ends the gate as a shell expects: 128 + its number.
    for (signal, code) in [(libc::SIGINT, 130), (libc::SIGTERM, 143), (libc::SIGHUP, 129)] {
        let tmp = tempfile::tempdir().unwrap();
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_repro"))
            .args(["gate", "--workload", "adder", "--steps", "100000", "--batch", "100"])
            .env("TMPDIR", tmp.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let scratch = || {
            fs::read_dir(tmp.path()).unwrap().filter_map(Result::ok).map(|e| e.path()).find(|p| {
                p.file_name().unwrap().to_string_lossy().starts_with("repro-gate-") && p.join("run-0").exists()
            })
        };
        let started = std::time::Instant::now();
        let dir = loop {
            if let Some(dir) = scratch() {
                break dir;
            }
            assert!(started.elapsed().as_secs() < 60, "the gate never started recording");
            std::thread::sleep(std::time::Duration::from_millis(50));
        };
        // SAFETY: kill(2) with a child's pid and a signal number has no memory effects.
        assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(code), "signal {signal}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(!dir.exists(), "{} left behind", dir.display());
        assert!(String::from_utf8_lossy(&out.stderr).contains("interrupted"));
    }
}

#[cfg(target_os = "linux")]
#[test]
fn a_gated_program_that_hangs_is_stopped_at_its_timeout_with_everything_it_started() {
    // A marker no other process on the machine has in its command line.
    let marker = format!("sleep 1000.{}", std::process::id());
    let script = format!("{marker} & {marker}");
    let started = std::time::Instant::now();
    let run = repro(&["gate", "--timeout", "1", "--", "sh", "-c", &script]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("ran longer than --timeout 1s"), "{}", run.stderr);
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    // Neither sleep outlives the gate: the program's whole process group was stopped.
    std::thread::sleep(std::time::Duration::from_millis(200));
    let left: Vec<String> = fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(&marker) && !c.contains("repro"))
        .collect();
    assert!(left.is_empty(), "left running: {left:?}");
}

#[test]
fn a_tolerance_keeps_values_and_is_refused_against_a_hashes_only_baseline() {
    let dir = tempfile::tempdir().unwrap();
    let kept = dir.path().join("kept");
    let run = gate(&["--tolerance", "ulp:2", "--keep", s(&kept)]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let inspect = repro(&["inspect", s(&kept.join("run-0"))]);
    assert!(
        inspect.stdout.contains("full steps 0, 1, 2,"),
        "a tolerance keeps every step's values: {}",
        inspect.stdout
    );

    let base = dir.path().join("base.rpr");
    assert_eq!(repro(&[&["baseline", "write", "--out", s(&base)][..], &SMALL].concat()).code, 0);
    let run = gate(&["--baseline", s(&base), "--tolerance", "ulp:2"]);
    assert_eq!(run.code, 2, "{}{}", run.stdout, run.stderr);
    assert!(run.stderr.contains("keeps hashes only") && run.stderr.contains("no --baseline"), "{}", run.stderr);
}

/// Writes a finished trace of no steps at `path`, of `workload` with these settings.
fn stepless_trace(path: &std::path::Path, workload: &str, params: &[(&str, &str)]) {
    use repro::trace::TraceWriter;
    let params = params.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let mut header = crate::util::test_header(workload, 12);
    header.run.params = params;
    TraceWriter::create(path, &header, false).unwrap().finish().unwrap();
}

#[test]
fn a_baseline_s_settings_never_become_options_of_the_gate() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, params: &[(&str, &str)]| {
        let path = dir.path().join(name);
        stepless_trace(&path, "adder", params);
        path
    };
    // A setting named `help` once printed the help text and passed the gate (exit 0) with no run.
    let run = repro(&["gate", "--baseline", s(&write("help", &[("help", "1")]))]);
    assert_eq!(run.code, 2, "{}{}", run.stdout, run.stderr);
    assert!(run.stderr.contains("setting `help`") && !run.stdout.contains("Usage"), "{}{}", run.stdout, run.stderr);
    // A value that looks like an option stays a value: clap refuses it as a batch size.
    let run = repro(&["gate", "--baseline", s(&write("value", &[("batch", "--help")]))]);
    assert_eq!(run.code, 2, "{}{}", run.stdout, run.stderr);
    assert!(!run.stdout.contains("Usage"), "{}", run.stdout);
}

#[test]
fn a_program_that_leaves_no_finished_trace_fails_the_gate_and_writes_no_baseline() {
    let dir = tempfile::tempdir().unwrap();
    // A trace with no steps, and one cut short, for the programs to copy.
    let empty = dir.path().join("empty");
    stepless_trace(&empty, "mine", &[]);
    let cut = crate::util::record(dir.path(), "cut", &[]);
    let records = cut.join("records.rpr");
    let len = fs::metadata(&records).unwrap().len();
    fs::OpenOptions::new().write(true).open(&records).unwrap().set_len(len - 100).unwrap();
    let programs = [
        (
            "garbage",
            "mkdir -p \"$REPRO_TRACE_DIR\" && printf 12345678 > \"$REPRO_TRACE_DIR/records.rpr\"".to_string(),
            "not a readable trace",
        ),
        (
            "link",
            "mkdir -p \"$REPRO_TRACE_DIR\" && ln -s /etc/passwd \"$REPRO_TRACE_DIR/records.rpr\"".to_string(),
            "as a link",
        ),
        ("no steps", format!("cp -r {}/. \"$REPRO_TRACE_DIR\"", s(&empty)), "recorded no steps"),
        ("unfinished", format!("cp -r {}/. \"$REPRO_TRACE_DIR\"", s(&cut)), "unfinished trace"),
    ];
    for (what, script, says) in programs {
        let run = repro(&["gate", "--", "sh", "-c", &script]);
        assert_eq!(run.code, 2, "{what}: {}{}", run.stdout, run.stderr);
        assert!(run.stderr.contains(says), "{what}: {}", run.stderr);
        let base = dir.path().join(format!("{what}.rpr"));
        let run = repro(&["baseline", "write", "--out", s(&base), "--", "sh", "-c", &script]);
        assert_eq!(run.code, 2, "{what}: {}", run.stderr);
        assert!(run.stderr.contains(says), "{what}: {}", run.stderr);
        assert!(!base.exists(), "{what}: a baseline was written");
    }
}

#[test]
fn a_baseline_is_replaced_only_when_asked_and_then_whole() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.rpr");
    let write = |extra: &[&str]| repro(&[&["baseline", "write", "--out", s(&base)][..], &SMALL, extra].concat());
    assert_eq!(write(&[]).code, 0);
    let first = fs::read(&base).unwrap();
    let run = write(&["--seed", "1"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("exists: pass --force"), "{}", run.stderr);
    assert_eq!(fs::read(&base).unwrap(), first, "the old baseline is untouched");
    assert_eq!(write(&["--seed", "1", "--force"]).code, 0);
    assert_ne!(fs::read(&base).unwrap(), first, "--force wrote the new baseline");
    let leftovers: Vec<_> = fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(leftovers.len(), 1, "no temporary file is left beside it: {leftovers:?}");
}

/// Issue 34, section 7: with `-- CMD` the built-in workloads' options would be silently
/// ignored (the program trains as its own arguments say), so they are refused.
#[test]
fn workload_options_are_refused_with_a_program_of_the_user_s_own() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let program = format!("touch {}", marker.display());
    for args in [
        vec!["gate", "--steps", "5", "--", "sh", "-c", &program],
        vec!["gate", "--workload=gpt", "--", "sh", "-c", &program],
        vec!["baseline", "write", "--out", "b.rpr", "--seed", "3", "--", "sh", "-c", &program],
    ] {
        let run = repro(&args);
        assert_eq!(run.code, 2, "{args:?}: {}", run.stderr);
        assert!(run.stderr.contains("is a setting of the built-in workloads"), "{args:?}: {}", run.stderr);
    }
    assert!(!marker.exists(), "refused before the program ran");
    // The program's own arguments after `--` are its business.
    let run = repro(&["gate", "--runs", "2", "--", "sh", "-c", &program, "--steps", "5"]);
    assert!(!run.stderr.contains("built-in workloads"), "{}", run.stderr);
}

/// Issue 72, item 11: a gate's JSON names no trace it removed; with --keep, the traces kept.
#[test]
fn a_gate_names_only_traces_that_exist() {
    let v = json(&gate(&["--json"]).stdout);
    let path = v["comparisons"][0]["diff"]["a"]["path"].as_str().unwrap().to_string();
    assert_eq!(path, "run-0 (removed; --keep DIR keeps the traces)");
    let dir = tempfile::tempdir().unwrap();
    let kept = dir.path().join("kept");
    let v = json(&gate(&["--json", "--keep", s(&kept)]).stdout);
    let path = v["comparisons"][0]["diff"]["b"]["path"].as_str().unwrap().to_string();
    assert!(std::path::Path::new(&path).join("records.rpr").is_file(), "{path}");
}

/// Issue 72, item 9: the pre-commit hook finds the repro it builds in its own checkout even where
/// `CARGO_TARGET_DIR` points elsewhere (it used to build there, then exit 127 on every commit).
#[test]
fn the_pre_commit_hook_runs_the_gate_whatever_cargo_target_dir_says() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let built = root.join("target/release/repro");
    let modified = |p: &std::path::Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    // The hook builds only where its binary is missing or older than Cargo.lock; the test's own
    // build (`cargo test --release`) is that binary, so nothing is built here.
    assert!(modified(&built) >= modified(&root.join("Cargo.lock")), "{} is older than Cargo.lock", built.display());
    let elsewhere = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(root.join("scripts/pre-commit-gate.sh"))
        .args(["--steps", "3"])
        .env("CARGO_TARGET_DIR", elsewhere.path())
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("PASS"), "{stdout}");
    assert!(!stderr.contains("building repro"), "{stderr}");
}
