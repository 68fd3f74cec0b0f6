use crate::util::{record, repro, s};
use std::fs;
use std::path::Path;

fn expect_error(args: &[&str], needles: &[&str]) {
    let run = repro(args);
    assert_eq!(run.code, 2, "expected exit 2 for {args:?}, got {}: {}{}", run.code, run.stdout, run.stderr);
    assert!(run.stderr.starts_with("error: "), "{}", run.stderr);
    assert_eq!(run.stderr.trim_end().lines().count(), 1, "one clear line, got: {}", run.stderr);
    for n in needles {
        assert!(run.stderr.contains(n), "`{n}` not in: {}", run.stderr);
    }
}

#[test]
fn missing_empty_and_file_paths_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let a = record(dir.path(), "a", &[]);
    let missing = dir.path().join("nope");
    expect_error(&["diff", s(&a), s(&missing)], &[s(&missing), "No such file"]);
    let empty = dir.path().join("empty");
    fs::create_dir(&empty).unwrap();
    expect_error(&["inspect", s(&empty)], &[s(&empty), "is not a repro trace", "records.rpr"]);
    let file = dir.path().join("file.txt");
    fs::write(&file, "hello").unwrap();
    expect_error(&["diff", s(&file), s(&a)], &[s(&file), "is not a repro trace"]);
    let foreign = dir.path().join("foreign");
    fs::create_dir(&foreign).unwrap();
    fs::write(foreign.join("records.rpr"), b"PK\x03\x04 not ours at all").unwrap();
    expect_error(&["inspect", s(&foreign)], &["records.rpr", "magic"]);
}

#[test]
fn truncated_trace_reads_as_incomplete_at_every_cut() {
    let dir = tempfile::tempdir().unwrap();
    let a = record(dir.path(), "a", &[]);
    let bytes = fs::read(a.join("records.rpr")).unwrap();
    let cut_dir = dir.path().join("cut");
    fs::create_dir(&cut_dir).unwrap();
    fs::create_dir_all(cut_dir.join("tensors")).unwrap();
    fs::copy(a.join("tensors/step-00000000.safetensors"), cut_dir.join("tensors/step-00000000.safetensors")).unwrap();
    // Cut in many places after the header: every cut must give an incomplete but readable trace
    // whose complete steps diff as identical to the original's.
    let header_len = u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize;
    let header_end = 12 + 8 + header_len;
    for cut in (header_end..bytes.len()).step_by(bytes.len() / 37) {
        fs::write(cut_dir.join("records.rpr"), &bytes[..cut]).unwrap();
        let run = repro(&["inspect", s(&cut_dir)]);
        assert_eq!(run.code, 0, "cut at {cut}: {}", run.stderr);
        assert!(run.stdout.contains("INCOMPLETE"), "cut at {cut}: {}", run.stdout);
        let diff = repro(&["diff", s(&a), s(&cut_dir), "--json"]);
        assert_eq!(diff.code, 1, "cut at {cut}: {}", diff.stderr);
        let v: serde_json::Value = serde_json::from_str(&diff.stdout).unwrap();
        assert!(v["first_divergence"].is_null(), "cut at {cut}: common steps must match");
        assert_eq!(v["b"]["complete"], false);
        assert_eq!(v["structure"][0]["type"], "missing_steps");
    }
}

#[test]
fn flipped_bytes_in_records_are_corruption_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let a = record(dir.path(), "a", &[]);
    let bad = dir.path().join("bad");
    fs::create_dir_all(bad.join("tensors")).unwrap();
    for f in ["tensors/step-00000000.safetensors", "tensors/step-00000019.safetensors"] {
        fs::copy(a.join(f), bad.join(f)).unwrap();
    }
    let bytes = fs::read(a.join("records.rpr")).unwrap();
    for pos in [20usize, bytes.len() / 2, bytes.len() - 3] {
        let mut damaged = bytes.clone();
        damaged[pos] ^= 0x10;
        fs::write(bad.join("records.rpr"), &damaged).unwrap();
        expect_error(&["diff", s(&a), s(&bad)], &["records.rpr", "corrupt"]);
    }
}

