//! `repro invariance`: a sequence run alone and in batches, compared op by op.

use crate::util::{json, repro};

const SMALL_GPT: &[&str] =
    &["invariance", "--workload", "gpt", "--context", "16", "--width", "32", "--heads", "2", "--layers", "1"];

#[test]
fn the_gpt_is_checked_in_every_batching_and_the_classes_cover_them_all() {
    let run = repro(&[SMALL_GPT, &["--batch-sizes", "1,2,5", "--paddings", "3", "--chunks", "1,4", "--json"]].concat());
    assert!(run.code == 0 || run.code == 1, "{}{}", run.stdout, run.stderr);
    let v = json(&run.stdout);
    assert_eq!(v["schema"], "repro.invariance.v1");
    let results = v["results"].as_array().unwrap();
    let labels: Vec<[u64; 4]> = results
        .iter()
        .map(|r| ["batch", "position", "padding", "chunk"].map(|k| r["batching"][k].as_u64().unwrap()))
        .collect();
    assert_eq!(
        labels,
        [[2, 0, 0, 0], [2, 1, 0, 0], [5, 0, 0, 0], [5, 4, 0, 0], [1, 0, 3, 0], [1, 0, 0, 1], [1, 0, 0, 4]],
        "first and last row of each batch size above 1, then the sequence alone: padded, decoded, in chunks"
    );
    assert_eq!(v["tokens"], 16 - 3, "the sequence leaves room for the padding in the context");
    for r in results {
        assert!(r["ops_compared"].as_u64().unwrap() > 50, "every graph node is compared: {r}");
        // A difference in the logits always has a first op.
        assert!(r["logits_identical"] == true || r["first_op"]["name"].is_string(), "{r}");
        if r["batching"]["chunk"] == 0 {
            assert_eq!(r["unmatched"].as_array().map_or(0, Vec::len), 0, "{r}");
            assert!(r["op_max_ulp"].as_array().unwrap().iter().all(|u| u.is_u64()), "every op compared: {r}");
        }
    }
    // Pieces after the first concatenate the KV cache: ops the whole prefill has not.
    let chunked = &results[6];
    assert!(chunked["unmatched"].as_array().unwrap().iter().any(|n| n.as_str().unwrap().contains("attn")), "{chunked}");
    let classes = v["classes"].as_array().unwrap();
    assert_eq!(classes.iter().map(|c| c.as_array().unwrap().len()).sum::<usize>(), 8, "the reference and 7 batchings");
    assert_eq!(classes[0][0]["batch"], 1, "the reference's class comes first");
    assert_eq!(run.code == 0, v["verdict"] == "invariant");
    assert_eq!(run.code == 0, classes.len() == 1);

    let text = repro(&[SMALL_GPT, &["--batch-sizes", "1,2"]].concat()).stdout;
    assert!(text.contains("batchings with bit-identical logits: {1"), "{text}");
}

#[test]
fn the_gpt_s_batch_invariant_mode_passes_every_check() {
    let run = repro(
        &[
            SMALL_GPT,
            &["--batch-invariant", "--batch-sizes", "1,3,8", "--paddings", "1,4", "--chunks", "1,5", "--json"],
        ]
        .concat(),
    );
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let v = json(&run.stdout);
    assert_eq!(v["verdict"], "invariant");
    assert!(v["subject"].as_str().unwrap().contains("batch-invariant kernels"), "{v}");
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 8);
    for r in results {
        // Not only the logits: every op compared is identical too.
        assert_eq!(r["logits_identical"], true, "{r}");
        assert_eq!(r["ops_differing"], 0, "{r}");
        assert!(r["ops_compared"].as_u64().unwrap() > 50, "{r}");
    }
    assert_eq!(v["classes"].as_array().unwrap().len(), 1);
    let text = repro(&[SMALL_GPT, &["--batch-invariant", "--batch-sizes", "2", "--chunks", "1"]].concat()).stdout;
    assert!(text.contains("1 decode") && text.contains("INVARIANT"), "{text}");

    // The mode trains too (its ops have backward passes), is written in the trace header, and
    // a baseline of it gates with the mode on.
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("bi.rpr");
    let gpt = [
        "--workload",
        "gpt",
        "--batch-invariant",
        "--steps",
        "2",
        "--context",
        "16",
        "--width",
        "32",
        "--heads",
        "2",
        "--layers",
        "1",
    ];
    let write = repro(&[&["baseline", "write", "--out", crate::util::s(&base)][..], &gpt].concat());
    assert_eq!(write.code, 0, "{}", write.stderr);
    let info = json(&repro(&["inspect", crate::util::s(&base), "--json"]).stdout);
    assert_eq!(info["header"]["run"]["params"]["batch_invariant"], "true", "{info}");
    let gate = repro(&["gate", "--baseline", crate::util::s(&base)]);
    assert_eq!(gate.code, 0, "{}{}", gate.stdout, gate.stderr);
}

