#!/bin/bash
# The GPU hashing library's correctness on a GPU, after a change to it: the GPU tests of
# python/tests/test_torch.py (tensors hashed on the GPU under each flush policy, from the
# program's own stream too, equal to the host's hashes byte for byte), under each data hash.
# From the repository root on a GPU machine after `make cuda` (target/gpu-pack), .whl/ carried:
#
#   python/bench/gpu_hash_checks.sh OUT
set -u
OUT=${1:?usage: gpu_hash_checks.sh OUT}
source python/bench/gpu_env.sh
{
    for hash in blake3 xxh3-1k; do
        echo "== GPU tests, data hash $hash"
        REPRO_DATA_HASH=$hash python3 -m unittest discover -v -s python/tests -p test_torch.py -k gpu 2>&1 | grep -v Warning | tail -8
    done
} 2>&1 | tee "$OUT/gpu-hash-checks.txt"
