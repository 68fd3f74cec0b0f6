//! Automatic graph capture, through the `gpt` workload: its model code has no recording calls,
//! and every node of its graph is recorded and named after the model's `tracing` spans.

use crate::util::{example, json, record_small_gpt, repro, s};
use std::path::{Path, PathBuf};

/// A small gpt run storing every step's full values.
fn gpt(dir: &Path, name: &str, extra: &[&str]) -> PathBuf {
    record_small_gpt(dir, name, "all", extra)
}

#[test]
fn two_gpt_runs_capture_the_same_named_nodes_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (gpt(dir.path(), "a", &[]), gpt(dir.path(), "b", &[]));
    let run = repro(&["diff", s(&a), s(&b)]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("IDENTICAL  3 steps"), "{}", run.stdout);

    let summary = json(&repro(&["inspect", s(&a), "--json"]).stdout);
    let tensors = summary["tensors"].as_array().unwrap();
    let names: Vec<&str> = tensors.iter().map(|t| t["name"].as_str().unwrap()).collect();
    // Data, then parameters by VarMap path, then graph nodes by span path, then gradients.
    assert_eq!(&names[..2], ["tokens", "targets"]);
    for expected in [
        "h.1.attn.c_attn.weight",
        "h[1]/attn/c_attn#0",
        "h[0]/mlp/c_fc#0",
        "h[1]/ln_2#0",
        "lm_head#0",
        "loss",
        "wte.weight.grad",
        "h.1.mlp.c_proj.bias.updated",
    ] {
        assert!(names.contains(&expected), "{expected} not among {names:?}");
    }
    let positions: Vec<u64> = tensors.iter().filter_map(|t| t["node"].as_u64()).collect();
    assert!(positions.len() > 50, "only {} graph nodes", positions.len());
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "graph nodes out of topological order");
    assert!(summary["no_gradient"].as_array().unwrap().is_empty());
    // Nodes that read another node's or a parameter's memory are views of it (format 1.5), and
    // the listing says of which.
    let views: Vec<&str> = tensors.iter().filter_map(|t| t["view_of"].as_str()).collect();
    assert!(views.len() > 20 && views.contains(&"h.0.attn.c_attn.weight"), "{views:?}");
    let text = repro(&["inspect", s(&a)]).stdout;
    assert!(text.contains("view of h.0.attn.c_attn.weight"), "{text}");
    // Where each node's scope was opened: the code to look at.
    assert!(text.contains(" at src/workloads/gpt/"), "{text}");
}

#[test]
fn a_fault_in_a_middle_layer_is_found_at_its_node_by_the_leaf_rule() {
    let dir = tempfile::tempdir().unwrap();
    let a = gpt(dir.path(), "a", &[]);
    let p = gpt(dir.path(), "p", &["--perturb", "1:h.1.mlp.c_fc.weight:1"]);
    let run = repro(&["diff", s(&a), s(&p)]);
    assert_eq!(run.code, 1, "{}", run.stdout);
    assert!(run.stdout.contains("root cause: `h[1]/mlp/c_fc#"), "{}", run.stdout);
    assert!(
        run.stdout.contains("every recorded leaf of the graph (data, parameters) is identical in both runs"),
        "{}",
        run.stdout
    );

    let v = json(&repro(&["diff", s(&a), s(&p), "--json"]).stdout);
    let root = &v["root_cause"];
    assert_eq!(root["rule"], "identical_leaves");
    // The first node computed from the moved weight, inside the planted layer: one element, 1 ULP.
    let cause = root["cause"]["tensor"].as_str().unwrap();
    assert!(cause.starts_with("h[1]/mlp/c_fc#"), "{cause}");
    assert_eq!(root["cause"]["step"], 1);
    assert_eq!(root["cause"]["metrics"]["mismatched"], 1);
    assert_eq!(root["cause"]["metrics"]["max_ulp"], 1);
    // Nothing before the planted layer differs: the cause is the first divergence of the run.
    assert_eq!(v["first_divergence"]["tensor"], cause);
}

