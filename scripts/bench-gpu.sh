#!/usr/bin/env bash
# The scale ladder: recording's cost at the sizes people train, on one GPU. Build here first
# (`make cuda`), then on the GPU machine:
#
#   scripts/bench-gpu.sh OUT_DIR [RUNG...]        # or: OUT=dir make bench-gpu
#
# Rungs (all by default): gpt-default gpt-mid gpt-small gpt-medium gpt-1b resnet18-256
# resnet18-512 resnet18-1024 qwen2-0.5b. Each rung runs `repro overhead` (plain and hash-only
# recorded blocks of one run: step times, ratio, peak device memory of each mode, peak host
# memory, trace bytes per step), starting from the batch given and halving it until plain
# candle fits (the batch used is in the row); then, where the disk holds a step's values, it
# records two steps with full values at the second (`--capture steps:1`) and reports the write
# throughput. Results: OUT_DIR/ladder.md.
set -uo pipefail
out="${1:?usage: bench-gpu.sh OUT_DIR [RUNG...]}"
shift
rungs="${*:-gpt-default gpt-mid gpt-small gpt-medium gpt-1b resnet18-256 resnet18-512 resnet18-1024 qwen2-0.5b}"
repro="${REPRO_BIN:-target/cuda/release/repro}"
device="${DEVICE:-cuda:0}"
work="$(mktemp -d)"
mkdir -p "$out"
export LD_LIBRARY_PATH="/usr/local/cuda-13.0/targets/x86_64-linux/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
table="$out/ladder.md"
log="$out/ladder.log"
say() { echo "$@" | tee -a "$table"; }

# name: workload options | first batch to try | steps | block | whether to time a full-value
# step (off where a step's values outgrow a 64 GB disk: the GPT-2-medium shape's graph nodes;
# the GPT-2-small shape's step stores 40 GiB, the 1B gpt's 32 GiB).
rung() {
  case "$1" in
    gpt-default) echo "--workload gpt|8|200|10|full" ;;
    gpt-mid) echo "--workload gpt --width 512 --heads 8 --layers 4 --context 256|16|80|4|full" ;;
    gpt-small) echo "--workload gpt --width 768 --heads 12 --layers 12 --context 1024|8|24|2|full" ;;
    gpt-medium) echo "--workload gpt --width 1024 --heads 16 --layers 24 --context 1024|4|24|2|" ;;
    gpt-1b) echo "--workload gpt --width 2048 --heads 16 --layers 20 --context 512|4|16|2|full" ;;
    resnet18-256) echo "--workload resnet18|256|24|2|full" ;;
    resnet18-512) echo "--workload resnet18|512|24|2|full" ;;
    resnet18-1024) echo "--workload resnet18|1024|16|2|" ;;
    qwen2-0.5b) echo "--workload qwen2 --shape qwen2-0.5b --dtype bf16 --layers 24 --context 1024|16|24|2|full" ;;
    *) return 1 ;;
  esac
}

{
  echo "# Scale ladder"
  echo
  echo '```'
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  echo "repro: $("$repro" --version)"
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  # The disk's own write speed, the ceiling of a full-value step's (4 GiB, page cache bypassed).
  dd if=/dev/zero of="$work/dd" bs=16M count=256 oflag=direct 2>&1 | tail -1 | sed 's/^/disk: /'
  rm -f "$work/dd"
  echo '```'
  echo
} | tee -a "$table"
header=--header
for name in $rungs; do
  spec="$(rung "$name")" || { echo "unknown rung $name" >&2; continue; }
  IFS='|' read -r options batch steps block full <<<"$spec"
  row=""
  while [ "$batch" -ge 1 ]; do
    # shellcheck disable=SC2086
    if row="$("$repro" overhead $header --device "$device" $options --batch "$batch" --steps "$steps" --block "$block" 2>>"$log")"; then
      break
    fi
    echo "$name: batch $batch failed (see the log); halving" | tee -a "$log" >&2
    row=""
    batch=$((batch / 2))
  done
  [ -n "$row" ] || { say "| $name | failed at every batch |"; continue; }
  say "$row"
  header=""
  [ -n "$full" ] || continue
  # Full values at one step: two steps, the second stored whole; the time of the record beyond
  # a hash-only one of the same two steps is the cost of bringing the values home and writing them.
  # shellcheck disable=SC2086
  start=$(date +%s.%N)
  "$repro" record $options --batch "$batch" --steps 2 --capture none --device "$device" --out "$work/$name-none" --force >/dev/null 2>>"$log"
  mid=$(date +%s.%N)
  # shellcheck disable=SC2086
  if "$repro" record $options --batch "$batch" --steps 2 --capture steps:1 --device "$device" --out "$work/$name-full" --force >/dev/null 2>>"$log"; then
    end=$(date +%s.%N)
    bytes=$(du -sb "$work/$name-full/tensors" 2>/dev/null | cut -f1)
    python3 - "$name" "$batch" "$bytes" "$start" "$mid" "$end" <<'EOF' | tee -a "$out/full-step.md"
import sys
name, batch, size, start, mid, end = sys.argv[1], sys.argv[2], int(sys.argv[3] or 0), *map(float, sys.argv[4:])
extra = (end - mid) - (mid - start)
rate = size / extra / 1e9 if extra > 0 else float("nan")
print(f"| {name} | {batch} | {size / 2**30:.2f} GiB | {end - mid:.1f} s | {mid - start:.1f} s | {rate:.2f} GB/s |")
EOF
  else
    echo "| $name | $batch | full-value step failed (see ladder.log) |" | tee -a "$out/full-step.md"
  fi
  rm -rf "$work/$name-none" "$work/$name-full"
done
if [ -f "$out/full-step.md" ]; then
  say
  say "Full values at one step (two-step runs, the second stored whole; throughput = stored bytes over the extra time):"
  say
  say "| rung | batch | stored | record, full at step 1 | record, hashes only | write throughput |"
  say "|---|---|---|---|---|---|"
  cat "$out/full-step.md" >>"$table"
  cat "$out/full-step.md"
fi
rm -rf "$work"
