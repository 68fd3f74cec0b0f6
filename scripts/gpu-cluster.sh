#!/usr/bin/env bash
# Launched ranks (issue 36) and the PyTorch recorder (issue 35) on a GPU machine, in one call.
# Build first, here (`make cuda`), then on a 2-GPU machine:
#
#   scripts/gpu-cluster.sh OUT_DIR
#
# `launched`: the gpt data-parallel on two GPUs three ways: `--devices cuda:0,cuda:1` (NVLink /
# P2P), the same with NCCL forced onto its network path (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1),
# and two torchrun "nodes" of one GPU each (CUDA_VISIBLE_DEVICES) on that network path; each
# pair diffed, and `repro overhead` rows for the step times. `torch`: the Python recorder's tests
# with this machine's torch, and its overhead on GPT-2 (and ResNet-18 where torchvision is), CUDA
# tensors hashed on the GPU and on the host, beside PyTorch's DebugMode. `port`: transformers'
# Qwen2 against candle-transformers' qwen2 on one checkpoint, correct and with port bugs planted.
# `fourgpu` (on a 4-GPU machine, not run by default): Ring against Tree at 4 ranks, world size 2
# against 4, and a 1,000-step run's replicas.
# Results: OUT_DIR/summary.md.
set -uo pipefail
out="${1:?usage: gpu-cluster.sh OUT_DIR [SECTION...]}"
shift
sections="${*:-launched torch}"
want() { [[ " $sections " == *" $1 "* ]]; }
repro="$(realpath "${REPRO_BIN:-target/cuda/release/repro}")"
work="$(mktemp -d)"
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH="/usr/local/cuda-13.0/targets/x86_64-linux/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
summary="$out/summary.md"
say() { echo "$@" | tee -a "$summary"; }
section() { say; say "## $1"; say; }
say "# gpu-cluster $(date -u +%FT%TZ)"
say "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -2 | paste -sd';')"
py=python3

gpt=(--workload gpt --width 512 --layers 4 --heads 8 --context 256 --batch 16)
net=(env NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1)
torchrun_nodes() { # torchrun_nodes COMMAND...: two nodes of one GPU each, on the network path
    local port=$((29500 + RANDOM % 1000)) pids=()
    for node in 0 1; do
        CUDA_VISIBLE_DEVICES=$node "${net[@]}" "$py" -m torch.distributed.run --nnodes 2 --node_rank $node \
            --nproc_per_node 1 --master_addr 127.0.0.1 --master_port $port --no-python "$@" \
            > "$work/node$node.log" 2>&1 &
        pids+=($!)
    done
    local rc=0
    for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
    tail -n 3 "$work/node0.log" "$work/node1.log" | tee -a "$summary"
    return $rc
}
verdict() { "$repro" diff "$@" 2>&1 | grep -E -A4 '^(IDENTICAL|DIVERGED|INCOMPLETE|error)' | head -6 | tee -a "$summary"; }

if want launched; then
    section "Launched ranks: torchrun nodes against --devices (gpt 512 x 4, context 256, batch 16, 30 steps)"
    "$repro" record "${gpt[@]}" --capture none --steps 30 --devices cuda:0,cuda:1 --out "$work/devices" 2>&1 | tail -1 | tee -a "$summary"
    "${net[@]}" "$repro" record "${gpt[@]}" --capture none --steps 30 --devices cuda:0,cuda:1 --out "$work/devices-net" 2>&1 | tail -1 | tee -a "$summary"
    torchrun_nodes "$repro" record "${gpt[@]}" --capture none --steps 30 --device cuda --out "$work/launched"
    say; say "devices (P2P) vs devices (network path):"; verdict "$work/devices" "$work/devices-net"
    say "devices (network path) vs launched (network path):"; verdict "$work/devices-net" "$work/launched"
    say "devices (P2P) vs launched:"; verdict "$work/devices" "$work/launched"
    "$repro" inspect "$work/launched" 2>&1 | grep -E "replicas|backend" | tee -a "$summary"
