use crate::util::{json, record, repro, s};

#[test]
fn same_seed_twice_is_identical_and_byte_identical() {
    let dir = tempfile::tempdir().unwrap();
    let a = record(dir.path(), "a", &["--seed", "0"]);
    let b = record(dir.path(), "b", &["--seed", "0"]);
    let run = repro(&["diff", s(&a), s(&b)]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("IDENTICAL  20 steps, 320 tensors compared, bit-exact"), "{}", run.stdout);
    for file in ["records.rpr", "tensors/step-00000000.safetensors", "tensors/step-00000019.safetensors"] {
        let (x, y) = (std::fs::read(a.join(file)).unwrap(), std::fs::read(b.join(file)).unwrap());
        assert!(x == y, "{file} differs between identical runs");
    }
}

#[test]
fn one_ulp_in_the_loss_is_found_at_its_step_and_grows() {
    let dir = tempfile::tempdir().unwrap();
    let a = record(dir.path(), "a", &[]);
    let p = record(dir.path(), "p", &["--perturb", "5:loss:1"]);
    let run = repro(&["diff", s(&a), s(&p)]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("DIVERGED  first at step 5, tensor `loss` (loss)"), "{}", run.stdout);
    assert!(run.stdout.contains("1 of 1 elements differ"), "{}", run.stdout);
    assert!(run.stdout.contains("max 1 ULP"), "{}", run.stdout);
    assert!(run.stdout.contains("perturb: (unset) | 5:loss:1"), "{}", run.stdout);

    let v = json(&repro(&["diff", s(&a), s(&p), "--json"]).stdout);
    let first = &v["first_divergence"];
    assert_eq!(first["step"], 5);
    assert_eq!(first["tensor"], "loss");
    assert_eq!(first["metrics"]["max_ulp"], 1);
    // The change reaches the gradients at the same step and the weights at the next.
    assert_eq!(v["first_divergence_by_kind"]["gradient"], 5);
    // The updated weights of step 5 already differ; the weights step 6 starts from, too.
    assert_eq!(v["first_divergence_by_kind"]["weight"], 5);
    let weight = v["tensors"].as_array().unwrap().iter().find(|t| t["name"] == "weight").unwrap();
    assert_eq!(weight["first_divergent_step"], 6);
    assert!(weight["steps_diverged"].as_u64().unwrap() >= 10, "{weight}");
}

#[test]
fn full_capture_gives_exact_metrics_at_every_step() {
    let dir = tempfile::tempdir().unwrap();
    let a = record(dir.path(), "a", &["--capture", "all"]);
    let p = record(dir.path(), "p", &["--capture", "all", "--perturb", "3:loss:-2"]);
    let v = json(&repro(&["diff", s(&a), s(&p), "--json"]).stdout);
    let first = &v["first_divergence"];
    assert_eq!((first["step"].as_u64(), first["tensor"].as_str()), (Some(3), Some("loss")));
    assert_eq!(first["metrics"]["mismatched"], 1);
    assert_eq!(first["metrics"]["max_ulp"], 2);
    assert_eq!(first["metrics"]["first_mismatch"], 0);
    let preds = v["tensors"].as_array().unwrap().iter().find(|t| t["name"] == "predictions").unwrap();
    assert_eq!(preds["first_divergent_step"], 4, "the perturbed gradient reaches the predictions one step later");
    let steps: Vec<u64> = preds["growth"].as_array().unwrap().iter().map(|g| g["step"].as_u64().unwrap()).collect();
    assert_eq!(steps[0], 4);
    assert!(steps.windows(2).all(|w| w[0] < w[1]), "{steps:?}");
    assert!(steps.iter().skip(1).all(|st| (st - 4).is_power_of_two() || *st == 19), "{steps:?}");
    assert_eq!(*steps.last().unwrap(), 19, "the last divergent step closes the series");
}

#[test]
fn hashes_alone_still_place_the_divergence() {
    let dir = tempfile::tempdir().unwrap();
    let a = record(dir.path(), "a", &["--capture", "none"]);
    let p = record(dir.path(), "p", &["--capture", "none", "--perturb", "4:predictions:1"]);
    let run = repro(&["diff", s(&a), s(&p)]);
    assert_eq!(run.code, 1);
    assert!(run.stdout.contains("first at step 4, tensor `predictions` (prediction)"), "{}", run.stdout);
    assert!(run.stdout.contains("values not stored at this step"), "{}", run.stdout);
    assert!(!a.join("tensors").exists(), "capture none must write no payloads");
}

