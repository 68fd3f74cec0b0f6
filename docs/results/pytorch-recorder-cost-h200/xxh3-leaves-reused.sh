#!/bin/bash
# Session 2026-11-28 (fifth), third call: leaf memory reused from one flush to the next, checked
# (hashes under every flush policy, the GPU tests) and its memory measured.
set -u
source python/bench/gpu_env.sh  # what was run inline then: the same steps
{
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== data hashes on the GPU against the host's, and their rates"
timeout 150 python3 python/bench/torch_data_hash_check.py 1 4 2>&1 | grep -v Warning
echo "== GPU tests, xxh3-1k"
REPRO_DATA_HASH=xxh3-1k timeout 120 python3 -m unittest python/tests/test_torch.py -k gpu 2>&1 | tail -3
echo "== flush policies record the same hashes, xxh3-1k"
REPRO_DATA_HASH=xxh3-1k timeout 200 python3 python/bench/torch_flush_check.py "$(mktemp -d)" resnet50 densenet121 efficientnet_b0 2>&1 | grep -v Warning
echo "== memory and cost"
python3 python/bench/torch_cost.py --header --steps 8 --pairs 8 --variants plain,batched,xxh3 resnet50 densenet121 2>&1 | grep -v Warning
python3 python/bench/torch_cost.py --steps 8 --variants plain,batched,xxh3 --batch 8 resnet50 2>&1 | grep -v Warning
} 2>&1 | tee $OUT/log.txt
