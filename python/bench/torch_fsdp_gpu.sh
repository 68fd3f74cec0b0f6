#!/bin/bash
# FSDP2 recorded shard by shard on 2 GPUs (issue 47): what recording costs FSDP2 beside DDP, and
# FSDP2 compared with DDP and with one GPU (f32, and bf16 mixed precision) on whole parameters
# assembled from the ranks' shards, the cause between world sizes from each rank's share.
# Run from the repository root with the wheels installed, REPRO_CUDA_HASH_LIB set and `repro` at
# $REPRO_BIN.
#   python/bench/torch_fsdp_gpu.sh OUT [cost|compare|both]
set -u
OUT=${1:?usage: torch_fsdp_gpu.sh OUT [cost|compare|both]}
WHICH=${2:-both}
REPRO=${REPRO_BIN:-target/release/repro}
RUNS=$(mktemp -d)
export PYTHONPATH="python${PYTHONPATH:+:$PYTHONPATH}" CUBLAS_WORKSPACE_CONFIG=:4096:8 NCCL_NVLS_ENABLE=0
if [ "$WHICH" != compare ]; then
    # Plain and recorded (hashes only) steps of DDP f32 and FSDP2 bf16, two rounds each: log.txt.
    python/bench/torch_ddp_cost_gpu.sh "$OUT" 12 2 32 1024 both
fi
[ "$WHICH" = cost ] && exit 0
# GPT-2 (124M), 3 steps of 4 x 256 tokens, full values at step 0 (or hashes only, with `none`).
gpt2() {
    local ranks=$1 capture=$2
    shift 2
    REPRO_CAPTURE=$capture python3 -m torch.distributed.run --standalone --nproc_per_node "$ranks" \
        python/bench/torch_ddp_gpt2.py "$@" --steps 3 --batch 4 --context 256 2>&1 | grep -E "Error|error" | tail -5
}
{
    gpt2 2 steps:0 "$RUNS/fsdp-2" --fsdp
    gpt2 2 steps:0 "$RUNS/fsdp-2-again" --fsdp
    gpt2 2 steps:0 "$RUNS/ddp-2"
    gpt2 1 steps:0 "$RUNS/fsdp-1" --fsdp
    gpt2 2 none "$RUNS/fsdp-2-hashes" --fsdp
    gpt2 2 steps:0 "$RUNS/fsdp-2-bf16" --fsdp --bf16
    gpt2 1 steps:0 "$RUNS/fsdp-1-bf16" --fsdp --bf16
    for pair in "fsdp-2 fsdp-2-again" "fsdp-2 ddp-2" "fsdp-2 fsdp-1" "fsdp-2-hashes ddp-2" "fsdp-2-bf16 fsdp-1-bf16"; do
        set -- $pair
        echo "== repro diff $1 $2"
        "$REPRO" diff "$RUNS/$1" "$RUNS/$2" --rows 5 2>&1 | head -40
        echo "exit ${PIPESTATUS[0]}"
    done
    echo "== repro inspect fsdp-2 --verify"
    "$REPRO" inspect "$RUNS/fsdp-2" --verify 2>&1 | grep -E "replicas|SHARD|UNFINISHED|DRIFT|error"
    du -sh "$RUNS"/*
} 2>&1 | tee "$OUT/compare.txt"
rm -rf "$RUNS"
