#!/usr/bin/env bash
# Compiles repro's GPU kernels without a GPU, as the binary does at run time (NVRTC,
# src/cuda/kernels.rs): the main module's files concatenated in kernels.rs's order, and
# kernels/matmul_bf16.cu on its own for compute_80 and kernels/matmul_bf16_hopper.cu for
# compute_90a; then each module's PTX to sm_90 (sm_90a) code (H100, H200). A kernel that does not compile then fails here (CI runs this through `make cuda-check`)
# rather than at the first recording on a GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(scripts/cuda-toolchain.sh)"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
mapfile -t files < <(sed -n '/^pub(crate) const SOURCE/,/^);/p' src/cuda/kernels.rs | grep -o 'kernels/[a-z0-9_]*\.cuh\?')
[ "${#files[@]}" -gt 0 ] || { echo "error: no kernel files found in src/cuda/kernels.rs's SOURCE" >&2; exit 2; }
cat "${files[@]}" > "$out/repro.cu"
# compute_75: the oldest architecture CUDA 13 compiles for.
nvcc -ptx -arch=compute_75 -o "$out/repro.ptx" "$out/repro.cu"
ptxas -arch=sm_90 -o "$out/repro.cubin" "$out/repro.ptx"
nvcc -ptx -arch=compute_80 -o "$out/tensor_core.ptx" kernels/matmul_bf16.cu
ptxas -arch=sm_90 -o "$out/tensor_core.cubin" "$out/tensor_core.ptx"
nvcc -ptx -arch=compute_90a -o "$out/hopper.ptx" kernels/matmul_bf16_hopper.cu
ptxas -arch=sm_90a -o "$out/hopper.cubin" "$out/hopper.ptx"
echo "kernels compile: ${files[*]}; kernels/matmul_bf16.cu (PTX, then sm_90 code); kernels/matmul_bf16_hopper.cu (compute_90a PTX, then sm_90a code)"
