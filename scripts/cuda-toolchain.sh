#!/usr/bin/env bash
# Installs the pinned CUDA 13.0 compiler (nvcc from PyPI) into a cache folder and prints the
# environment a CUDA build needs, as `export` lines for `eval`.
#
#   eval "$(scripts/cuda-toolchain.sh)"     # then: cargo build --features cuda ...
#
# REPRO_CUDA_CACHE chooses the folder (default: ~/.cache/repro-cuda). The GPU machine's driver
# speaks CUDA 13.0, so every package is pinned to 13.0.x: PTX from a newer nvvm is refused there.
set -euo pipefail

cache="${REPRO_CUDA_CACHE:-$HOME/.cache/repro-cuda}"
venv="$cache/venv"
cuda="$venv/lib/python3.11/site-packages/nvidia/cu13"
packages=(
  nvidia-cuda-nvcc==13.0.88
  nvidia-cuda-crt==13.0.88
  nvidia-cuda-runtime==13.0.96
  nvidia-cuda-cccl==13.0.85
  nvidia-nvvm==13.0.88
)

if [ ! -x "$cuda/bin/nvcc" ]; then
  echo "installing nvcc 13.0 into $venv (about 300 MB, once)" >&2
  mkdir -p "$cache"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "${packages[@]}" >&2
fi
python_dir=$(ls -d "$venv"/lib/python3.* | head -1)
cuda="$python_dir/site-packages/nvidia/cu13"
[ -x "$cuda/bin/nvcc" ] || { echo "error: nvcc missing at $cuda/bin/nvcc after install" >&2; exit 2; }

echo "export PATH=\"$cuda/bin:\$PATH\""
echo "export CUDA_ROOT=\"$cuda\" CUDA_PATH=\"$cuda\" CUDA_HOME=\"$cuda\""
# Without a GPU candle-kernels cannot ask the device for its compute capability; 90 builds
# sm_90a code, right for the H100 and the H200.
echo "export CUDA_COMPUTE_CAP=90"
echo "export REPRO_CUDA_LIB=\"$cuda/lib\""