#[test]
fn an_unmodified_qwen2_is_checked_too() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("inv.svg");
    let run = repro(&[
        "invariance",
        "--workload",
        "qwen2",
        "--context",
        "8",
        "--batch-sizes",
        "2",
        "--json",
        "--plot",
        crate::util::s(&svg),
    ]);
    assert!(run.code == 0 || run.code == 1, "{}{}", run.stdout, run.stderr);
    let v = json(&run.stdout);
    assert!(v["subject"].as_str().unwrap().starts_with("candle-transformers qwen2"), "{v}");
    // candle's fused RMS norm cuts the graph candle exposes: what is left behind the logits
    // is the output head, compared op by op.
    let r = &v["results"][0];
    assert!(r["ops_compared"].as_u64().unwrap() >= 1, "{v}");
    assert!(r["logits_identical"] == true || r["first_op"]["name"].as_str().unwrap().starts_with("lm_head"), "{v}");
    // One column per op of the alone run's graph, in every row of the heat map.
    let ops = v["ops"].as_array().unwrap().len();
    assert_eq!(r["op_max_ulp"].as_array().unwrap().len(), ops);
    let drawn = std::fs::read_to_string(&svg).unwrap();
    assert!(drawn.contains("batch invariance: candle-transformers qwen2") && drawn.contains("2@1"), "{drawn}");
}

#[test]
fn gemma_is_compared_op_by_op_inside_its_layers() {
    let run = repro(&["invariance", "--workload", "gemma", "--context", "8", "--batch-sizes", "2", "--json"]);
    assert!(run.code == 0 || run.code == 1, "{}{}", run.stdout, run.stderr);
    let v = json(&run.stdout);
    assert!(v["subject"].as_str().unwrap().starts_with("candle-transformers gemma"), "{v}");
    // Unlike Qwen2's, Gemma's graph is not cut by a fused norm: all parameters but the queries'
    // and keys' projections (behind the fused softmax) are reached, and ops inside the layers
    // are compared.
    assert_eq!(v["parameters_reached"], 16, "{v}");
    assert_eq!(v["parameters"], 20, "{v}");
    let ops: Vec<&str> = v["ops"].as_array().unwrap().iter().map(|o| o.as_str().unwrap()).collect();
    assert!(ops.iter().any(|o| o.starts_with("model.layers.1.")), "{ops:?}");
    assert!(ops.iter().any(|o| o.starts_with("norm#")) && ops.last().unwrap().starts_with("lm_head#"), "{ops:?}");
    for r in v["results"].as_array().unwrap() {
        assert!(r["error"].is_null(), "{r}");
        assert!(r["ops_compared"].as_u64().unwrap() > 30, "{r}");
        assert!(r["logits_identical"] == true || r["first_op"]["name"].is_string(), "{r}");
        // Batches and paddings give the same graph as the sequence alone: every op pairs.
        if r["batching"]["chunk"] == 0 && r["batching"]["padding"] == 0 {
            assert_eq!(r["ops_compared"].as_u64().unwrap() as usize, ops.len(), "{r}");
        }
    }
}

#[test]
fn workloads_without_a_forward_pass_and_bad_sizes_are_refused() {
    let run = repro(&["invariance", "--workload", "adder"]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("--workload gpt, --workload qwen2 or --workload gemma"), "{}", run.stderr);
    let run = repro(&["invariance", "--workload", "gpt", "--batch-sizes", "0,2"]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("at least 1"), "{}", run.stderr);
    let run = repro(&["invariance", "--workload", "gpt", "--context", "16", "--paddings", "16"]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("leaves no room"), "{}", run.stderr);
    let run = repro(&["invariance", "--workload", "qwen2", "--context", "500", "--paddings", "16"]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("exceed its 512 positions"), "{}", run.stderr);
    let run = repro(&["invariance", "--workload", "qwen2", "--batch-invariant"]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("mode of the gpt"), "{}", run.stderr);
}

