#!/usr/bin/env bash
# Checks that two repro binaries write byte-identical traces and print the same reports, for a
# refactoring that must not change behaviour: scripts/same-output.sh OLD_BINARY NEW_BINARY.
# Each binary works in its own directory with the same names, so paths in outputs agree.
set -euo pipefail
old=$(realpath "$1") new=$(realpath "$2")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for side in old new; do
  bin=${!side}
  mkdir "$work/$side" && cd "$work/$side"
  "$bin" record --out adder --steps 30 2>/dev/null
  "$bin" record --out adder-matmul --steps 20 --formulation matmul --perturb 5:loss.sum:1 2>/dev/null
  "$bin" record --workload gpt --steps 3 --out gpt --perturb 1:wpe.weight:2 2>/dev/null
  "$bin" record --workload mlp --steps 5 --out mlp --devices cpu,cpu 2>/dev/null
  "$bin" record --workload qwen2 --steps 2 --out qwen2 2>/dev/null
  "$bin" baseline write --steps 7 --batch 200 --seed 3 --out base.rpr 2>/dev/null
  { "$bin" gate --baseline base.rpr 2>&1 || true; } | grep -v repro-gate- > gate.out
  { "$bin" gate --baseline base.rpr --steps 8 2>&1 || true; } > gate-mismatch.out
  { "$bin" gate --baseline base.rpr --perturb 2:loss.sum:1 2>&1 || true; } | grep -v repro-gate- > gate-perturbed.out
  { "$bin" diff adder adder-matmul 2>&1 || true; } > diff.out
  { "$bin" diff adder gpt --json 2>&1 || true; } > diff.json
  { "$bin" matrix adder adder-matmul adder 2>&1 || true; } > matrix.out
  { "$bin" inspect gpt 2>&1 || true; } > inspect.out
  { "$bin" invariance --workload gpt --batch-sizes 1,2 --json 2>&1 || true; } | grep -v seconds > invariance.json
done
cd "$work"
status=0
# run-meta.json and .repro-lock say when, where and by which process a trace was written.
for file in $(cd old && find . -type f ! -name run-meta.json ! -name .repro-lock | sort); do
  if cmp -s "old/$file" "new/$file"; then echo "same    $file"; else echo "DIFFERS $file"; status=1; fi
done
exit $status