#[test]
fn damaged_payload_is_caught_by_its_hash() {
    let dir = tempfile::tempdir().unwrap();
    let a = record(dir.path(), "a", &[]);
    let p = record(dir.path(), "p", &["--perturb", "1:loss:1"]);
    let payload = p.join("tensors/step-00000019.safetensors");
    let mut bytes = fs::read(&payload).unwrap();
    // Damage the predictions, which differ between the runs, so diff must read them.
    let (header_len, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let (start, _) = meta.info("predictions").unwrap().data_offsets;
    bytes[8 + header_len + start + 5] ^= 0x01;
    fs::write(&payload, bytes).unwrap();
    expect_error(&["diff", s(&a), s(&p)], &["step-00000019.safetensors", "step 19", "do not match the recorded hash"]);
}

#[test]
fn newer_major_version_is_refused_with_advice() {
    let dir = tempfile::tempdir().unwrap();
    let a = record(dir.path(), "a", &[]);
    let mut bytes = fs::read(a.join("records.rpr")).unwrap();
    bytes[8] = 3; // major version, little-endian u16 after the 8-byte magic (1 and 2 are read)
    fs::write(a.join("records.rpr"), &bytes).unwrap();
    expect_error(&["inspect", s(&a)], &["records.rpr", "format 3.", "reads only 1.x and 2.x", "upgrade repro"]);
    // A readable major in the preamble that the header contradicts is damage, not a version.
    bytes[8] = 2;
    fs::write(a.join("records.rpr"), &bytes).unwrap();
    expect_error(&["inspect", s(&a)], &["records.rpr", "header says format 1.10 but the preamble says 2.10"]);
}

#[test]
fn bad_arguments_are_explained() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x");
    expect_error(&["record", "--out", s(&out), "--perturb", "5:nope:1"], &["no tensor `nope`", "weight.grad"]);
    expect_error(&["record", "--out", s(&out), "--steps", "10", "--perturb", "10:loss:1"], &["steps 0 to 9"]);
    expect_error(&["record", "--out", s(&out), "--device", "cuda:0", "--steps", "1"], &["make cuda"]);
    let run = repro(&["record", "--out", s(&out), "--capture", "sometimes"]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("every:N"), "{}", run.stderr);
    let run = repro(&["record", "--out", s(&out), "--perturb", "five:loss:1"]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("STEP:TENSOR:ULPS"), "{}", run.stderr);
    let run = repro(&["matrix", s(&out)]);
    assert_eq!(run.code, 2);
    // A classifier's tensor names are checked before training, and nothing is written.
    let mlp = ["record", "--workload", "mlp", "--steps", "3", "--out", s(&out)];
    expect_error(
        &[&mlp[..], &["--perturb", "1:fc3.weight:1"]].concat(),
        &["mlp records no tensor `fc3.weight`", "fc2.bias.grad"],
    );
    expect_error(&[&mlp[..], &["--perturb", "3:fc1:1"]].concat(), &["steps 0 to 2"]);
    assert!(!out.exists(), "a refused record writes nothing");
    let run = repro(&[&mlp[..], &["--perturb", "1:relu1:1", "--capture", "all"]].concat());
    assert_eq!(run.code, 0, "{}", run.stderr);
}

#[test]
fn recording_never_writes_among_or_deletes_files_it_did_not_write() {
    let dir = tempfile::tempdir().unwrap();
    let run_with = |out: &std::path::Path, extra: &[&str]| {
        repro(&[&["record", "--steps", "3", "--batch", "10", "--out", s(out)][..], extra].concat())
    };
    // A directory of someone else's files is refused, even with --force.
    let foreign = dir.path().join("notes");
    fs::create_dir_all(&foreign).unwrap();
    fs::write(foreign.join("todo.txt"), "precious").unwrap();
    for extra in [&[][..], &["--force"][..]] {
        let run = run_with(&foreign, extra);
        assert_eq!(run.code, 2, "{extra:?}");
        assert!(run.stderr.contains("is not empty and holds no trace"), "{}", run.stderr);
    }
    assert_eq!(fs::read_dir(&foreign).unwrap().count(), 1, "nothing was written there");

    // --force replaces the trace and only the trace.
    let trace = dir.path().join("t");
    assert_eq!(run_with(&trace, &[]).code, 0);
    fs::write(trace.join("tensors/keep.txt"), "precious").unwrap();
    let lock = fs::read(trace.join(".repro-lock")).unwrap();
    let refused = run_with(&trace, &[]);
    assert_eq!(refused.code, 2);
    assert_eq!(fs::read(trace.join(".repro-lock")).unwrap(), lock, "a refused record changes nothing");
    assert_eq!(run_with(&trace, &["--force"]).code, 0);
    assert_eq!(fs::read_to_string(trace.join("tensors/keep.txt")).unwrap(), "precious");
}

