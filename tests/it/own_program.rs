//! A user's own program through `-- CMD` (issue 34, section 1): `repro record -- CMD` with the
//! capture policy, `--against` and `--force` passed through the environment contract, and
//! `repro bisect -- CMD` from "two runs differ" to the op and its exact error. The program is
//! the `own_training_loop` example, made to differ between runs by a wrapper that plants a
//! fault (`REPRO_PERTURB`) in every second run.

use crate::util::{example, json, repro, s};
use std::path::Path;

/// A wrapper script in `dir` that runs the example, planting a 3-ULP fault in `hidden` at step
/// 5 in every second run.
fn flaky_program(dir: &Path) -> String {
    let body = format!(
        "if [ $((n % 2)) = 1 ]; then export REPRO_PERTURB=5:hidden:3; fi\nexec {}",
        example("own_training_loop").display()
    );
    counting_script(dir, "flaky.sh", &body)
}

#[test]
fn record_runs_the_program_with_the_capture_policy_and_never_replaces_a_trace_silently() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let program = example("own_training_loop");
    let run = repro(&["record", "--out", s(&out), "--capture", "steps:3,7", "--", s(&program)]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stderr.contains("recorded 50 steps of"), "{}", run.stderr);
    let inspect = repro(&["inspect", s(&out), "--json"]);
    assert_eq!(json(&inspect.stdout)["full_steps"], serde_json::json!([3, 7]), "{}", inspect.stdout);

    // A second recording into the same directory is refused, then replaced with --force.
    let again = repro(&["record", "--out", s(&out), "--", s(&program)]);
    assert_eq!(again.code, 2);
    assert!(again.stderr.contains("already holds a trace; --force replaces it"), "{}", again.stderr);
    let forced = repro(&["record", "--out", s(&out), "--force", "--capture", "all", "--", s(&program)]);
    assert_eq!(forced.code, 0, "{}", forced.stderr);
    // A directory of other files is the program's to refuse, and nothing in it is removed.
    let notes = dir.path().join("notes");
    std::fs::create_dir(&notes).unwrap();
    std::fs::write(notes.join("mine.txt"), "keep").unwrap();
    let run = repro(&["record", "--out", s(&notes), "--", s(&program)]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert_eq!(std::fs::read_to_string(notes.join("mine.txt")).unwrap(), "keep");
    // Workload options do not apply to a program.
    let refused = repro(&["record", "--out", s(&dir.path().join("x")), "--steps", "3", "--", s(&program)]);
    assert_eq!(refused.code, 2);
    assert!(refused.stderr.contains("--steps is a setting of the built-in workloads"), "{}", refused.stderr);
}

#[test]
fn record_against_a_reference_stops_at_the_first_divergence_and_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let program = flaky_program(dir.path());
    let reference = dir.path().join("reference");
    let run = repro(&["record", "--out", s(&reference), "--capture", "all", "--", &program]);
    assert_eq!(run.code, 0, "{}", run.stderr);

    let b = dir.path().join("b");
    let run = repro(&["record", "--out", s(&b), "--against", s(&reference), "--", &program]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("DIVERGED  first at step 5, tensor `hidden`"), "{}", run.stdout);
    // The reference keeps every step and the run keeps the diverging one: exact metrics.
    assert!(run.stdout.contains("max 3 ULP"), "{}", run.stdout);
    assert!(run.stderr.contains("stopped at the divergence"), "{}", run.stderr);
    let summary = json(&repro(&["inspect", s(&b), "--json"]).stdout);
    assert_eq!(summary["steps"], 6, "stopped after step 5: {summary}");

    // Agreeing with the reference: exit 0 and IDENTICAL.
    let c = dir.path().join("c");
    let run = repro(&["record", "--out", s(&c), "--against", s(&reference), "--", &program]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("IDENTICAL"), "{}", run.stdout);
}

