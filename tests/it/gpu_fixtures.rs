//! Traces recorded on GPUs (fixtures/gpu-*, see fixtures/README.md), read on the CPU.

use crate::util::{json, record_small_gpt, repro};
use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/gpu-h100").join(name)
}

fn runs(reductions: &str) -> Vec<String> {
    (0..7).map(|i| fixture(&format!("adder-{reductions}-r{i}")).to_str().unwrap().to_string()).collect()
}

fn matrix(reductions: &str, step: &str, extra: &[&str]) -> crate::util::Run {
    let runs = runs(reductions);
    let mut args: Vec<&str> = vec!["matrix"];
    args.extend(runs.iter().map(String::as_str));
    args.extend(["--step", step, "--tensor", "predictions", "--tensor", "loss", "--tensor", "weight.grad"]);
    args.extend(["--tensor", "bias.grad"]);
    args.extend_from_slice(extra);
    repro(&args)
}

#[test]
fn cpu_reproduces_the_matrices_printed_on_the_gpu() {
    for reductions in ["atomic", "ordered"] {
        for step in ["0", "last"] {
            let printed = std::fs::read_to_string(fixture(&format!("matrix-{reductions}-step-{step}.txt"))).unwrap();
            let run = matrix(reductions, step, &[]);
            let prefix = format!("{}/", fixture("").to_str().unwrap().trim_end_matches('/'));
            assert_eq!(run.stdout.replace(&prefix, ""), printed, "{reductions} step {step}");
        }
    }
}

/// Cells of the named tensor's matrix.
fn cells(v: &serde_json::Value, tensor: &str) -> Vec<f64> {
    let m = v["matrices"].as_array().unwrap().iter().find(|m| m["tensor"] == tensor).unwrap();
    m["values"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|row| row.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()))
        .collect()
}

#[test]
fn atomic_reductions_split_loss_and_bias_gradient_first_then_everything() {
    let step0 = json(&matrix("atomic", "0", &["--json"]).stdout);
    for tensor in ["predictions", "weight.grad"] {
        assert!(cells(&step0, tensor).iter().all(|&x| x == 0.0), "{tensor} must agree at step 0");
    }
    for tensor in ["loss", "bias.grad"] {
        assert!(cells(&step0, tensor).iter().any(|&x| x > 0.0), "{tensor} should differ at step 0");
    }
    let last = json(&matrix("atomic", "last", &["--json"]).stdout);
    for tensor in ["predictions", "loss", "weight.grad", "bias.grad"] {
        assert!(cells(&last, tensor).iter().any(|&x| x > 0.0), "{tensor} should differ by the last step");
    }
}

#[test]
fn ordered_reductions_are_bit_identical_on_the_gpu() {
    for step in ["0", "last"] {
        let run = matrix("ordered", step, &["--json"]);
        assert_eq!(run.code, 0, "{}", run.stderr);
        let v = json(&run.stdout);
        for tensor in ["predictions", "loss", "weight.grad", "bias.grad"] {
            assert!(cells(&v, tensor).iter().all(|&x| x == 0.0), "{tensor} at step {step}");
        }
    }
    let ordered = runs("ordered");
    let run = repro(&["diff", &ordered[0], &ordered[6]]);
    assert_eq!(run.code, 0, "{}", run.stdout);
}