#[test]
fn qwen2_runs_in_bf16_and_a_bf16_baseline_keeps_its_dtype() {
    let run = repro(&[
        "invariance",
        "--workload",
        "qwen2",
        "--dtype",
        "bf16",
        "--context",
        "8",
        "--batch-sizes",
        "2",
        "--json",
    ]);
    let v = json(&run.stdout);
    assert!(v["subject"].as_str().unwrap().contains(", bf16,"), "{v}");
    // candle-transformers 0.11.1's Qwen2 builds the mask of a chunk after the first from an F32
    // and a BF16 part, and fails: that batching is reported, the others still compared.
    assert_eq!(run.code, 2, "{}{}", run.stdout, run.stderr);
    assert_eq!(v["verdict"], "incomplete");
    let failed: Vec<&serde_json::Value> =
        v["results"].as_array().unwrap().iter().filter(|r| r["error"].is_string()).collect();
    assert_eq!(failed.len(), 1, "{v}");
    assert_eq!(failed[0]["batching"]["chunk"], 2, "{v}");
    assert!(failed[0]["error"].as_str().unwrap().contains("dtype mismatch"), "{v}");
    let decode = v["results"].as_array().unwrap().iter().find(|r| r["batching"]["chunk"] == 1).unwrap();
    assert!(decode["ops_compared"].as_u64().unwrap() >= 1, "decoding works in bf16: {decode}");

    // The gate takes a baseline's dtype as a default like its other settings.
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("q.rpr");
    let qwen = ["--workload", "qwen2", "--dtype", "bf16", "--steps", "1", "--context", "8"];
    assert_eq!(repro(&[&["baseline", "write", "--out", crate::util::s(&base)][..], &qwen].concat()).code, 0);
    // The model really ran in bf16: its recorded logits are BF16.
    let info = json(&repro(&["inspect", crate::util::s(&base), "--json"]).stdout);
    let logits = info["tensors"].as_array().unwrap().iter().find(|t| t["name"] == "logits").unwrap();
    assert_eq!(logits["dtype"], "BF16", "{logits}");
    let gate = repro(&["gate", "--baseline", crate::util::s(&base)]);
    assert_eq!(gate.code, 0, "{}{}", gate.stdout, gate.stderr);
    // The gpt trains in f32, and its forward pass runs in bf16 for the check.
    let run =
        repro(&["record", "--workload", "gpt", "--dtype", "bf16", "--out", crate::util::s(&dir.path().join("g"))]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("gpt trains in f32"), "{}", run.stderr);
    let run = repro(&["invariance", "--workload", "gpt", "--dtype", "bf16", "--batch-sizes", "1,2", "--json"]);
    assert!(run.code <= 1, "{}{}", run.stdout, run.stderr);
    let v = json(&run.stdout);
    assert!(v["subject"].as_str().unwrap().contains("bf16"), "{v}");
}

#[test]
fn the_cost_of_the_batch_invariant_mode_is_timed_and_its_logits_agree_with_the_default_s() {
    let run = repro(&[SMALL_GPT, &["--cost", "2", "--batch-sizes", "1,4", "--json"]].concat());
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let v = json(&run.stdout);
    assert_eq!(v["schema"], "repro.invariance-cost.v1");
    assert_eq!(v["passes"], 2);
    let rows = v["costs"].as_array().unwrap_or_else(|| panic!("{v}"));
    assert_eq!(rows.iter().map(|r| r["batch"].as_u64().unwrap()).collect::<Vec<_>>(), [1, 4]);
    for r in rows {
        assert!(r["default_ms"].as_f64().unwrap() > 0.0 && r["invariant_ms"].as_f64().unwrap() > 0.0, "{r}");
        // The same function in another summation order: rounding-level differences only.
        assert!(r["max_abs_diff"].as_f64().unwrap() < 1e-4, "{r}");
    }
    let text = repro(&[SMALL_GPT, &["--cost", "1", "--batch-sizes", "2"]].concat()).stdout;
    assert!(text.contains("invariant ms") && text.contains("ratio"), "{text}");
    let run = repro(&["invariance", "--workload", "qwen2", "--cost", "1"]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("--workload gpt"), "{}", run.stderr);
}
