//! The gate's reports: for people (terminal), for pull requests (Markdown), for CI systems
//! (JUnit XML).

use crate::diff::{metrics_sentence, structure_line, write_root_cause, write_root_cause_with};
use repro_diff::{GateReport, TraceDiff, Verdict};
use std::fmt::Write;

/// What a divergence from a baseline says of its values: a baseline keeps hashes only.
const BASELINE_HAS_NO_VALUES: &str =
    "hashes differ; the baseline keeps hashes only, so no values can be compared with it";

/// One line on what a comparison found.
fn verdict_line(d: &TraceDiff) -> String {
    match (d.verdict(), &d.first_divergence) {
        (_, Some(f)) => {
            let metrics = f.metrics.as_ref().map_or("hashes differ".to_string(), metrics_sentence);
            format!("first differs at step {}, `{}` ({}): {metrics}", f.step, f.tensor, f.kind)
        }
        (Verdict::Identical, None) => format!("identical ({} steps, {} tensors)", d.steps_compared, d.tensors_compared),
        (Verdict::WithinTolerance, None) => format!(
            "within {} ({} steps, {} tensors, {} differ within it)",
            d.tolerance.as_ref().expect("a verdict within a tolerance has one"),
            d.steps_compared,
            d.tensors_compared,
            d.tensors_within_tolerance
        ),
        (Verdict::Unverified, None) => format!(
            "unverified: {} tensor record(s) could not be compared ({} steps, {} tensors agree; record with full \
             values, `--capture all`, to compare the rest)",
            d.not_compared, d.steps_compared, d.tensors_compared
        ),
        (Verdict::Incomplete, None) => {
            let unfinished: Vec<&str> = [(&d.a, "the reference"), (&d.b, "this run")]
                .into_iter()
                .filter(|(s, _)| !s.complete)
                .map(|(_, n)| n)
                .collect();
            format!(
                "incomplete: {} did not finish ({} steps agree; the rest were never compared)",
                unfinished.join(" and "),
                d.steps_compared
            )
        }
        (Verdict::Diverged, None) => {
            let more = match d.structure.len() {
                0 | 1 => String::new(),
                n => format!(" (and {} more difference(s))", n - 1),
            };
            let first = d.structure.first().map_or(String::new(), |f| format!(": {}", structure_line(f)));
            format!("the runs recorded different steps or tensors{first}{more}")
        }
    }
}

/// The terminal report.
pub fn render_gate(r: &GateReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "gate: {}", r.subject);
    let _ = writeln!(out, "reference: {}", r.reference);
    for repro_diff::GateComparison { run: label, diff: d, replicas, .. } in &r.comparisons {
        let _ = writeln!(out, "  {label}: {}", verdict_line(d));
        for replica in replicas.iter().filter(|r| !r.passed()) {
            let _ = write!(out, "    {}", super::ranks::replica_line(replica));
        }
    }
    let _ = writeln!(out);
    if r.passed() {
        match r.comparisons.first().and_then(|c| c.diff.tolerance.as_ref()) {
            Some(t) => {
                let _ = writeln!(out, "PASS  within {t}: {} run(s) agree with the reference", r.comparisons.len());
            }
            None => {
                let _ = writeln!(out, "PASS  bit-exact: {} run(s) identical to the reference", r.comparisons.len());
            }
        }
        if !r.likely_causes.is_empty() {
            let _ = writeln!(out, "note: the reference was recorded in another environment:");
            for cause in &r.likely_causes {
                let _ = writeln!(out, "  - {cause}");
            }
        }
        return out;
    }
    let failed = r.comparisons.iter().filter(|c| !c.passed).count();
    let _ = writeln!(out, "FAIL  {failed} of {} run(s) differ from the reference", r.comparisons.len());
    if let Some(repro_diff::GateComparison { run: label, diff: d, .. }) = r.comparisons.iter().find(|c| !c.passed) {
        if let Some(root) = &d.root_cause {
            let _ = writeln!(out, "\n{label}:");
            match (r.baseline, root.cause.metrics) {
                (true, None) => {
                    let _ = write_root_cause_with(&mut out, root, BASELINE_HAS_NO_VALUES);
                    let _ = writeln!(
                        out,
                        "\nto measure the difference: record the baseline's code and this code with `--capture \
                         steps:{step}` and `repro diff` the two traces (`repro bisect` compares runs of one code, \
                         so it cannot see a change of code)",
                        step = root.cause.step
                    );
                }
                _ => {
                    let _ = write_root_cause(&mut out, root);
                }
            }
        }
        if let (Some(t), n @ 1..) = (d.tolerance.as_ref(), d.hash_only_differences) {
            let _ = writeln!(
                out,
                "\n{n} tensor(s) differ where only hashes were kept: {t} cannot judge them, so they fail (gate with `--capture all`)"
            );
        }
        if !d.config_differences.is_empty() {
            let _ = writeln!(out, "\nconfig differs from the reference:");
            for f in &d.config_differences {
                let (a, b) = f.values();
                let _ = writeln!(out, "  {}: {a} | {b}", f.field);
            }
        }
    }
    if !r.likely_causes.is_empty() {
        let _ = writeln!(out, "\nthe reference was recorded elsewhere; likely causes:");
        for cause in &r.likely_causes {
            let _ = writeln!(out, "  - {cause}");
        }
    }
    out
}

