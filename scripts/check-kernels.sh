#!/usr/bin/env bash
# Checks the hashing kernels of kernels/hash.cu on the host: the test crate
# crates/kernel-host-check compiles them as C, and repro's record::device::plan tests run batched plans
# through them against the blake3 crate and a plain row-major read.
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo test --release --locked -p repro --lib record::device::plan -- --nocapture
