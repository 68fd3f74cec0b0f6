#!/bin/bash
# Session 2026-11-29 (second), the cost table after this session's changes (xxh3-1k's leaves
# hashed once for many flushes, its leaf pass at 16 bytes a lane, the records packed natively):
# the CNNs of issue 46 and one it does not name (regnet_y_1_6gf), at batch 64 with PyTorch's
# DebugMode beside, and at batch 8; one H200.
set -u
source python/bench/gpu_env.sh
bench() { timeout 285 python3 python/bench/torch_cost.py "$@" 2>&1 | grep -v Warning; }
{
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== batch 64"
bench --header --steps 8 --pairs 8 --variants plain,batched,xxh3,debug resnet50 densenet121 efficientnet_b0 mobilenet_v3_large convnext_tiny regnet_y_1_6gf
echo "== batch 8"
bench --header --steps 8 --pairs 8 --batch 8 --variants plain,batched,xxh3 resnet50 densenet121 efficientnet_b0 mobilenet_v3_large
} 2>&1 | tee $OUT/log.txt
