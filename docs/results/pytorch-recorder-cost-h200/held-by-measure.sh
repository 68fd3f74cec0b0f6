#!/bin/bash
# Session 2026-11-29, first call: flushes of outputs held by measured memory, against the code
# before (.baseline/old = HEAD's python/), resnet50 and densenet121 at batch 64, one H200.
# (Run with MEASURE_MIN_BYTES at 16 MiB, every flush of more measured; it is 256 MiB since. The
# xxh3 rows count the tensors read at their hooks twice, a counting fault fixed since.)
set -u
source python/bench/gpu_env.sh
NEW="python:python/bench:/tmp/site"; OLD=".baseline/old/python:.baseline/old/python/bench:/tmp/site"
{
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== PyTorch's allocator statistics: the time of one reading"
python3 -c "
import time, torch
torch.zeros(1, device='cuda'); f = torch._C._cuda_memoryStats; f(0)
t = time.perf_counter()
for _ in range(1000): f(0)['allocated_bytes']['all']['current']
print(f'{(time.perf_counter() - t) * 1e3:.1f} us a reading')"
for hash in blake3 xxh3-1k; do for code in OLD NEW; do
  echo "== resnet50, batch 64, host time ($hash, $code)"
  PYTHONPATH=${!code} REPRO_DATA_HASH=$hash REPRO_PROFILE_PYTHON=timers timeout 150 python3 python/bench/torch_profile.py resnet50 64 batched 2>&1 | grep -E "^== |unsynchronized|Error|error"
done; done
for code in OLD NEW; do
  echo "== cost, batch 64 ($code)"
  PYTHONPATH=${!code} timeout 200 python3 python/bench/torch_cost.py --header --steps 8 --pairs 8 --variants plain,batched,xxh3 resnet50 densenet121 2>&1 | grep -v Warning
done
} 2>&1 | tee $OUT/log.txt
