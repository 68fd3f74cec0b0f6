#!/bin/bash
# Session 2026-11-29 (second): the GPU tests again, after the rename that keeps the CPU build's
# library test out of `-k gpu` (it failed there, the CPU build not being on the GPU machine).
set -u
source python/bench/gpu_env.sh
{
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for hash in xxh3-1k blake3; do
  echo "== GPU tests, $hash"
  REPRO_DATA_HASH=$hash timeout 120 python3 -m unittest -v python/tests/test_torch.py -k gpu 2>&1 | grep -E "^test_|Ran|OK|FAIL|Error" | head
done
} 2>&1 | tee $OUT/log.txt
