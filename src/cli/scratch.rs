//! Scratch directories of commands that record traces only to compare them (`gate`, `baseline
//! write`, `overhead`): created with unique names under the system's temporary directory, and
//! removed when the command ends, whether it succeeds, fails, or is stopped with Ctrl-C.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, Once};

/// Directories to remove if the process is interrupted.
static LIVE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
static HANDLER: Once = Once::new();

/// A temporary directory, removed on drop and on Ctrl-C (SIGINT, SIGTERM).
pub struct ScratchDir {
    dir: tempfile::TempDir,
}

impl ScratchDir {
    /// Creates `<tmp>/repro-<purpose>-XXXXXX`.
    pub fn new(purpose: &str) -> Result<Self, String> {
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

/// On interruption: remove every live scratch directory, then exit as a shell expects of a
/// process stopped by SIGINT (130). Child processes of the same terminal get the signal too.
fn install_handler() {
    // Without a handler (another one already set), interruption leaves the directories behind;
    // nothing else depends on it.
    let _ = ctrlc::set_handler(|| {
        for dir in LIVE.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
            let _ = std::fs::remove_dir_all(dir);
        }
        eprintln!("\ninterrupted: temporary traces removed");
        std::process::exit(130);
    });
}
