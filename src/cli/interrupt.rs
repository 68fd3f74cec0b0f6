//! What SIGINT, SIGTERM and SIGHUP do to a command: run the clean-ups registered with
//! [`on_interrupt`] (stop the programs it runs, remove its scratch directories), then exit as a
//! shell expects of a process stopped by that signal (128 + its number: 130, 143, 129).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Mutex, Once};

/// When a clean-up runs among the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stage {
    /// Stop what still writes (the programs a command runs).
    StopPrograms,
    /// Then remove what they wrote into (scratch directories).
    RemoveFiles,
}

/// The clean-up of each stage.
static CLEAN_UPS: Mutex<BTreeMap<Stage, fn()>> = Mutex::new(BTreeMap::new());
static HANDLER: Once = Once::new();
/// The signal this process is being stopped by, once the handler has started (0: none).
static INTERRUPTED: AtomicI32 = AtomicI32::new(0);

/// Makes `clean_up` the one to run at `stage` if the process is interrupted, and starts
/// listening for the signals.
pub fn on_interrupt(stage: Stage, clean_up: fn()) {
    HANDLER.call_once(install_handler);
    CLEAN_UPS.lock().unwrap_or_else(|p| p.into_inner()).insert(stage, clean_up);
}

/// Returns at once unless this process is being stopped by a signal; then never: the handler
/// is cleaning up and ends the process with the signal's exit code. (A program that died
/// because the handler stopped it is no failure of its own to report: "signal 9", exit 2.)
pub fn unless_interrupted() {
    if INTERRUPTED.load(Ordering::SeqCst) != 0 {
        loop {
            std::thread::park();
        }
    }
}

fn install_handler() {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    // Without the handler (signals cannot be registered), interruption leaves what it would
    // clean behind; nothing else depends on it.
    let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]) else { return };
    std::thread::Builder::new()
        .name("repro-interrupt".into())
        .spawn(move || {
            if let Some(signal) = signals.forever().next() {
                INTERRUPTED.store(signal, Ordering::SeqCst);
                let clean_ups = CLEAN_UPS.lock().unwrap_or_else(|p| p.into_inner()).clone();
                for clean_up in clean_ups.into_values() {
                    clean_up();
                }
                eprintln!("\ninterrupted: what this command started was stopped, and its temporary traces removed");
                std::process::exit(128 + signal);
            }
        })
        .expect("the OS starts a thread");
}
