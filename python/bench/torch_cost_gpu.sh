#!/bin/bash
# The GPU proof of docs/results/pytorch-recorder-cost-h100.md (issue 46): the PyTorch tests that
# need a GPU, the flush policies' hashes compared on real models, then `torch_cost.py` over the
# benchmark set at batch 64 (and the CNNs at batch 8),
# GPT-2 at 8 x 1024 and a 1.1B Llama shape in bf16. Run from the repository root with the wheels
# installed, REPRO_CUDA_HASH_LIB set and `repro` at $REPRO_BIN; OUT is the folder for the log.
#   python/bench/torch_cost_gpu.sh OUT [all|checks|bench|quick]   (checks: tests and hashes; bench: tables)
#   python/bench/torch_cost_gpu.sh OUT others   (resnet50 compiled by torch.compile, and models
#       outside the benchmark set, at batch 64)
#   [MODELS=...] python/bench/torch_cost_gpu.sh OUT against DIR [BATCH]   (the CNNs' cost over 16 steps and 8 paired steps,
#       recorded by the Python package in DIR/python and by this tree's, model by model, in two rounds,
#       on one GPU: before and after a change)
set -u
OUT=${1:?usage: torch_cost_gpu.sh OUT [all|checks|bench|quick|others|against DIR [BATCH]]}
WHAT=${2:-all}
export PYTHONPATH="python${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
bench() { python3 python/bench/torch_cost.py "$@" 2>&1 | grep -v Warning; }
{
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    python3 -c 'import torch, torchvision, transformers; print("torch", torch.__version__, "cudnn", torch.backends.cudnn.version(), "torchvision", torchvision.__version__, "transformers", transformers.__version__)'
    if [ "$WHAT" != bench ]; then
        echo "== GPU tests"
        python3 -m unittest python/tests/test_torch.py -k gpu 2>&1 | tail -4
    fi
    if [ "$WHAT" = all ] || [ "$WHAT" = checks ]; then
        echo "== every flush policy records the same hashes (deterministic steps, python/bench/torch_flush_check.py)"
        checks=$(mktemp -d)
        python3 python/bench/torch_flush_check.py "$checks" resnet50 densenet121 efficientnet_b0 mobilenet_v3_large \
            convnext_tiny vit_b_16 gpt2 2>&1 | grep -v Warning
        [ "$WHAT" = checks ] && exit 0
    fi
    if [ "$WHAT" = others ]; then
        echo "== compiled by torch.compile, batch 64"
        bench --header --steps 8 --variants plain,batched --compile resnet50
        echo "== models outside the benchmark set, batch 64"
        bench --header --steps 8 --variants plain,batched regnet_y_1_6gf swin_t shufflenet_v2_x1_0 resnext50_32x4d
        exit 0
    fi
    if [ "$WHAT" = against ]; then
        before=${3:?against: the folder holding the other Python package (DIR/python)}
        cnns=${MODELS:-resnet50 densenet121 efficientnet_b0 mobilenet_v3_large convnext_tiny regnet_y_1_6gf shufflenet_v2_x1_0}
        # Model by model, the two trees one after the other, twice: the step of a program bound by
        # its host drifts over minutes, so only neighbouring rows compare.
        echo "| model | variant | step | x plain | PyTorch's peak | over plain | device memory in use | over plain | tensors a step | bytes a step | flushes a step |"
        echo "|---|---|---|---|---|---|---|---|---|---|---|"
        for round in 1 2; do
            for model in $cnns; do
                for tree in "$before" .; do
                    echo "| round $round: $model recorded by $tree/python |"
                    PYTHONPATH="$tree/python:${PYTHONPATH#python:}" bench --steps 16 --pairs 8 --batch "${4:-64}" --variants plain,batched "$model" | grep '^| '
                done
            done
        done
        exit 0
    fi
    if [ "$WHAT" = quick ]; then
        bench --header --steps 6 --variants plain,batched,module resnet50
        exit 0
    fi
    echo "== batch 64"
    bench --header --steps 8 --variants plain,batched,module,debug resnet50 densenet121 efficientnet_b0 mobilenet_v3_large convnext_tiny vit_b_16
    echo "== batch 8"
    bench --header --steps 8 --batch 8 --variants plain,batched,module resnet50 densenet121 efficientnet_b0 mobilenet_v3_large convnext_tiny
    echo "== language models, batch 8 x 1024"
    bench --header --steps 6 --batch 8 --variants plain,batched,module,debug gpt2 llama-1b
} 2>&1 | tee "$OUT/log.txt"
