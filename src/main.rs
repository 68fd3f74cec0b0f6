//! The `repro` command: parses arguments and dispatches to `cli`.

mod cli;

fn main() -> std::process::ExitCode {
    cli::run(cli::parse()).into()
}
