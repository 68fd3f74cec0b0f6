#!/bin/bash
# Session 2026-11-28 (fifth): the data hash xxh3-1k on the GPU checked against the host's, and
# its rate; the GPU tests under both data hashes; the flush policies under xxh3-1k.
set -u
source python/bench/gpu_env.sh  # what was run inline then: the same steps
{
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c 'import torch, xxhash; print("torch", torch.__version__, "xxhash", xxhash.VERSION)'
echo "== gpu-check --only hash (blake3, the candle pipeline)"
timeout 120 $REPRO_BIN gpu-check --only hash 2>&1 | head -8
echo "== data hashes on the GPU against the host's, and their rates"
timeout 150 python3 python/bench/torch_data_hash_check.py 1 4 2>&1 | grep -v Warning
echo "== GPU tests, blake3"
timeout 120 python3 -m unittest python/tests/test_torch.py -k gpu 2>&1 | tail -3
echo "== GPU tests, xxh3-1k"
REPRO_DATA_HASH=xxh3-1k timeout 120 python3 -m unittest python/tests/test_torch.py -k gpu 2>&1 | tail -3
echo "== flush policies record the same hashes, xxh3-1k"
REPRO_DATA_HASH=xxh3-1k timeout 150 python3 python/bench/torch_flush_check.py "$(mktemp -d)" resnet50 densenet121 2>&1 | grep -v Warning
} 2>&1 | tee $OUT/log.txt
