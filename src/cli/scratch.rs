//! Scratch directories of commands that record traces only to compare them (`gate`, `baseline
//! write`, `overhead`): created with unique names under the system's temporary directory, and
//! removed when the command ends, whether it succeeds, fails, or is stopped by a signal (which
//! also stops the programs it runs, `supervise`).

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

/// Makes SIGINT, SIGTERM and SIGHUP stop the programs running (`supervise`) and remove the
/// scratch directories before this process exits (once; later calls do nothing).
pub fn handle_interrupts() {
    HANDLER.call_once(install_handler);
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
                super::supervise::stop_all();
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
