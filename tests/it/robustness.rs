//! Traces are evidence: killed recorders, flipped bytes and concurrent recorders must never
//! produce a trace that lies or a reader that crashes.

use crate::util::{json, record, repro, s};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const ARGS: [&str; 7] = ["record", "--steps", "3000", "--batch", "200", "--capture", "every:7"];

/// A small deterministic generator for the trials (no dependence on the clock).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, bound: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % bound
    }
}

fn start_recording(out: &Path) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_repro")).args(ARGS).arg("--out").arg(out).stderr(Stdio::null()).spawn().unwrap()
}

#[test]
fn fifty_kills_leave_fifty_readable_traces_that_agree_with_a_full_run() {
    let dir = tempfile::tempdir().unwrap();
    let full = dir.path().join("full");
    assert_eq!(repro(&[&ARGS[..], &["--out", s(&full)]].concat()).code, 0);
    let mut rng = Lcg(7);
    let (mut incomplete, mut compared) = (0, 0);
    for trial in 0..50 {
        let out = dir.path().join(format!("killed-{trial}"));
        let mut child = start_recording(&out);
        // Wait for the header, then let it run a random while before kill -9.
        let deadline = Instant::now() + Duration::from_secs(20);
        while fs::metadata(out.join("records.rpr")).map(|m| m.len()).unwrap_or(0) < 1500 {
            assert!(Instant::now() < deadline, "trial {trial}: the recorder made no progress");
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(rng.next(120)));
        child.kill().unwrap();
        child.wait().unwrap();

        let verified = repro(&["inspect", "--verify", s(&out), "--json"]);
        let summary = json(&verified.stdout);
        // Readable and sound as far as it goes, but a trace cut short is no clean bill: exit 1.
        let expected = if summary["complete"] == true { 0 } else { 1 };
        assert_eq!(verified.code, expected, "trial {trial}: {}", verified.stderr);
        if summary["complete"] == false {
            incomplete += 1;
            assert!(summary["incomplete_reason"].as_str().unwrap().contains("step"), "{summary}");
        }
        let diff = json(&repro(&["diff", s(&full), s(&out), "--json"]).stdout);
        assert!(diff["first_divergence"].is_null(), "trial {trial}: the steps on disk must match the full run");
        compared += diff["steps_compared"].as_u64().unwrap();
    }
    assert!(incomplete >= 40, "only {incomplete} of 50 kills landed mid-run");
    assert!(compared > 0);
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(files(&path));
        } else if !path.ends_with(".repro-lock") {
            out.push(path);
        }
    }
    out.sort();
    out
}

#[test]
fn a_thousand_flipped_bits_are_all_detected_or_harmless() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t");
    let run = repro(&["record", "--steps", "30", "--batch", "100", "--capture", "every:5", "--out", s(&trace)]);
    assert_eq!(run.code, 0);
    let files = files(&trace);
    let mut rng = Lcg(11);
    let (mut errors, mut incomplete, mut harmless) = (0, 0, 0);
    for trial in 0..1000 {
        let file = &files[rng.next(files.len() as u64) as usize];
        let original = fs::read(file).unwrap();
        let mut damaged = original.clone();
        let at = rng.next(original.len() as u64) as usize;
        damaged[at] ^= 1 << rng.next(8);
        fs::write(file, &damaged).unwrap();
        let run = repro(&["inspect", "--verify", "--json", s(&trace)]);
        let name = file.strip_prefix(&trace).unwrap().display().to_string();
        match run.code {
            2 => {
                assert!(
                    run.stderr.contains(&name),
                    "trial {trial}: {name} byte {at}: the error must name the file: {}",
                    run.stderr
                );
                errors += 1;
            }
            0 if name == "run-meta.json" => harmless += 1,
            1 => {
                // A damaged length field can only look like a record cut short by a crash:
                // the trace must then say it is incomplete (exit 1), never pass as whole.
                let v = json(&run.stdout);
                assert_eq!(v["complete"], false, "trial {trial}: flip in {name} byte {at} went unnoticed");
                assert!(name == "records.rpr", "trial {trial}: {name}");
                incomplete += 1;
            }
            code => panic!("trial {trial}: flip in {name} byte {at}: exit {code}: {}", run.stderr),
        }
        fs::write(file, &original).unwrap();
    }
    assert_eq!(errors + incomplete + harmless, 1000);
    // Files are picked uniformly, so about one trial in eight lands in run-meta.json.
    assert!(errors >= 800, "{errors} errors, {incomplete} incomplete, {harmless} harmless");
}