#[test]
fn bisect_finds_the_step_and_re_records_both_sides_with_its_values() {
    let dir = tempfile::tempdir().unwrap();
    let program = flaky_program(dir.path());
    let keep = dir.path().join("kept");
    let run = repro(&["bisect", "--keep", s(&keep), "--json", "--", &program]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    let report = json(&run.stdout);
    assert_eq!(report["schema"], "repro.bisect.v1");
    assert_eq!(report["first_differing_step"], 5);
    assert_eq!(report["rounds"], 1);
    let root = &report["diff"]["diff"]["root_cause"]["cause"];
    assert_eq!(root["tensor"], "hidden", "{report}");
    assert_eq!(root["metrics"]["max_ulp"], 3, "{report}");
    assert_eq!(root["metrics"]["mismatched"], 1, "{report}");
    // The second run of each pair stopped at the divergence on purpose: no structure differs.
    let text = repro(&["bisect", "--", &program]).stdout;
    assert!(text.contains("DIVERGED  first at step 5") && !text.contains("recorded only in A"), "{text}");
    assert!(text.contains("pair 2 (full values at step 5): first differs at step 5 (reported below)"), "{text}");
    // Hash-only runs first, then a pair with values at step 5 only.
    let full = json(&repro(&["inspect", s(&keep.join("values-1-a")), "--json"]).stdout);
    assert_eq!(full["full_steps"], serde_json::json!([5]), "{full}");
    let hashes = json(&repro(&["inspect", s(&keep.join("hashes-a")), "--json"]).stdout);
    assert_eq!(hashes["full_steps"], serde_json::json!([]), "{hashes}");

    // A program whose runs agree: IDENTICAL, exit 0, no second round.
    let run = repro(&["bisect", "--", s(&example("own_training_loop"))]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("IDENTICAL"), "{}", run.stdout);
}

/// Issue 34, section 3: under a tolerance, a difference that grows past it from one within it is
/// drift, named where it began; "identical" is said only of what is bit-identical.
#[test]
fn under_a_tolerance_the_root_cause_tells_drift_from_a_new_cause() {
    let dir = tempfile::tempdir().unwrap();
    let program = example("own_training_loop");
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let run = repro(&["record", "--out", s(&a), "--capture", "all", "--", s(&program)]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    // A fault in the hidden layer's output at step 5, in a positive element (so the ReLU passes
    // it on): 20,000 ULPs of 5.85e-2, about 7.5e-5.
    let planted = format!("REPRO_PERTURB=5:hidden:20000@8 exec {}", s(&program));
    let run = repro(&["record", "--out", s(&b), "--capture", "all", "--", "sh", "-c", &planted]);
    assert_eq!(run.code, 0, "{}", run.stderr);

    // Bit-exact: the faulty op is the cause, its inputs identical.
    let exact = json(&repro(&["diff", s(&a), s(&b), "--json"]).stdout);
    assert_eq!(exact["root_cause"]["cause"]["tensor"], "hidden");
    assert_eq!(exact["root_cause"]["rule"], "recorded_inputs");

    // Forward ops may differ by 1e-4: `hidden` and `hidden.relu` are within it, the prediction
    // computed from them is not. That is drift from `hidden`, not a new cause.
    let run = repro(&["diff", s(&a), s(&b), "--tolerance", "op_output=abs:1e-4", "--json"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    let drift = json(&run.stdout);
    assert_eq!(drift["root_cause"]["cause"]["tensor"], "predictions", "{drift}");
    assert_eq!(drift["root_cause"]["rule"], "drift", "{drift}");
    assert_eq!(drift["root_cause"]["drift_from"], "hidden", "{drift}");
    let text = repro(&["diff", s(&a), s(&b), "--tolerance", "op_output=abs:1e-4"]).stdout;
    assert!(text.contains("differs only within the tolerance (by at most 7.45e-5), first at `hidden`"), "{text}");
    assert!(!text.contains("inputs are identical"), "{text}");
}

/// A script in `dir` that counts its runs and runs `body` with `$n` the runs before this one.
fn counting_script(dir: &Path, name: &str, body: &str) -> String {
    let script = dir.join(name);
    let counter = dir.join(format!("{name}.count"));
    std::fs::write(
        &script,
        format!("#!/bin/sh\nn=$(cat {c} 2>/dev/null || echo 0); echo $((n+1)) > {c}\n{body}\n", c = counter.display()),
    )
    .unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    script.display().to_string()
}

/// Issue 45, item 1: runs that record different numbers of steps differ in structure, and
/// bisect's exit code and JSON verdict say so, as its text does.
#[test]
fn bisect_follows_the_comparison_when_the_runs_record_different_steps() {
    let dir = tempfile::tempdir().unwrap();
    let program = counting_script(
        dir.path(),
        "steps.sh",
        &format!(
            "exec {} record --workload adder --steps $((5 + n % 2 * 2)) --batch 50 --out \"$REPRO_TRACE_DIR\" --force",
            env!("CARGO_BIN_EXE_repro")
        ),
    );
    let run = repro(&["bisect", "--json", "--", &program]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    let report = json(&run.stdout);
    assert_eq!(report["verdict"], "diverged", "{report}");
    assert!(!report["diff"]["diff"]["structure"].as_array().unwrap().is_empty(), "{report}");

    let run = repro(&["bisect", "--", &program]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("DIVERGED  in structure"), "{}", run.stdout);
    // The traces went with the scratch directory: no path to them is printed.
    assert!(run.stdout.contains("run A (removed; --keep DIR keeps the traces)"), "{}", run.stdout);
}

/// Issue 45, item 6: a fault that fires in one run of three. One try per pair can miss it;
/// `--runs N` records each pair's second run until it differs, and finds the fault's values.
#[test]
fn bisect_with_runs_catches_a_fault_that_fires_only_sometimes() {
    let dir = tempfile::tempdir().unwrap();
    let body = format!(
        "if [ $((n % 3)) = 2 ]; then export REPRO_PERTURB=5:hidden:3; fi\nexec {}",
        example("own_training_loop").display()
    );
    // Runs 1 and 2 agree: one try reports them identical, which is all it saw.
    let once = counting_script(dir.path(), "once.sh", &body);
    let run = repro(&["bisect", "--json", "--", &once]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);

    let retried = counting_script(dir.path(), "retried.sh", &body);
    let run = repro(&["bisect", "--runs", "3", "--json", "--", &retried]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    let report = json(&run.stdout);
    assert_eq!(report["first_differing_step"], 5, "{report}");
    let root = &report["diff"]["diff"]["root_cause"]["cause"];
    assert_eq!(root["tensor"], "hidden", "{report}");
    assert_eq!(root["metrics"]["max_ulp"], 3, "values at the step, from a pair that differs: {report}");
    assert!(run.stderr.contains("recording the second run again"), "{}", run.stderr);
}

/// Records the `any_model` example into `dir/a`, and into `dir/b` with a 1-ULP fault planted in
/// `head.bias` at step 2 (`REPRO_PERTURB`), each keeping full values as `capture` says.
fn any_model_with_a_fault(dir: &Path, capture: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let program = example("any_model");
    let (a, b) = (dir.join("a"), dir.join("b"));
    let run = repro(&["record", "--out", s(&a), "--capture", capture, "--", s(&program)]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let env = [("REPRO_PERTURB", "2:head.bias:1")];
    let run = crate::util::repro_with_env(&["record", "--out", s(&b), "--capture", capture, "--", s(&program)], &env);
    assert_eq!(run.code, 0, "{}", run.stderr);
    (a, b)
}

/// Issue 45, item 7: `REPRO_PERTURB` reaches a `ModelRecorder` program's parameters (moved for
/// the forward pass of their step, so the fault propagates as a real one would), and says what
/// it cannot reach (the loss such a program computes before repro sees it).
#[test]
fn a_perturbation_reaches_a_captured_models_parameters_and_names_what_it_cannot() {
    use crate::util::repro_with_env;
    let dir = tempfile::tempdir().unwrap();
    let program = example("any_model");
    let (a, b) = any_model_with_a_fault(dir.path(), "steps:2");
    let v = json(&repro(&["diff", s(&a), s(&b), "--json"]).stdout);
    assert_eq!(v["first_divergence"]["step"], 2, "{v}");
    // The trace keeps the parameter's true value; the node that read the moved one differs.
    assert_eq!(v["root_cause"]["rule"], "identical_leaves", "{v}");
    assert!(v["root_cause"]["cause"]["tensor"].as_str().unwrap().starts_with("net#"), "{v}");
    assert_eq!(v["root_cause"]["cause"]["metrics"]["max_ulp"].as_u64().map(|u| u <= 2), Some(true), "{v}");

    let env = [("REPRO_PERTURB", "2:loss:1")];
    let run = repro_with_env(&["record", "--out", s(&dir.path().join("c")), "--", s(&program)], &env);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("a parameter, by its VarMap name"), "{}", run.stderr);
}

/// Issue 45, item 9: an updated parameter is linked to its value before the step and its
/// gradient, so that under a tolerance a first divergence in an update says how the optimizer
/// amplified its inputs' difference, with the numbers, rather than nothing.
#[test]
fn under_a_tolerance_an_update_names_the_difference_its_optimizer_amplified() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = any_model_with_a_fault(dir.path(), "all");
    // Loose on what the step computes, strict on the weights.
    let tolerance = "grad=abs:1e-5,op_output=abs:1e-5,loss=abs:1e-5,prediction=abs:1e-5,abs:1e-8";
    let v = json(&repro(&["diff", s(&a), s(&b), "--tolerance", tolerance, "--json"]).stdout);
    let root = &v["root_cause"];
    assert_eq!(root["cause"]["phase"], "update", "{v}");
    assert_eq!(root["rule"], "drift", "{v}");
    let upstream: Vec<&str> =
        root["upstream"].as_array().unwrap().iter().map(|u| u["tensor"].as_str().unwrap()).collect();
    assert!(upstream.iter().any(|t| t.ends_with(".grad")), "{v}");
    let text = repro(&["diff", s(&a), s(&b), "--tolerance", tolerance]).stdout;
    assert!(text.contains("the optimizer's update amplified their difference into"), "{text}");
}

/// Issue 45, "record -- CMD": a timeout, --out checked before the program starts, a crash under
/// --against called a crash (not a divergence), and the program's output passed through.
#[test]
fn record_of_a_program_checks_first_bounds_its_time_and_calls_a_crash_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let program = example("own_training_loop");
    // --out is a file: refused before the program runs (it would leave a marker).
    let file = dir.path().join("a-file");
    std::fs::write(&file, "mine").unwrap();
    let marker = dir.path().join("ran");
    let touch = format!("touch {}; exec {}", s(&marker), s(&program));
    let run = repro(&["record", "--out", s(&file), "--", "sh", "-c", &touch]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("is not a directory") && !marker.exists(), "{}", run.stderr);

    // A program that runs past --timeout is stopped, and says so.
    let run = repro(&["record", "--out", s(&dir.path().join("slow")), "--timeout", "1", "--", "sleep", "30"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("ran longer than --timeout 1s"), "{}", run.stderr);

    // What the program started goes with it, also a process in a session of its own (as
    // torchrun starts its workers): at the timeout, and when the program exits first.
    #[cfg(target_os = "linux")]
    for (name, rest, timeout) in [("at-timeout", "sleep 30", "1"), ("at-exit", "true", "30")] {
        let pid_file = dir.path().join(format!("{name}.pid"));
        let escaped =
            format!("setsid sh -c 'echo $$ > {}; exec sleep 300' >/dev/null 2>&1 & sleep 0.5; {rest}", s(&pid_file));
        let out = dir.path().join(name);
        let run = repro(&["record", "--out", s(&out), "--timeout", timeout, "--", "sh", "-c", &escaped]);
        assert_eq!(run.code, 2, "{}", run.stderr);
        let pid = std::fs::read_to_string(&pid_file).unwrap().trim().to_string();
        let gone = (0..100).any(|_| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let alive = stat.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'));
            alive.then(|| std::thread::sleep(std::time::Duration::from_millis(20))).is_none()
        });
        assert!(gone, "{name}: process {pid}, started in a session of its own, outlived the program");
    }

    // The program's own output reaches the user (on stderr: repro's report is stdout).
    let reference = dir.path().join("reference");
    let chatty = format!("echo hello from the program; exec {}", s(&program));
    let run = repro(&["record", "--out", s(&reference), "--capture", "all", "--", "sh", "-c", &chatty]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stderr.contains("hello from the program") && !run.stdout.contains("hello"), "{}", run.stderr);

    // Diverging, recording to the end (--keep-going), then crashing: a failure (exit 2), not
    // a divergence (exit 1).
    let crash = format!("REPRO_PERTURB=5:hidden:3 {}; exit 3", s(&program));
    let b = dir.path().join("b");
    let run = repro(&["record", "--out", s(&b), "--against", s(&reference), "--keep-going", "--", "sh", "-c", &crash]);
    assert_eq!(run.code, 2, "{}{}", run.stdout, run.stderr);
    assert!(run.stderr.contains("a crash, not a divergence"), "{}", run.stderr);
}
