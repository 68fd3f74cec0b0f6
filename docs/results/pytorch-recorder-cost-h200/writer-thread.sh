#!/bin/bash
# Session 2026-11-29 (second): every step written on the writer's thread (docs/results/pytorch-recorder-cost-h200/writer_thread.py)
# against written on the training thread, resnet50 and densenet121 at batch 64 under xxh3-1k,
# alternated; one H200.
set -u
source python/bench/gpu_env.sh
{
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for model in resnet50 densenet121; do for round in 1 2; do for how in inline thread; do
  echo "== $model, batch 64, xxh3-1k, writer $how, round $round"
  if [ $how = inline ]; then script=python/bench/torch_profile.py; else script=docs/results/pytorch-recorder-cost-h200/writer_thread.py; fi
  REPRO_DATA_HASH=xxh3-1k REPRO_PROFILE_PYTHON=timers timeout 200 python3 $script $model 64 batched 2>&1 | grep -E "^== |unsynchronized|Error|error"
done; done; done
} 2>&1 | tee $OUT/log.txt
