//! The command line: argument definitions and dispatch. Each subcommand lives in its own file
//! and returns an `Exit`; errors become one `error:` line on stderr and exit code 2.

mod baseline;
mod bisect;
mod diff;
mod error;
mod exit;
mod gate;
#[cfg(feature = "cuda")]
mod gpu_check;
mod inspect;
mod interrupt;
mod invariance;
mod loss;
mod matrix;
mod output;
mod overhead;
mod program;
mod progress;
mod ranks;
mod record;
mod recording;
mod report_args;
mod scratch;
mod show;
mod study;
mod supervise;
mod workload_args;

pub use error::CliError;
pub use exit::Exit;

use clap::{Parser, Subcommand};

/// Record neural-network training, and find where two runs stop being bit-identical.
#[derive(Debug, Parser)]
#[command(name = "repro", version, about, after_help = EXIT_CODES)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

const EXIT_CODES: &str = "Exit codes: 0 identical (or success), 1 diverged, 2 error.";

#[derive(Debug, Subcommand)]
enum Command {
    /// Record a trace: of your own program, which records itself (-- CMD: PyTorch with
    /// repro.torch, candle with repro's library), or of a built-in workload.
    Record(record::RecordArgs),
    /// Compare two traces: first diverging step and tensor, and how the error grows.
    ///
    /// Tensors are compared by their recorded hashes, and stored values are read only where
    /// hashes differ: damage to a payload under matching hashes goes unseen here. Run `repro
    /// inspect --verify` on a trace you did not record yourself.
    Diff(diff::DiffArgs),
    /// Pairwise error matrices of N traces at one step.
    Matrix(matrix::MatrixArgs),
    /// A trace's loss curve, or two traces' side by side (text, --json or --plot).
    Loss(loss::LossArgs),
    /// Show a trace's header, environment, steps, tensors and sizes.
    Inspect(inspect::InspectArgs),
    /// Show a step's tensors, or one tensor's values: statistics, first elements, and an
    /// export to a safetensors file.
    Show(show::ShowArgs),
    /// Fail (exit 1) when training is not bit-exact: across runs, or against a baseline.
    Gate(gate::GateArgs),
    /// Write a baseline: one run's hashes, to commit and gate against.
    Baseline(baseline::BaselineArgs),
    /// Find where two runs of a program (-- CMD) or a built-in workload first differ, and
    /// re-record both with full values there: the op, its exact error and its root cause.
    Bisect(bisect::BisectArgs),
    /// Multi-run studies from the reproducibility literature: noise sources, devices, cost of determinism.
    Study(study::StudyArgs),
    /// Batch invariance: run one sequence alone and inside batches of others, and name the first
    /// op whose result for it depends on its batch.
    Invariance(invariance::InvarianceArgs),
    /// Time training steps of any workload with and without hashes-only recording on one device.
    Overhead(overhead::OverheadArgs),
    /// Check GPU hashing against the CPU and measure its throughput (CUDA builds).
    #[cfg(feature = "cuda")]
    GpuCheck(gpu_check::GpuCheckArgs),
    /// Check GPU hashing against the CPU and measure its throughput (needs a CUDA build: `make
    /// cuda`).
    #[cfg(not(feature = "cuda"))]
    GpuCheck(NoGpuArgs),
}

/// `gpu-check`'s arguments in a build without CUDA: whatever they are, the answer is the same.
#[cfg(not(feature = "cuda"))]
#[derive(Debug, clap::Args)]
pub struct NoGpuArgs {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    ignored: Vec<String>,
}

/// Parses and runs the process's command line: its exit status. A command line that does not
/// parse is an error like any other: with `--json` on it, stdout gets the `repro.error.v1`
/// document too.
pub fn main() -> Exit {
    // A `repro` started as the guardian of a program's cgroup does that alone.
    if let Some(exit) = supervise::guard() {
        return exit;
    }
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let json = argv.iter().any(|a| a == "--json");
    let parsed = parse(argv)
        .map_err(|e| match e.kind() {
            // Asked-for help and version are printed as clap prints them.
            clap::error::ErrorKind::DisplayHelp
            | clap::error::ErrorKind::DisplayVersion
            | clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => e.exit(),
            _ => e.render().to_string().trim_start_matches("error: ").trim_end().to_string(),
        })
        .map_err(CliError::from);
    match parsed {
        Ok(cli) => run(cli),
        Err(message) => fail(&message, json),
    }
}

