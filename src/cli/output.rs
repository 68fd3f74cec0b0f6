//! Writing reports to stdout. A reader that goes away early (`repro diff A B --json | head`)
//! closes the pipe: the report simply ends there, with the command's own exit code, instead of
//! the panic `print!` gives on a broken pipe.

use std::io::Write;

/// Writes `text` to stdout as it is.
pub fn emit(text: &str) {
    let mut out = std::io::stdout().lock();
    let result = out.write_all(text.as_bytes()).and_then(|()| out.flush());
    if let Err(e) = result {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            eprintln!("error: cannot write to stdout: {e}");
        }
    }
}

/// Writes `text` and a newline to stdout.
pub fn line(text: &str) {
    emit(&format!("{text}\n"));
}
