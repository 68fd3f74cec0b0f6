#!/bin/bash
# The GPU measurements of the capture ladder (issue 67; docs/results/capture-ladder-h100.md), from
# the repository root on a GPU machine after `make cuda` (target/gpu-pack) with .whl/ carried:
#
#   python/bench/torch_levels_gpu.sh OUT [table] [diagnose] [bisect]    (none named: all three)
#
# table: torch_cost.py over the benchmark set, each model plain, at the default levels (`steps`:
#   module outputs at the first step alone), with module outputs at every step (`batched`), one
#   step of the `ops` level at every timed step, and DebugMode hashing every op's output; the CNNs
#   at batch 64 and 8, GPT-2 and a 1.1B Llama shape at 8 x 1024.
# diagnose: where the `steps` level's time goes: paired steps (plain, then recorded) at blake3 and
#   xxh3-1k, and the recorder's calls timed on resnet50 at batch 8 and 64.
# bisect: `repro bisect -- CMD` on resnet50 at batch 64 whose pooling is an atomic index_add_,
#   from the command to the named aten op, beside the same program run plain.
set -u
OUT=${1:?usage: torch_levels_gpu.sh OUT [table] [diagnose] [bisect]}
shift
WHAT=" ${*:-table diagnose bisect} "
asked() { [[ "$WHAT" == *" $1 "* ]]; }
source python/bench/gpu_env.sh
bench() { python3 python/bench/torch_cost.py "$@" 2>&1 | grep -v Warning; }
{
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    python3 -c 'import torch, torchvision, transformers; print("torch", torch.__version__, "torchvision", torchvision.__version__, "transformers", transformers.__version__)'
    if asked diagnose; then
        echo "== the steps level, paired steps (batch 64, then 8)"
        bench --header --steps 8 --pairs 8 --variants plain,steps,steps-xxh3 resnet50 regnet_y_1_6gf mobilenet_v3_large
        bench --steps 8 --pairs 8 --batch 8 --variants plain,steps,steps-xxh3 resnet50 mobilenet_v3_large
        echo "== the recorder's calls, steps level, resnet50 at batch 8 and 64"
        for b in 8 64; do
            REPRO_PROFILE_PYTHON=timers REPRO_PROFILE_MODULES=none python3 python/bench/torch_profile.py resnet50 $b batched 2>&1 | grep -v Warning
        done
        echo "== the steps level's kernels and host calls, resnet50 at batch 64 (torch.profiler)"
        REPRO_PROFILE_ROWS=16 REPRO_PROFILE_MODULES=none python3 python/bench/torch_profile.py resnet50 64 batched 2>&1 | grep -v Warning
    fi
    if asked bisect; then
        echo "== bisect: resnet50, batch 64, 6 steps, pooling by an atomic index_add_"
        prog="python3 python/bench/bisect_resnet.py /tmp/unused --steps 6"
        /usr/bin/time -f "plain program: %e s wall" $prog --plain
        /usr/bin/time -f "plain program again: %e s wall" $prog --plain
        /usr/bin/time -f "recorded once (default levels): %e s wall" $prog
        rm -rf /tmp/unused /tmp/bisect-kept
        /usr/bin/time -f "repro bisect: %e s wall" "$REPRO_BIN" bisect --runs 3 --keep /tmp/bisect-kept --timeout 300 -- $prog
        ls /tmp/bisect-kept
    fi
    if asked table; then
        echo "== batch 64"
        bench --header --steps 8 --variants plain,steps,batched,ops,debug resnet50 densenet121 efficientnet_b0 mobilenet_v3_large convnext_tiny vit_b_16
        echo "== batch 8"
        bench --steps 8 --batch 8 --variants plain,steps,batched,ops,debug resnet50 densenet121 efficientnet_b0 mobilenet_v3_large convnext_tiny vit_b_16
        echo "== language models, batch 8 x 1024"
        bench --steps 6 --batch 8 --variants plain,steps,batched,debug gpt2 llama-1b
    fi
} 2>&1 | tee "$OUT/log-$(echo $WHAT | tr ' ' '-').txt"
