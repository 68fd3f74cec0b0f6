use crate::util::{json, repro, s};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A small but real noise study: mlp on 2,000 gauss2d examples, 2 epochs at a high learning rate.
const NOISE: &[&str] =
    &["study", "noise", "--workload", "mlp", "--examples", "2000", "--epochs", "2", "--lr", "0.01", "--runs", "3"];

fn with_out<'a>(base: &[&'a str], out: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = base.to_vec();
    args.extend_from_slice(&["--out", out]);
    args.extend_from_slice(extra);
    args
}

fn finished_runs(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir.join("runs"))
        .map(|r| r.filter_map(|e| e.ok()?.file_name().into_string().ok()).filter(|n| n.ends_with(".json")).collect())
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn noise_study_reports_every_variant_and_resumes_after_a_kill() {
    let tmp = tempfile::tempdir().unwrap();
    let (full, resumed) = (tmp.path().join("full"), tmp.path().join("resumed"));

    let run = repro(&with_out(NOISE, s(&full), &["--json"]));
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let report = json(&run.stdout);
    let variants = report["variants"].as_array().unwrap();
    let names: Vec<&str> = variants.iter().map(|v| v["variant"].as_str().unwrap()).collect();
    assert_eq!(names, ["control", "algo", "impl", "algo+impl"]);
    let control = &variants[0];
    assert_eq!(control["accuracy_stdev"], 0.0, "fixed seeds and ordered reductions repeat exactly");
    assert_eq!(control["churn"], 0.0);
    assert_eq!(control["l2_normalized"], 0.0);
    assert!(variants[1]["l2_normalized"].as_f64().unwrap() > 0.1, "different seeds give different weights");
    assert!(control["accuracy_mean"].as_f64().unwrap() > 0.8, "the mlp learns gauss2d: {control}");
    for file in ["noise.md", "noise.json", "noise.svg", "study.json"] {
        assert!(full.join(file).exists(), "{file} missing");
    }
    assert!(std::fs::read_to_string(full.join("noise.svg")).unwrap().starts_with("<svg"));
    assert_eq!(finished_runs(&full).len(), 12);
    let shown = repro(&["study", "show", s(&full.join("noise.json"))]);
    assert_eq!(shown.code, 0, "{}", shown.stderr);
    assert!(shown.stdout.contains("control runs agree exactly"), "{}", shown.stdout);
    assert!(shown.stdout.contains("algo+impl"), "{}", shown.stdout);

    // Interrupt a second study after some runs, then resume it.
    let out = s(&resumed).to_string();
    let mut child = Command::new(env!("CARGO_BIN_EXE_repro"))
        .args(with_out(NOISE, &out, &[]))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while finished_runs(&resumed).len() < 3 && started.elapsed() < Duration::from_secs(120) {
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let before = finished_runs(&resumed);
    assert!((3..12).contains(&before.len()), "killed after {} runs", before.len());
    let stamps: Vec<_> =
        before.iter().map(|n| std::fs::metadata(resumed.join("runs").join(n)).unwrap().modified().unwrap()).collect();

    let run = repro(&with_out(NOISE, &out, &["--json"]));
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    for (name, stamp) in before.iter().zip(&stamps) {
        let now = std::fs::metadata(resumed.join("runs").join(name)).unwrap().modified().unwrap();
        assert_eq!(&now, stamp, "finished run {name} was redone");
    }
    assert_eq!(finished_runs(&resumed).len(), 12);
    // The deterministic variants give the same numbers whether or not the study was interrupted.
    let again = json(&run.stdout);
    for v in 0..2 {
        assert_eq!(again["variants"][v], report["variants"][v], "variant {v}");
    }

    // Other settings in the same directory are refused, not mixed in.
    let run = repro(&with_out(NOISE, &out, &["--seed", "5"]));
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("other settings") && run.stderr.contains("--restart"), "{}", run.stderr);
}

