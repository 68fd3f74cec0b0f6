#!/bin/bash
# Session 2026-11-29, seventh call: the memory the recorder may keep capped at 2% of PyTorch's
# peak so far (it was 256 MiB whatever the model: mobilenet_v3_large's peak rose 8.0% at batch 8
# (Run with EXTRA_SHARE at 2%; it is 3% since: the flushes this forced under blake3 at batch 8.)
# under blake3's copies); the CNNs under blake3 at batch 8 and 64; one H200.
set -u
source python/bench/gpu_env.sh
bench() { timeout 250 python3 python/bench/torch_cost.py "$@" 2>&1 | grep -v Warning; }
{
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== batch 8"
bench --header --steps 8 --batch 8 --variants plain,batched,xxh3 mobilenet_v3_large densenet121 efficientnet_b0 resnet50
echo "== batch 64"
bench --steps 8 --variants plain,batched mobilenet_v3_large densenet121 efficientnet_b0 resnet50
} 2>&1 | tee $OUT/log.txt
