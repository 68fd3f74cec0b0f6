//! Issue 66, item 8: a program run with `-- CMD` is stopped with every process it started (in
//! its process group, session and cgroup or not), and a process it did not start survives,
//! whichever way repro owns the program's processes: a cgroup of its own where the machine lets
//! it make one, else as its descendants (`REPRO_SUPERVISE=descendants`).

use crate::util::repro_with_env;
use std::path::Path;
use std::time::{Duration, Instant};

/// A program that leaves a process in a session of its own (a sleeper) and a chain in which
/// every generation starts the next in a new session and exits (no process group holds it),
/// then waits. Every process of it runs this script, whose path names the test.
const ESCAPING: &str = r#"case "$1" in
  sleeper) while :; do sleep 1; done ;;
  chain) sleep 0.05; setsid sh "$0" chain & exit 0 ;;
  *) setsid sh "$0" sleeper & setsid sh "$0" chain & exec sleep 1000 ;;
esac
"#;

/// The processes whose command line holds `token`.
fn running(token: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let zombie = stat.rsplit_once(')').is_some_and(|(_, after)| after.trim_start().starts_with('Z'));
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if !zombie && String::from_utf8_lossy(&cmdline).contains(token) {
            found.push(pid);
        }
    }
    found
}

/// Whether the processes holding `token` are all gone within 5 seconds (a loaded machine
/// starts a guardian slowly).
fn all_gone(token: &str) -> bool {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(5) {
        if running(token).is_empty() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

fn kill_all(token: &str) {
    for pid in running(token) {
        // SAFETY: kill(2) with a pid and a signal number has no memory effects.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
}

fn record_with_timeout(dir: &Path, script: &Path, env: &[(&str, &str)]) -> crate::util::Run {
    let out = dir.join("run");
    repro_with_env(
        &["record", "--timeout", "2", "--out", out.to_str().unwrap(), "--", "sh", script.to_str().unwrap()],
        env,
    )
}

#[test]
fn a_timeout_stops_every_process_the_program_started_however_it_escaped() {
    for way in ["cgroup", "descendants"] {
        for attempt in 0..3 {
            let dir = tempfile::tempdir().unwrap();
            let token = format!("escaping-{way}-{attempt}-{}", std::process::id());
            let script = dir.path().join(format!("{token}.sh"));
            std::fs::write(&script, ESCAPING).unwrap();
            let run = record_with_timeout(dir.path(), &script, &[("REPRO_SUPERVISE", way)]);
            let gone = all_gone(&token);
            kill_all(&token);
            assert_eq!(run.code, 2, "{way}: {}", run.stderr);
            assert!(run.stderr.contains("ran longer than --timeout 2s and was stopped"), "{}", run.stderr);
            assert!(gone, "{way}, attempt {attempt}: processes of the program survived ({})", run.stderr);
        }
    }
}

#[test]
fn a_process_the_program_did_not_start_survives_its_stop_though_a_descendant_joined_its_group() {
    for way in ["cgroup", "descendants"] {
        // Not the program's: a process of this test's session in a group of its own.
        let mut unrelated = std::process::Command::new("sleep");
        std::os::unix::process::CommandExt::process_group(&mut unrelated, 0);
        let mut unrelated = unrelated.arg("1000").spawn().unwrap();
        let group = unrelated.id();
        let dir = tempfile::tempdir().unwrap();
        // A descendant of the program joins that group (same session: allowed), then waits.
        let script = dir.path().join("join.sh");
        let joined = dir.path().join("joined");
        let python = format!(
            "import os, time; os.setpgid(0, {group}); open('{}', 'w').close(); time.sleep(1000)",
            joined.display()
        );
        std::fs::write(&script, format!("python3 -c \"{python}\" &\nexec sleep 1000\n")).unwrap();
        let run = record_with_timeout(dir.path(), &script, &[("REPRO_SUPERVISE", way)]);
        assert!(joined.exists(), "{way}: the descendant never joined the group ({})", run.stderr);
        let alive = unrelated.try_wait().unwrap().is_none();
        let _ = unrelated.kill();
        let _ = unrelated.wait();
        assert_eq!(run.code, 2, "{way}: {}", run.stderr);
        assert!(alive, "{way}: stopping the program killed a process it did not start ({})", run.stderr);
        // The descendant itself was stopped.
        assert!(all_gone(&format!("os.setpgid(0, {group})")), "{way}: the descendant survived");
    }
}

#[test]
fn a_program_goes_with_repro_killed_outright_where_it_runs_in_a_cgroup() {
    // Only the cgroup's guardian can stop what left the program's first process: the
    // descendants' way has none (its first process alone dies with repro).
    let dir = tempfile::tempdir().unwrap();
    let token = format!("orphaned-{}", std::process::id());
    let script = dir.path().join(format!("{token}.sh"));
    std::fs::write(&script, ESCAPING).unwrap();
    let mut repro = std::process::Command::new(env!("CARGO_BIN_EXE_repro"))
        .args(["record", "--out"])
        .arg(dir.path().join("run"))
        .args(["--", "sh"])
        .arg(&script)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while running(&token).len() < 3 {
        assert!(started.elapsed() < Duration::from_secs(10), "the program never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    let cgroup_way = std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
        let cmdline = std::fs::read(e.path().join("environ")).unwrap_or_default();
        String::from_utf8_lossy(&cmdline).contains("REPRO_GUARD_CGROUP=")
    });
    // SAFETY: kill(2) with a child's pid and a signal number has no memory effects.
    assert_eq!(unsafe { libc::kill(repro.id() as i32, libc::SIGKILL) }, 0);
    let _ = repro.wait();
    let gone = all_gone(&token);
    kill_all(&token);
    if cgroup_way {
        assert!(gone, "processes of the program survived repro's SIGKILL");
    }
}