#[test]
fn devices_study_finds_identical_runs_and_the_root_cause_of_atomic_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let base = ["study", "devices", "--workload", "cnn", "--batch-norm", "--epochs", "1", "--devices", "cpu,cpu"];
    let same = tmp.path().join("same");
    let run = repro(&with_out(&base, s(&same), &[]));
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("cpu vs cpu: IDENTICAL"), "{}", run.stdout);

    let atomic = tmp.path().join("atomic");
    let run = repro(&with_out(&base, s(&atomic), &["--reductions", "atomic", "--json"]));
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    let report = json(&run.stdout);
    let c = &report["comparisons"][0];
    assert_eq!(c["identical"], false);
    // The batch-norm layers' statistics are the atomic reductions of step 0. Racing threads
    // can happen to add one layer's rows in the same order in both runs, so the first that
    // differs is a batch norm, usually `bn1`, not always.
    assert_eq!(c["first_divergence"][0], 0);
    let layer = c["first_divergence"][1].as_str().unwrap();
    assert!(layer.starts_with("bn"), "{c}");
    assert!(c["root_cause"].as_str().unwrap().contains(&format!("`{layer}`")), "{c}");
    // Each model evaluated on each device: its own device's error on the diagonal.
    let cross = report["cross_error"].as_array().unwrap();
    assert_eq!(cross.len(), 2);
    for (i, row) in cross.iter().enumerate() {
        assert_eq!(row.as_array().unwrap().len(), 2);
        assert_eq!(row[i], report["runs"][i]["error_rate"], "{cross:?}");
    }
    let gaps = c["weight_gap"].as_array().unwrap();
    assert_eq!(gaps[0]["step"], 0);
    assert_eq!(gaps[0]["max_ulp"], 0, "both runs start from the same weights");
    assert!(gaps.last().unwrap()["max_ulp"].as_u64().unwrap() > 0, "{gaps:?}");
    assert!(std::fs::read_to_string(atomic.join("devices.svg")).unwrap().starts_with("<svg"));
}

#[test]
fn cost_study_times_every_mode_of_every_workload() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("cost");
    let args = ["study", "cost", "--workloads", "mlp,gpt", "--steps", "3", "--rounds", "1", "--batch", "4", "--json"];
    let run = repro(&with_out(&args, s(&out), &[]));
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let rows = json(&run.stdout)["rows"].as_array().unwrap().clone();
    let modes: Vec<&str> = rows.iter().map(|r| r["reductions"].as_str().unwrap()).collect();
    assert_eq!(modes, ["candle", "ordered", "atomic", "candle", "ordered", "atomic"]);
    for r in &rows {
        assert_eq!(r["steps_timed"], 3, "{r}");
        assert!(r["median_ms"].as_f64().unwrap() > 0.0, "{r}");
        assert_eq!(r["deterministic"], r["reductions"] != "atomic");
    }
    assert_eq!(rows[2]["overhead_vs_atomic_percent"], 0.0);
    assert!(rows[3]["workload"].as_str().unwrap().starts_with("gpt (2 layers, width 128, batch 4)"), "{}", rows[3]);
    assert!(out.join("cost.md").exists() && out.join("cost.svg").exists());
}

#[test]
fn studies_refuse_bad_settings_with_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("x");
    for (args, expected) in [
        (vec!["study", "noise", "--workload", "adder"], "studies train mlp, cnn, resnet18 or gpt, not adder"),
        (vec!["study", "noise", "--workload", "mlp", "--runs", "1"], "--runs 2 or more"),
        (vec!["study", "noise", "--workload", "cnn", "--dataset", "gauss2d"], "trains on images"),
        (vec!["study", "devices", "--workload", "mlp", "--devices", "cpu"], "two or more devices"),
        (vec!["study", "cost", "--workloads", "vgg"], "unknown model `vgg`"),
    ] {
        let run = repro(&with_out(&args, s(&out), &[]));
        assert_eq!(run.code, 2, "{args:?}: {}", run.stderr);
        assert!(run.stderr.contains(expected), "{args:?}: {}", run.stderr);
    }
    std::fs::write(tmp.path().join("mine.txt"), "keep").unwrap();
    let run = repro(&["study", "show", s(&tmp.path().join("mine.txt"))]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("mine.txt: not a study report"), "{}", run.stderr);
    let run = repro(&["study", "noise", "--workload", "mlp", "--out", s(tmp.path())]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("not a study directory"), "{}", run.stderr);
    assert!(tmp.path().join("mine.txt").exists());
}

