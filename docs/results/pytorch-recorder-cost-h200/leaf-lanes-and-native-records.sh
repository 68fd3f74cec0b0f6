#!/bin/bash
# Session 2026-11-29 (second), second measuring call: the xxh3-1k leaf pass reads 16 bytes a lane
# (four lanes a chunk, no shuffle a stripe, the secret's words in registers), and the writer packs
# each step's hashed records through the library (repro_pack_hashed_records). Checks (hashes
# against the host's, the GPU tests, every flush policy IDENTICAL), the rates against the last
# library (target/cuda-bin/old: c088714, whose writer packs in Python), resnet50's host time with
# each library alternated, and its kernels; one H200.
set -u
source python/bench/gpu_env.sh
NEW=$REPRO_CUDA_HASH_LIB OLD=$PWD/target/cuda-bin/old/librepro_cuda_hash.so
{
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for lib in NEW OLD; do
  echo "== data hashes on the GPU against the host's, and their rates, library $lib"
  REPRO_CUDA_HASH_LIB=${!lib} timeout 150 python3 python/bench/torch_data_hash_check.py 1 4 2>&1 | grep -v Warning | tail -9
done
for hash in xxh3-1k blake3; do
  echo "== GPU tests, $hash"
  REPRO_DATA_HASH=$hash timeout 120 python3 -m unittest python/tests/test_torch.py -k gpu 2>&1 | tail -3
done
echo "== the writer's tests against this library (native records)"
timeout 60 python3 -m unittest python/tests/test_writer.py 2>&1 | tail -3
echo "== flush policies record the same hashes, batch 64, 5 steps, xxh3-1k"
REPRO_DATA_HASH=xxh3-1k timeout 200 python3 python/bench/torch_flush_check.py "$(mktemp -d)" --batch 64 --steps 5 resnet50 mobilenet_v3_large 2>&1 | grep -v Warning
echo "== flush policies record the same hashes, batch 64, 5 steps, blake3"
timeout 100 python3 python/bench/torch_flush_check.py "$(mktemp -d)" --batch 64 --steps 5 resnet50 2>&1 | grep -v Warning
for round in 1 2; do for lib in OLD NEW; do
  echo "== resnet50, batch 64, xxh3-1k, library $lib, round $round"
  REPRO_CUDA_HASH_LIB=${!lib} REPRO_DATA_HASH=xxh3-1k REPRO_PROFILE_PYTHON=timers timeout 200 python3 python/bench/torch_profile.py resnet50 64 batched 2>&1 | grep -E "^== |unsynchronized|Error|error"
done; done
echo "== resnet50, batch 64, kernels (xxh3-1k, new library)"
REPRO_PROFILE_ROWS=40 REPRO_DATA_HASH=xxh3-1k timeout 200 python3 python/bench/torch_profile.py resnet50 64 batched 2>&1 | grep -v Warning
} 2>&1 | tee $OUT/log.txt
