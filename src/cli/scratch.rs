//! Scratch directories of commands that record traces only to compare them (`gate`, `baseline
//! write`, `overhead`): created with unique names under the system's temporary directory, and
//! removed when the command ends, whether it succeeds, fails, or is stopped by a signal
//! (`interrupt`).

use super::error::CliError;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Directories to remove if the process is interrupted.
static LIVE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

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
        super::interrupt::on_interrupt(super::interrupt::Stage::RemoveFiles, remove_live);
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

/// Removes every live scratch directory (the command is being interrupted).
fn remove_live() {
    for dir in LIVE.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
        // The training thread may still be writing into it: a file it adds between the
        // removal's listing and its last rmdir fails that removal, so try again.
        for _ in 0..50 {
            if std::fs::remove_dir_all(&dir).is_ok() || !dir.exists() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }
}
