//! Writing reports to stdout. A reader that goes away early (`repro diff A B --json | head`)
//! closes the pipe: the report simply ends there, with the command's own exit code, instead of
//! the panic `print!` gives on a broken pipe.

use super::error::CliError;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set when a report could not be written (a full disk, say): the command then exits with
/// the error code, never with a verdict a truncated report does not back.
static WRITE_FAILED: AtomicBool = AtomicBool::new(false);

/// Writes `text` to stdout, its control characters escaped (`terminal_safe`).
pub fn emit(text: &str) {
    let mut out = std::io::stdout().lock();
    let result = out.write_all(terminal_safe(text).as_bytes()).and_then(|()| out.flush());
    if let Err(e) = result {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            eprintln!("error: cannot write to stdout: {e}");
            WRITE_FAILED.store(true, Ordering::Relaxed);
        }
    }
}

/// `text` with every control character but newline and tab written as an escape (`\u{1b}`): a
/// path, name or address a user gave cannot move the cursor, recolour or clear the terminal
/// it is printed on. (JSON documents escape them already.)
pub fn terminal_safe(text: &str) -> std::borrow::Cow<'_, str> {
    let unsafe_char = |c: char| c.is_control() && c != '\n' && c != '\t';
    if !text.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut safe = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match unsafe_char(c) {
            true => safe.extend(c.escape_unicode()),
            false => safe.push(c),
        }
    }
    std::borrow::Cow::Owned(safe)
}

/// Whether some report could not be written to stdout.
pub fn write_failed() -> bool {
    WRITE_FAILED.load(Ordering::Relaxed)
}

/// Writes `text` and a newline to stdout.
pub fn line(text: &str) {
    emit(&format!("{text}\n"));
}

/// Writes a chart (`--plot FILE`) and says where on stderr, so that stdout keeps the report.
pub fn write_plot(path: &std::path::Path, svg: Result<String, String>) -> Result<(), CliError> {
    let svg = svg?;
    std::fs::write(path, svg).map_err(|e| format!("cannot write the plot to {}: {e}", path.display()))?;
    eprintln!("plot: {}", path.display());
    Ok(())
}

/// Prints `report` as pretty JSON on stdout, under `schema` and with its `verdict`
/// (`repro::report::json::document`).
pub fn print_json(schema: &str, verdict: Option<&str>, report: &impl serde::Serialize) -> Result<(), CliError> {
    let text =
        repro::report::json::document(schema, verdict, report).map_err(|e| format!("cannot encode JSON: {e}"))?;
    line(&text);
    Ok(())
}
