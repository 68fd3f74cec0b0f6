#!/bin/bash
# Session 2026-11-29 (second): under xxh3-1k an output changed in place over the copy's limit is
# read at its hook by the leaf pass, without a flush (and so is every output of the watched first
# step). Checks (the GPU tests, every flush policy IDENTICAL), then this Python against the last
# commit's (.baseline/py-old), alternated, resnet50 and densenet121 at batch 64; one H200.
set -u
source python/bench/gpu_env.sh
NEWPY=$PYTHONPATH OLDPY=".baseline/py-old/python:.baseline/py-old/python/bench:/tmp/site"
{
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for hash in xxh3-1k blake3; do
  echo "== GPU tests, $hash"
  REPRO_DATA_HASH=$hash timeout 120 python3 -m unittest python/tests/test_torch.py -k gpu 2>&1 | tail -3
done
echo "== flush policies record the same hashes, batch 64, 5 steps, xxh3-1k"
REPRO_DATA_HASH=xxh3-1k timeout 200 python3 python/bench/torch_flush_check.py "$(mktemp -d)" --batch 64 --steps 5 resnet50 efficientnet_b0 2>&1 | grep -v Warning
for model in resnet50 densenet121; do for round in 1 2; do for py in OLDPY NEWPY; do
  echo "== $model, batch 64, xxh3-1k, python $py, round $round"
  PYTHONPATH=${!py} REPRO_DATA_HASH=xxh3-1k REPRO_PROFILE_PYTHON=timers timeout 200 python3 python/bench/torch_profile.py $model 64 batched 2>&1 | grep -E "^== |unsynchronized|Error|error"
done; done; done
} 2>&1 | tee $OUT/log.txt
