//! Exit codes, part of the command-line interface's contract (see README.md).

use std::process::ExitCode;

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// 0: success; the compared runs are bit-identical.
    Same,
    /// 1: the compared runs diverged.
    Diverged,
    /// 2: an error (bad input, unreadable trace, failed recording, usage).
    Error,
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> ExitCode {
        ExitCode::from(match e {
            Exit::Same => 0,
            Exit::Diverged => 1,
            Exit::Error => 2,
        })
    }
}

impl From<repro::diff::Verdict> for Exit {
    /// 0 for runs that count as the same, 1 for any other verdict (diverged or incomplete).
    fn from(v: repro::diff::Verdict) -> Exit {
        if v.is_same() {
            Exit::Same
        } else {
            Exit::Diverged
        }
    }
}
