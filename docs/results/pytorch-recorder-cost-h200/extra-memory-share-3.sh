#!/bin/bash
# Session 2026-11-29, eighth call: EXTRA_SHARE at 3% (2% forced 23 flushes a resnet50 step at
# batch 8 under blake3's copies); batch 8 and 64 under blake3; one H200.
set -u
source python/bench/gpu_env.sh
bench() { timeout 200 python3 python/bench/torch_cost.py "$@" 2>&1 | grep -v Warning; }
{
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
bench --header --steps 8 --batch 8 --variants plain,batched mobilenet_v3_large densenet121 resnet50
bench --steps 8 --variants plain,batched mobilenet_v3_large resnet50
} 2>&1 | tee $OUT/log.txt
