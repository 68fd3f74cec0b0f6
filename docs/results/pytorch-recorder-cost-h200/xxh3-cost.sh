#!/bin/bash
# Session 2026-11-28 (fifth): what recording costs with the data hash xxh3-1k against blake3,
# batch 64 (and the two host-bound CNNs at batch 8), one H200, one call.
set -u
source python/bench/gpu_env.sh  # what was run inline then: the same steps
bench() { python3 python/bench/torch_cost.py "$@" 2>&1 | grep -v Warning; }
{
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== batch 64"
bench --header --steps 8 --pairs 8 --variants plain,batched,xxh3 resnet50 densenet121 efficientnet_b0 mobilenet_v3_large convnext_tiny vit_b_16
echo "== batch 8"
bench --steps 8 --pairs 8 --batch 8 --variants plain,batched,xxh3 resnet50 efficientnet_b0
} 2>&1 | tee $OUT/log.txt
