#!/bin/bash
# Session 2026-11-29 (second), first measuring call: under xxh3-1k a flush in order whose batch
# holds only leaves runs the leaf pass alone, and the step's leaves are hashed by one BLAKE3 pass
# at the next flush that reads the program's memory or at the step's end. Checks (hashes against
# the host's, the GPU tests, every flush policy IDENTICAL), then the new library against the old
# (target/cuda-bin/old in the pack) alternated; one H200.
set -u
source python/bench/gpu_env.sh
NEW=$REPRO_CUDA_HASH_LIB OLD=$PWD/target/cuda-bin/old/librepro_cuda_hash.so
{
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== data hashes on the GPU against the host's, and their rates"
timeout 150 python3 python/bench/torch_data_hash_check.py 1 2>&1 | grep -v Warning | tail -12
for hash in xxh3-1k blake3; do
  echo "== GPU tests, $hash"
  REPRO_DATA_HASH=$hash timeout 120 python3 -m unittest python/tests/test_torch.py -k gpu 2>&1 | tail -3
done
echo "== flush policies record the same hashes, batch 64, 5 steps, xxh3-1k"
REPRO_DATA_HASH=xxh3-1k timeout 200 python3 python/bench/torch_flush_check.py "$(mktemp -d)" --batch 64 --steps 5 resnet50 efficientnet_b0 2>&1 | grep -v Warning
for model in resnet50 densenet121; do for round in 1 2; do for lib in OLD NEW; do
  echo "== $model, batch 64, xxh3-1k, library $lib, round $round"
  REPRO_CUDA_HASH_LIB=${!lib} REPRO_DATA_HASH=xxh3-1k REPRO_PROFILE_PYTHON=timers timeout 200 python3 python/bench/torch_profile.py $model 64 batched 2>&1 | grep -E "^== |unsynchronized|Error|error"
done; done; done
echo "== resnet50, batch 64, kernels (xxh3-1k, new library)"
REPRO_PROFILE_ROWS=40 REPRO_DATA_HASH=xxh3-1k timeout 200 python3 python/bench/torch_profile.py resnet50 64 batched 2>&1 | grep -v Warning
} 2>&1 | tee $OUT/log.txt
