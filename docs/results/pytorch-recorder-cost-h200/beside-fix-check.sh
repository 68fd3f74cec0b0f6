#!/bin/bash
# Session 2026-11-29, after the fix: a flush in order after one read beside waits for that
# flush's tree before its chunk pass writes the tree's scratch (REPRO_TORCH_FLUSH=beside had
# recorded a wrong hash of resnet50's layer1.1.bn2 at step 1 under blake3, batch 64). The GPU
# tests, and the flush policies twice on resnet50, under blake3; one H200.
set -u
source python/bench/gpu_env.sh
{
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== GPU tests, blake3"
timeout 60 python3 -m unittest python/tests/test_torch.py -k gpu 2>&1 | tail -3
for round in 1 2; do
  echo "== flush policies record the same hashes, batch 64, 5 steps, blake3, round $round"
  timeout 100 python3 python/bench/torch_flush_check.py "$(mktemp -d)" --batch 64 --steps 5 resnet50 2>&1 | grep -v Warning
done
} 2>&1 | tee $OUT/log.txt
