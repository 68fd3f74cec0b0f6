#!/bin/bash
# Session 2026-11-28 (fifth), fourth call: under xxh3-1k, outputs changed in place read at once
# at their hooks (the leaf pass), not copied: checked (hashes under every flush policy, the GPU
# tests) and measured against blake3 on the CNNs.
set -u
source python/bench/gpu_env.sh  # what was run inline then: the same steps
{
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== GPU tests, blake3 and xxh3-1k"
timeout 120 python3 -m unittest python/tests/test_torch.py -k gpu 2>&1 | tail -1
REPRO_DATA_HASH=xxh3-1k timeout 120 python3 -m unittest python/tests/test_torch.py -k gpu 2>&1 | tail -1
echo "== flush policies record the same hashes, xxh3-1k"
REPRO_DATA_HASH=xxh3-1k timeout 240 python3 python/bench/torch_flush_check.py "$(mktemp -d)" resnet50 densenet121 efficientnet_b0 mobilenet_v3_large 2>&1 | grep -v Warning
echo "== cost, batch 64 and 8"
python3 python/bench/torch_cost.py --header --steps 8 --pairs 8 --variants plain,batched,xxh3 resnet50 densenet121 efficientnet_b0 mobilenet_v3_large 2>&1 | grep -v Warning
python3 python/bench/torch_cost.py --steps 8 --pairs 8 --batch 8 --variants plain,batched,xxh3 resnet50 efficientnet_b0 2>&1 | grep -v Warning
} 2>&1 | tee $OUT/log.txt