#[test]
fn classifier_settings_that_cannot_train_are_refused_before_any_file_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x");
    for (args, needle) in [
        (&["--workload", "mlp", "--dataset", "digits"][..], "mlp trains on vectors"),
        (&["--workload", "mlp", "--examples", "1"][..], "fewer than one batch of 32"),
        (&["--workload", "cnn", "--dataset", "gauss2d"][..], "cnn trains on images"),
    ] {
        expect_error(&[&["record", "--steps", "2", "--out", s(&out)][..], args].concat(), &[needle]);
        assert!(!out.exists(), "{args:?} created {}", out.display());
    }
}

#[test]
fn json_commands_report_errors_as_json_too() {
    let dir = tempfile::tempdir().unwrap();
    let a = record(dir.path(), "a", &[]);
    let missing = dir.path().join("missing");
    for args in [
        vec!["diff", s(&a), s(&missing), "--json"],
        vec!["matrix", s(&a), s(&missing), "--json"],
        vec!["inspect", s(&missing), "--json"],
        vec!["gate", "--baseline", s(&missing), "--json"],
    ] {
        let run = repro(&args);
        assert_eq!(run.code, 2, "{args:?}");
        assert!(run.stderr.starts_with("error: "), "{}", run.stderr);
        let v = crate::util::json(&run.stdout);
        assert_eq!((v["schema"].as_str(), v["verdict"].as_str()), (Some("repro.error.v1"), Some("error")), "{args:?}");
        assert!(v["error"].as_str().unwrap().contains("missing"), "{v}");
    }
    // Without --json, stdout stays empty.
    assert_eq!(repro(&["diff", s(&a), s(&missing)]).stdout, "");
}

#[test]
fn a_tensor_name_of_64_kib_is_read_and_reported_without_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, value: f32| {
        let path = dir.path().join(name);
        write_one_tensor_trace(&path, &"n".repeat(70_000), value.to_le_bytes().to_vec(), true);
        path
    };
    let (a, b) = (write("a", 1.0), write("b", 2.0));
    let inspect = repro(&["inspect", s(&a)]);
    assert_eq!(inspect.code, 0, "{}", inspect.stderr);
    let diff = repro(&["diff", s(&a), s(&b)]);
    assert_eq!(diff.code, 1, "{}", diff.stderr);
}

#[test]
fn sizes_beyond_the_hosts_memory_are_refused_before_anything_is_allocated() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    for args in [
        vec!["record", "--features", "100000000", "--out", s(&out)],
        vec!["invariance", "--batch-sizes", "18446744073709551615"],
        vec!["invariance", "--batch-sizes", "1,100000000"],
        vec!["invariance", "--cost", "18446744073709551615"],
    ] {
        let run = repro(&args);
        assert_eq!(run.code, 2, "{args:?}: {}", run.stderr);
        assert!(run.stderr.contains("lower --") || run.stderr.contains("at most"), "{args:?}: {}", run.stderr);
    }
    assert!(!out.exists(), "nothing was recorded");
}

