//! Options that several commands share for their report: `--json`, `--plot FILE.svg` and
//! `--tolerance`, each parsed and acted on in one place. A command that draws something else
//! than the default text says so with `mut_arg` on its own arguments.

use super::error::CliError;
use clap::Args;
use repro::diff::Tolerance;
use std::path::PathBuf;

/// `--json`: the report as a versioned JSON document on stdout (errors then come as one too).
#[derive(Debug, Args)]
pub struct JsonOutput {
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

/// `--plot FILE.svg`: a chart of the report.
#[derive(Debug, Args)]
pub struct PlotOutput {
    /// Draw the result into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
}

impl PlotOutput {
    /// Draws the chart with `draw` when `--plot` was given, and says where on stderr.
    pub fn write(&self, draw: impl FnOnce() -> Result<String, String>) -> Result<(), CliError> {
        match &self.plot {
            Some(path) => super::output::write_plot(path, draw()),
            None => Ok(()),
        }
    }
}

/// `arg`'s help with `more` after it, for a command that says more of a shared option.
pub fn extend_help(arg: clap::Arg, more: &str) -> clap::Arg {
    let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
    arg.help(format!("{help}. {more}"))
}

/// `--tolerance`: how far runs may differ and still agree.
#[derive(Debug, Args)]
pub struct ToleranceArgs {
    /// Count tensors that differ by no more than this as agreeing: ulp:N, abs:X, rel:X or
    /// allclose:ATOL:RTOL (|a-b| <= ATOL + RTOL·|b|, as numpy.allclose), element by element;
    /// for some tensors only with KIND=T or NAME=T (`grad=rel:1e-3,lm_head*=abs:1e-6`;
    /// repeatable, comma-separated; tensors no rule names stay bit-exact unless a plain T is
    /// given). Default: bit-exact.
    #[arg(long, value_name = "ulp:N|abs:X|rel:X|allclose:A:R")]
    pub tolerance: Vec<Tolerance>,
}

impl ToleranceArgs {
    /// The tolerance the options give together, `None` for bit-exact.
    pub fn combined(&self) -> Option<Tolerance> {
        Tolerance::combine(self.tolerance.clone())
    }
}
