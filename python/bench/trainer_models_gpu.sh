#!/bin/bash
# transformers models this repository did not write, through transformers' Trainer and
# ReproCallback on a GPU (issue 68; docs/results/trainer-models-gpu.md), from the repository root
# on a GPU machine after `make cuda` (target/gpu-pack) with .whl/ carried:
#
#   python/bench/trainer_models_gpu.sh OUT [MODEL ...]        (default: bert qwen2)
#
# Each model: a plain run, two recorded runs by `repro record -- python ...` and their diff (the
# Trainer's defaults), then the same with the Trainer's full_determinism; median step times.
set -u
OUT=${1:?usage: trainer_models_gpu.sh OUT [MODEL ...]}
shift
source python/bench/gpu_env.sh
prog=python/bench/trainer_models_gpu.py
quiet() { grep -v -e Warning -e warn -e "^ *$"; }
{
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
    for model in ${*:-bert qwen2}; do
        echo "== $model"
        python3 $prog $model /tmp/unused /tmp/trainer-out --plain 2>&1 | quiet
        for det in "" --deterministic; do
            for run in a b; do
                rm -rf /tmp/tr-$run
                /usr/bin/time -f "recorded $run$det: %e s wall" "$REPRO_BIN" record --capture none --out /tmp/tr-$run -- \
                    python3 $prog $model /tmp/tr-$run /tmp/trainer-out $det 2>&1 | quiet | tail -3
            done
            du -sh /tmp/tr-a
            "$REPRO_BIN" diff /tmp/tr-a /tmp/tr-b 2>&1 | head -40
            echo "diff exit: ${PIPESTATUS[0]}"
        done
        rm -rf /tmp/tr-a /tmp/tr-b /tmp/trainer-out
    done
} 2>&1 | tee "$OUT/trainer-models.txt"