#[cfg(unix)]
#[test]
fn recording_never_writes_or_deletes_through_a_link_in_the_trace() {
    let dir = tempfile::tempdir().unwrap();
    let victims = dir.path().join("victims");
    fs::create_dir_all(&victims).unwrap();
    let victim_payload = victims.join("step-00000000.safetensors");
    let victim_file = victims.join("precious.txt");
    fs::write(&victim_payload, b"someone else's payload").unwrap();
    fs::write(&victim_file, b"someone else's file").unwrap();
    for (name, target) in [("tensors", &victims), (".repro-lock", &victim_file), ("run-meta.json.tmp", &victim_file)] {
        let trace = record(dir.path(), &format!("trace-{}", name.trim_start_matches('.')), &[]);
        let link = trace.join(name);
        if link.is_dir() {
            fs::remove_dir_all(&link).unwrap();
        } else {
            let _ = fs::remove_file(&link);
        }
        std::os::unix::fs::symlink(target, &link).unwrap();
        let run = repro(&["record", "--steps", "3", "--force", "--out", s(&trace)]);
        assert_eq!(run.code, 2, "{name}: {}", run.stderr);
        assert!(run.stderr.contains("is a symbolic link"), "{name}: {}", run.stderr);
        assert_eq!(fs::read(&victim_payload).unwrap(), b"someone else's payload", "{name}");
        assert_eq!(fs::read(&victim_file).unwrap(), b"someone else's file", "{name}");
    }
}

#[cfg(unix)]
#[test]
fn a_fifo_for_records_and_a_file_for_out_are_refused_not_waited_on() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("fifo");
    fs::create_dir_all(&trace).unwrap();
    let fifo = trace.join("records.rpr");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    // Run with a deadline: a reader that opens the FIFO would wait for a writer forever.
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_repro"))
        .args(["inspect", s(&trace)])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > std::time::Duration::from_secs(20) {
            child.kill().unwrap();
            panic!("inspect blocked on a FIFO");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(2));
    let file = dir.path().join("a-file");
    fs::write(&file, b"not a trace").unwrap();
    let run = repro(&["record", "--steps", "2", "--out", s(&file)]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("is a file, not a directory"), "{}", run.stderr);
    assert_eq!(fs::read(&file).unwrap(), b"not a trace");
}

#[test]
fn a_command_line_that_does_not_parse_still_gives_the_json_error_document() {
    let run = repro(&["diff", "--json", "--bogus", "a", "b"]);
    assert_eq!(run.code, 2);
    let doc = crate::util::json(&run.stdout);
    assert_eq!((doc["schema"].as_str(), doc["verdict"].as_str()), (Some("repro.error.v1"), Some("error")));
    assert!(doc["error"].as_str().unwrap().contains("--bogus"), "{doc}");
    assert!(run.stderr.starts_with("error: "), "{}", run.stderr);
}

#[test]
fn an_option_the_workload_does_not_take_is_refused_not_ignored() {
    let dir = tempfile::tempdir().unwrap();
    for (args, says) in [
        (vec!["--workload", "mlp", "--features", "7"], "--features is a setting of adder, not of mlp"),
        (vec!["--epochs", "3"], "--epochs is a setting of mlp, cnn, resnet18, not of adder"),
        (vec!["--workload", "gpt", "--dataset", "digits"], "not of gpt"),
        (vec!["--workload", "qwen2", "--norm", "fused"], "--norm is a setting of gpt, not of qwen2"),
    ] {
        let out = dir.path().join("out");
        let run = repro(&[&["record", "--steps", "1", "--out", s(&out)][..], &args].concat());
        assert_eq!(run.code, 2, "{args:?}: {}", run.stderr);
        assert!(run.stderr.contains(says), "{args:?}: {}", run.stderr);
        assert!(!out.exists(), "{args:?}: recorded anyway");
    }
    // The options a workload does take still work, `=` form included.
    let run = repro(&["record", "--workload", "mlp", "--steps", "1", "--epochs=1", "--out", s(&dir.path().join("ok"))]);
    assert_eq!(run.code, 0, "{}", run.stderr);
}