#[test]
fn configs_lengths_and_formulations_are_reported_not_crashed_on() {
    let dir = tempfile::tempdir().unwrap();
    let reduce = record(dir.path(), "reduce", &[]);
    let matmul = record(dir.path(), "matmul", &["--formulation", "matmul"]);
    let run = repro(&["diff", s(&reduce), s(&matmul)]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(run.stdout.contains("formulation: reduce | matmul"), "{}", run.stdout);

    let short = dir.path().join("short");
    assert_eq!(repro(&["record", "--steps", "12", "--batch", "500", "--out", s(&short)]).code, 0);
    let run = repro(&["diff", s(&reduce), s(&short)]);
    assert_eq!(run.code, 1);
    assert!(run.stdout.contains("8 step(s) from step 12 recorded only in A"), "{}", run.stdout);
    assert!(run.stdout.contains("steps: 20 | 12"), "{}", run.stdout);

    let wide = dir.path().join("wide");
    assert_eq!(repro(&["record", "--steps", "20", "--batch", "500", "--features", "4", "--out", s(&wide)]).code, 0);
    let run = repro(&["diff", s(&reduce), s(&wide)]);
    assert_eq!(run.code, 1);
    assert!(run.stdout.contains("`weight` is F32 [10, 1] in A but F32 [4, 1] in B"), "{}", run.stdout);
}

#[test]
fn matrix_shows_which_runs_agree() {
    let dir = tempfile::tempdir().unwrap();
    let r0 = record(dir.path(), "r0", &[]);
    let r1 = record(dir.path(), "r1", &[]);
    let r2 = record(dir.path(), "r2", &["--perturb", "2:loss:1"]);
    let run = repro(&["matrix", s(&r0), s(&r1), s(&r2), "--step", "last", "--tensor", "loss", "--json"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    let v = json(&run.stdout);
    assert_eq!(v["step"], 19);
    let m = &v["matrices"][0]["values"];
    assert_eq!(m[0][1], 0.0);
    assert!(m[0][2].as_f64().unwrap() > 0.0);
    assert_eq!(m[0][2], m[2][0]);
    assert_eq!(m[2][2], 0.0);

    let text = repro(&["matrix", s(&r0), s(&r1), s(&r2)]).stdout;
    for tensor in ["weight", "bias", "predictions", "loss", "weight.grad", "bias.grad"] {
        assert!(text.lines().any(|l| l == tensor), "matrix for {tensor} missing:\n{text}");
    }
    let same = repro(&["matrix", s(&r0), s(&r1), "--step", "0", "--metric", "ulp"]);
    assert_eq!(same.code, 0, "{}", same.stderr);
    assert!(same.stdout.contains("(all runs bit-identical)"));
}

#[test]
fn matrix_explains_missing_values() {
    let dir = tempfile::tempdir().unwrap();
    let r0 = record(dir.path(), "r0", &[]);
    let r1 = record(dir.path(), "r1", &[]);
    let run = repro(&["matrix", s(&r0), s(&r1), "--step", "7", "--tensor", "predictions"]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("stored only the hash of `predictions` at step 7"), "{}", run.stderr);
    assert!(run.stderr.contains("--capture steps:7"), "{}", run.stderr);
    let run = repro(&["matrix", s(&r0), s(&r1), "--tensor", "nope"]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("has no tensor `nope`"), "{}", run.stderr);

    // Every tensor (the default) at a step that keeps only some values: hash-only tensors are
    // compared by hash and listed, the small inline ones get their matrices.
    let run = repro(&["matrix", s(&r0), s(&r1), "--step", "7"]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.lines().any(|l| l == "loss"), "{}", run.stdout);
    assert!(!run.stdout.lines().any(|l| l == "predictions"), "{}", run.stdout);
    assert!(run.stdout.contains("stored as hashes only at step 7"), "{}", run.stdout);
    assert!(run.stdout.contains("same hash in every run: x, y,"), "{}", run.stdout);
    let p = record(dir.path(), "p", &["--perturb", "7:predictions:1"]);
    let run = repro(&["matrix", s(&r0), s(&p), "--step", "7", "--json"]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    let v = json(&run.stdout);
    let preds = v["hash_only"].as_array().unwrap().iter().find(|h| h["tensor"] == "predictions").unwrap();
    assert_eq!(preds["identical"], false);
    // `--capture none` still keeps the one-element loss in its records.
    let none0 = record(dir.path(), "n0", &["--capture", "none"]);
    let none1 = record(dir.path(), "n1", &["--capture", "none"]);
    let run = repro(&["matrix", s(&none0), s(&none1), "--step", "0"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stdout.lines().any(|l| l == "loss") && run.stdout.contains("weight.grad"), "{}", run.stdout);
}

#[test]
fn inspect_shows_header_environment_and_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let a = record(dir.path(), "a", &["--capture", "every:5"]);
    let run = repro(&["inspect", s(&a)]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    for needle in [
        "format     1.10",
        "status     complete",
        "workload       adder",
        "formulation    reduce",
        "device         cpu",
        "20 steps (0 to 19)",
        "full steps 0, 5, 10, 15",
        "predictions       prediction  forward   F32    [500]",
    ] {
        assert!(run.stdout.contains(needle), "missing `{needle}` in:\n{}", run.stdout);
    }
    let v = json(&repro(&["inspect", s(&a), "--json"]).stdout);
    assert_eq!(v["steps"], 20);
    assert_eq!(v["header"]["capture"]["full"], "every:5");
}

#[test]
fn recording_refuses_to_overwrite_unless_forced() {
    let dir = tempfile::tempdir().unwrap();
    let a = record(dir.path(), "a", &[]);
    let again = repro(&["record", "--steps", "3", "--out", s(&a)]);
    assert_eq!(again.code, 2);
    assert!(again.stderr.contains("already holds a trace"), "{}", again.stderr);
    assert_eq!(repro(&["record", "--steps", "3", "--batch", "10", "--out", s(&a), "--force"]).code, 0);
    let v = json(&repro(&["inspect", s(&a), "--json"]).stdout);
    assert_eq!(v["steps"], 3);
    assert!(!a.join("tensors/step-00000019.safetensors").exists(), "stale payloads must go");
}

#[test]
fn the_library_example_records_a_trace_repro_can_diff() {
    // `cargo test` builds examples next to the binary's directory.
    let example = crate::util::example("own_training_loop");
    let dir = tempfile::tempdir().unwrap();
    for name in ["x", "y"] {
        let status = std::process::Command::new(&example).arg(dir.path().join(name)).status().unwrap();
        assert!(status.success());
    }
    let run = repro(&["diff", s(&dir.path().join("x")), s(&dir.path().join("y"))]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("own-mlp, 50 steps, complete"), "{}", run.stdout);
}

#[test]
fn a_recording_killed_mid_run_leaves_a_readable_incomplete_trace() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["record", "--steps", "400", "--batch", "500", "--capture", "every:50", "--out"];
    let full = dir.path().join("full");
    assert_eq!(repro(&[&args[..], &[s(&full)]].concat()).code, 0);
    let killed = dir.path().join("killed");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_repro"))
        .args(args)
        .arg(&killed)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wait until some steps are on disk, then kill -9.
    let records = killed.join("records.rpr");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::fs::metadata(&records).map(|m| m.len()).unwrap_or(0) < 20_000 {
        assert!(std::time::Instant::now() < deadline, "recorder made no progress");
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let run = repro(&["inspect", s(&killed)]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    if run.stdout.contains("status     complete") {
        return; // the run finished before the kill landed; nothing to check
    }
    assert!(run.stdout.contains("INCOMPLETE"), "{}", run.stdout);
    let v = json(&repro(&["diff", s(&full), s(&killed), "--json"]).stdout);
    assert!(v["first_divergence"].is_null(), "the steps that made it to disk match the full run");
    assert!(v["steps_compared"].as_u64().unwrap() > 0);
}

#[test]
fn ordered_reductions_are_bit_reproducible_and_atomic_ones_still_record() {
    let dir = tempfile::tempdir().unwrap();
    let a = record(dir.path(), "a", &["--reductions", "ordered"]);
    let b = record(dir.path(), "b", &["--reductions", "ordered"]);
    assert_eq!(repro(&["diff", s(&a), s(&b)]).code, 0);
    let candle = record(dir.path(), "candle", &[]);
    let run = repro(&["diff", s(&candle), s(&a)]);
    assert!(run.stdout.contains("reductions: candle | ordered"), "{}", run.stdout);
    // Racing threads may or may not reorder a given sum; what must hold is that every atomic
    // run records, stays close to the ordered one, and diffs cleanly against it.
    let atomic = record(dir.path(), "atomic", &["--reductions", "atomic"]);
    let v = json(&repro(&["diff", s(&a), s(&atomic), "--json"]).stdout);
    if let Some(m) = v["first_divergence"]["metrics"].as_object() {
        assert!(m["max_ulp"].as_u64().unwrap() < 1000, "{m:?}");
    }
}

#[test]
fn each_command_lists_its_own_options_before_the_workload_headings() {
    for (command, own) in [
        (&["record"][..], &["--out", "--force", "--capture", "--against"][..]),
        (&["gate"][..], &["--runs", "--baseline", "--budget", "--json", "--junit"][..]),
        (&["baseline", "write"][..], &["--out"][..]),
        (&["study", "noise"][..], &["--runs", "--out", "--json"][..]),
        (&["overhead"][..], &["--block", "--repeats"][..]),
    ] {
        let help = repro(&[command, &["--help"][..]].concat()).stdout;
        let lines: Vec<&str> = help.lines().collect();
        let headings = lines.iter().position(|l| l.starts_with("Classifiers (")).expect("classifier heading");
        for option in own {
            let at = lines
                .iter()
                .position(|l| l.split_whitespace().next() == Some(option))
                .unwrap_or_else(|| panic!("{command:?}: no {option}"));
            assert!(at < headings, "{command:?}: {option} is listed under the workload headings:\n{help}");
        }
    }
}

#[test]
fn a_trace_against_itself_or_another_workload_is_flagged() {
    let dir = tempfile::tempdir().unwrap();
    let a = record(dir.path(), "a", &[]);
    let run = repro(&["diff", s(&a), s(&a)]);
    assert_eq!(run.code, 0);
    assert!(run.stdout.contains("warning: A and B are the same trace"), "{}", run.stdout);
    let v = json(&repro(&["diff", s(&a), &format!("{}/.", s(&a)), "--json"]).stdout);
    assert!(v["warnings"][0].as_str().unwrap().contains("same trace"), "{v}");

    let other = dir.path().join("gpt");
    let made = repro(&[
        "record",
        "--workload",
        "gpt",
        "--steps",
        "1",
        "--batch",
        "1",
        "--context",
        "4",
        "--width",
        "8",
        "--heads",
        "2",
        "--out",
        s(&other),
    ]);
    assert_eq!(made.code, 0, "{}", made.stderr);
    let run = repro(&["diff", s(&a), s(&other)]);
    assert!(run.stdout.contains("warning: A records workload `adder` and B `gpt`"), "{}", run.stdout);

    let b = record(dir.path(), "b", &[]);
    assert!(json(&repro(&["diff", s(&a), s(&b), "--json"]).stdout)["warnings"].as_array().unwrap().is_empty());
}

#[test]
fn inspect_reads_a_traces_lone_record_file() {
    let dir = tempfile::tempdir().unwrap();
    // Default capture: payloads at the first and last steps, referenced from the record file.
    let a = record(dir.path(), "a", &[]);
    // Inside its trace, the record file opens the whole trace, payloads included.
    let run = repro(&["inspect", "--verify", s(&a.join("records.rpr"))]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stdout.contains("20 steps (0 to 19)"), "{}", run.stdout);
    assert!(run.stdout.contains("full steps 0, 19"), "{}", run.stdout);
    assert!(run.stderr.contains("176 stored values match") && !run.stderr.contains("not checked"), "{}", run.stderr);
    // Copied out on its own (a baseline), it keeps hashes and small values: what it has is
    // verified, and the payload values left behind are named, not taken for damage.
    let lone = dir.path().join("lone.rpr");
    std::fs::copy(a.join("records.rpr"), &lone).unwrap();
    let run = repro(&["inspect", "--verify", s(&lone)]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stdout.contains("full steps none"), "{}", run.stdout);
    assert!(
        run.stderr.contains("160 stored values match their hashes; 16 values kept in payload files were not checked"),
        "{}",
        run.stderr
    );
}

#[test]
fn json_reports_name_their_schema_and_verdict() {
    let dir = tempfile::tempdir().unwrap();
    let a = record(dir.path(), "a", &[]);
    let b = record(dir.path(), "b", &[]);
    let p = record(dir.path(), "p", &["--perturb", "3:predictions:1"]);
    let same = json(&repro(&["diff", s(&a), s(&b), "--json"]).stdout);
    assert_eq!((same["schema"].as_str(), same["verdict"].as_str()), (Some("repro.diff.v1"), Some("identical")));
    let differs = json(&repro(&["diff", s(&a), s(&p), "--json"]).stdout);
    assert_eq!(differs["verdict"], "diverged");
    assert_eq!(differs["first_divergence"]["step"], 3, "the report's own fields stay at the top level");
    let m = json(&repro(&["matrix", s(&a), s(&b), "--step", "last", "--json"]).stdout);
    assert_eq!((m["schema"].as_str(), m["verdict"].as_str()), (Some("repro.matrix.v1"), Some("identical")));
    let i = json(&repro(&["inspect", s(&a), "--json"]).stdout);
    assert_eq!(i["schema"], "repro.inspect.v1");
    let g = json(&repro(&["gate", "--steps", "5", "--batch", "100", "--json"]).stdout);
    assert_eq!((g["schema"].as_str(), g["verdict"].as_str()), (Some("repro.gate.v2"), Some("pass")));
}

#[test]
fn record_says_how_much_the_full_values_will_take() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("a");
    let run = repro(&["record", "--steps", "20", "--batch", "500", "--capture", "every:5", "--out", s(&out)]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    // Steps 0, 5, 10 and 15 store full values.
    assert!(run.stderr.contains("4 step(s) store them"), "{}", run.stderr);
    let hashes_only =
        repro(&["record", "--steps", "5", "--batch", "500", "--capture", "none", "--out", s(&dir.path().join("b"))]);
    assert!(!hashes_only.stderr.contains("full values take"), "{}", hashes_only.stderr);
}

#[test]
fn diff_and_matrix_draw_the_gap_as_svg() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let small = ["record", "--steps", "6", "--batch", "100", "--capture", "all"];
    assert_eq!(repro(&[&small[..], &["--out", s(&a)]].concat()).code, 0);
    assert_eq!(repro(&[&small[..], &["--perturb", "3:linear.matmul:2", "--out", s(&b)]].concat()).code, 0);

    let gap = dir.path().join("gap.svg");
    let run = repro(&["diff", s(&a), s(&b), "--plot", s(&gap), "--plot-tensor", "linear.matmul", "--json"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    let svg = std::fs::read_to_string(&gap).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("first divergence: step 3, `linear.matmul`"), "{svg}");
    // One series per kind that differs, then the tensor asked for; points only from step 3 on.
    let v = json(&run.stdout);
    let labels: Vec<&str> = v["gaps"].as_array().unwrap().iter().map(|g| g["label"].as_str().unwrap()).collect();
    assert!(labels.contains(&"kind:op_output") && labels.last() == Some(&"tensor:linear.matmul"), "{labels:?}");
    for series in v["gaps"].as_array().unwrap() {
        let first = &series["points"][0];
        assert_eq!(first["step"], 3, "{series}");
        assert!(first["max_ulp"].as_u64().unwrap() >= 1 && first["differing"].as_u64().unwrap() >= 1, "{series}");
    }

    let heat = dir.path().join("m.svg");
    let run = repro(&["matrix", s(&a), s(&b), "--step", "3", "--tensor", "linear.matmul", "--plot", s(&heat)]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    let svg = std::fs::read_to_string(&heat).unwrap();
    assert!(svg.contains("pairwise") && svg.contains("\nlinear.matmul\n"), "{svg}");
    // A plot that cannot be written is an error that names the file.
    let run = repro(&["diff", s(&a), s(&b), "--plot", s(&dir.path().join("no/such/dir/x.svg"))]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("cannot write the plot to") && run.stderr.contains("x.svg"), "{}", run.stderr);
}

/// Issue 34, section 9, and issue 66, item 12: the report leads with the verdict, the first
/// divergence, its root cause and the command that goes further; its tables come with --full, and
/// can be cut or filtered.
#[test]
fn the_text_report_is_short_and_its_tables_come_when_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let a = record(dir.path(), "a", &["--capture", "all"]);
    let p = record(dir.path(), "p", &["--perturb", "5:loss:1", "--capture", "all"]);
    let full = repro(&["diff", s(&a), s(&p), "--full"]);
    assert_eq!(full.code, 1);
    assert!(full.stdout.contains("per tensor:") && full.stdout.contains("error growth"), "{}", full.stdout);
    let full = full.stdout;

    for short in [repro(&["diff", s(&a), s(&p)]), repro(&["diff", s(&a), s(&p), "--brief"])] {
        assert_eq!(short.code, 1, "the verdict is the same");
        let text = &short.stdout;
        assert!(text.contains("DIVERGED  first at step 5, tensor `loss` (loss)"), "{text}");
        // The planted fault is named as the cause of what follows it.
        assert!(text.contains("the runs differ in a planted fault (perturb: (unset) in A, 5:loss:1 in B)"), "{text}");
        assert!(!text.contains("per tensor:") && !text.contains("error growth"), "{text}");
        assert!(text.trim_end().ends_with("`repro diff --full` (or --json)"), "{text}");
        assert!(text.lines().count() < full.lines().count() / 2);
    }
    assert_eq!(repro(&["diff", s(&a), s(&p), "--full", "--brief"]).code, 2, "the two contradict each other");

    let cut = repro(&["diff", s(&a), s(&p), "--rows", "2"]).stdout;
    assert!(cut.contains("... and ") && cut.contains("more row(s) (--rows sets how many)"), "{cut}");
    assert!(cut.lines().count() < full.lines().count());

    let gradients = repro(&["diff", s(&a), s(&p), "--kind", "gradient"]).stdout;
    let table = gradients.split("per tensor:").nth(1).unwrap().split("\n\n").next().unwrap();
    assert!(table.contains("weight.grad") && !table.contains(" loss "), "{table}");
    let named = repro(&["diff", s(&a), s(&p), "--tensor", "bias"]).stdout;
    let table = named.split("per tensor:").nth(1).unwrap().split("\n\n").next().unwrap();
    assert!(table.lines().skip(2).all(|l| l.contains("bias")), "{table}");
    // The JSON report is the whole data whatever the text shows.
    assert_eq!(json(&repro(&["diff", s(&a), s(&p), "--json"]).stdout)["verdict"], "diverged");
}

/// Issue 34, section 6: a step's tensors, one tensor's values, and its export.
#[test]
fn show_lists_a_step_and_shows_and_exports_one_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let a = record(dir.path(), "a", &[]);
    let listing = repro(&["show", s(&a), "--step", "1"]);
    assert_eq!(listing.code, 0, "{}", listing.stderr);
    assert!(listing.stdout.contains("step 1 of") && listing.stdout.contains("weight"), "{}", listing.stdout);
    // The default capture stores the first and last steps in full, step 1 as hashes only.
    assert!(listing.stdout.contains("hash only"), "{}", listing.stdout);
    let hash_only = repro(&["show", s(&a), "--step", "1", "--tensor", "predictions"]);
    assert_eq!(hash_only.code, 2);
    assert!(hash_only.stderr.contains("--capture steps:1"), "{}", hash_only.stderr);

    let out = dir.path().join("w.safetensors");
    let shown = repro(&["show", s(&a), "--tensor", "weight", "--values", "3", "--safetensors", s(&out)]);
    assert_eq!(shown.code, 0, "{}", shown.stderr);
    assert!(
        shown.stdout.contains("`weight` (weight) at step 19 of") && shown.stdout.contains("min "),
        "{}",
        shown.stdout
    );
    let v = json(&repro(&["show", s(&a), "--tensor", "weight", "--json"]).stdout);
    assert_eq!(v["schema"], "repro.show.v1");
    assert_eq!(v["stats"]["elements"], 10);
    // The export holds the recorded values: its hash is the trace's.
    let bytes = std::fs::read(&out).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let w = file.tensor("weight").unwrap();
    let hash = repro::hash::tensor_hash(repro::dtype::DType::F32, &[10, 1], w.data());
    let mut reader = repro::trace::TraceReader::open(&a).unwrap();
    let mut last = None;
    while let Some(step) = reader.next_step().unwrap() {
        last = Some(step);
    }
    let recorded = last.unwrap().tensors.into_iter().find(|t| t.name == "weight").unwrap().hash;
    assert_eq!(hash, recorded, "the exported values hash as recorded");
    assert_eq!(v["stats"]["first"].as_array().unwrap().len(), 8);
    let again = repro(&["show", s(&a), "--tensor", "weight", "--safetensors", s(&out)]);
    assert_eq!(again.code, 2, "an existing file is not replaced");

    // The same values for numpy: a .npy file that reads back bit for bit.
    let npy = dir.path().join("w.npy");
    let shown = repro(&["show", s(&a), "--tensor", "weight", "--npy", s(&npy)]);
    assert_eq!(shown.code, 0, "{}", shown.stderr);
    let read = candle_core::Tensor::read_npy(&npy).unwrap();
    let exported: Vec<f32> =
        file.tensor("weight").unwrap().data().chunks(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
    assert_eq!(read.flatten_all().unwrap().to_vec1::<f32>().unwrap(), exported);
    let again = repro(&["show", s(&a), "--tensor", "weight", "--npy", s(&npy)]);
    assert_eq!(again.code, 2, "an existing file is not replaced");
    assert!(again.stderr.contains("choose a new file"), "{}", again.stderr);
}

/// Issue 45: `show` prints every digit a value needs, so one ULP shows, and puts a tensor of
/// two traces side by side with the ULPs between their elements.
#[test]
fn show_tells_values_one_ulp_apart_and_sets_two_traces_side_by_side() {
    let dir = tempfile::tempdir().unwrap();
    let a = record(dir.path(), "a", &["--capture", "all"]);
    let b = record(dir.path(), "b", &["--capture", "all", "--perturb", "2:predictions:1@3"]);
    let first = |trace: &std::path::Path| {
        let run = repro(&["show", s(trace), "--step", "2", "--tensor", "predictions", "--values", "4"]);
        run.stdout.lines().find(|l| l.trim_start().starts_with("values:")).unwrap().to_string()
    };
    assert_ne!(first(&a), first(&b), "one ULP apart at element 3, and printed so");
    let run = repro(&["show", s(&a), "--step", "2", "--tensor", "predictions", "--values", "5", "--against", s(&b)]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("1 of 500 elements differ"), "{}", run.stdout);
    let v =
        json(&repro(&["show", s(&a), "--step", "2", "--tensor", "predictions", "--against", s(&b), "--json"]).stdout);
    assert_eq!(v["verdict"], "diverged");
    let ulps: Vec<u64> = v["first"].as_array().unwrap().iter().map(|p| p["ulps"].as_u64().unwrap()).collect();
    assert_eq!(ulps[..5], [0, 0, 0, 1, 0]);
    let same = repro(&["show", s(&a), "--step", "2", "--tensor", "weight", "--against", s(&a)]);
    assert_eq!(same.code, 0, "{}", same.stderr);
    assert!(same.stdout.contains("identical: 10 elements, bit for bit"), "{}", same.stdout);
}

/// Issue 34, section 6: loss curves, one trace's or two side by side.
#[test]
fn loss_curves_show_where_two_runs_part() {
    let dir = tempfile::tempdir().unwrap();
    let a = record(dir.path(), "a", &[]);
    let p = record(dir.path(), "p", &["--perturb", "5:loss:1"]);
    let plot = dir.path().join("loss.svg");
    let run = repro(&["loss", s(&a), s(&p), "--every", "1", "--plot", s(&plot)]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stdout.contains("the losses first differ at step 5"), "{}", run.stdout);
    let marked: Vec<&str> = run.stdout.lines().filter(|l| l.contains("<- first difference")).collect();
    assert_eq!(marked.len(), 1, "{}", run.stdout);
    assert!(marked[0].trim_start().starts_with("5 "), "{}", marked[0]);
    assert_eq!(run.stdout.lines().filter(|l| l.trim_start().starts_with(char::is_numeric)).count(), 20, "every step");
    assert!(std::fs::read_to_string(&plot).unwrap().starts_with("<svg"));
    let same = repro(&["loss", s(&a), s(&a)]);
    assert!(same.stdout.contains("bit-identical at every step"), "{}", same.stdout);
    let v = json(&repro(&["loss", s(&a), "--json"]).stdout);
    assert_eq!(v["curves"][0]["points"].as_array().unwrap().len(), 20);
    assert!(v["curves"][0]["points"][0][1].as_f64().unwrap() > 0.0);
}

/// Issue 34, section 4: the tolerance ML code writes, atol + rtol·|b|.
#[test]
fn an_allclose_tolerance_judges_each_element_by_atol_and_rtol() {
    let dir = tempfile::tempdir().unwrap();
    let a = record(dir.path(), "a", &["--capture", "all"]);
    let p = record(dir.path(), "p", &["--perturb", "5:loss:1", "--capture", "all"]);
    let within = repro(&["diff", s(&a), s(&p), "--tolerance", "allclose:1e-6:1e-5"]);
    assert_eq!(within.code, 0, "{}", within.stdout);
    assert!(within.stdout.contains("WITHIN TOLERANCE  allclose:1e-6:1e-5"), "{}", within.stdout);
    let beyond = repro(&["diff", s(&a), s(&p), "--tolerance", "allclose:0:1e-9"]);
    assert_eq!(beyond.code, 1, "{}", beyond.stdout);
    assert!(beyond.stdout.contains("DIVERGED  beyond allclose:0e0:1e-9 first at step 5"), "{}", beyond.stdout);
}

/// Issue 34, section 4: tolerances per tensor kind or name, and a repeated --tolerance.
#[test]
fn tolerances_can_name_the_tensors_they_judge() {
    let dir = tempfile::tempdir().unwrap();
    let a = record(dir.path(), "a", &["--capture", "all"]);
    let p = record(dir.path(), "p", &["--perturb", "5:loss:1", "--capture", "all"]);
    // Only the loss is judged loosely: the gradients it moves stay bit-exact, and diverge.
    let loss_only = repro(&["diff", s(&a), s(&p), "--tolerance", "loss=rel:1e-3"]);
    assert_eq!(loss_only.code, 1, "{}", loss_only.stdout);
    assert!(loss_only.stdout.contains("DIVERGED  beyond loss=rel:1e-3 first at step 5"), "{}", loss_only.stdout);
    assert!(!loss_only.stdout.contains("tensor `loss`"), "the loss itself is within: {}", loss_only.stdout);
    // A rule for the loss first, then a plain tolerance for every other tensor.
    let both = repro(&["diff", s(&a), s(&p), "--tolerance", "loss=abs:0", "--tolerance", "allclose:1e-6:1e-5"]);
    assert_eq!(both.code, 1, "{}", both.stdout);
    assert!(both.stdout.contains("first at step 5, tensor `loss` (loss)"), "{}", both.stdout);
    let v = json(
        &repro(&["diff", s(&a), s(&p), "--tolerance", "grad=allclose:1e-6:1e-5,allclose:1e-6:1e-5", "--json"]).stdout,
    );
    assert_eq!(v["verdict"], "within_tolerance", "{v}");
    assert_eq!(v["tolerance"]["kind"], "per_tensor");
}

/// Issue 35, part 2: `repro diff --map FILE` renames and leaves out tensors of both runs before
/// they are paired, for runs whose names differ; a bad map file is an error naming its line.
#[test]
fn a_name_map_pairs_tensors_named_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let a = record(dir.path(), "a", &[]);
    let b = record(dir.path(), "b", &["--perturb", "1:loss.sum:1"]);
    let map = dir.path().join("map.txt");
    let tensors = |map_text: &str, b: &std::path::Path| {
        std::fs::write(&map, map_text).unwrap();
        let v = json(&repro(&["diff", s(&a), s(b), "--map", s(&map), "--json"]).stdout);
        let names: Vec<String> =
            v["tensors"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap().to_string()).collect();
        (v, names)
    };
    // Renamed in both runs, so still paired: compared under the new name.
    let (v, names) = tensors("rename *.grad *.gradient  # a comment\n", &a);
    assert!(names.contains(&"weight.gradient".to_string()) && !names.contains(&"weight.grad".to_string()), "{names:?}");
    assert_eq!(v["verdict"], "identical");
    // Left out on both sides: the perturbed step's loss is no longer what differs first.
    let (v, names) = tensors("ignore loss*\n", &b);
    assert!(!names.iter().any(|n| n.starts_with("loss")), "{names:?}");
    assert_ne!(v["first_divergence"]["tensor"].as_str().unwrap_or("loss").get(..4), Some("loss"), "{v}");
    std::fs::write(&map, "ignore a\nrename x\n").unwrap();
    let run = repro(&["diff", s(&a), s(&b), "--map", s(&map)]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("map.txt: line 2: expected `rename PATTERN NEW`"), "{}", run.stderr);
    // Issue 45, item 4: a map that leaves nothing to compare is no verdict of identical.
    std::fs::write(&map, "ignore *\n").unwrap();
    let run = repro(&["diff", s(&a), s(&a), "--map", s(&map)]);
    assert_eq!(run.code, 2, "{}", run.stdout);
    assert!(run.stderr.contains("leaves no tensor to compare"), "{}", run.stderr);
}

/// Issue 45, item 4: renamed tensors whose values sit in the step's payload file are read
/// under the names the trace stores them by (a port check, `rename model.* *`).
#[test]
fn a_name_map_reads_the_stored_values_of_renamed_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let a = record(dir.path(), "a", &["--capture", "all", "--inline-max-bytes", "0"]);
    let b = record(dir.path(), "b", &["--capture", "all", "--inline-max-bytes", "0", "--perturb", "3:loss.sum:2"]);
    let map = dir.path().join("map.txt");
    std::fs::write(&map, "rename * model.*\n").unwrap();
    let run = repro(&["diff", s(&a), s(&b), "--map", s(&map), "--json"]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    let v = json(&run.stdout);
    assert_eq!(v["first_divergence"]["tensor"], "model.loss.sum", "{v}");
    assert_eq!(v["first_divergence"]["metrics"]["max_ulp"], 2, "{v}");
}

/// A two-step trace of one F32 matrix: step 0 keeps its values inline, step 1 only its hash.
fn matrix_trace(dir: &std::path::Path, shape: [u64; 2], values: &[f32]) {
    use repro::trace::{StepTensor, TensorKind, TensorRecord, TraceWriter};
    let header = crate::util::test_header("matrix", 2);
    let mut w = TraceWriter::create(dir, &header, false).unwrap();
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    for step in 0..2 {
        let record = TensorRecord {
            inline: (step == 0).then(|| bytes.clone()),
            ..TensorRecord::of_bytes("w", TensorKind::Weight, repro::dtype::DType::F32, shape.to_vec(), &bytes)
        };
        w.write_step(step, vec![StepTensor { record, payload: None }]).unwrap();
    }
    w.finish().unwrap();
}

/// Issue 35, part 2: a map's `transpose a|b PATTERN` compares a matrix one run stores
/// transposed (GPT-2's Conv1D against a Linear) with the other's, where values are stored.
#[test]
fn a_name_map_compares_a_matrix_stored_transposed() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, c) = (dir.path().join("a"), dir.path().join("b"), dir.path().join("c"));
    matrix_trace(&a, [2, 3], &[0., 1., 2., 3., 4., 5.]);
    matrix_trace(&b, [3, 2], &[0., 3., 1., 4., 2., 5.]);
    matrix_trace(&c, [3, 2], &[0., 3., 1., 4., 2., 6.]);
    let map = dir.path().join("map.txt");
    std::fs::write(&map, "transpose b w  # B stores w as [in, out]\n").unwrap();
    // Without the map, the layouts differ.
    assert_eq!(repro(&["diff", s(&a), s(&b)]).code, 1);
    // With it, step 0's values agree; step 1 keeps hashes only, so is not compared, and says so.
    let same = repro(&["diff", s(&a), s(&b), "--map", s(&map)]);
    assert_eq!(same.code, 0, "{}{}", same.stdout, same.stderr);
    assert!(same.stdout.contains("IDENTICAL"), "{}", same.stdout);
    assert!(
        same.stdout.contains("transposes 1 tensor record(s) at steps that keep only their hashes"),
        "{}",
        same.stdout
    );
    // One element off, found at its place in A's layout.
    let v = json(&repro(&["diff", s(&a), s(&c), "--map", s(&map), "--json"]).stdout);
    assert_eq!(v["first_divergence"]["tensor"], "w", "{v}");
    assert_eq!(v["first_divergence"]["metrics"]["mismatched"], 1, "{v}");
    assert_eq!(v["first_divergence"]["metrics"]["first_mismatch"], 5, "{v}");
}
