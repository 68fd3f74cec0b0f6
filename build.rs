//! Compiles the host test build of the kernels, and captures the candle-core version (from Cargo.lock) and the rustc version at build time, so
//! traces can name the exact toolchain that produced them.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=Cargo.lock");
    // The BLAKE3 part of the CUDA kernels, built for the host so tests can check it without a GPU.
    println!("cargo:rerun-if-changed=kernels/repro.cu");
    println!("cargo:rerun-if-changed=kernels/host_test.c");
    cc::Build::new().file("kernels/host_test.c").warnings(true).compile("repro_kernels_host");
    let lock = std::fs::read_to_string("Cargo.lock").unwrap_or_default();
    let candle = lock
        .split("[[package]]")
        .find(|pkg| pkg.contains("name = \"candle-core\""))
        .and_then(|pkg| pkg.lines().find_map(|l| l.strip_prefix("version = \"")))
        .map(|v| v.trim_end_matches('"').to_string())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=REPRO_CANDLE_VERSION={candle}");
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=REPRO_RUSTC_VERSION={version}");
}
