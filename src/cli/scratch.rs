//! Scratch directories of commands that record traces only to compare them (`gate`, `baseline
//! write`, `overhead`): created with unique names under the system's temporary directory, and
//! removed when the command ends, whether it succeeds, fails, or is stopped by a signal; and
//! the programs such a command runs (`-- CMD`), stopped with it.

use super::error::CliError;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, Once};

/// Directories to remove if the process is interrupted.
static LIVE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
static HANDLER: Once = Once::new();

/// A temporary directory, removed on drop and on SIGINT, SIGTERM or SIGHUP.
pub struct ScratchDir {
    dir: tempfile::TempDir,
}

impl ScratchDir {
    /// Creates `<tmp>/repro-<purpose>-XXXXXX`.
    pub fn new(purpose: &str) -> Result<Self, CliError> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("repro-{purpose}-"))
            .tempdir()
            .map_err(|e| format!("cannot create a temporary directory in {}: {e}", std::env::temp_dir().display()))?;
        HANDLER.call_once(install_handler);
        LIVE.lock().unwrap_or_else(|p| p.into_inner()).push(dir.path().to_path_buf());
        Ok(ScratchDir { dir })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        LIVE.lock().unwrap_or_else(|p| p.into_inner()).retain(|d| d != self.dir.path());
    }
}

/// The signal this process is being stopped by, once its handler has started (0: none).
static INTERRUPTED: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// Returns at once unless this process is being stopped by a signal; then never: the handler
/// is stopping the programs it started and ends the process with the signal's exit code
/// (130, 143, 129). A program that died because the handler stopped it is no failure of its own
/// to report (exit 2, "signal 9").
pub fn unless_interrupted() {
    if INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst) != 0 {
        loop {
            std::thread::park();
        }
    }
}

/// Process groups of programs the command started (a gated program and its children), to stop
/// if the command is interrupted.
static PROGRAMS: Mutex<Vec<u32>> = Mutex::new(Vec::new());

/// Notes a running program's process group, to stop it with the command; `forget` it once it
/// has exited.
pub fn watch_program(group: u32) {
    HANDLER.call_once(install_handler);
    PROGRAMS.lock().unwrap_or_else(|p| p.into_inner()).push(group);
}

/// Forgets a program that has exited.
pub fn forget_program(group: u32) {
    PROGRAMS.lock().unwrap_or_else(|p| p.into_inner()).retain(|&g| g != group);
}

/// Makes the child die with this process, however this process ends (a cancelled CI job's
/// SIGKILL included): on Linux, the kernel sends it SIGKILL when its parent exits. A child that
/// would start after its parent already died does not start. Elsewhere, nothing. Linux ties the
/// signal to the thread that spawns the child, so spawn from the main thread (every caller
/// does), not from a thread that may end before the child should.
pub fn die_with_this_process(command: &mut std::process::Command) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: the closure runs in the child between fork and exec and calls only
        // async-signal-safe functions (prctl, getppid).
        let parent = std::process::id() as libc::pid_t;
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::getppid() != parent {
                    return Err(std::io::Error::other("the supervisor exited before this rank started"));
                }
                Ok(())
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = command;
}

/// Stops a program the command started, with everything it started (SIGKILL): its process
/// group, and on Linux every descendant that left the group, as torchrun's workers do (each
/// starts a session of its own). Descendants are found through /proc before any is killed, and
/// again until none is left; those orphaned when their parent exited were adopted by this
/// process (see [`adopt_orphans`]) and are found as its own.
pub fn stop_program(leader: u32) {
    kill_group(leader);
    #[cfg(target_os = "linux")]
    for _ in 0..50 {
        let found = descendants(&[leader, std::process::id()]);
        if found.is_empty() {
            break;
        }
        // SAFETY: kill, killpg, getpgid and a non-blocking waitpid only signal, ask about or
        // reap processes; a process already gone makes them fail harmlessly.
        unsafe {
            let own_group = libc::getpgrp();
            for &pid in &found {
                let group = libc::getpgid(pid as libc::pid_t);
                if group > 0 && group != own_group {
                    libc::killpg(group, libc::SIGKILL);
                }
                libc::kill(pid as libc::pid_t, libc::SIGKILL);
            }
            for &pid in &found {
                libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), libc::WNOHANG);
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Makes this process adopt the orphans of the programs it starts (Linux: a child subreaper),
/// so that [`stop_program`] finds a program's descendants after the program itself exited.
pub fn adopt_orphans() {
    #[cfg(target_os = "linux")]
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER only sets a flag of this process.
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1);
    }
}

/// Every living process below `roots` (by parent, transitively), this process excluded, read
/// from /proc; zombies are left out (they hold nothing).
#[cfg(target_os = "linux")]
fn descendants(roots: &[u32]) -> Vec<u32> {
    let mut children: std::collections::BTreeMap<u32, Vec<u32>> = std::collections::BTreeMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        // `pid (command) state ppid ...`: the command may hold spaces and parentheses.
        let Some((_, after)) = stat.rsplit_once(')') else { continue };
        let mut fields = after.split_whitespace();
        let (Some(state), Some(Ok(parent))) = (fields.next(), fields.next().map(str::parse::<u32>)) else { continue };
        if state != "Z" {
            children.entry(parent).or_default().push(pid);
        }
    }
    let me = std::process::id();
    let mut found = Vec::new();
    let mut queue: Vec<u32> = roots.to_vec();
    while let Some(pid) = queue.pop() {
        for &child in children.get(&pid).into_iter().flatten() {
            if child != me && !found.contains(&child) {
                found.push(child);
                queue.push(child);
            }
        }
    }
    found
}

/// Stops a process group (SIGKILL to every process in it).
fn kill_group(group: u32) {
    #[cfg(unix)]
    // SAFETY: killpg only sends a signal; a group that is gone makes it fail harmlessly.
    unsafe {
        libc::killpg(group as libc::pid_t, libc::SIGKILL);
    }
    #[cfg(not(unix))]
    let _ = group;
}

/// On SIGINT, SIGTERM or SIGHUP: stop the programs the command started, remove every live
/// scratch directory, then exit as a shell expects of a process stopped by that signal
/// (128 + its number: 130, 143, 129).
fn install_handler() {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    // Without the handler (signals cannot be registered), interruption leaves the directories
    // behind; nothing else depends on it.
    let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]) else { return };
    std::thread::Builder::new()
        .name("repro-interrupt".into())
        .spawn(move || {
            if let Some(signal) = signals.forever().next() {
                INTERRUPTED.store(signal, std::sync::atomic::Ordering::SeqCst);
                for group in PROGRAMS.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
                    stop_program(group);
                }
                for dir in LIVE.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
                    // The training thread may still be writing into it: a file it adds between
                    // the removal's listing and its last rmdir fails that removal, so try again.
                    for _ in 0..50 {
                        if std::fs::remove_dir_all(&dir).is_ok() || !dir.exists() {
                            break;
                        }
                        std::thread::sleep(std::time::Duration::from_millis(2));
                    }
                }
                eprintln!("\ninterrupted: temporary traces removed");
                std::process::exit(128 + signal);
            }
        })
        .expect("the OS starts a thread");
}
