#!/bin/bash
# Session 2026-11-29, fifth call: the chunk pass over xxh3-1k's leaves beside the program (new
# library) against in order (old library, target/cuda-bin/old in the pack), alternated in one call, resnet50
# and densenet121 at batch 64; one H200.
set -u
source python/bench/gpu_env.sh
NEW=$REPRO_CUDA_HASH_LIB OLD=$PWD/target/cuda-bin/old/librepro_cuda_hash.so
{
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for model in resnet50 densenet121; do for round in 1 2; do for lib in OLD NEW; do
  echo "== $model, batch 64, xxh3-1k, library $lib, round $round"
  REPRO_CUDA_HASH_LIB=${!lib} REPRO_DATA_HASH=xxh3-1k REPRO_PROFILE_PYTHON=timers timeout 200 python3 python/bench/torch_profile.py $model 64 batched 2>&1 | grep -E "^== |unsynchronized|Error|error"
done; done; done
} 2>&1 | tee $OUT/log.txt