/// Parses a command line, noting which workload options it gave (`WorkloadArgs::note_given`).
fn parse(argv: Vec<std::ffi::OsString>) -> Result<Cli, clap::Error> {
    use clap::{CommandFactory, FromArgMatches};
    let matches = Cli::command().try_get_matches_from(argv)?;
    let mut cli = Cli::from_arg_matches(&matches)?;
    let mut innermost = &matches;
    while let Some((_, sub)) = innermost.subcommand() {
        innermost = sub;
    }
    if let Some(train) = cli.command.workload_args_mut() {
        train.note_given(innermost);
    }
    Ok(cli)
}

impl Command {
    /// What the command trains, for the commands that take a built-in workload's options.
    fn workload_args_mut(&mut self) -> Option<&mut workload_args::WorkloadArgs> {
        match self {
            Command::Record(a) => Some(a.train_mut()),
            Command::Gate(a) => Some(a.train_mut()),
            Command::Baseline(a) => Some(a.train_mut()),
            Command::Bisect(a) => Some(a.train_mut()),
            Command::Study(a) => a.train_mut(),
            Command::Invariance(a) => Some(a.train_mut()),
            Command::Overhead(a) => Some(a.train_mut()),
            Command::Diff(_) | Command::Matrix(_) | Command::Loss(_) | Command::Inspect(_) | Command::Show(_) => None,
            Command::GpuCheck(_) => None,
        }
    }

    /// Whether the command prints JSON (`--json`).
    fn json(&self) -> bool {
        match self {
            Command::Diff(a) => a.json(),
            Command::Matrix(a) => a.json(),
            Command::Loss(a) => a.json(),
            Command::Inspect(a) => a.json(),
            Command::Show(a) => a.json(),
            Command::Gate(a) => a.json(),
            Command::Bisect(a) => a.json(),
            Command::Study(a) => a.json(),
            Command::Invariance(a) => a.json(),
            _ => false,
        }
    }
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> Exit {
    let json = cli.command.json();
    let result = match cli.command {
        Command::Record(args) => record::run(args),
        Command::Diff(args) => diff::run(args),
        Command::Matrix(args) => matrix::run(args),
        Command::Loss(args) => loss::run(args),
        Command::Inspect(args) => inspect::run(args),
        Command::Show(args) => show::run(args),
        Command::Gate(args) => gate::run(args),
        Command::Baseline(args) => baseline::run(args),
        Command::Bisect(args) => bisect::run(args),
        Command::Study(args) => study::run(args),
        Command::Invariance(args) => invariance::run(args),
        Command::Overhead(args) => overhead::run(args),
        #[cfg(feature = "cuda")]
        Command::GpuCheck(args) => gpu_check::run(args),
        #[cfg(not(feature = "cuda"))]
        Command::GpuCheck(_) => Err("`repro gpu-check` needs a build with CUDA: `make cuda` builds one at \
                                     target/cuda/release/repro (this build has no GPU code)"
            .into()),
    };
    match result {
        Ok(_) if output::write_failed() => Exit::Error,
        Ok(exit) => exit,
        Err(message) => fail(&message, json),
    }
}

/// Reports an error: `error: …` (and `caused by: …` for each cause the message does not show)
/// on stderr and, under `--json`, the error document on stdout (a program reading stdout gets a
/// document whatever happened).
fn fail(error: &CliError, json: bool) -> Exit {
    let lines = error.lines();
    eprintln!("error: {}", output::terminal_safe(&lines.join("\ncaused by: ")));
    if json {
        #[derive(serde::Serialize)]
        struct Failure<'a> {
            error: &'a str,
            #[serde(skip_serializing_if = "<[String]>::is_empty")]
            caused_by: &'a [String],
        }
        let failure = Failure { error: &lines[0], caused_by: &lines[1..] };
        let _ = output::print_json("repro.error.v1", Some("error"), &failure);
    }
    Exit::Error
}
