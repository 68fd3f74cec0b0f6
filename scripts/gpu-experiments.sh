#!/usr/bin/env bash
# All of the CUDA issue's GPU work in one call on the GPU machine. Build first, here:
#
#   scripts/build-cuda.sh
#
# then run on the GPU machine (the device tool carries target/cuda/release/repro):
#
#   scripts/gpu-experiments.sh OUT_DIR [STEPS] [SECTION...]
#
# Sections (all by default): `midsize` records the mid-size rungs that once crashed (gpt 512 x 4
# layers, context 256, batch 16; ResNet-18 at batch 256), checks device hashes against host
# hashes and diffs two same-seed runs; `hash` checks GPU hashing against the CPU and benchmarks it;
# `matrices` records seven same-seed adder runs for each reduction mode and formulation and
# prints their error matrices at step 0 and the last step; `devices` diffs a CPU run against a
# GPU run; `fixtures` keeps small traces for fixtures/; `rootcause` diffs two atomic runs op by
# op and records one against another online; `overhead` times per-op recording against plain
# steps; `opfixtures` keeps small op-level traces for fixtures/. The studies: `cost`,
# `devices-study`, `noise-mlp`, `noise-cnn`, `noise-resnet18` (RESNET_RUNS, RESNET_EPOCHS), and
# `studyfixtures` (atomic cnn traces for fixtures/), `gpt-studies` (noise, devices and cost on
# the gpt; GPT_RUNS, GPT_STEPS), `gptfixtures`, `ab` (overhead and traces of this binary against REPRO_BASE's), `hashab` (GPU hashing's throughput, pipe use and gpt-rung cost against REPRO_BASE's), `views` (a small gpt trace whose parameter views are checked on the CPU), `invariance` (gpt default and --batch-invariant with its cost, qwen2 f32 and bf16), `order` (study order, mlp and cnn; ORDER_RUNS), `noise-hw` (cnn noise study with TF32 off and on; NOISE_RUNS), `noise-subgroups` (mlp on the subgroups dataset; SUBGROUP_RUNS), `tensorcore` (the bf16
# invariant product's checks and TFLOPS, the gpt's bf16 invariant-mode cost at widths 768 to 2048,
# and its prefill against decode; COST_PASSES, COST_BATCHES), `invariance-large` (Qwen2-0.5B and the GPT-2-medium-shaped gpt
# at batches up to 256), not run by default. `gpt`: the
# transformer recorded by automatic capture (same-seed GPU runs, CPU vs GPU, Qwen2, fixtures). Results land in OUT_DIR:
# summary.md (everything printed), results.tar.gz (all outputs), fixtures.tar.gz.
set -uo pipefail
out="${1:?usage: gpu-experiments.sh OUT_DIR [STEPS] [SECTION...]}"
steps="${2:-1000}"
shift $(( $# < 2 ? $# : 2 ))
sections="${*:-midsize hash matrices devices fixtures opfixtures rootcause overhead}"
want() { [[ " $sections " == *" $1 "* ]]; }
repro="${REPRO_BIN:-target/cuda/release/repro}"
work="$(mktemp -d)"
mkdir -p "$out" "$work/results" "$work/fixtures"
export LD_LIBRARY_PATH="/usr/local/cuda-13.0/targets/x86_64-linux/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
summary="$work/results/summary.md"
say() { echo "$@" | tee -a "$summary"; }
section() { say; say "## $1"; say; }
# A diff's verdict and the lines that explain a divergence (the per-tensor table is left out).
verdict() { "$repro" diff "$@" 2>&1 | sed "s#$work/runs/##g" | grep -E -A4 '^(IDENTICAL|DIVERGED|INCOMPLETE|error)' | head -8; }
runs=7

section "Machine"
say '```'
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>&1 | tee -a "$summary"
nvcc --version 2>/dev/null | tail -1 | tee -a "$summary"
say "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
say "repro: $($repro --version)"
say '```'

if want midsize; then
section "Mid-size rungs: record, device hashes against host hashes, two same-seed runs"
for spec in "gpt --width 512 --heads 8 --layers 4 --context 256 --batch 16" "resnet18 --batch 256"; do
  name="${spec%% *}"
  say "### $spec"
  say '```'
  ok=1
  for run in a b; do
    # shellcheck disable=SC2086
    "$repro" record --workload $spec --seed 0 --steps 3 --capture none --device cuda:0 \
      --out "$work/runs/mid-$name-$run" --force 2>&1 | tail -1 | sed "s#$work/runs/##g" | tee -a "$summary" || ok=0
  done
  # shellcheck disable=SC2086
  "$repro" record --workload $spec --seed 0 --steps 3 --capture steps:2 --device cuda:0 \
    --out "$work/runs/mid-$name-full" --force 2>&1 | tail -1 | sed "s#$work/runs/##g" | tee -a "$summary"
  say "same seed, hashes on the device:"
  verdict "$work/runs/mid-$name-a" "$work/runs/mid-$name-b" | tee -a "$summary"
  say "hashes on the device against hashes of the values read back (step 2):"
  verdict "$work/runs/mid-$name-a" "$work/runs/mid-$name-full" | tee -a "$summary"
  say '```'
  rm -rf "$work/runs/mid-$name-"*
done
fi

if want hash; then
section "GPU hashing: correctness and throughput"
"$repro" gpu-check --device cuda:0 2>&1 | tee -a "$summary"
# The recorder's own path: hashes computed on the device (hash-only capture) must equal the
# hashes of the same tensors copied to the host (full capture).
for capture in none all; do
  "$repro" record --workload adder --seed 0 --steps 50 --reductions ordered --capture "$capture" --device cuda:0 \
    --out "$work/runs/capture-$capture" 2>>"$work/results/record.log"
done
say '```'
verdict "$work/runs/capture-none" "$work/runs/capture-all" | tee -a "$summary"
say '```'
# The same for a captured graph, whose views (transposed, broadcast, narrowed) the device
# hashes through their strides.
for capture in none all; do
  "$repro" record --workload gpt --seed 0 --steps 5 --capture "$capture" --device cuda:0 \
    --out "$work/runs/gpt-capture-$capture" 2>>"$work/results/record.log"
done
say '```'
verdict "$work/runs/gpt-capture-none" "$work/runs/gpt-capture-all" | tee -a "$summary"
say '```'
fi

# Seven runs per variant; matrices at step 0 and at the last step.
want matrices && for variant in reduce:atomic reduce:ordered reduce:candle matmul:candle; do
  formulation="${variant%%:*}" reductions="${variant##*:}"
  name="$formulation-$reductions"
  dirs=()
  started=$SECONDS
  for i in $(seq 0 $((runs - 1))); do
    dir="$work/runs/$name-r$i"
    "$repro" record --workload adder --seed 0 --steps "$steps" --formulation "$formulation" \
      --reductions "$reductions" --device cuda:0 --out "$dir" 2>>"$work/results/record.log" || say "record failed: $dir"
    dirs+=("$dir")
  done
  elapsed=$((SECONDS - started))
  section "Adder on the GPU, formulation $formulation, reductions $reductions ($runs runs x $steps steps, ${elapsed}s)"
  for step in 0 last; do
    say "### step $step"
    say '```'
    "$repro" matrix "${dirs[@]}" --step "$step" --tensor predictions --tensor loss --tensor weight.grad \
      --tensor bias.grad 2>&1 | sed "s#$work/runs/##g" | tee -a "$summary" "$work/results/matrix-$name-step-$step.txt"
    say '```'
  done
  say "first divergence between r0 and each other run:"
  say '```'
  for i in $(seq 1 $((runs - 1))); do
    "$repro" diff "${dirs[0]}" "${dirs[$i]}" --json > "$work/results/diff-$name-r0-r$i.json"
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); f=d["first_divergence"]; print(sys.argv[2], "identical" if f is None else "step %d %s (%s ULP)" % (f["step"], f["tensor"], f["metrics"]["max_ulp"] if f["metrics"] else "hash only"))' \
      "$work/results/diff-$name-r0-r$i.json" "r0 vs r$i:" | tee -a "$summary"
  done
  say '```'
done

if want devices; then
section "CPU vs GPU (reduce formulation, ordered reductions, seed 0, $steps steps)"
"$repro" record --workload adder --seed 0 --steps "$steps" --reductions ordered --capture all --device cpu --out "$work/runs/cpu" 2>>"$work/results/record.log"
"$repro" record --workload adder --seed 0 --steps "$steps" --reductions ordered --capture all --device cuda:0 --out "$work/runs/gpu" 2>>"$work/results/record.log"
say '```'
"$repro" diff "$work/runs/cpu" "$work/runs/gpu" 2>&1 | sed "s#$work/runs/##g" | head -60 | tee -a "$summary"
say '```'
"$repro" diff "$work/runs/cpu" "$work/runs/gpu" --json > "$work/results/diff-cpu-gpu.json"
fi

# Small traces for CPU tests: 7 atomic and 7 ordered runs of 50 steps, steps 0 and 49 in full.
want fixtures && for reductions in atomic ordered; do
  for i in $(seq 0 $((runs - 1))); do
    "$repro" record --workload adder --seed 0 --steps 50 --reductions "$reductions" --device cuda:0 \
      --out "$work/fixtures/adder-$reductions-r$i" 2>>"$work/results/record.log"
  done
  "$repro" matrix "$work"/fixtures/adder-$reductions-r* --step 0 --tensor predictions --tensor loss \
    --tensor weight.grad --tensor bias.grad 2>&1 | sed "s#$work/fixtures/##g" > "$work/fixtures/matrix-$reductions-step-0.txt"
  "$repro" matrix "$work"/fixtures/adder-$reductions-r* --step last --tensor predictions --tensor loss \
    --tensor weight.grad --tensor bias.grad 2>&1 | sed "s#$work/fixtures/##g" > "$work/fixtures/matrix-$reductions-step-last.txt"
done
want fixtures && "$repro" record --workload adder --seed 0 --steps 50 --reductions ordered --device cpu \
  --out "$work/fixtures/adder-cpu-ordered" 2>>"$work/results/record.log"

# Op-level traces (format 1.1) of two atomic runs and an ordered CPU/GPU pair, for CPU tests of
# root-cause analysis on real GPU divergences.
if want opfixtures; then
  mkdir -p "$work/fixtures/ops"
  for i in 0 1; do
    "$repro" record --workload adder --seed 0 --steps 20 --reductions atomic --capture none --device cuda:0 \
      --out "$work/fixtures/ops/atomic-r$i" 2>>"$work/results/record.log"
  done
  for device in cpu cuda:0; do
    "$repro" record --workload adder --seed 0 --steps 20 --reductions ordered --capture none --device "$device" \
      --out "$work/fixtures/ops/ordered-${device%%:*}" 2>>"$work/results/record.log"
  done
  rm -f "$work"/fixtures/ops/*/run-meta.json
  section "Op-level fixtures"
  say '```'
  "$repro" diff "$work/fixtures/ops/atomic-r0" "$work/fixtures/ops/atomic-r1" 2>&1 | sed "s#$work/fixtures/ops/##g" | head -16 | tee -a "$summary"
  say '```'
fi

if want rootcause; then
section "Root cause of a real atomic-reduction divergence (two runs, $steps steps, hashes only)"
for i in 0 1; do
  "$repro" record --workload adder --seed 0 --steps "$steps" --reductions atomic --capture none --device cuda:0 \
    --out "$work/runs/rc-$i" 2>>"$work/results/record.log"
done
say '```'
"$repro" diff "$work/runs/rc-0" "$work/runs/rc-1" 2>&1 | sed "s#$work/runs/##g" | head -40 | tee -a "$summary"
say '```'
section "Online: an atomic run recorded against another (stops at the first divergence)"
say '```'
"$repro" record --workload adder --seed 0 --steps "$steps" --reductions atomic --device cuda:0 \
  --against "$work/runs/rc-0" --out "$work/runs/online" 2>&1 | sed "s#$work/runs/##g" | tee -a "$summary"
"$repro" inspect "$work/runs/online" | grep -E '^(steps|full steps)' | tee -a "$summary"
say '```'
fi

if want overhead; then
section "Recording overhead per training step (hashes only, every recorded tensor or graph node; GPU tensors hashed on the GPU)"
{
  "$repro" overhead --header --device cuda:0 --steps 400 --batch 10000
  "$repro" overhead --device cuda:0 --steps 200 --batch 1000000
  "$repro" overhead --device cuda:0 --workload mlp --steps 400
  "$repro" overhead --device cuda:0 --workload cnn --steps 200
  "$repro" overhead --device cuda:0 --workload resnet18 --steps 40 --block 2
  # Twice for the gpt: its host-bound steps vary with the machine's moment.
  for run in 1 2; do "$repro" overhead --device cuda:0 --workload gpt --steps 400; done
  "$repro" overhead --device cuda:0 --workload gpt --steps 200 --layers 4 --width 256 --context 128 --batch 32
  "$repro" overhead --device cpu --workload gpt --steps 16 --block 2
  # Where a recorded step's extra time goes, and the GPU time of the hashing kernels.
  REPRO_PROFILE=1 "$repro" record --workload gpt --steps 200 --capture none --device cuda:0 --out "$work/runs/profile"
  if command -v ncu >/dev/null; then
    ncu --clock-control none -k regex:'hash_|copy_views' --metrics gpu__time_duration.sum --csv \
      "$repro" record --workload gpt --steps 4 --capture none --device cuda:0 --out "$work/runs/ncu" 2>/dev/null |
      python3 -c '
import csv, collections, sys
ns, n = collections.defaultdict(float), collections.Counter()
for row in csv.reader(sys.stdin):
    name = next((c.split("(")[0] for c in row if c.startswith(("hash_", "copy_views"))), None)
    if name and row[-2] != "Metric Unit":
        ns[name] += float(row[-1].replace(",", "")); n[name] += 1
for k in sorted(ns): print(f"{k}: {n[k] / 4:.0f} launches, {ns[k] / 4e6:.3f} ms per step")'
  fi
} 2>&1 | grep -v '^note\|^recorded' | tee -a "$summary"
fi

# Two builds side by side (REPRO_BASE: the other binary): overhead rounds alternating the two,
# and whether they record the same traces.
if want ab; then
  base="${REPRO_BASE:?set REPRO_BASE to the binary to compare with}"
  section "A/B: $($base --version) (base) against $($repro --version) (new)"
  say '```'
  for round in 1 2 3; do
    for bin in base new; do
      b="$repro"; [ "$bin" = base ] && b="$base"
      echo -n "$bin round $round: "
      "$b" overhead --device cuda:0 --workload gpt --steps 400 2>/dev/null | tail -1
    done
  done 2>&1 | tee -a "$summary"
  for bin in base new; do
    b="$repro"; [ "$bin" = base ] && b="$base"
    echo -n "$bin larger gpt: "; "$b" overhead --device cuda:0 --workload gpt --steps 200 --layers 4 --width 256 --context 128 --batch 32 2>/dev/null | tail -1
    echo -n "$bin resnet18: "; "$b" overhead --device cuda:0 --workload resnet18 --steps 40 --block 2 2>/dev/null | tail -1
  done 2>&1 | tee -a "$summary"
  for bin in base new; do
    b="$repro"; [ "$bin" = base ] && b="$base"
    "$b" record --workload gpt --steps 200 --capture none --device cuda:0 --out "$work/runs/ab-$bin" 2>>"$work/results/record.log"
  done
  "$repro" record --workload gpt --steps 200 --capture none --device cuda:0 --out "$work/runs/ab-new2" 2>>"$work/results/record.log"
  "$repro" diff "$work/runs/ab-base" "$work/runs/ab-new" 2>&1 | sed "s#$work/runs/##g" | tail -2 | tee -a "$summary"
  "$repro" diff "$work/runs/ab-new" "$work/runs/ab-new2" 2>&1 | sed "s#$work/runs/##g" | tail -2 | tee -a "$summary"
  # A planted one-ULP fault on the GPU is found where it was planted.
  "$repro" record --workload gpt --steps 3 --capture none --device cuda:0 --perturb 1:h.1.mlp.c_fc.weight:1 \
    --out "$work/runs/ab-planted" 2>>"$work/results/record.log"
  "$repro" diff "$work/runs/ab-new" "$work/runs/ab-planted" 2>&1 | sed "s#$work/runs/##g" | head -8 | tee -a "$summary"
  say '```'
fi

# GPU hashing of this binary against REPRO_BASE's: gpu-check's throughput table, the integer
# pipes' use of the chunk kernel (Nsight Compute, where installed), and the recorded step's
# cost at the gpt rungs whose extra time is hashing.
if want hashab; then
  base="${REPRO_BASE:?set REPRO_BASE to the binary to compare with}"
  section "Hashing A/B: $($base --version) (base) against $($repro --version) (new)"
  say '```'
  for bin in base new; do
    b="$repro"; [ "$bin" = base ] && b="$base"
    say "$bin:"
    "$b" gpu-check --only hash --device cuda:0 2>&1 | grep -E "^\| [0-9]|MISMATCH|mismatch" | tee -a "$summary"
  done
  if command -v ncu >/dev/null; then
    for bin in base new; do
      b="$repro"; [ "$bin" = base ] && b="$base"
      say "$bin, Nsight Compute (gpt 512 x 4, context 256, batch 16, one recorded step):"
      ncu --clock-control none --print-units base -k regex:'hash_' --launch-count 40 --csv \
        --metrics gpu__time_duration.sum,sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active \
        "$b" record --workload gpt --width 512 --heads 8 --layers 4 --context 256 --batch 16 --steps 2 --capture none \
        --device cuda:0 --out "$work/runs/ncu-$bin" --force 2>/dev/null > "$work/results/ncu-$bin.csv"
      python3 - "$work/results/ncu-$bin.csv" <<'PY' | tee -a "$summary"
import collections, csv, sys
rows = csv.reader(line for line in open(sys.argv[1]) if line.startswith('"'))
next(rows)  # the header
launches = collections.defaultdict(dict)
for r in rows:
    launches[(r[0], r[4])][r[12]] = float(r[14].replace(",", ""))
kernels = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])
for (_, kernel), m in launches.items():
    t = m["gpu__time_duration.sum"]
    k = kernels[kernel]
    k[0] += 1; k[1] += t
    k[2] += t * m["sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active"]
    k[3] += t * m["sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active"]
for kernel, (n, t, alu, fma) in sorted(kernels.items()):
    print(f"{kernel}: {n} launches, {t / 1000:.1f} us, ALU {alu / t:.0f}%, FMA {fma / t:.0f}% (time-weighted)")
PY
    done
  fi
  for spec in "--width 512 --heads 8 --layers 4 --context 256 --batch 16 --steps 40 --block 4" \
              "--width 768 --heads 12 --layers 12 --context 1024 --batch 8 --steps 16 --block 2"; do
    for bin in base new; do
      b="$repro"; [ "$bin" = base ] && b="$base"
      echo -n "$bin gpt $spec: "
      # shellcheck disable=SC2086
      "$b" overhead --device cuda:0 --workload gpt $spec 2>/dev/null | tail -1
    done 2>&1 | tee -a "$summary"
  done
  say '```'
fi

# The gpt workload, recorded by automatic graph capture: two same-seed GPU runs, CPU against
# GPU (first diverging graph node), and candle-transformers' Qwen2 at inference on both.
if want gpt; then
section "gpt: same-seed GPU runs, CPU vs GPU (automatic capture)"
gpt_args=(--workload gpt --steps 50 --capture first-and-last)
for run in cuda-0 cuda-1; do
  "$repro" record "${gpt_args[@]}" --device cuda:0 --out "$work/runs/gpt-$run" 2>>"$work/results/record.log"
done
"$repro" record "${gpt_args[@]}" --device cpu --out "$work/runs/gpt-cpu" 2>>"$work/results/record.log"
say '```'
"$repro" diff "$work/runs/gpt-cuda-0" "$work/runs/gpt-cuda-1" 2>&1 | sed "s#$work/runs/##g" | tail -4 | tee -a "$summary"
say '```'
say '```'
"$repro" diff "$work/runs/gpt-cpu" "$work/runs/gpt-cuda-0" 2>&1 | sed "s#$work/runs/##g" | head -40 | tee -a "$summary"
say '```'
"$repro" diff "$work/runs/gpt-cpu" "$work/runs/gpt-cuda-0" --json > "$work/results/gpt-cpu-vs-cuda.json" 2>&1
for device in cpu cuda:0; do
  "$repro" record --workload qwen2 --steps 4 --device "$device" --out "$work/runs/qwen2-${device%%:*}" \
    2>>"$work/results/record.log"
done
say '```'
"$repro" diff "$work/runs/qwen2-cpu" "$work/runs/qwen2-cuda" 2>&1 | sed "s#$work/runs/##g" | head -20 | tee -a "$summary"
say '```'
# Small GPU gpt traces for CPU tests: the same graph, named the same, on another device.
mkdir -p "$work/fixtures/gpt"
"$repro" record --workload gpt --steps 3 --batch 2 --context 16 --width 32 --heads 2 --capture none \
  --device cuda:0 --out "$work/fixtures/gpt/cuda" 2>>"$work/results/record.log"
rm -f "$work"/fixtures/gpt/*/run-meta.json
fi

# The seeds' studies (`repro study`). Each study directory stays in $work (a ResNet study keeps
# tens of MB of weights per run); its report, JSON and plot go into $out/studies.tar.gz as soon
# as it finishes, so a run cut short still returns the studies it completed.
study() {
  local name="$1"; shift
  local dir="$work/studies/$name" started=$SECONDS
  mkdir -p "$work/studies-out"
  "$repro" study "$@" --out "$dir" > "$work/results/study-$name.txt" 2>&1
  local code=$?
  section "Study $name (\`repro study $*\`, exit $code, $((SECONDS - started))s)"
  say '```'
  sed "s#$work/studies/##g" "$work/results/study-$name.txt" | tee -a "$summary"
  say '```'
  for f in "$dir"/*.md "$dir"/*.json "$dir"/*.svg; do
    [ -f "$f" ] && [ "$(basename "$f")" != study.json ] && cp "$f" "$work/studies-out/$name-$(basename "$f")"
  done
  cp "$summary" "$out/summary.md"
  tar -C "$work" -czf "$out/studies.tar.gz" studies-out
}
want cost && study cost cost --device cuda:0 --steps 20 --rounds 3
want devices-study && {
  study devices-mlp-gauss2d devices --workload mlp --devices cpu,cuda:0
  study devices-mlp-gauss5d devices --workload mlp --dataset gauss5d --epochs 1 --devices cpu,cuda:0
  study devices-cnn devices --workload cnn --devices cpu,cuda:0
}
want noise-mlp && study noise-mlp noise --workload mlp --device cuda:0 --runs 10
want noise-cnn && {
  study noise-cnn noise --workload cnn --device cuda:0 --runs 10
  study noise-cnn-bn noise --workload cnn --batch-norm --device cuda:0 --runs 10
}
# The gpt in the studies: seeds against reduction order, CPU against GPU, the cost of ordered
# sums; and two atomic runs diffed op by op (which graph node diverges first).
if want gpt-studies; then
  study noise-gpt noise --workload gpt --device cuda:0 --runs "${GPT_RUNS:-10}" --steps "${GPT_STEPS:-300}"
  study devices-gpt devices --workload gpt --steps 50 --devices cpu,cuda:0
  study cost-gpt cost --device cuda:0 --workloads gpt --steps 20 --rounds 3
  section "gpt: two same-seed atomic-reduction GPU runs (automatic capture, 20 steps)"
  for i in 0 1; do
    "$repro" record --workload gpt --reductions atomic --steps 20 --capture first-and-last --device cuda:0 \
      --out "$work/runs/gpt-atomic-$i" 2>>"$work/results/record.log"
  done
  say '```'
  "$repro" diff "$work/runs/gpt-atomic-0" "$work/runs/gpt-atomic-1" 2>&1 | sed "s#$work/runs/##g" | head -30 | tee -a "$summary"
  say '```'
  "$repro" record --workload gpt --reductions ordered --steps 20 --capture none --device cuda:0 \
    --out "$work/runs/gpt-ordered-0" 2>>"$work/results/record.log"
  "$repro" record --workload gpt --reductions ordered --steps 20 --capture none --device cuda:0 \
    --out "$work/runs/gpt-ordered-1" 2>>"$work/results/record.log"
  say '```'
  "$repro" diff "$work/runs/gpt-ordered-0" "$work/runs/gpt-ordered-1" 2>&1 | sed "s#$work/runs/##g" | sed -n 4p | tee -a "$summary"
  say '```'
fi
# Graph nodes that are views of a parameter (a transposed weight, a broadcast bias) share its
# memory, which the optimizer overwrites in place: they must be read before the update. A small
# gpt trace (values up to 512 bytes inline, so the biases and their updates are in it) keeps
# the evidence for a CPU test, next to the same run on this machine's CPU.
if want views; then
  section "gpt: graph views of parameters hold their values before the update (small fixture)"
  small=(--workload gpt --steps 3 --batch 2 --context 16 --width 32 --heads 2 --capture none --inline-max-bytes 512)
  mkdir -p "$work/fixtures/gpt-views"
  "$repro" record "${small[@]}" --device cuda:0 --out "$work/fixtures/gpt-views/cuda" 2>>"$work/results/record.log"
  "$repro" record "${small[@]}" --device cpu --out "$work/runs/gpt-views-cpu" 2>>"$work/results/record.log"
  rm -f "$work"/fixtures/gpt-views/*/run-meta.json
  say '```'
  "$repro" diff "$work/runs/gpt-views-cpu" "$work/fixtures/gpt-views/cuda" 2>&1 | sed "s#$work/##g" | head -12 | tee -a "$summary"
  say '```'
fi
# Two small atomic gpt runs, hashes only, for CPU tests of the backward-pass root cause.
if want gptfixtures; then
  section "gpt fixtures (atomic reductions, 2 steps)"
  mkdir -p "$work/fixtures/gpt-atomic"
  for i in 0 1; do
    "$repro" record --workload gpt --reductions atomic --steps 2 --batch 2 --context 16 --width 32 --heads 2 \
      --layers 1 --capture none --device cuda:0 --out "$work/fixtures/gpt-atomic/r$i" 2>>"$work/results/record.log"
  done
  rm -f "$work"/fixtures/gpt-atomic/*/run-meta.json
  say '```'
  "$repro" diff "$work/fixtures/gpt-atomic/r0" "$work/fixtures/gpt-atomic/r1" 2>&1 | sed "s#$work/fixtures/##g" | head -12 | tee -a "$summary"
  say '```'
fi
# Batch invariance of the gpt and of candle-transformers' Qwen2: one sequence alone, in batches
# of 2 to 128, padded, decoded token by token and prefilled in chunks against the KV cache; the
# first op whose part for it differs. Then the gpt's --batch-invariant mode, and its cost.
if want invariance; then
  for dtype in f32 bf16; do
    section "Batch invariance on cuda:0: candle-transformers qwen2 ($dtype, 64 tokens)"
    say '```'
    "$repro" invariance --workload qwen2 --dtype "$dtype" --device cuda:0 2>&1 | tee -a "$summary"
    say '```'
  done
  for mode in "" --batch-invariant; do
    section "Batch invariance on cuda:0: gpt ${mode:-default kernels} (default size, untrained)"
    say '```'
    "$repro" invariance --workload gpt $mode --device cuda:0 --plot "$work/results/invariance-gpt${mode:+-invariant}.svg" 2>&1 | tee -a "$summary"
    say '```'
    "$repro" invariance --workload gpt $mode --device cuda:0 --json > "$work/results/invariance-gpt${mode:+-invariant}.json" 2>&1
  done
  section "Batch invariance on cuda:0: gpt --batch-invariant, 4 layers, width 256, context 128"
  say '```'
  "$repro" invariance --workload gpt --batch-invariant --layers 4 --width 256 --context 128 --device cuda:0 \
    --batch-sizes 1,2,8,64 --paddings 1,32 --chunks 1,32 2>&1 | tail -12 | tee -a "$summary"
  say '```'
  for size in "--layers 2 --width 128" "--layers 4 --width 256"; do
    section "Cost of --batch-invariant on cuda:0: gpt $size, 64 tokens"
    say '```'
    "$repro" invariance --workload gpt $size --device cuda:0 --cost 50 --batch-sizes 1,8,64,256 2>&1 | tee -a "$summary"
    say '```'
  done
fi
# The batch-invariant bf16 product on tensor cores: its checks and TFLOPS beside cuBLAS's, then
# what the gpt's --batch-invariant mode costs in bf16 at real sizes (issue 31, section 3).
if want tensorcore; then
  section "Tensor-core batch-invariant product: checks and TFLOPS against cuBLAS"
  say '```'
  "$repro" gpu-check --device cuda:0 --only tensor-core 2>&1 | tee -a "$summary"
  say '```'
  # Every gpt width from 768 to 2048, at contexts 512 and 1024 (issue 50's set).
  for size in "--layers 12 --width 768 --heads 12 --context 1024" "--layers 12 --width 1024 --heads 16 --context 512" \
    "--layers 12 --width 1536 --heads 12 --context 512" "--layers 12 --width 2048 --heads 16 --context 512" \
    "--layers 12 --width 2048 --heads 16 --context 1024"; do
    section "Cost of --batch-invariant on cuda:0, bf16 forward: gpt $size"
    say '```'
    # shellcheck disable=SC2086
    "$repro" invariance --workload gpt $size --dtype bf16 --device cuda:0 --cost "${COST_PASSES:-10}" \
      --batch-sizes "${COST_BATCHES:-1,64,128}" 2>&1 | tee -a "$summary"
    say '```'
  done
  section "Prefill against decode in the invariant mode, bf16: gpt 4 layers, width 768, context 256"
  say '```'
  "$repro" invariance --workload gpt --layers 4 --width 768 --heads 12 --context 256 --dtype bf16 --batch-invariant \
    --device cuda:0 --batch-sizes 1,8 --paddings 0,64 --chunks 1,7,64 2>&1 | tee -a "$summary"
  say '```'
fi
# Batch invariance at real sizes, batches up to 256: logits from passes that keep no graph, ops
# compared where the whole graph fits (issue 31, section 3).
if want invariance-large; then
  section "Batch invariance on cuda:0: Qwen2-0.5B shape, bf16, 512 tokens, batches up to 256"
  say '```'
  "$repro" invariance --workload qwen2 --shape qwen2-0.5b --layers 24 --dtype bf16 --context 512 --device cuda:0 \
    --batch-sizes 1,8,64,128,256 --paddings 0 --chunks 0 2>&1 | tee -a "$summary"
  say '```'
  for mode in "" --batch-invariant; do
    section "Batch invariance on cuda:0: GPT-2-medium-shaped gpt ${mode:-default kernels}, f32, context 512, batches up to 256"
    say '```'
    # shellcheck disable=SC2086
    "$repro" invariance --workload gpt --layers 24 --width 1024 --heads 16 --context 512 $mode --device cuda:0 \
      --batch-sizes 1,8,64,256 --paddings 0 --chunks 0 2>&1 | tee -a "$summary"
    say '```'
  done
fi
# The data order alone, up to full batch (issue: the rest of the noise study).
if want order; then
  for w in mlp cnn; do
    section "Data order alone on cuda:0: $w, batch sizes up to the whole training set"
    say '```'
    "$repro" study order --workload "$w" --device cuda:0 --runs "${ORDER_RUNS:-5}" --out "$work/results/order-$w" 2>&1 | tee -a "$summary"
    say '```'
  done
fi
# Implementation noise per device kind and with TF32 tensor-core matrix products (REPRO_TF32).
if want noise-hw; then
  gpu="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
  for tf32 in 0 1; do
    section "Noise study on $gpu: cnn, REPRO_TF32=$tf32"
    say '```'
    REPRO_TF32=$tf32 "$repro" study noise --workload cnn --device cuda:0 --runs "${NOISE_RUNS:-5}" \
      --out "$work/results/noise-cnn-tf32-$tf32" 2>&1 | grep -v '^report:' | tee -a "$summary"
    say '```'
  done
fi
want noise-subgroups && study noise-subgroups noise --workload mlp --dataset subgroups --device cuda:0 --runs "${SUBGROUP_RUNS:-10}"
want noise-resnet18 && study noise-resnet18 noise --workload resnet18 --device cuda:0 --runs "${RESNET_RUNS:-10}" --epochs "${RESNET_EPOCHS:-2}"

# Two atomic cnn runs with batch norm, per-op hashes, for CPU tests of root cause on real GPU
# batch-norm and weight-gradient divergences.
if want studyfixtures; then
  mkdir -p "$work/fixtures/cnn"
  for i in 0 1; do
    "$repro" record --workload cnn --batch-norm --reductions atomic --steps 5 --capture none --device cuda:0 \
      --out "$work/fixtures/cnn/atomic-r$i" 2>>"$work/results/record.log"
  done
  rm -f "$work"/fixtures/cnn/*/run-meta.json
  section "cnn fixtures (atomic, batch norm, 5 steps)"
  say '```'
  "$repro" diff "$work/fixtures/cnn/atomic-r0" "$work/fixtures/cnn/atomic-r1" 2>&1 | sed "s#$work/fixtures/cnn/##g" | head -30 | tee -a "$summary"
  say '```'
fi

# Data-parallel training on two GPUs over NCCL (NVLink multicast off, as these machines need).
if want dp; then
  export NCCL_NVLS_ENABLE=0
  dp_steps="${DP_STEPS:-1000}"
  nvidia-smi topo -m > "$work/results/topology.txt" 2>&1
  dp() { "$repro" record --devices cuda:0,cuda:1 "$@" 2>>"$work/results/record.log"; }
  strip_paths() { sed "s#$work/runs/##g"; }
  cp "$summary" "$out/summary.md"
  section "gpt on 2 GPUs, $dp_steps steps: replicas, and two same-seed runs"
  for r in a b; do
    started=$SECONDS
    dp --workload gpt --steps "$dp_steps" --out "$work/runs/dp-gpt-$r" || say "record failed: dp-gpt-$r"
    say "dp-gpt-$r: $((SECONDS - started)) s"
  done
  say '```'
  "$repro" inspect "$work/runs/dp-gpt-a" --verify 2>&1 | grep -E '^(verified|replicas|REPLICA)' | strip_paths | tee -a "$summary"
  "$repro" diff "$work/runs/dp-gpt-a" "$work/runs/dp-gpt-b" 2>&1 | strip_paths | grep -vE '^  ' | head -20 | tee -a "$summary"
  say '```'
  for workload in gpt resnet18; do
    case $workload in
      gpt) args=(--workload gpt --steps 20) ;;
      resnet18) args=(--workload resnet18 --steps 10 --batch 128) ;;
    esac
    section "$workload: 1 GPU against 2 (full values at the first and last step)"
    "$repro" record "${args[@]}" --device cuda:0 --out "$work/runs/one-$workload" 2>>"$work/results/record.log"
    dp "${args[@]}" --out "$work/runs/two-$workload"
    say '```'
    "$repro" diff "$work/runs/one-$workload" "$work/runs/two-$workload" 2>&1 | strip_paths \
      | grep -E '^(data-parallel|replicas|REPLICA|  world_size|  collective|DIVERGED|IDENTICAL|  F32|cause)' | tee -a "$summary"
    say '```'
  done
  section "NCCL algorithms and protocols at 2 ranks (gpt, 20 steps): seven runs"
  dirs=()
  for setting in default Ring:LL Ring:LL128 Ring:Simple Tree:LL Tree:LL128 Tree:Simple; do
    dir="$work/runs/nccl-$setting"
    if [ "$setting" = default ]; then
      dp --workload gpt --steps 20 --capture first-and-last --out "$dir"
    else
      NCCL_ALGO="${setting%%:*}" NCCL_PROTO="${setting##*:}" dp --workload gpt --steps 20 --capture first-and-last --out "$dir"
    fi
    dirs+=("$dir")
  done
  say '```'
  say "Ring against Tree:"
  "$repro" diff "$work/runs/nccl-Ring:Simple" "$work/runs/nccl-Tree:Simple" 2>&1 | strip_paths \
    | grep -E '^(data-parallel|replicas|  env|IDENTICAL|DIVERGED|cause)' | tee -a "$summary"
  for step in 0 last; do
    "$repro" matrix "${dirs[@]}" --step "$step" --tensor loss --tensor lm_head.weight.grad --tensor wte.weight.updated \
      --metric max-abs 2>&1 | strip_paths | tee -a "$summary"
  done
  say '```'
  section "Scaling: steps per second on 1 and 2 GPUs, plain and recording hashes of everything"
  say '```'
  ov() { timeout 170 "$repro" overhead --repeats 3 "$@" 2>>"$work/results/record.log" | tee -a "$summary"; }
  ov --header --workload gpt --steps 200 --device cuda:0
  ov --workload gpt --steps 200 --devices cuda:0,cuda:1
  # The ceiling: one GPU at batch 128 against batch 256.
  ov --workload resnet18 --steps 20 --batch 128 --device cuda:0
  ov --workload resnet18 --steps 20 --batch 256 --device cuda:0
  ov --workload resnet18 --steps 20 --batch 256 --devices cuda:0,cuda:1
  say '```'
  # Small traces for CPU tests: the small gpt of the tests on 1 GPU and on 2.
  small=(--workload gpt --steps 3 --batch 2 --context 16 --width 32 --heads 2 --capture all)
  mkdir -p "$work/fixtures/dp"
  "$repro" record "${small[@]}" --device cuda:0 --out "$work/fixtures/dp/gpt-1gpu" 2>>"$work/results/record.log"
  dp "${small[@]}" --out "$work/fixtures/dp/gpt-2gpu"
  rm -f "$work"/fixtures/dp/*/run-meta.json "$work"/fixtures/dp/*/*/run-meta.json
fi

cp "$summary" "$out/summary.md"
tar -C "$work" -czf "$out/results.tar.gz" results
tar -C "$work" -czf "$out/fixtures.tar.gz" fixtures
du -sh "$out"/* | tee -a "$out/summary.md"