#[test]
fn an_empty_record_file_left_by_a_failed_start_does_not_block_the_next_recording() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    fs::create_dir_all(&out).unwrap();
    fs::write(out.join("records.rpr"), b"").unwrap();
    let run = repro(&["record", "--steps", "2", "--out", s(&out)]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(repro(&["inspect", s(&out), "--verify"]).code, 0);
    // A record file that holds a trace is still guarded.
    let run = repro(&["record", "--steps", "2", "--out", s(&out)]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    // The same for a data-parallel run whose ranks failed to start.
    let run_dir = dir.path().join("ranks");
    for rank in 0..2 {
        fs::create_dir_all(run_dir.join(format!("rank-{rank}"))).unwrap();
        fs::write(run_dir.join(format!("rank-{rank}/records.rpr")), b"").unwrap();
    }
    let run = repro(&["record", "--workload", "mlp", "--devices", "cpu,cpu", "--steps", "2", "--out", s(&run_dir)]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(repro(&["inspect", s(&run_dir), "--verify"]).code, 0);
}

/// Issue 32, item 12: diffing large stored tensors keeps memory flat (payloads were mapped
/// populated, so a 2 GiB pair took 4.1 GB of resident memory).
#[test]
fn diffing_large_stored_tensors_keeps_resident_memory_flat() {
    const ELEMENTS: usize = 64 << 20; // 256 MiB of f32 in each trace
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, bump: bool| {
        let mut bytes: Vec<u8> = (0..ELEMENTS).flat_map(|i| (i as f32).to_le_bytes()).collect();
        if bump {
            // One element in every 64 KiB changes by one ULP.
            for i in (0..ELEMENTS).step_by(16_384) {
                let v = f32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap());
                bytes[4 * i..4 * i + 4].copy_from_slice(&f32::from_bits(v.to_bits() + 1).to_le_bytes());
            }
        }
        let path = dir.path().join(name);
        write_one_tensor_trace(&path, "big", bytes, false);
        path
    };
    let (a, b) = (write("a", false), write("b", true));
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_repro"))
        .args(["diff", s(&a), s(&b)])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // The child's own high-water mark, read while it runs: its rusage would count the test
    // process's memory too (a spawned process inherits its parent's peak across exec).
    let status_file = format!("/proc/{}/status", child.id());
    let mut peak_kib = 0u64;
    let code = loop {
        if let Some(kib) = std::fs::read_to_string(&status_file).ok().and_then(|status| {
            let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        }) {
            peak_kib = peak_kib.max(kib);
        }
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    assert_eq!(code, Some(1), "the traces differ");
    assert!(peak_kib > 0, "the child's memory was read at least once");
    let peak_mib = peak_kib / 1024;
    assert!(peak_mib < 160, "diff of two 256 MiB tensors peaked at {peak_mib} MiB of resident memory");
}

/// Writes a finished one-step trace holding one 1-D f32 tensor, stored inline or in a payload.
fn write_one_tensor_trace(path: &Path, name: &str, bytes: Vec<u8>, inline: bool) {
    write_one_tensor_trace_hashed(path, name, bytes, inline, repro::hash::DataHash::Blake3);
}

/// `write_one_tensor_trace`, the trace's tensors hashed with `kind`.
fn write_one_tensor_trace_hashed(path: &Path, name: &str, bytes: Vec<u8>, inline: bool, kind: repro::hash::DataHash) {
    use repro::dtype::DType;
    use repro::trace::{StepTensor, TensorKind, TensorRecord, TraceWriter};
    let header = repro::trace::Header { data_hash: kind, ..crate::util::test_header("mine", 1) };
    let shape = vec![(bytes.len() / 4) as u64];
    let record = TensorRecord {
        inline: inline.then(|| bytes.clone()),
        in_payload: !inline,
        hash: kind.tensor_hash(DType::F32, &shape, &bytes),
        ..TensorRecord::of_bytes(name, TensorKind::Weight, DType::F32, shape, &bytes)
    };
    let mut w = TraceWriter::create(path, &header, false).unwrap();
    w.write_step(0, vec![StepTensor { record, payload: (!inline).then_some(repro::trace::Payload::Bytes(bytes)) }])
        .unwrap();
    w.finish().unwrap();
}

/// Issue 34, section 8: two runs with the same settings that start from other parameters are
/// told that the initialisation is likely unseeded.
#[test]
fn other_initial_parameters_under_the_same_settings_point_at_unseeded_initialisation() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    write_one_tensor_trace(&a, "w", 1.0f32.to_le_bytes().to_vec(), true);
    write_one_tensor_trace(&b, "w", 2.0f32.to_le_bytes().to_vec(), true);
    let run = repro(&["diff", s(&a), s(&b)]);
    assert_eq!(run.code, 1, "{}", run.stdout);
    assert!(run.stdout.contains("is the initialisation seeded?"), "{}", run.stdout);
}

/// Format 2.0: traces of the data hash xxh3-1k compare with each other as any traces do, and a
/// comparison across data hashes is refused (exit 2, naming both traces), never a false verdict.
#[test]
fn traces_of_different_data_hashes_are_refused_and_xxh3_traces_compare_as_usual() {
    use repro::hash::DataHash;
    let dir = tempfile::tempdir().unwrap();
    let (xa, xb, xc, b3) = (dir.path().join("xa"), dir.path().join("xb"), dir.path().join("xc"), dir.path().join("b3"));
    let floats = |values: &[f32]| values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>();
    write_one_tensor_trace_hashed(&xa, "w", floats(&[1.0, 2.0]), true, DataHash::Xxh3Chunks);
    write_one_tensor_trace_hashed(&xb, "w", floats(&[1.0, 2.0]), true, DataHash::Xxh3Chunks);
    write_one_tensor_trace_hashed(&xc, "w", floats(&[1.0, 2.5]), true, DataHash::Xxh3Chunks);
    write_one_tensor_trace_hashed(&b3, "w", floats(&[1.0, 2.0]), true, DataHash::Blake3);
    let same = repro(&["diff", s(&xa), s(&xb)]);
    assert_eq!(same.code, 0, "{}{}", same.stdout, same.stderr);
    let other = repro(&["diff", s(&xa), s(&xc)]);
    assert_eq!(other.code, 1, "{}{}", other.stdout, other.stderr);
    let verify = repro(&["inspect", "--verify", s(&xa)]);
    assert_eq!(verify.code, 0, "{}{}", verify.stdout, verify.stderr);
    for args in [vec!["diff", s(&xa), s(&b3)], vec!["matrix", s(&b3), s(&xa)]] {
        let run = repro(&args);
        assert_eq!(run.code, 2, "{args:?}: {}{}", run.stdout, run.stderr);
        assert!(
            run.stderr.contains("hashes its tensors with") && run.stderr.contains("cannot be compared"),
            "{}",
            run.stderr
        );
    }
    let built_in = repro(&["record", "--out", s(&dir.path().join("r")), "--data-hash", "xxh3-1k"]);
    assert_eq!(built_in.code, 2, "{}", built_in.stderr);
    assert!(built_in.stderr.contains("built-in workloads record with blake3 only"), "{}", built_in.stderr);
    let unknown = repro(&["record", "--out", s(&dir.path().join("r")), "--data-hash", "md5"]);
    assert_eq!(unknown.code, 2, "{}", unknown.stderr);
    assert!(unknown.stderr.contains("`md5` is not a data hash"), "{}", unknown.stderr);
}

/// Issue 66, item 9: a path of bytes that are not UTF-8 (a Unix path may hold any) is recorded
/// into and read back, not a panic that leaves a 12-byte record file behind.
#[test]
fn a_path_that_is_not_utf8_is_recorded_into_and_read() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join(std::ffi::OsStr::from_bytes(b"run-\xff"));
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_repro"))
        .args(["record", "--workload", "adder", "--steps", "3", "--batch", "100", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(status.status.code(), Some(0), "{}", String::from_utf8_lossy(&status.stderr));
    let inspect = std::process::Command::new(env!("CARGO_BIN_EXE_repro"))
        .arg("inspect")
        .arg(&out)
        .arg("--verify")
        .output()
        .unwrap();
    assert_eq!(inspect.status.code(), Some(0), "{}", String::from_utf8_lossy(&inspect.stderr));
}

/// Issue 72, item 11: `gpu-check` in a build without CUDA says how to get one, whatever its
/// arguments, instead of "unrecognized subcommand".
#[cfg(not(feature = "cuda"))]
#[test]
fn gpu_check_in_a_cpu_build_says_it_needs_make_cuda() {
    for args in [vec!["gpu-check"], vec!["gpu-check", "--device", "cuda:1"]] {
        let run = repro(&args);
        assert_eq!(run.code, 2, "{}", run.stderr);
        assert!(run.stderr.contains("needs a build with CUDA: `make cuda`"), "{}", run.stderr);
    }
}
