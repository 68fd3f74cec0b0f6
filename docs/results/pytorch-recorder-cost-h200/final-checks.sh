#!/bin/bash
# Session 2026-11-29, last call: the final code (caps at 3% of the peak, 256 outputs a flush, the
# leaves' chunk pass beside) checked: the GPU tests and every flush policy IDENTICAL at batch 64
# under both data hashes; one H200.
set -u
source python/bench/gpu_env.sh
{
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for hash in blake3 xxh3-1k; do
  echo "== GPU tests, $hash"
  REPRO_DATA_HASH=$hash timeout 100 python3 -m unittest python/tests/test_torch.py -k gpu 2>&1 | tail -3
  echo "== flush policies record the same hashes, batch 64, 5 steps, $hash"
  REPRO_DATA_HASH=$hash timeout 150 python3 python/bench/torch_flush_check.py "$(mktemp -d)" --batch 64 --steps 5 resnet50 mobilenet_v3_large 2>&1 | grep -v Warning
done
} 2>&1 | tee $OUT/log.txt