/// The Markdown report, for a pull-request comment or `GITHUB_STEP_SUMMARY`.
pub fn render_gate_markdown(r: &GateReport) -> String {
    let mut out = String::new();
    let status = if r.passed() { "✅ PASS: bit-exact" } else { "❌ FAIL: training is not bit-exact" };
    let _ = writeln!(out, "### repro determinism gate: {status}\n");
    let _ = writeln!(out, "{}, against {}.\n", r.subject, r.reference);
    let _ = writeln!(out, "| run | result |\n|---|---|");
    for repro_diff::GateComparison { run: label, diff: d, .. } in &r.comparisons {
        let _ = writeln!(out, "| {label} | {} |", verdict_line(d).replace('|', "\\|"));
    }
    if let Some(root) = r.comparisons.iter().find_map(|c| c.diff.root_cause.as_ref().filter(|_| !c.passed)) {
        let mut text = String::new();
        let _ = write_root_cause(&mut text, root);
        let _ = writeln!(out, "\n```\n{}```", text);
    }
    if !r.likely_causes.is_empty() {
        let _ = writeln!(out, "\nLikely causes (the reference was recorded elsewhere):\n");
        for cause in &r.likely_causes {
            let _ = writeln!(out, "- {cause}");
        }
    }
    out
}

/// The JUnit XML report: one test suite, one test case per comparison.
pub fn render_gate_junit(r: &GateReport) -> Result<String, String> {
    use quick_junit::{NonSuccessKind, Report, TestCase, TestCaseStatus, TestSuite};
    let mut report = Report::new("repro");
    let mut suite = TestSuite::new("repro gate");
    for repro_diff::GateComparison { run: label, diff: d, passed, .. } in &r.comparisons {
        let status = if *passed {
            TestCaseStatus::success()
        } else {
            let mut s = TestCaseStatus::non_success(NonSuccessKind::Failure);
            s.set_message(verdict_line(d));
            let mut detail = String::new();
            if let Some(root) = &d.root_cause {
                let _ = write_root_cause(&mut detail, root);
            }
            for cause in &r.likely_causes {
                let _ = writeln!(detail, "likely cause: {cause}");
            }
            s.set_description(detail);
            s
        };
        let mut case = TestCase::new(format!("{label} vs {}", r.reference), status);
        case.set_classname(r.subject.clone());
        suite.add_test_case(case);
    }
    report.add_test_suite(suite);
    report.to_string().map_err(|e| format!("cannot write JUnit XML: {e}"))
}
