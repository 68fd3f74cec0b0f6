#!/bin/bash
# The GPU proof of docs/results/pytorch-ddp-h200x2.md (and -h200x4.md): GPT-2 (124M) under DDP on
# RANKS GPUs (default 2), recorded per rank by repro.torch; same-seed runs, NCCL_ALGO=Ring against
# Tree, half the ranks against all of them, and the recorded step against the plain one. Run from
# the repository root, with `repro` at $REPRO_BIN (default target/release/repro) and OUT the
# folder for the log and the traces.
set -u
OUT=${1:?usage: torch_ddp_gpu.sh OUT [STEPS] [RANKS]}
STEPS=${2:-10}
RANKS=${3:-2}
HALF=$((RANKS / 2))
REPRO=${REPRO_BIN:-target/release/repro}
RUNS=$(mktemp -d)
export PYTHONPATH="python${PYTHONPATH:+:$PYTHONPATH}" CUBLAS_WORKSPACE_CONFIG=:4096:8 NCCL_NVLS_ENABLE=0
train() {  # train RANKS OUT [ARGS...]: GPT-2 under torchrun
    local ranks=$1; shift
    python3 -m torch.distributed.run --standalone --nproc_per_node "$ranks" python/bench/torch_ddp_gpt2.py "$@" \
        --steps "$STEPS" 2>&1 | grep -E "step: median|Error|error|NCCL WARN|NCCL INFO.*(fail|invalid)" | tail -20
}
{
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    python3 -c 'import torch, transformers; print("torch", torch.__version__, "nccl", ".".join(map(str, torch.cuda.nccl.version())), "transformers", transformers.__version__)'
    echo "== plain, $RANKS ranks";   train "$RANKS" --plain
    echo "== a (values at step 0)";  REPRO_CAPTURE=steps:0 train "$RANKS" "$RUNS/a"
    echo "== b (hashes only)";       REPRO_CAPTURE=none train "$RANKS" "$RUNS/b"
    echo "== tree (values at step 0)"; NCCL_ALGO=allreduce:tree NCCL_DEBUG=WARN REPRO_CAPTURE=steps:0 train "$RANKS" "$RUNS/tree"
    echo "== half: $HALF rank(s) (values at step 0)"; REPRO_CAPTURE=steps:0 train "$HALF" "$RUNS/half"
    echo "== plain, again";          train "$RANKS" --plain
    for pair in "a b" "a tree" "half a"; do
        set -- $pair
        echo "== repro diff $1 $2"; "$REPRO" diff "$RUNS/$1" "$RUNS/$2" | head -40; echo "exit ${PIPESTATUS[0]}"
    done
    echo "== repro inspect b --verify"; "$REPRO" inspect "$RUNS/b" --verify | grep -E "replicas|verified|UNFINISHED|DRIFT"
} 2>&1 | tee "$OUT/log.txt"
tar -C "$RUNS" -czf "$OUT/traces.tar.gz" --exclude='*.safetensors' --exclude=run-meta.json --exclude=.repro-lock b tree
