//! The `repro` command: parses arguments and dispatches to `cli`.

mod cli;

/// mimalloc, not the system's `malloc`: the recorder's writer thread frees what the training
/// thread allocated, and glibc makes such frees wait for the training thread's arena lock
/// (docs/cuda.md, "The allocator").
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    repro::record::pin_cpu_threads();
    cli::main().into()
}
