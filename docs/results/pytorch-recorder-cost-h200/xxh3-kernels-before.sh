#!/bin/bash
# Session 2026-11-29, third call: where the GPU time of a recorded resnet50 step at batch 64
# goes (torch profiler, kernels by name, two steps), under each data hash; one H200.
set -u
source python/bench/gpu_env.sh
{
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for hash in xxh3-1k; do
  echo "== resnet50, batch 64, kernels ($hash)"
  REPRO_PROFILE_ROWS=60 REPRO_DATA_HASH=$hash timeout 200 python3 python/bench/torch_profile.py resnet50 64 batched 2>&1 | grep -v Warning
done
} 2>&1 | tee $OUT/log.txt