#[test]
fn parameters_behind_an_op_without_backward_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let fused = gpt(dir.path(), "fused", &["--norm", "fused"]);
    let run = repro(&["inspect", s(&fused)]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stdout.contains("backpropagation never reached"), "{}", run.stdout);
    // Everything before the last fused norm loses its gradient: embeddings and block 0 included.
    for name in ["`wte.weight`", "`h.0.attn.c_attn.weight`", "`ln_f.weight`"] {
        assert!(run.stdout.contains(name), "{name} missing in:\n{}", run.stdout);
    }
    let v = json(&repro(&["inspect", s(&fused), "--json"]).stdout);
    let missing: Vec<&str> = v["no_gradient"].as_array().unwrap().iter().map(|m| m["name"].as_str().unwrap()).collect();
    assert!(!missing.contains(&"lm_head.weight"), "lm_head is after every norm: {missing:?}");
    assert!(v["no_gradient"][0]["steps"] == 3);

    // Recording says so at once, on the first step, and only once.
    let again = dir.path().join("again");
    let args = ["record", "--workload", "gpt", "--norm", "fused", "--steps", "3", "--capture", "none"];
    let run = repro(&[&args[..], &["--out", s(&again)]].concat());
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.stderr.matches("got no gradient").count(), 1, "{}", run.stderr);
    assert!(run.stderr.contains("parameter(s) got no gradient at step 0: `h.0.attn.c_attn.bias`"), "{}", run.stderr);
    let plain = repro(&["record", "--workload", "gpt", "--steps", "1", "--out", s(&dir.path().join("plain"))]);
    assert!(!plain.stderr.contains("got no gradient"), "{}", plain.stderr);

    let ops = gpt(dir.path(), "ops", &[]);
    let diff = repro(&["diff", s(&ops), s(&fused)]);
    assert!(
        diff.stdout.contains("trainable parameters that received no gradient in B: `h.0.attn.c_attn.bias`"),
        "{}",
        diff.stdout
    );
}

#[test]
fn a_graph_of_another_shape_is_a_structural_difference_not_a_failure() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (gpt(dir.path(), "a", &[]), gpt(dir.path(), "b", &["--layers", "3"]));
    let run = repro(&["diff", s(&a), s(&b)]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("config differs"), "{}", run.stdout);
    assert!(run.stdout.contains("h.2.attn.c_attn.weight"), "{}", run.stdout);
}

#[test]
fn bad_gpt_settings_are_refused_before_recording() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x");
    for (args, needle) in [
        (&["--width", "30", "--heads", "4"][..], "multiple of --heads"),
        (&["--perturb", "1:h.9.mlp.c_fc.weight:1"][..], "not a parameter of this gpt"),
        (&["--formulation", "matmul"][..], "setting of the adder"),
        (&["--steps", "0"][..], "at least 1"),
    ] {
        let mut a = vec!["record", "--workload", "gpt", "--out", s(&out)];
        a.extend_from_slice(args);
        let run = repro(&a);
        assert_eq!(run.code, 2, "{args:?}: {}", run.stderr);
        assert!(run.stderr.contains(needle), "{args:?}: {}", run.stderr);
        assert!(!out.exists(), "{args:?} created {}", out.display());
    }
}

