//! Captures the candle-core version (from Cargo.lock) and the rustc version at build time, so
//! traces can name the exact toolchain that produced them.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=Cargo.lock");
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
