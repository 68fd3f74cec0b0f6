#!/usr/bin/env bash
# Builds repro with CUDA support on a machine without a GPU: pinned nvcc from PyPI, link stubs,
# a target folder of its own (so the CPU build is never rebuilt). The binary runs on a machine
# with the NVIDIA driver and CUDA 13 libraries.
#
#   scripts/build-cuda.sh [check]      # `check`: type-check, and compile the kernels (what CI does)
#
# Output: $REPRO_CUDA_TARGET/release/repro (default target/cuda/release/repro), the PyTorch
# recorder's librepro_cuda_hash.so beside it, and the test binaries listed in
# $REPRO_CUDA_TARGET/test-binaries.txt; and target/gpu-pack/pack.tar.gz, the binary and the library
# stripped (cuda-bin/), which the GPU scripts carry and unpack (python/bench/gpu_env.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(scripts/cuda-toolchain.sh)"
cache="${REPRO_CUDA_CACHE:-$HOME/.cache/repro-cuda}"
export CARGO_TARGET_DIR="${REPRO_CUDA_TARGET:-target/cuda}"
stubs="$cache/stubs"
# Always the same RUSTFLAGS: a change would rebuild everything, candle's kernels included.
export RUSTFLAGS="-L $stubs"
mkdir -p "$stubs"

if [ "${1:-}" = check ]; then
  cargo check --locked --release --features nccl --all-targets
  cargo check --locked --release -p repro-cuda-hash --features cuda,repro/nccl
  # The kernels are compiled at run time, on the GPU machine: compile them here too.
  scripts/compile-kernels.sh
  exit 0
fi
cargo build --locked --release --features nccl --lib
scripts/cuda-stubs.sh "$CARGO_TARGET_DIR/release/deps" "$stubs" "$REPRO_CUDA_LIB/libcudart.so.13"
cargo build --locked --release --features nccl --bins --examples
# The PyTorch recorder's C library, beside the binary (the features as above: nothing rebuilt).
cargo build --locked --release -p repro-cuda-hash --features cuda,repro/nccl
cargo test --locked --release --features nccl --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])' > "$CARGO_TARGET_DIR/test-binaries.txt"
pack=target/gpu-pack
rm -rf "$pack" && mkdir -p "$pack/cuda-bin"
cp "$CARGO_TARGET_DIR/release/repro" "$CARGO_TARGET_DIR/release/librepro_cuda_hash.so" "$pack/cuda-bin/"
strip "$pack/cuda-bin/repro" "$pack/cuda-bin/librepro_cuda_hash.so"
tar -czf "$pack/pack.tar.gz" -C "$pack" cuda-bin && rm -rf "$pack/cuda-bin"
echo "built $CARGO_TARGET_DIR/release/repro, packed into $pack/pack.tar.gz" >&2