fi
if want launched || want steptimes; then
    section "Step times (repro overhead, 40 steps, blocks of 10)"
    "$repro" overhead "${gpt[@]}" --steps 40 --device cuda:0 --header 2>&1 | grep "^|" | sed 's/$/ (one GPU)/' | tee -a "$summary"
    "$repro" overhead "${gpt[@]}" --steps 40 --devices cuda:0,cuda:1 2>&1 | grep "^|" | tee -a "$summary"
    "${net[@]}" "$repro" overhead "${gpt[@]}" --steps 40 --devices cuda:0,cuda:1 2>&1 | grep "^|" | sed 's/$/ (network path)/' | tee -a "$summary"
    torchrun_nodes "$repro" overhead "${gpt[@]}" --steps 40 --device cuda
    grep -h "^|" "$work/node0.log" "$work/node1.log" | sed 's/$/ (torchrun nodes, network path)/' | tee -a "$summary"
fi

if want fourgpu; then
    four=cuda:0,cuda:1,cuda:2,cuda:3
    section "Four GPUs: Ring against Tree (gpt 512 x 4, context 256, batch 16, 50 steps, hashes of every tensor)"
    for algo in Ring Tree; do
        for i in 1 2; do
            NCCL_ALGO=$algo "$repro" record "${gpt[@]}" --capture none --steps 50 --devices $four \
                --out "$work/$algo-$i" 2>&1 | tail -1 | tee -a "$summary"
        done
    done
    for pair in "Ring-1 Ring-2" "Tree-1 Tree-2" "Ring-1 Tree-1"; do
        set -- $pair
        say "$1 vs $2:"
        "$repro" diff "$work/$1" "$work/$2" 2>&1 | grep -E -A8 '^(IDENTICAL|DIVERGED|INCOMPLETE|error)' | head -10 | tee -a "$summary"
    done
    section "World size 2 against 4 (the same global batch)"
    "$repro" record "${gpt[@]}" --capture none --steps 50 --devices cuda:0,cuda:1 --out "$work/two" 2>&1 | tail -1 | tee -a "$summary"
    "$repro" diff "$work/two" "$work/Ring-1" 2>&1 | grep -E -A8 '^(IDENTICAL|DIVERGED|INCOMPLETE|error)' | head -10 | tee -a "$summary"
    section "1,000-step replicas (gpt default size, 4 ranks)"
    "$repro" record --workload gpt --steps 1000 --capture none --devices $four --out "$work/long" 2>&1 | tail -1 | tee -a "$summary"
    "$repro" inspect "$work/long" 2>&1 | grep -E "replicas" | tee -a "$summary"
    section "Step times at 1, 2 and 4 GPUs (repro overhead, 40 steps)"
    "$repro" overhead "${gpt[@]}" --steps 40 --device cuda:0 --header 2>&1 | grep "^|" | tee -a "$summary"
    "$repro" overhead "${gpt[@]}" --steps 40 --devices cuda:0,cuda:1 2>&1 | grep "^|" | tee -a "$summary"
    "$repro" overhead "${gpt[@]}" --steps 40 --devices $four 2>&1 | grep "^|" | tee -a "$summary"
fi

if want torch || want port || want torchbreakdown || want torchlarge; then
    # No network on the GPU machine: the wheels travel in gpubin/wheels.
    $py -m pip install --quiet --no-deps --no-index --find-links gpubin/wheels --target "$work/py" msgpack blake3 safetensors >/dev/null 2>&1 || say "(could not install msgpack, blake3, safetensors from gpubin/wheels)"
    export PYTHONPATH="python:$work/py"
    # repro's GPU hashing for the PyTorch recorder, built by `make cuda` beside the binary.
    lib="$(dirname "$repro")/librepro_cuda_hash.so"
    if [ -f "$lib" ]; then export REPRO_CUDA_HASH_LIB="$lib"; else say "(no $lib: CUDA tensors are hashed on the host)"; fi
fi

if want torchlarge; then
    section "PyTorch recorder cost at 1.1B parameters (a Llama shape, bf16 autocast; python/bench/torch_cost.py)"
    $py python/bench/torch_cost.py --header --batch 8 --variants plain,batched,debug llama-1b 2>&1 | grep "^|" | tee -a "$summary"
