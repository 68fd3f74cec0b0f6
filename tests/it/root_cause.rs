//! Per-op recording: root cause of a planted divergence, structural differences, and online
//! comparison while recording.

use crate::util::{json, record, repro, s};
use repro::dtype::DType;
use repro::trace::{Phase, StepTensor, TensorKind, TensorRecord, TraceWriter};
use std::path::Path;

#[test]
fn a_one_ulp_change_in_one_op_is_the_root_cause_and_the_rest_are_consequences() {
    let dir = tempfile::tempdir().unwrap();
    let a = record(dir.path(), "a", &["--capture", "steps:3"]);
    let p = record(dir.path(), "p", &["--capture", "steps:3", "--perturb", "3:predictions:1"]);
    let run = repro(&["diff", s(&a), s(&p)]);
    assert_eq!(run.code, 1);
    assert!(run.stdout.contains("root cause: `predictions` (prediction, forward) at step 3"), "{}", run.stdout);
    assert!(run.stdout.contains("its recorded inputs are identical in both runs"), "{}", run.stdout);
    assert!(run.stdout.contains("consequences in the same step:"), "{}", run.stdout);

    let v = json(&repro(&["diff", s(&a), s(&p), "--json"]).stdout);
    let root = &v["root_cause"];
    assert_eq!(root["cause"]["tensor"], "predictions");
    assert_eq!(root["cause"]["phase"], "forward");
    assert_eq!(root["inputs_checked"], true);
    assert_eq!(root["cause"]["metrics"]["mismatched"], 1);
    assert_eq!(root["cause"]["metrics"]["max_ulp"], 1);
    assert!(root["independent"].as_array().unwrap().is_empty(), "{root}");
    let consequences: Vec<(&str, &serde_json::Value)> =
        root["consequences"].as_array().unwrap().iter().map(|c| (c["tensor"].as_str().unwrap(), &c["from"])).collect();
    let names: Vec<&str> = consequences.iter().map(|(n, _)| *n).collect();
    for downstream in ["loss.diff", "loss.square", "predictions.grad"] {
        assert!(names.contains(&downstream), "{downstream} missing from {names:?}");
    }
    for (name, from) in &consequences {
        assert_eq!(from[0], "predictions", "{name} should follow from the planted op");
    }
    // Nothing upstream of the planted op is blamed.
    for upstream in ["x", "weight", "bias", "linear.matmul", "linear.bias"] {
        assert!(!names.contains(&upstream), "{upstream} listed as a consequence");
    }
}

#[test]
fn a_changed_gradient_is_placed_in_the_backward_pass() {
    let dir = tempfile::tempdir().unwrap();
    let a = record(dir.path(), "a", &[]);
    // Large enough to survive the rounding of the update w - lr * g.
    let p = record(dir.path(), "p", &["--perturb", "2:weight.grad:100000"]);
    let v = json(&repro(&["diff", s(&a), s(&p), "--json"]).stdout);
    assert_eq!(v["root_cause"]["cause"]["tensor"], "weight.grad");
    assert_eq!(v["root_cause"]["cause"]["phase"], "backward");
    let consequences = v["root_cause"]["consequences"].as_array().unwrap();
    assert!(consequences.iter().any(|c| c["tensor"] == "weight.updated" && c["phase"] == "update"), "{consequences:?}");
}

/// Writes a one-step trace whose tensors are (name, seed of its values, inputs).
fn synthetic(dir: &Path, ops: &[(&str, u8, &[&str])]) {
    let header = crate::util::test_header("synthetic", 1);
    let mut w = TraceWriter::create(dir, &header, false).unwrap();
    let tensors = ops
        .iter()
        .map(|(name, seed, inputs)| {
            let bytes = vec![*seed; 16];
            StepTensor {
                record: TensorRecord {
                    inline: Some(bytes.clone()),
                    phase: Some(Phase::Forward),
                    inputs: inputs.iter().map(|s| s.to_string()).collect(),
                    ..TensorRecord::of_bytes(*name, TensorKind::OpOutput, DType::F32, vec![4], &bytes)
                },
                payload: None,
            }
        })
        .collect();
    w.write_step(0, tensors).unwrap();
    w.finish().unwrap();
}