#[test]
fn a_classifier_run_records_per_layer_and_a_planted_ulp_is_traced_to_its_layer() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, p) = (tmp.path().join("a"), tmp.path().join("p"));
    let base = ["record", "--workload", "cnn", "--steps", "4", "--examples", "256"];
    for (out, extra) in [(&a, vec![]), (&p, vec!["--perturb", "2:fc2:1"])] {
        let mut args = base.to_vec();
        args.extend_from_slice(&["--out", s(out)]);
        args.extend(extra);
        let run = repro(&args);
        assert_eq!(run.code, 0, "{}", run.stderr);
    }
    let run = repro(&["diff", s(&a), s(&p), "--json"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    let v = json(&run.stdout);
    assert_eq!(v["first_divergence"]["step"], 2);
    assert_eq!(v["first_divergence"]["tensor"], "fc2");
    assert_eq!(v["root_cause"]["cause"]["tensor"], "fc2");
    let consequences: Vec<&str> =
        v["root_cause"]["consequences"].as_array().unwrap().iter().map(|c| c["tensor"].as_str().unwrap()).collect();
    assert_eq!(v["root_cause"]["independent"], serde_json::json!([]), "every other difference follows from fc2");
    for later in ["predictions", "fc2.weight.grad", "conv1.weight.grad"] {
        assert!(consequences.contains(&later), "{later} not among {consequences:?}");
    }
}

#[test]
fn a_study_whose_training_diverges_says_so_and_stays_readable() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("nan");
    let args =
        ["study", "noise", "--workload", "mlp", "--lr=1e30", "--runs", "2", "--examples", "200", "--epochs", "1"];
    for _ in 0..2 {
        // The second call resumes from the saved runs, which hold NaN as JSON null.
        let run = repro(&[&args[..], &["--out", s(&out)]].concat());
        assert_eq!(run.code, 0, "{}", run.stderr);
        assert!(run.stdout.contains("control runs cannot be compared: training diverged"), "{}", run.stdout);
        assert!(!run.stdout.contains("DIFFER"), "{}", run.stdout);
    }
    let shown = repro(&["study", "show", s(&out.join("noise.json"))]);
    assert_eq!(shown.code, 0, "{}", shown.stderr);
    assert!(shown.stdout.contains("training diverged"), "{}", shown.stdout);

    std::fs::write(dir.path().join("noise.json"), "{\"variants\": []}").unwrap();
    let bad = repro(&["study", "show", s(&dir.path().join("noise.json"))]);
    assert_eq!(bad.code, 2);
    assert!(bad.stderr.contains("not a readable noise report: missing field"), "{}", bad.stderr);
}

/// A small gpt: 1 layer, width 32, context 16, 3 steps of 2 sequences.
const SMALL_GPT: &[&str] =
    &["--workload", "gpt", "--steps", "3", "--batch", "2", "--context", "16", "--width", "32", "--layers", "1"];

#[test]
fn the_studies_train_the_gpt_too() {
    let tmp = tempfile::tempdir().unwrap();
    let noise = tmp.path().join("noise");
    let args = [&["study", "noise", "--runs", "2", "--json"][..], SMALL_GPT].concat();
    let run = repro(&with_out(&args, s(&noise), &[]));
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let report = json(&run.stdout);
    assert!(report["subject"].as_str().unwrap().starts_with("gpt (1 layers, width 32, context 16"), "{report}");
    assert_eq!(report["test_examples"], 32 * 16, "next-byte predictions at every position of 32 windows");
    let control = &report["variants"][0];
    assert_eq!((control["variant"].as_str(), control["churn"].as_f64()), (Some("control"), Some(0.0)));
    let algo = &report["variants"][1];
    assert!(algo["l2_normalized"].as_f64().unwrap() > 0.0, "other seeds, other weights: {algo}");

    // Two runs in one process: the second's graph nodes get the same names as the first's.
    let devices = tmp.path().join("devices");
    let args = [&["study", "devices", "--devices", "cpu,cpu", "--json"][..], SMALL_GPT].concat();
    let run = repro(&with_out(&args, s(&devices), &[]));
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let report = json(&run.stdout);
    assert_eq!(report["comparisons"][0]["identical"], true, "{report}");
    assert_eq!(
        report["cross_error"][0][0], report["cross_error"][0][1],
        "weights evaluated elsewhere predict the same"
    );
}

