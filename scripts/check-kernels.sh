#!/usr/bin/env bash
# Checks the BLAKE3 part of kernels/repro.cu on the host: compiles it as C and compares the
# chunk and parent chaining values it computes, merged into a root on the host, with the
# blake3 crate's hash (the test crate crates/kernel-host-check).
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo test --release --locked -p kernel-host-check -- --nocapture