#[test]
fn inserted_removed_and_renamed_ops_are_aligned_not_failed_on() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    synthetic(
        &a,
        &[("x", 1, &[]), ("fc1", 2, &["x"]), ("relu", 3, &["fc1"]), ("fc2", 4, &["relu"]), ("loss", 5, &["fc2"])],
    );
    synthetic(
        &b,
        &[
            ("x", 1, &[]),
            ("fc1", 2, &["x"]),
            ("gelu", 9, &["fc1"]),
            ("dropout", 7, &["gelu"]),
            ("fc2", 8, &["dropout"]),
            ("loss", 8, &["fc2"]),
        ],
    );
    let run = repro(&["diff", s(&a), s(&b)]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(run.stdout.contains("`relu` in A is `gelu` in B"), "{}", run.stdout);
    assert!(run.stdout.contains("`dropout` recorded only in B"), "{}", run.stdout);
    assert!(run.stdout.contains("root cause: `relu` (op_output, forward, `gelu` in B) at step 0"), "{}", run.stdout);
    let v = json(&repro(&["diff", s(&a), s(&b), "--json"]).stdout);
    assert_eq!(v["root_cause"]["cause"]["tensor_b"], "gelu", "B's counterpart, named: {v}");
    let consequences: Vec<&str> =
        v["root_cause"]["consequences"].as_array().unwrap().iter().map(|c| c["tensor"].as_str().unwrap()).collect();
    assert_eq!(consequences, ["fc2", "loss"]);
}

#[test]
fn the_adder_formulations_differ_in_structure_and_diff_says_how() {
    let dir = tempfile::tempdir().unwrap();
    let reduce = record(dir.path(), "reduce", &[]);
    let matmul = record(dir.path(), "matmul", &["--formulation", "matmul"]);
    let run = repro(&["diff", s(&reduce), s(&matmul)]);
    assert_eq!(run.code, 1);
    for line in [
        "`linear.bias` recorded only in A",
        "`linear.concat` recorded only in B",
        "`linear.bias_column` recorded only in B",
    ] {
        assert!(run.stdout.contains(line), "`{line}` not in:\n{}", run.stdout);
    }
}

#[test]
fn recording_against_a_reference_stops_at_the_first_divergence() {
    let dir = tempfile::tempdir().unwrap();
    let reference = record(dir.path(), "reference", &["--capture", "none"]);
    let same = dir.path().join("same");
    let run = repro(&["record", "--steps", "20", "--batch", "500", "--against", s(&reference), "--out", s(&same)]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("IDENTICAL  20 steps matched the reference"), "{}", run.stdout);
    assert!(!same.join("tensors/step-00000005.safetensors").exists(), "matching steps keep the normal policy");

    let diverged = dir.path().join("diverged");
    let args = ["record", "--steps", "20", "--batch", "500", "--perturb", "7:loss.sum:1", "--against", s(&reference)];
    let run = repro(&[&args[..], &["--out", s(&diverged)]].concat());
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("DIVERGED  step 7 differs from the reference"), "{}", run.stdout);
    assert!(run.stdout.contains("root cause: `loss.sum`"), "{}", run.stdout);
    let v = json(&repro(&["inspect", s(&diverged), "--json"]).stdout);
    assert_eq!(v["steps"], 8, "recording stops after the diverging step");
    assert_eq!(v["complete"], false, "8 of the 20 steps its header announces: finished, not complete");
    assert_eq!(v["full_steps"], serde_json::json!([0, 6, 7]), "the step before and the diverging step in full");

    let kept = dir.path().join("kept");
    let run = repro(&[&args[..], &["--keep-going", "--out", s(&kept)]].concat());
    assert_eq!(run.code, 1);
    let v = json(&repro(&["inspect", s(&kept), "--json"]).stdout);
    assert_eq!((v["steps"].as_u64(), v["complete"].as_bool()), (Some(20), Some(true)));
}

#[test]
fn an_input_of_another_shape_is_the_first_divergence_and_its_setting_explains_it() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    for (out, batch) in [(&a, "100"), (&b, "200")] {
        assert_eq!(repro(&["record", "--steps", "5", "--batch", batch, "--out", s(out)]).code, 0);
    }
    let run = repro(&["diff", s(&a), s(&b)]);
    assert_eq!(run.code, 1);
    assert!(run.stdout.contains("DIVERGED  first at step 0, tensor `x` (input)"), "{}", run.stdout);
    assert!(run.stdout.contains("other settings, which explains it: batch 100 vs 200"), "{}", run.stdout);
    assert!(run.stdout.contains("F32 [100, 10] in A, F32 [200, 10] in B"), "{}", run.stdout);
    let v = json(&repro(&["diff", s(&a), s(&b), "--json"]).stdout);
    assert_eq!(v["root_cause"]["rule"], "leaf");
    assert_eq!(v["root_cause"]["cause"]["tensor"], "x");
    assert_eq!(v["first_divergence"]["b_layout"][1], serde_json::json!([200, 10]));
    // The batches of all 5 steps differ in shape: counted as compared pairs that diverged, in
    // the totals and in the tensor's history, like pairs whose values differ.
    let x = v["tensors"].as_array().unwrap().iter().find(|t| t["name"] == "x").expect("x has a history");
    assert_eq!((x["steps_compared"].as_u64(), x["steps_diverged"].as_u64()), (Some(5), Some(5)));
    assert!(v["tensors_diverged"].as_u64().unwrap() >= 5, "{}", v["tensors_diverged"]);
    assert!(v["tensors_compared"].as_u64().unwrap() >= v["tensors_diverged"].as_u64().unwrap());
}

