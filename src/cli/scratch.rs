//! Scratch directories of commands that record traces only to compare them (`gate`, `baseline
//! write`, `overhead`): created with unique names under the system's temporary directory, and
//! removed when the command ends, whether it succeeds, fails, or is stopped by a signal; and
//! the programs such a command runs (`-- CMD`), stopped with it.

use super::CliError;
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

/// Stops a process group (SIGKILL to every process in it).
pub fn kill_group(group: u32) {
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
                for group in PROGRAMS.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
                    kill_group(group);
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
