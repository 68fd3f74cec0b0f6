//! `repro invariance`: a sequence run alone and in batches, compared op by op.

use crate::util::{json, repro};

const SMALL_GPT: &[&str] =
    &["invariance", "--workload", "gpt", "--context", "16", "--width", "32", "--heads", "2", "--layers", "1"];

#[test]
fn the_gpt_is_checked_in_every_batching_and_the_classes_cover_them_all() {
    let run = repro(&[SMALL_GPT, &["--batch-sizes", "1,2,5", "--paddings", "3", "--json"]].concat());
    assert!(run.code == 0 || run.code == 1, "{}{}", run.stdout, run.stderr);
    let v = json(&run.stdout);
    assert_eq!(v["schema"], "repro.invariance.v1");
    let results = v["results"].as_array().unwrap();
    let labels: Vec<(u64, u64, u64)> = results
        .iter()
        .map(|r| {
            let b = &r["batching"];
            (b["batch"].as_u64().unwrap(), b["position"].as_u64().unwrap(), b["padding"].as_u64().unwrap())
        })
        .collect();
    assert_eq!(
        labels,
        [(2, 0, 0), (2, 1, 0), (5, 0, 0), (5, 4, 0), (1, 0, 3)],
        "first and last row of each batch size above 1, then the sequence alone and padded"
    );
    assert_eq!(v["tokens"], 16 - 3, "the sequence leaves room for the padding in the context");
    for r in results {
        assert!(r["ops_compared"].as_u64().unwrap() > 50, "every graph node is compared: {r}");
        assert_eq!(r["unmatched"].as_array().map_or(0, Vec::len), 0, "{r}");
        assert!(r["op_max_ulp"].as_array().unwrap().iter().all(|u| u.is_u64()), "every op compared: {r}");
        // A difference in the logits always has a first op.
        assert!(r["logits_identical"] == true || r["first_op"]["name"].is_string(), "{r}");
    }
    let classes = v["classes"].as_array().unwrap();
    assert_eq!(classes.iter().map(|c| c.as_array().unwrap().len()).sum::<usize>(), 6, "the reference and 5 batchings");
    assert_eq!(classes[0][0]["batch"], 1, "the reference's class comes first");
    assert_eq!(run.code == 0, v["verdict"] == "invariant");
    assert_eq!(run.code == 0, classes.len() == 1);

    let text = repro(&[SMALL_GPT, &["--batch-sizes", "1,2"]].concat()).stdout;
    assert!(text.contains("batchings with bit-identical logits: {1"), "{text}");
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
    assert!(r["logits_identical"] == true || r["first_op"]["name"].as_str().unwrap().starts_with("linear"), "{v}");
    // One column per op of the alone run's graph, in every row of the heat map.
    let ops = v["ops"].as_array().unwrap().len();
    assert_eq!(r["op_max_ulp"].as_array().unwrap().len(), ops);
    let drawn = std::fs::read_to_string(&svg).unwrap();
    assert!(drawn.contains("batch invariance: candle-transformers qwen2") && drawn.contains("2@1"), "{drawn}");
}

#[test]
fn workloads_without_a_forward_pass_and_bad_sizes_are_refused() {
    let run = repro(&["invariance", "--workload", "adder"]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("--workload gpt or --workload qwen2"), "{}", run.stderr);
    let run = repro(&["invariance", "--workload", "gpt", "--batch-sizes", "0,2"]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("at least 1"), "{}", run.stderr);
    let run = repro(&["invariance", "--workload", "gpt", "--context", "16", "--paddings", "16"]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("leaves no room"), "{}", run.stderr);
    let run = repro(&["invariance", "--workload", "qwen2", "--paddings", "4"]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("--paddings applies to gpt"), "{}", run.stderr);
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
    assert!(run.code == 0 || run.code == 1, "{}{}", run.stdout, run.stderr);
    let v = json(&run.stdout);
    assert!(v["subject"].as_str().unwrap().contains(", bf16,"), "{v}");

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
    let run = repro(&["invariance", "--workload", "gpt", "--dtype", "bf16"]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("gpt trains in f32"), "{}", run.stderr);
}
