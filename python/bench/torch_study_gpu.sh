#!/bin/bash
# The GPU runs of the PyTorch studies (issue 48): `python -m repro.study cost` over seed 004's
# figure 9 networks and the medium CNN at kernel sizes 1 to 7, and `python -m repro.study noise`
# over the CIFAR ResNet-18 and the small CNN. Run from the repository root with the wheels
# installed, REPRO_CUDA_HASH_LIB set and `repro` at $REPRO_BIN. The studies work in $STUDY_WORK
# (default /tmp/repro-study; rerunning resumes them); their JSON results, pages and the two
# recorded IMPL runs of the small CNN are copied to OUT.
#   python/bench/torch_study_gpu.sh OUT [cost|noise|all] [NETWORKS]
set -u
OUT=${1:?usage: torch_study_gpu.sh OUT [cost|noise|all] [NETWORKS]}
WHAT=${2:-all}
NETWORKS=${3:-figure9}
WORK=${STUDY_WORK:-/tmp/repro-study}
export PYTHONPATH="python${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p "$OUT" "$WORK"
{
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    python3 -c 'import torch, torchvision; print("torch", torch.__version__, "cudnn", torch.backends.cudnn.version(), "torchvision", torchvision.__version__)'
    if [ "$WHAT" = cost ] || [ "$WHAT" = all ]; then
        python3 -m repro.study cost --models "$NETWORKS" --out "$WORK/cost" 2>&1 | grep -v Warning
        mkdir -p "$OUT/cost/cost"
        cp "$WORK/cost/study.json" "$WORK/cost/cost.md" "$OUT/cost/" 2>/dev/null
        cp "$WORK"/cost/cost/*.json "$OUT/cost/cost/"
    fi
    if [ "$WHAT" = noise ] || [ "$WHAT" = all ]; then
        python3 -m repro.study noise --models resnet18_cifar,small_cnn --runs "${RUNS:-5}" --out "$WORK/noise" 2>&1 |
            grep -v Warning
        mkdir -p "$OUT/noise"
        cp "$WORK/noise/study.json" "$WORK/noise/noise.json" "$WORK/noise/noise.md" "$OUT/noise/" 2>/dev/null
        cp -r "$WORK/noise/traces/small_cnn" "$OUT/noise/small_cnn-traces" 2>/dev/null
    fi
} 2>&1 | tee -a "$OUT/log.txt"