#[test]
fn an_unmodified_candle_nn_model_records_itself_and_gates() {
    let example = example("any_model");
    let dir = tempfile::tempdir().unwrap();
    for name in ["x", "y"] {
        let status = std::process::Command::new(&example).arg(dir.path().join(name)).status().unwrap();
        assert!(status.success());
    }
    let (x, y) = (dir.path().join("x"), dir.path().join("y"));
    let run = repro(&["diff", s(&x), s(&y)]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let summary = json(&repro(&["inspect", s(&x), "--json"]).stdout);
    let names: Vec<&str> = summary["tensors"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    for expected in ["x", "conv1.weight", "net#0", "loss", "head.bias.grad", "conv2.weight.updated"] {
        assert!(names.contains(&expected), "{expected} not among {names:?}");
    }
    let gate = repro(&["gate", "--", s(&example)]);
    assert_eq!(gate.code, 0, "{}{}", gate.stdout, gate.stderr);
    assert!(gate.stdout.contains("PASS"), "{}", gate.stdout);
}

#[test]
fn candle_transformers_qwen2_records_its_forward_pass_the_same_way_twice() {
    let dir = tempfile::tempdir().unwrap();
    let mut traces = Vec::new();
    for name in ["a", "b"] {
        let out = dir.path().join(name);
        let run = repro(&["record", "--workload", "qwen2", "--steps", "2", "--context", "8", "--out", s(&out)]);
        assert_eq!(run.code, 0, "{}", run.stderr);
        // The recording says how much of the model candle's graph reaches (fused ops cut it).
        assert!(run.stderr.contains("reaches 1 of 26 parameters"), "{}", run.stderr);
        traces.push(out);
    }
    let run = repro(&["diff", s(&traces[0]), s(&traces[1])]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let summary = json(&repro(&["inspect", s(&traces[0]), "--json"]).stdout);
    let names: Vec<&str> = summary["tensors"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    for expected in ["prompts", "model.layers.1.self_attn.q_proj.weight", "model.embed_tokens.weight", "logits"] {
        assert!(names.contains(&expected), "{expected} not among {names:?}");
    }
}

#[test]
fn candle_transformers_gemma_is_captured_through_every_layer() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("g");
    let run = repro(&["record", "--workload", "gemma", "--steps", "1", "--context", "8", "--out", s(&out)]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    // Gemma's RMS norm is made of tensor ops: candle's graph reaches past every layer's norms
    // (only the queries' and keys' side of attention stays behind the fused softmax and rope).
    assert!(run.stderr.contains("reaches 16 of 20 parameters"), "{}", run.stderr);
    let summary = json(&repro(&["inspect", s(&out), "--json"]).stdout);
    assert_eq!(summary["header"]["run"]["workload"], "gemma");
    let names: Vec<&str> = summary["tensors"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert!(names.iter().any(|n| n.starts_with("model.layers.0.mlp.down_proj.weight+")), "{names:?}");
    let gate = repro(&["gate", "--baseline", s(&out)]);
    assert_eq!(gate.code, 0, "{}{}", gate.stdout, gate.stderr);
}

#[test]
fn overhead_times_any_workload_with_every_graph_node_recorded() {
    let run = repro(&[
        "overhead",
        "--header",
        "--workload",
        "gpt",
        "--steps",
        "4",
        "--batch",
        "2",
        "--context",
        "8",
        "--width",
        "16",
        "--heads",
        "2",
    ]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(
        lines[0],
        "| device | workload | tensors/step | plain step | hashes-only recording | ratio | middle half | pairs \
         | peak device memory, plain | recorded | peak host memory | trace/step |"
    );
    let cells: Vec<&str> = lines[2].split('|').map(str::trim).collect();
    assert_eq!(cells[1], "cpu");
    assert!(cells[2].starts_with("gpt (2 layers, width 16"), "{}", lines[2]);
    // The trace it timed holds every graph node, parameter, gradient and updated parameter.
    assert!(cells[3].parse::<usize>().unwrap() > 200, "{}", lines[2]);
    let ratio: f64 = cells[6].trim_end_matches('x').parse().unwrap();
    assert!(ratio > 0.0, "{}", lines[2]);
    // Four steps make two pairs of one-step blocks, the first of which warms up.
    assert_eq!(cells[8], "1", "{}", lines[2]);
    // Memory: no device peaks on the CPU; the process's peak and the trace's bytes per step.
    assert_eq!((cells[9], cells[10]), ("-", "-"), "{}", lines[2]);
    let mib = |cell: &str| cell.trim_end_matches(" MiB").parse::<f64>().unwrap();
    assert!(mib(cells[11]) > 1.0, "{}", lines[2]);
    assert!(cells[12].trim_end_matches(" KiB").parse::<f64>().unwrap() > 1.0, "{}", lines[2]);
    // One pair is far too few to time steadily: the user is told how many steps to run.
    let note = run.stderr.lines().find(|l| l.starts_with("note: 1 pair(s) of 1-step blocks")).expect(&run.stderr);
    let asked: u64 = note.rsplit("--steps ").next().unwrap().split(' ').next().unwrap().parse().unwrap();
    assert_eq!(asked, 20, "{note}");
    // A run too short to hold a recorded and a plain step is refused.
    let one = repro(&["overhead", "--workload", "gpt", "--steps", "1"]);
    assert!(one.code == 2 && one.stderr.contains("pass --steps 2 or more"), "{}", one.stderr);
}

#[test]
fn gate_and_matrix_work_on_a_captured_workload() {
    let small =
        ["--workload", "gpt", "--steps", "2", "--batch", "2", "--context", "8", "--width", "16", "--heads", "2"];
    let gate = repro(&[&["gate"][..], &small[..]].concat());
    assert_eq!(gate.code, 0, "{}{}", gate.stdout, gate.stderr);
    assert!(gate.stdout.contains("PASS"), "{}", gate.stdout);

    let dir = tempfile::tempdir().unwrap();
    let runs: Vec<PathBuf> = (0..3).map(|i| gpt(dir.path(), &format!("r{i}"), &[])).collect();
    let run = repro(&[
        "matrix",
        s(&runs[0]),
        s(&runs[1]),
        s(&runs[2]),
        "--step",
        "last",
        "--tensor",
        "loss",
        "--tensor",
        "h[1]/mlp/c_fc#3",
    ]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("h[1]/mlp/c_fc#3"), "{}", run.stdout);
    assert!(run.stdout.contains("all runs bit-identical"), "{}", run.stdout);
}

#[test]
fn a_reader_that_closes_the_pipe_early_ends_the_report_quietly() {
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    let (a, p) = (gpt(dir.path(), "a", &[]), gpt(dir.path(), "p", &["--perturb", "1:h.1.mlp.c_fc.weight:1"]));
    for _ in 0..3 {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_repro"))
            .args(["diff", s(&a), s(&p), "--json"])
            .env("RUST_BACKTRACE", "1")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Read a little of a report far larger than the pipe's buffer, then hang up.
        let mut head = [0u8; 10];
        child.stdout.take().unwrap().read_exact(&mut head).unwrap();
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "the verdict (diverged) stays the exit code: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

#[test]
fn a_tolerance_decides_which_differences_count_and_says_what_it_cannot_judge() {
    let dir = tempfile::tempdir().unwrap();
    let a = gpt(dir.path(), "a", &[]);
    let p = gpt(dir.path(), "p", &["--perturb", "1:h.1.mlp.c_fc.weight:1"]);
    // Loose enough: every difference is within it.
    let run = repro(&["diff", s(&a), s(&p), "--tolerance", "abs:1e-3"]);
    assert_eq!(run.code, 0, "{}", run.stdout);
    assert!(run.stdout.contains("WITHIN TOLERANCE  abs:1e-3: 3 steps"), "{}", run.stdout);
    let v = json(&repro(&["diff", s(&a), s(&p), "--tolerance", "abs:1e-3", "--json"]).stdout);
    assert_eq!(v["verdict"], "within_tolerance");
    assert!(v["tensors_within_tolerance"].as_u64().unwrap() > 0);
    // 1 ULP at the planted node is within ulp:4; the cause is the first tensor beyond it.
    let v = json(&repro(&["diff", s(&a), s(&p), "--tolerance", "ulp:4", "--json"]).stdout);
    assert_eq!(v["verdict"], "diverged");
    let cause = &v["root_cause"]["cause"];
    assert!(cause["metrics"]["max_ulp"].as_u64().unwrap() > 4, "{cause}");
    assert_ne!(cause["tensor"], v["largest_within_tolerance"]["tensor"]);
    assert_eq!(v["first_divergence"]["step"], 1);

    // Hashes alone cannot be judged: they count as divergences, and the report says why.
    let ha = record_small_gpt(dir.path(), "ha", "none", &[]);
    let hp = record_small_gpt(dir.path(), "hp", "none", &["--perturb", "1:h.1.mlp.c_fc.weight:1"]);
    let run = repro(&["diff", s(&ha), s(&hp), "--tolerance", "abs:1"]);
    assert_eq!(run.code, 1, "{}", run.stdout);
    assert!(run.stdout.contains("a tolerance needs values"), "{}", run.stdout);
    assert!(run.stdout.contains("--capture all"), "{}", run.stdout);

    // The matrix judges every pair of runs by the same tolerance.
    let m = repro(&["matrix", s(&a), s(&p), "--step", "last", "--tensor", "loss", "--tolerance", "abs:1e-3"]);
    assert_eq!(m.code, 0, "{}{}", m.stdout, m.stderr);
    let m = json(&repro(&["matrix", s(&a), s(&p), "--step", "last", "--tolerance", "ulp:0", "--json"]).stdout);
    assert_eq!(m["verdict"], "diverged");
    let beyond: Vec<&serde_json::Value> =
        m["matrices"].as_array().unwrap().iter().filter(|x| x.get("beyond_tolerance").is_some()).collect();
    assert!(!beyond.is_empty() && beyond[0]["beyond_tolerance"][0] == serde_json::json!([0, 1]), "{m}");

    let bad = repro(&["diff", s(&a), s(&p), "--tolerance", "ulps:4"]);
    assert_eq!(bad.code, 2);
    assert!(bad.stderr.contains("use ulp:N"), "{}", bad.stderr);
}

#[test]
fn a_perturbation_the_step_does_not_read_is_refused_and_one_it_reads_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let gpt = ["--workload", "gpt", "--width", "16", "--heads", "2", "--context", "8", "--batch", "2", "--steps", "3"];
    let record = |name: &str, extra: &[&str]| {
        let out = dir.path().join(name);
        (repro(&[&["record", "--capture", "none", "--out", out.to_str().unwrap()][..], &gpt, extra].concat()), out)
    };
    // Element 0 of the token embedding is byte 0's, which no batch holds: nothing would change.
    let (run, _) = record("byte-0", &["--perturb", "1:wte.weight:3"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("the step does not read it"), "{}", run.stderr);
    let suggested: String = run.stderr.split("starts at element ").nth(1).unwrap().split(':').next().unwrap().into();
    // The element the message suggests is read, and the diff finds it at that step.
    let (clean, a) = record("clean", &[]);
    assert_eq!(clean.code, 0, "{}", clean.stderr);
    let (planted, b) = record("planted", &["--perturb", &format!("1:wte.weight:3@{suggested}")]);
    assert_eq!(planted.code, 0, "{}", planted.stderr);
    let diff = repro(&["diff", a.to_str().unwrap(), b.to_str().unwrap()]);
    assert_eq!(diff.code, 1, "{}", diff.stdout);
    assert!(diff.stdout.contains("DIVERGED  first at step 1"), "{}", diff.stdout);
}

/// Issue 34, section 5: fused against op-built layer norms changes the graph. Nodes are paired
/// by their place in it (scope, dtype, shape), not by their positional names, and the report
/// says first that the graph changed, and where.
#[test]
fn a_changed_graph_is_named_first_and_its_nodes_pair_by_structure() {
    let dir = tempfile::tempdir().unwrap();
    let (ops, fused) = (gpt(dir.path(), "ops", &[]), gpt(dir.path(), "fused", &["--norm", "fused"]));
    let run = repro(&["diff", s(&ops), s(&fused), "--json"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    let v = json(&run.stdout);
    let changed: Vec<&str> = v["structure"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["type"] == "graph_changed")
        .map(|d| d["scope"].as_str().unwrap())
        .collect();
    assert!(changed.contains(&"h[0]/ln_1"), "{changed:?}");
    // The cause is a node of the same layout in both runs, not an op paired with another by number.
    let cause = &v["root_cause"]["cause"];
    assert!(cause["b_layout"].is_null(), "{cause}");
    assert!(cause["tensor"].as_str().unwrap().starts_with("lm_head#"), "{cause}");

    let text = repro(&["diff", s(&ops), s(&fused)]).stdout;
    let said = text.find("the graph changed in scope").expect("the changed graph is named");
    assert!(said < text.find("root cause:").unwrap(), "named before the root cause:\n{text}");
}

/// Issue 34, section 5: a node created in `repro::capture::scope` points at the line of the
/// user's code that opened the scope (format 1.4 `source`).
#[test]
fn a_scope_s_nodes_point_at_the_line_that_opened_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("any");
    let run = repro(&["record", "--out", s(&out), "--", s(&crate::util::example("any_model"))]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let source = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/any_model.rs")).unwrap();
    let line = source.lines().position(|l| l.contains("scope(\"net\"")).unwrap() + 1;
    let mut reader = repro::trace::TraceReader::open(&out).unwrap();
    let step = reader.next_step().unwrap().unwrap();
    let net = step.tensors.iter().find(|t| t.name.starts_with("net")).expect("a node of the `net` scope");
    assert_eq!(net.source.as_deref(), Some(format!("examples/any_model.rs:{line}").as_str()), "{net:?}");
    // Parameters and data carry none.
    assert!(step.tensors.iter().filter(|t| t.node.is_none()).all(|t| t.source.is_none()));
}
