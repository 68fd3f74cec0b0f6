#!/bin/bash
# Session 2026-11-29, second call: the flushes by measured memory checked (hashes the same under
# every policy at batch 64, where steps 3 on flush as measured; the GPU tests), and reading
# beside the program under xxh3-1k against in order, resnet50 at batch 64; one H200.
set -u
source python/bench/gpu_env.sh
{
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for hash in blake3 xxh3-1k; do
  echo "== GPU tests, $hash"
  REPRO_DATA_HASH=$hash timeout 120 python3 -m unittest python/tests/test_torch.py -k gpu 2>&1 | tail -3
  echo "== flush policies record the same hashes, batch 64, 5 steps, $hash"
  REPRO_DATA_HASH=$hash timeout 200 python3 python/bench/torch_flush_check.py "$(mktemp -d)" --batch 64 --steps 5 resnet50 regnet_y_1_6gf 2>&1 | grep -v Warning
done
echo "== resnet50, batch 64, host time (xxh3-1k; in order, beside)"
REPRO_DATA_HASH=xxh3-1k REPRO_PROFILE_PYTHON=timers timeout 200 python3 python/bench/torch_profile.py resnet50 64 batched beside 2>&1 | grep -E "^== |unsynchronized|Error|error"
} 2>&1 | tee $OUT/log.txt