#[test]
fn recording_against_a_reference_names_other_settings_and_a_stopped_run_reads_as_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let reference = record(dir.path(), "ref", &[]);
    let out = dir.path().join("b");
    let run = repro(&[
        "record",
        "--steps",
        "20",
        "--batch",
        "500",
        "--seed",
        "1",
        "--against",
        s(&reference),
        "--out",
        s(&out),
    ]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.starts_with("config differs from the reference:\n  data_seed: 0 | 1\n"), "{}", run.stdout);
    assert!(run.stdout.contains("  seed: 0 | 1"), "{}", run.stdout);
    // It stopped at the divergence: finished, but not the 20 steps its header announces.
    let summary = json(&repro(&["inspect", s(&out), "--json"]).stdout);
    assert_eq!(summary["complete"], false);
    let reason = summary["incomplete_reason"].as_str().unwrap();
    assert!(reason.starts_with("stopped early: at the first divergence"), "{reason}");
}

/// Issue 45, item 2: a dropout mask drawn with another seed is randomness the trace does not
/// record, not an op that computes differently, and the root cause says so.
#[test]
fn a_dropout_mask_drawn_otherwise_is_named_as_unrecorded_randomness() {
    let dir = tempfile::tempdir().unwrap();
    let run = |name: &str, seed: &str| {
        let out = dir.path().join(name);
        let args = ["--workload", "mlp", "--dropout", "0.5", "--dropout-seed", seed, "--steps", "1"];
        let mut all = vec!["record", "--capture", "all", "--out", s(&out)];
        all.extend(args);
        let r = repro(&all);
        assert_eq!(r.code, 0, "{}", r.stderr);
        out
    };
    let (a, b) = (run("a", "1"), run("b", "2"));
    let v = json(&repro(&["diff", s(&a), s(&b), "--json"]).stdout);
    let root = &v["root_cause"];
    assert_eq!(root["cause"]["tensor"], "dropout1", "{v}");
    assert_eq!(root["random_mask"], true, "{v}");
    let text = repro(&["diff", s(&a), s(&b)]).stdout;
    assert!(text.contains("the shape of a random mask (dropout) drawn differently"), "{text}");
    assert!(!text.contains("the op computed it differently"), "{text}");

    // A fault of rounding in the same op is not taken for a mask.
    let p = dir.path().join("p");
    let r = repro(&[
        "record",
        "--capture",
        "all",
        "--out",
        s(&p),
        "--workload",
        "mlp",
        "--dropout",
        "0.5",
        "--dropout-seed",
        "1",
        "--steps",
        "1",
        "--perturb",
        "0:dropout1:1@3",
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v = json(&repro(&["diff", s(&a), s(&p), "--json"]).stdout);
    assert_eq!(v["root_cause"]["random_mask"], false, "{v}");
}

/// A captured graph whose nodes are all named `{scope}#k`, with the same values whatever the scope.
fn captured(dir: &Path, scope: &str) {
    let header = crate::util::test_header("synthetic", 1);
    let mut w = TraceWriter::create(dir, &header, false).unwrap();
    let tensors = (0..31u8)
        .map(|k| {
            let bytes = vec![k; 16];
            StepTensor {
                record: TensorRecord {
                    inline: Some(bytes.clone()),
                    phase: Some(Phase::Forward),
                    node: Some(k as u64),
                    ..TensorRecord::of_bytes(format!("{scope}#{k}"), TensorKind::OpOutput, DType::F32, vec![4], &bytes)
                },
                payload: None,
            }
        })
        .collect();
    w.write_step(0, tensors).unwrap();
    w.finish().unwrap();
}

/// Issue 45, item 5: a scope renamed with its values bit-identical is one line, not a row per
/// node, and a name map pairs it by name again.
#[test]
fn a_renamed_scope_is_one_line_and_a_map_pairs_it() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    captured(&a, "h[0]/mlp");
    captured(&b, "h[0]/ffn");
    let run = repro(&["diff", s(&a), s(&b)]);
    assert_eq!(run.code, 1, "{}", run.stdout);
    assert_eq!(run.stdout.matches("in A is").count(), 1, "{}", run.stdout);
    assert!(run.stdout.contains("scope `h[0]/mlp` in A is `h[0]/ffn` in B: 31 captured node(s)"), "{}", run.stdout);
    let map = dir.path().join("map.txt");
    std::fs::write(&map, "rename h[0]/ffn#* h[0]/mlp#*\n").unwrap();
    let run = repro(&["diff", s(&a), s(&b), "--map", s(&map)]);
    assert_eq!(run.code, 0, "{}", run.stdout);
    assert!(run.stdout.contains("IDENTICAL"), "{}", run.stdout);
}