#[test]
fn a_second_recorder_in_the_same_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("busy");
    let mut first = start_recording(&out);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !out.join("records.rpr").exists() {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(1));
    }
    let second = repro(&["record", "--steps", "5", "--out", s(&out), "--force"]);
    first.kill().unwrap();
    first.wait().unwrap();
    assert_eq!(second.code, 2, "{}", second.stderr);
    assert!(second.stderr.contains("another recorder (process"), "{}", second.stderr);
    // The lock dies with its process: now the directory can be reused.
    assert_eq!(repro(&["record", "--steps", "5", "--batch", "10", "--out", s(&out), "--force"]).code, 0);
}

#[test]
fn a_failed_write_is_reported_and_leaves_a_readable_incomplete_trace() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("full-disk");
    // A file-size limit makes writes fail part-way (EFBIG), as a full disk would.
    let script = format!(
        "ulimit -f 200; trap '' XFSZ; exec '{}' {} --out '{}'",
        env!("CARGO_BIN_EXE_repro"),
        ARGS.join(" "),
        s(&out)
    );
    let run = Command::new("bash").arg("-c").arg(&script).output().unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(2), "recording must not report success it did not have: {stderr}");
    assert!(stderr.contains("File too large") && stderr.contains("full-disk"), "{stderr}");
    let verified = repro(&["inspect", "--verify", "--json", s(&out)]);
    assert_eq!(verified.code, 1, "sound as far as it goes, but unfinished: {}", verified.stderr);
    let v = json(&verified.stdout);
    assert_eq!(v["complete"], false);
    assert!(v["steps"].as_u64().unwrap() > 0);
}

#[test]
fn two_traces_cut_short_the_same_way_are_incomplete_not_identical() {
    let dir = tempfile::tempdir().unwrap();
    let a = crate::util::record(dir.path(), "a", &[]);
    let records = a.join("records.rpr");
    let len = fs::metadata(&records).unwrap().len();
    fs::OpenOptions::new().write(true).open(&records).unwrap().set_len(len - 100).unwrap();
    let b = dir.path().join("b");
    fs::create_dir_all(b.join("tensors")).unwrap();
    fs::copy(&records, b.join("records.rpr")).unwrap();
    for entry in fs::read_dir(a.join("tensors")).unwrap() {
        let entry = entry.unwrap();
        fs::copy(entry.path(), b.join("tensors").join(entry.file_name())).unwrap();
    }
    let run = repro(&["diff", s(&a), s(&b)]);
    assert_eq!(run.code, 1, "every step both hold agrees, but neither finished: {}", run.stdout);
    assert!(
        run.stdout.contains("INCOMPLETE  19 steps") && run.stdout.contains("A and B did not finish"),
        "{}",
        run.stdout
    );
    assert_eq!(json(&repro(&["diff", s(&a), s(&b), "--json"]).stdout)["verdict"], "incomplete");
}

/// Issue 66, item 9: a path a user gives is printed with its control characters escaped, in
/// errors (stderr) and reports (stdout): it cannot drive the terminal.
#[test]
fn user_given_paths_cannot_drive_the_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let hostile = dir.path().join("run\u{1b}[2J\u{7}");
    let run = repro(&["inspect", s(&hostile)]);
    assert_eq!(run.code, 2);
    assert!(!run.stderr.contains('\u{1b}') && !run.stderr.contains('\u{7}'), "{:?}", run.stderr);
    assert!(run.stderr.contains("run\\u{1b}[2J\\u{7}"), "{}", run.stderr);
    // A trace recorded there: the report names it escaped.
    let out = record(dir.path(), "run\u{1b}[31m", &[]);
    let diff = repro(&["diff", s(&out), s(&out)]);
    assert_eq!(diff.code, 0, "{}", diff.stderr);
    assert!(!diff.stdout.contains('\u{1b}') && diff.stdout.contains("run\\u{1b}[31m"), "{:?}", diff.stdout);
}
