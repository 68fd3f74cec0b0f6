#!/bin/bash
# What recording costs GPT-2 (124M) under DDP (f32) and FSDP2 (bf16) on RANKS GPUs (issue 47):
# plain and recorded (hashes only, on the GPU with repro's hashing library) steps, each twice,
# taking turns, then the two recorded DDP runs compared and checked. Run from the repository root
# with the wheels installed, REPRO_CUDA_HASH_LIB set and `repro` at $REPRO_BIN.
#   python/bench/torch_ddp_cost_gpu.sh OUT [STEPS] [RANKS] [BATCH] [CONTEXT] [ddp|fsdp|both]
set -u
OUT=${1:?usage: torch_ddp_cost_gpu.sh OUT [STEPS] [RANKS] [BATCH] [CONTEXT] [ddp|fsdp|both]}
STEPS=${2:-12}
RANKS=${3:-2}
BATCH=${4:-32}
CONTEXT=${5:-1024}
WHICH=${6:-both}
REPRO=${REPRO_BIN:-target/release/repro}
RUNS=$(mktemp -d)
export PYTHONPATH="python${PYTHONPATH:+:$PYTHONPATH}" CUBLAS_WORKSPACE_CONFIG=:4096:8 NCCL_NVLS_ENABLE=0
train() {
    python3 -m torch.distributed.run --standalone --nproc_per_node "$RANKS" python/bench/torch_ddp_gpt2.py "$@" \
        --steps "$STEPS" --batch "$BATCH" --context "$CONTEXT" 2>&1 | grep -E "step: median|Error|error" | tail -5
}
{
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    python3 -c 'import torch, transformers; print("torch", torch.__version__, "nccl", ".".join(map(str, torch.cuda.nccl.version())), "transformers", transformers.__version__)'
    kinds=$([ "$WHICH" = both ] && echo "ddp fsdp" || echo "$WHICH")
    for round in 1 2; do
        for kind in $kinds; do
            options=$([ "$kind" = fsdp ] && echo "--fsdp --bf16")
            echo "== $kind (FSDP2 in bf16, DDP in f32), round $round"
            train $options --plain
            REPRO_CAPTURE=none train $options "$RUNS/$kind-$round"
        done
    done
    for kind in $kinds; do
        echo "== repro diff $kind-1 $kind-2"; "$REPRO" diff "$RUNS/$kind-1" "$RUNS/$kind-2" | tail -3
        echo "== repro inspect $kind-1 --verify"; "$REPRO" inspect "$RUNS/$kind-1" --verify | grep -E "replicas|UNFINISHED|DRIFT"
    done
} 2>&1 | tee "$OUT/log.txt"