#[test]
fn the_data_order_alone_changes_full_batch_training_through_the_first_sum_over_the_batch() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("order");
    let args = [
        "study",
        "order",
        "--workload",
        "mlp",
        "--examples",
        "200",
        "--epochs",
        "3",
        "--runs",
        "2",
        "--batch-sizes",
        "50,full",
        "--json",
        "--out",
    ];
    let run = repro(&[&args[..], &[s(&out)]].concat());
    assert_eq!(run.code, 0, "{}", run.stderr);
    let v = json(&run.stdout);
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(
        rows.iter().map(|r| (r["batch"].as_u64().unwrap(), r["full_batch"] == true)).collect::<Vec<_>>(),
        [(50, false), (200, true)]
    );
    // Only the order seed varies, yet the full-batch runs end with different weights.
    assert!(rows[1]["l2_normalized"].as_f64().unwrap() > 0.0, "{v}");
    // The inputs are the same examples permuted; the first tensor that should not depend on
    // their order and does is a sum over the batch.
    let d = &v["full_batch_divergence"];
    assert_eq!(d["step"], 0, "{d}");
    let permuted: Vec<&str> = d["permuted_before"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
    assert!(permuted.contains(&"x"), "{d}");
    let tensor = d["tensor"].as_str().unwrap();
    assert!(!permuted.contains(&tensor), "{d}");
    assert!(d["max_ulp"].as_u64().unwrap() >= 1, "{d}");
    // The report reads back with `study show`, and the study refuses the gpt.
    let shown = repro(&["study", "show", s(&out.join("order.json"))]);
    assert!(shown.stdout.contains("(full)") && shown.stdout.contains(tensor), "{}", shown.stdout);
    let gpt = repro(&["study", "order", "--workload", "gpt", "--out", s(&dir.path().join("g"))]);
    assert_eq!(gpt.code, 2);
    assert!(gpt.stderr.contains("classifier"), "{}", gpt.stderr);
}

#[test]
fn on_protected_attributes_the_noise_study_reports_each_sub_group_against_the_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("subgroups");
    let args = [
        "study",
        "noise",
        "--workload",
        "mlp",
        "--dataset",
        "subgroups",
        "--examples",
        "3000",
        "--epochs",
        "1",
        "--lr",
        "0.01",
        "--runs",
        "3",
        "--json",
        "--out",
        s(&out),
    ];
    let run = repro(&args);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let report = json(&run.stdout);
    let variants = report["subgroups"].as_array().unwrap();
    assert_eq!(variants.len(), 4, "one table per variant");
    let algo = variants.iter().find(|v| v["variant"] == "algo").unwrap();
    let groups: Vec<&str> = algo["groups"].as_array().unwrap().iter().map(|g| g["group"].as_str().unwrap()).collect();
    assert_eq!(groups, ["all", "male", "female", "old", "young"]);
    let row = |name: &str| algo["groups"].as_array().unwrap().iter().find(|g| g["group"] == name).unwrap().clone();
    // Men and women partition the test set, and so do their positives.
    assert_eq!(row("male")["examples"].as_u64().unwrap() + row("female")["examples"].as_u64().unwrap(), 3000);
    let share = row("male")["positive_share"].as_f64().unwrap() + row("female")["positive_share"].as_f64().unwrap();
    assert!((share - 1.0).abs() < 1e-12, "{share}");
    assert!(row("male")["positive_share"].as_f64().unwrap() < 0.05, "positives are rare among men");
    // Seeds vary: the whole test set's error spreads, and the whole's ratio to itself is 1.
    assert!(row("all")["error_stdev"].as_f64().unwrap() > 0.0);
    assert_eq!(row("all")["error_ratio"], 1.0);
    // Fixed seeds and ordered reductions: no spread, so no ratio.
    let control = variants.iter().find(|v| v["variant"] == "control").unwrap();
    assert!(control["groups"]
        .as_array()
        .unwrap()
        .iter()
        .all(|g| g["error_stdev"] == 0.0 && g["error_ratio"].is_null()));
    let text = std::fs::read_to_string(out.join("noise.md")).unwrap();
    assert!(text.contains("spread by sub-group") && text.contains("| algo | old |"), "{text}");
    assert!(std::fs::read_to_string(out.join("noise.svg")).unwrap().contains("false-negative rate"));
}
