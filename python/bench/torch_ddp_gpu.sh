#!/bin/bash
# The GPU proof of docs/results/pytorch-ddp-h200x2.md: GPT-2 (124M) under DDP on 2 GPUs, recorded
# per rank by repro_torch; same-seed runs, NCCL_ALGO=Ring against Tree, 1 GPU against 2, and the
# recorded step against the plain one. Run from the repository root, with `repro` at $REPRO_BIN
# (default target/release/repro) and OUT the folder for the log and the traces.
set -u
OUT=${1:?usage: torch_ddp_gpu.sh OUT [STEPS]}
STEPS=${2:-10}
REPRO=${REPRO_BIN:-target/release/repro}
RUNS=$(mktemp -d)
export PYTHONPATH="python${PYTHONPATH:+:$PYTHONPATH}" CUBLAS_WORKSPACE_CONFIG=:4096:8 NCCL_NVLS_ENABLE=0
train() {  # train RANKS OUT [ARGS...]: GPT-2 under torchrun
    local ranks=$1; shift
    python3 -m torch.distributed.run --standalone --nproc_per_node "$ranks" python/bench/torch_ddp_gpt2.py "$@" \
        --steps "$STEPS" 2>&1 | grep -E "step: median|Error|error" | tail -5
}
{
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    python3 -c 'import torch, transformers; print("torch", torch.__version__, "nccl", ".".join(map(str, torch.cuda.nccl.version())), "transformers", transformers.__version__)'
    echo "== plain";                 train 2 --plain
    echo "== a (values at step 0)";  REPRO_CAPTURE=steps:0 train 2 "$RUNS/a"
    echo "== b (hashes only)";       REPRO_CAPTURE=none train 2 "$RUNS/b"
    echo "== tree (hashes only)";    NCCL_ALGO=Tree REPRO_CAPTURE=none train 2 "$RUNS/tree"
    echo "== one GPU (values at step 0)"; REPRO_CAPTURE=steps:0 train 1 "$RUNS/one"
    echo "== plain, again";          train 2 --plain
    for pair in "a b" "b tree" "one a"; do
        set -- $pair
        echo "== repro diff $1 $2"; "$REPRO" diff "$RUNS/$1" "$RUNS/$2" | head -40; echo "exit ${PIPESTATUS[0]}"
    done
    echo "== repro inspect b --verify"; "$REPRO" inspect "$RUNS/b" --verify | grep -E "replicas|verified|UNFINISHED|DRIFT"
} 2>&1 | tee "$OUT/log.txt"
tar -C "$RUNS" -czf "$OUT/traces.tar.gz" --exclude='*.safetensors' --exclude=run-meta.json --exclude=.repro-lock b tree
