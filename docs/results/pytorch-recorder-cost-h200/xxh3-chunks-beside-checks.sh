#!/bin/bash
# Session 2026-11-29, fourth call: under xxh3-1k the chunk pass over the leaves runs beside the
# program (with the tree): hashes checked against the host's, the GPU tests, every flush policy
# IDENTICAL at batch 64; resnet50's kernels and host time at batch 64; one H200.
set -u
source python/bench/gpu_env.sh
{
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== data hashes on the GPU against the host's, and their rates"
timeout 150 python3 python/bench/torch_data_hash_check.py 1 4 2>&1 | grep -v Warning
echo "== gpu-check --only hash (blake3, the candle pipeline)"
timeout 120 $REPRO_BIN gpu-check --only hash 2>&1 | head -8
for hash in xxh3-1k blake3; do
  echo "== GPU tests, $hash"
  REPRO_DATA_HASH=$hash timeout 120 python3 -m unittest python/tests/test_torch.py -k gpu 2>&1 | tail -3
done
echo "== flush policies record the same hashes, batch 64, 5 steps, xxh3-1k"
REPRO_DATA_HASH=xxh3-1k timeout 200 python3 python/bench/torch_flush_check.py "$(mktemp -d)" --batch 64 --steps 5 resnet50 efficientnet_b0 2>&1 | grep -v Warning
echo "== resnet50, batch 64, host time (xxh3-1k)"
REPRO_DATA_HASH=xxh3-1k REPRO_PROFILE_PYTHON=timers timeout 200 python3 python/bench/torch_profile.py resnet50 64 batched 2>&1 | grep -E "^== |unsynchronized|Error|error"
echo "== resnet50, batch 64, kernels (xxh3-1k)"
REPRO_PROFILE_ROWS=60 REPRO_DATA_HASH=xxh3-1k timeout 200 python3 python/bench/torch_profile.py resnet50 64 batched 2>&1 | grep -v Warning
} 2>&1 | tee $OUT/log.txt