#[test]
fn cpu_and_gpu_runs_of_one_config_split_at_the_first_matmul() {
    let cpu = fixture("adder-cpu-ordered");
    let gpu = fixture("adder-ordered-r0");
    let run = repro(&["diff", cpu.to_str().unwrap(), gpu.to_str().unwrap(), "--json"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    let v = json(&run.stdout);
    assert_eq!(v["first_divergence"]["step"], 0);
    assert_eq!(v["first_divergence"]["tensor"], "predictions");
    assert!(v["first_divergence"]["metrics"]["max_ulp"].as_u64().unwrap() >= 1);
    assert!(v["config_differences"].as_array().unwrap().is_empty(), "same config on both devices");
    let env = v["environment_differences"].as_array().unwrap();
    assert!(env.iter().any(|d| d["field"] == "device" && d["b"] == "cuda:0"), "{env:?}");
    assert!(env.iter().any(|d| d["b"].as_str().is_some_and(|s| s.contains("H100"))), "{env:?}");
}

/// The path of fixture `name` in `fixtures/DIR`, as the binary's argument.
fn fixture_in(dir: &str, name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures").join(dir).join(name).to_str().unwrap().to_string()
}

fn op_fixture(name: &str) -> String {
    fixture_in("gpu-h100-ops", name)
}

#[test]
fn atomic_gpu_runs_are_traced_to_the_two_reductions() {
    let run = repro(&["diff", &op_fixture("atomic-r0"), &op_fixture("atomic-r1"), "--json"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    let root = &json(&run.stdout)["root_cause"];
    assert_eq!(root["cause"]["tensor"], "loss.sum");
    assert_eq!(root["cause"]["phase"], "forward");
    assert_eq!(root["inputs_checked"], true);
    assert_eq!(root["independent"][0]["tensor"], "bias.grad");
    assert_eq!(root["independent"][0]["phase"], "backward");
}

/// Two `cnn --batch-norm --reductions atomic` runs on the H100: the first atomic reduction of
/// the step, the first batch norm's statistics, is the root cause; everything after follows.
#[test]
fn atomic_gpu_cnn_runs_are_traced_to_the_first_batch_norm() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/gpu-h100-cnn");
    let (a, b) = (dir.join("atomic-r0"), dir.join("atomic-r1"));
    let run = repro(&["diff", a.to_str().unwrap(), b.to_str().unwrap(), "--json"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    let v = json(&run.stdout);
    let root = &v["root_cause"];
    assert_eq!(root["cause"]["step"], 0);
    assert_eq!(root["cause"]["tensor"], "bn1");
    assert_eq!(root["inputs_checked"], true, "conv1 and the parameters agree");
    assert_eq!(root["independent"], serde_json::json!([]));
    let consequences: Vec<&str> =
        root["consequences"].as_array().unwrap().iter().map(|c| c["tensor"].as_str().unwrap()).collect();
    for t in ["relu1", "bn2", "predictions", "loss", "conv1.weight.grad", "bn1.gamma.grad"] {
        assert!(consequences.contains(&t), "{t} not among {consequences:?}");
    }
    // The text report lists the first consequences and counts the rest.
    let text = repro(&["diff", a.to_str().unwrap(), b.to_str().unwrap()]).stdout;
    let more = format!("... and {} more (all of them with --json)", consequences.len() - 12);
    assert!(text.contains(&more), "{text}");
    assert!(
        text.contains("`relu1` (op_output, forward): from bn1") && !text.contains("`bn1.gamma.grad` (gradient"),
        "{text}"
    );
}

#[test]
fn cpu_and_gpu_first_differ_in_the_matmul_with_identical_inputs() {
    let run = repro(&["diff", &op_fixture("ordered-cpu"), &op_fixture("ordered-cuda"), "--json"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    let v = json(&run.stdout);
    assert_eq!(v["root_cause"]["cause"]["tensor"], "linear.matmul");
    assert_eq!(v["root_cause"]["inputs_checked"], true);
    for t in v["tensors"].as_array().unwrap() {
        if ["x", "y", "weight", "bias"].contains(&t["name"].as_str().unwrap()) {
            assert_ne!(t["first_divergent_step"], 0, "{} must agree at step 0: {t}", t["name"]);
        }
    }
}

/// Parameters are recorded at the start of a step and overwritten in place at its end; a GPU
/// recorder that read them late would record the updated values. Each step's `weight` must
/// equal the previous step's `weight.updated`.
#[test]
fn gpu_traces_record_parameters_before_their_update() {
    for name in ["ordered-cuda", "atomic-r0"] {
        let mut reader = repro::trace::TraceReader::open(op_fixture(name)).unwrap();
        let mut previous: Option<repro::trace::StepRecord> = None;
        let mut checked = 0;
        while let Some(step) = reader.next_step().unwrap() {
            if let Some(prev) = &previous {
                for param in ["weight", "bias"] {
                    let now = step.tensors.iter().find(|t| t.name == param).unwrap();
                    let updated = prev.tensors.iter().find(|t| t.name == format!("{param}.updated")).unwrap();
                    assert_eq!(now.hash, updated.hash, "{name}: {param} at step {}", step.step);
                    checked += 1;
                }
            }
            previous = Some(step);
        }
        assert_eq!(checked, 38, "{name}");
    }
}

/// `repro diff --json` of the small gpt recorded on this CPU against `gpu`, a GPU trace of the
/// same run, whose graph must have the same structure.
fn small_gpt_on_the_cpu_against(gpu: &str) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let cpu = record_small_gpt(dir.path(), "cpu", "none", &[]);
    let v = json(&repro(&["diff", cpu.to_str().unwrap(), gpu, "--json"]).stdout);
    assert_eq!(v["structure"].as_array().unwrap().len(), 0, "{}", v["structure"]);
    v
}

/// A gpt trace recorded on the H100 by automatic capture (fixtures/gpu-h100-gpt/cuda) has the
/// graph this CPU captures: the same nodes under the same names, in the same order. The first
/// node that differs comes after identical leaves.
#[test]
fn a_gpu_gpt_trace_has_the_cpu_graph_and_first_differs_at_a_named_node() {
    let v = small_gpt_on_the_cpu_against(&fixture_in("gpu-h100-gpt", "cuda"));
    assert!(v["tensors_compared"].as_u64().unwrap() > 3 * 200);
    // The fixture predates format 1.5: its views are hashed by their values, this trace's by
    // what they read, so those are left out, and said to be.
    let warnings = v["warnings"].to_string();
    assert!(warnings.contains("are views of an earlier tensor in one trace and hashed by their values"), "{warnings}");
    let root = &v["root_cause"];
    assert_eq!(root["rule"], "identical_leaves");
    assert_eq!(root["cause"]["step"], 0);
    // The layer norm's first reduction: CPU and GPU sum the row in different orders.
    assert_eq!(root["cause"]["tensor"], "h[0]/ln_1#0");
}

/// The same gpt recorded on an H100 in format 1.5 (fixtures/gpu-h100-gpt15/cuda): its graph's
/// views are views on both sides, so nothing is left out, and a view of a parameter, whose hash
/// each side derives from the parameter's, agrees at step 0 as the parameters do. The first
/// node that differs is the same as with the older fixture.
#[test]
fn a_format_1_5_gpu_gpt_trace_compares_its_views_with_the_cpus() {
    let gpu = fixture_in("gpu-h100-gpt15", "cuda");
    let v = small_gpt_on_the_cpu_against(&gpu);
    assert_eq!(v["warnings"].as_array().unwrap().len(), 0, "{}", v["warnings"]);
    assert_eq!(v["root_cause"]["rule"], "identical_leaves");
    assert_eq!(v["root_cause"]["cause"]["tensor"], "h[0]/ln_1#0");
    // The views of parameters, from the GPU trace's first step.
    let mut reader = repro::trace::TraceReader::open(&gpu).unwrap();
    let step = reader.next_step().unwrap().unwrap();
    let parameters: Vec<&str> = step.tensors.iter().filter(|t| t.node.is_none()).map(|t| t.name.as_str()).collect();
    let views: Vec<&str> = step
        .tensors
        .iter()
        .filter(|t| t.view.as_ref().is_some_and(|view| parameters.contains(&view.of.as_str())))
        .map(|t| t.name.as_str())
        .collect();
    assert!(views.len() >= 10, "{views:?}");
    let tensors = v["tensors"].as_array().unwrap();
    for view in views {
        let t = tensors.iter().find(|t| t["name"] == view).unwrap_or_else(|| panic!("`{view}` was not compared"));
        assert_ne!(t["first_divergent_step"], 0, "{t}");
    }
}

/// Two same-seed gpt runs with atomic reductions on the H100: the data, the parameters and the
/// whole forward graph agree at step 0, and the bias gradients, summed by float atomics over
/// the batch's tokens, do not: the root cause is in the backward pass.
#[test]
fn atomic_gpt_runs_on_the_gpu_part_in_the_backward_pass() {
    let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/gpu-h100-gpt");
    let (a, b) = (fixtures.join("atomic-r0"), fixtures.join("atomic-r1"));
    let run = repro(&["diff", a.to_str().unwrap(), b.to_str().unwrap(), "--json"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    let v = json(&run.stdout);
    let root = &v["root_cause"];
    assert_eq!((root["rule"].as_str(), root["cause"]["step"].as_u64()), (Some("backward"), Some(0)), "{root}");
    assert!(root["cause"]["tensor"].as_str().unwrap().ends_with(".bias.grad"), "{root}");
    let others: Vec<&str> =
        root["independent"].as_array().unwrap().iter().map(|d| d["tensor"].as_str().unwrap()).collect();
    assert!(!others.is_empty() && others.iter().all(|t| t.ends_with(".bias.grad")), "{others:?}");
    // Nothing of the forward pass differs at step 0.
    let forward_at_0 =
        v["tensors"].as_array().unwrap().iter().filter(|t| t["kind"] == "op_output" && t["first_divergent_step"] == 0);
    assert_eq!(forward_at_0.count(), 0);
    let text = repro(&["diff", a.to_str().unwrap(), b.to_str().unwrap()]).stdout;
    assert!(text.contains("the backward pass computed this gradient differently"), "{text}");
}

#[test]
fn two_h200s_over_nccl_kept_replicas_and_differ_from_one_by_the_batch_split() {
    let (one, two, tree) = (
        fixture_in("gpu-h200x2-dp", "gpt-1gpu"),
        fixture_in("gpu-h200x2-dp", "gpt-2gpu"),
        fixture_in("gpu-h200x2-dp", "gpt-2gpu-tree"),
    );
    let inspect = repro(&["inspect", &two, "--verify"]);
    assert_eq!(inspect.code, 0, "{}{}", inspect.stdout, inspect.stderr);
    assert!(inspect.stdout.contains("kept identical parameters and gradient sums on all 2 ranks at all 3 steps"));
    let j = json(&repro(&["diff", &one, &two, "--json"]).stdout);
    assert_eq!(j["diff"]["first_divergence"]["tensor"], "h.0.attn.c_attn.bias.grad");
    assert_eq!(j["cause"]["type"], "batch_split", "NCCL's sum of two shares is exact");
    // At two ranks NCCL's tree adds the two shares as its ring does: a + b.
    let run = repro(&["diff", &two, &tree]);
    assert_eq!(run.code, 0, "{}", run.stdout);
    assert!(run.stdout.contains("env.NCCL_ALGO: (unset) | Tree"), "{}", run.stdout);
}

/// Graph nodes that are views of a parameter (candle-nn's `Linear` adds its bias through a
/// broadcast view of it) share the parameter's memory, which the optimizer overwrites in place
/// at the end of the step: a GPU recorder must read them before that, as the CPU does. Each
/// broadcast bias node must hash as the bias before the update, never after.
#[test]
fn gpu_graph_views_of_parameters_hold_their_values_before_the_update() {
    use repro::dtype::DType;
    use repro::hash::tensor_hash;
    let fixture = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/gpu-h200-gpt/cuda");
    let mut reader = repro::trace::TraceReader::open(fixture).unwrap();
    let step = reader.next_step().unwrap().unwrap();
    let value = |name: &str| step.tensors.iter().find(|t| t.name == name).unwrap().inline.clone().unwrap();
    let mut checked = 0;
    for bias in step.tensors.iter().filter(|t| t.node.is_none() && t.name.ends_with("c_attn.bias")) {
        let (before, after) = (value(&bias.name), value(&format!("{}.updated", bias.name)));
        assert_ne!(before, after, "{}: the update changes the bias", bias.name);
        // The broadcast over [batch 2, context 16] of the bias's 96 values.
        let shape = [2, 16, 96];
        let broadcast = |v: &[u8]| tensor_hash(DType::F32, &shape, &v.repeat(32));
        let nodes: Vec<_> = step.tensors.iter().filter(|t| t.node.is_some() && t.shape == shape).collect();
        assert!(nodes.iter().all(|n| n.hash != broadcast(&after)), "{}: a view read after the update", bias.name);
        assert!(nodes.iter().any(|n| n.hash == broadcast(&before)), "{}: no view of the bias", bias.name);
        checked += 1;
    }
    assert_eq!(checked, 2);
}

/// Issue 35: one Qwen2 checkpoint run by transformers (traced by repro_torch) and by
/// candle-transformers (traced by examples/hf_port.rs) on an H100. The frameworks differ bit for
/// bit from the first layer on and agree within 1e-4 to the logits; a port bug planted in the
/// candle side's config (rotary base 1e6 for 1e4) is named at the first layer, whose inputs,
/// the token ids, are identical.
#[test]
fn a_port_is_checked_against_pytorch_layer_by_layer() {
    let (candle, torch, bug) = (
        fixture_in("gpu-h100-port", "candle"),
        fixture_in("gpu-h100-port", "torch"),
        fixture_in("gpu-h100-port", "bug-rope_theta"),
    );
    let exact = json(&repro(&["diff", &candle, &torch, "--json"]).stdout);
    assert_eq!(exact["verdict"], "diverged", "{exact}");
    assert_eq!(exact["root_cause"]["cause"]["tensor"], "model.layers.0", "{exact}");
    let within = repro(&["diff", &candle, &torch, "--tolerance", "abs:1e-4"]);
    assert_eq!(within.code, 0, "{}", within.stdout);
    assert!(within.stdout.contains("WITHIN TOLERANCE  abs:1e-4: 1 steps, 6 tensors compared"), "{}", within.stdout);
    let v = json(&repro(&["diff", &bug, &torch, "--tolerance", "abs:1e-4", "--json"]).stdout);
    assert_eq!(v["verdict"], "diverged", "{v}");
    assert_eq!(v["first_divergence"]["tensor"], "model.layers.0", "{v}");
    assert_eq!(v["root_cause"]["cause"]["tensor"], "model.layers.0", "{v}");
    assert_eq!(v["root_cause"]["inputs_checked"], true, "{v}");
    assert!(v["root_cause"]["cause"]["metrics"]["max_abs"].as_f64().unwrap() > 1e-2, "{v}");
}