fi

if want torchbreakdown; then
    section "Where ResNet-50's recording time goes (python/bench/torch_profile.py)"
    REPRO_PROFILE_PYTHON=timers $py python/bench/torch_profile.py resnet50 64 batched 2>&1 | grep -A1 "^==" | tee -a "$summary"
fi

if want torch; then
    section "PyTorch recorder: tests with this machine's torch"
    say "$($py -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' 2>&1)"
    REPRO_BIN="$repro" $py -W ignore -m unittest discover -s python/tests -v 2>&1 | tail -12 | tee -a "$summary"
    if $py -c "import torchvision" 2>/dev/null && [ -n "${REPRO_CUDA_HASH_LIB:-}" ]; then
        section "PyTorch recorder cost (hashes only), against PyTorch's DebugMode (python/bench/torch_cost.py)"
        $py python/bench/torch_cost.py --header --variants plain,batched,debug resnet50 gpt2 2>&1 | grep "^|" | tee -a "$summary"
    fi
fi

if want port; then
    section "Port check: transformers' Qwen2 against candle-transformers' qwen2 (examples/hf_port.rs)"
    port="$(dirname "$repro")/examples/hf_port"
    model="$work/qwen2"
    $py python/examples/hf_port.py "$model" "$work/torch" --device cuda 2>&1 | tail -1 | tee -a "$summary"
    "$port" "$model" "$work/candle" --device cuda:0 2>&1 | tail -1 | tee -a "$summary"
    say "correct port, --tolerance abs:1e-4:"
    "$repro" diff "$work/candle" "$work/torch" --tolerance abs:1e-4 2>&1 | grep -E -A3 '^(WITHIN|IDENTICAL|DIVERGED|error)' | tee -a "$summary"
    for bug in rms_norm_eps rope_theta hidden_act; do
        say "port bug planted in the candle side's config: $bug ($(grep -o "\"$bug\": [^,]*" "$model/bugs/$bug.json" | head -1)):"
        "$port" "$model" "$work/bug-$bug" --config "$model/bugs/$bug.json" --device cuda:0 >/dev/null 2>&1
        "$repro" diff "$work/bug-$bug" "$work/torch" --tolerance abs:1e-4 2>&1 | grep -E -A3 '^(DIVERGED|WITHIN|error|root cause)' | tee -a "$summary"
    done
    # A sliding window of 16 for every layer, in both: candle-transformers' mask keeps distance
    # 16, transformers' stops at 15; so candle's 16 matches transformers' 17.
    for window in 16 17; do
        cp -r "$model" "$work/sw$window"
        $py - "$work/sw$window/config.json" $window <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c.update(use_sliding_window=True, sliding_window=int(sys.argv[2]), max_window_layers=0)
c.pop("layer_types", None)
json.dump(c, open(sys.argv[1], "w"), indent=2)
PY
        $py python/examples/hf_port.py "$work/sw$window" "$work/sw$window-torch" --device cuda >/dev/null 2>&1
    done
    "$port" "$work/sw16" "$work/sw16-candle" --device cuda:0 >/dev/null 2>&1
    say "sliding window 16 in both configs:"
    "$repro" diff "$work/sw16-candle" "$work/sw16-torch" --tolerance abs:1e-4 2>&1 | grep -E -A3 '^(DIVERGED|WITHIN|error|root cause)' | tee -a "$summary"
    say "candle's window 16 against transformers' 17:"
    "$repro" diff "$work/sw16-candle" "$work/sw17-torch" --tolerance abs:1e-4 2>&1 | grep -E -A1 '^(DIVERGED|WITHIN|error)' | tee -a "$summary"
    # Small traces for fixtures/ (the CPU tests read them): the two frameworks' runs and one bug.
    mkdir -p "$out/port-fixtures"
    for run in torch candle bug-rope_theta; do cp -r "$work/$run" "$out/port-fixtures/$run"; done
    rm -f "$out"/port-fixtures/*/run-meta.json
fi
rm -rf "$work"
