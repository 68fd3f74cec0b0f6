#!/bin/bash
# Session 2026-11-28 (fifth), second call: 4 MiB leaf blocks checked (hashes and memory), and the
# host's time to queue a resnet50 step at batch 64, plain and recorded under each data hash.
set -u
source python/bench/gpu_env.sh  # what was run inline then: the same steps
{
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== data hashes on the GPU against the host's, and their rates"
timeout 150 python3 python/bench/torch_data_hash_check.py 1 4 2>&1 | grep -v Warning
echo "== GPU tests, xxh3-1k"
REPRO_DATA_HASH=xxh3-1k timeout 120 python3 -m unittest python/tests/test_torch.py -k gpu 2>&1 | tail -3
echo "== memory, resnet50 at batch 8 and 64"
python3 python/bench/torch_cost.py --header --steps 8 --variants plain,batched,xxh3 --batch 8 resnet50 2>&1 | grep -v Warning
python3 python/bench/torch_cost.py --steps 8 --variants plain,batched,xxh3 resnet50 2>&1 | grep -v Warning
for hash in blake3 xxh3-1k; do
  echo "== resnet50, batch 64, the host's time to queue a step ($hash)"
  REPRO_DATA_HASH=$hash REPRO_PROFILE_PYTHON=timers timeout 150 python3 python/bench/torch_profile.py resnet50 64 batched 2>&1 | grep -E "^== |unsynchronized"
done
} 2>&1 | tee $OUT/log.txt
