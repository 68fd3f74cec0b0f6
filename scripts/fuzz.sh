#!/usr/bin/env bash
# Bounded fuzzing of the trace reader (`make fuzz`): builds the cargo-fuzz targets in fuzz/,
# seeds their corpora from a freshly recorded trace, runs each for FUZZ_SECONDS (default 60)
# and prints the executions. Any crash, panic, timeout or out-of-memory fails the run; libFuzzer
# leaves the input under fuzz/artifacts/. Works on a stable toolchain (no sanitizer).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-60}

command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
cargo build --release --locked
(cd fuzz && cargo fuzz build --sanitizer none -O)

seed=$(mktemp -d)
trap 'rm -rf "$seed"' EXIT
target/release/repro record --steps 3 --batch 4 --features 3 --capture all --inline-max-bytes 16 --out "$seed/trace" >/dev/null
mkdir -p fuzz/corpus/trace_records fuzz/corpus/trace_payload
python3 - "$seed/trace" fuzz/corpus <<'PY'
import pathlib, struct, sys
trace, corpus = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
records = (trace / "records.rpr").read_bytes()
# Raw mode (first byte even): the record file as it is.
(corpus / "trace_records" / "seed-raw").write_bytes(b"\x00" + records)
# Framed mode (first byte odd): the record payloads, split by 0xFF 0xFE, framed by the target.
payloads, at = [], 12
while at + 8 <= len(records):
    (length,) = struct.unpack_from("<I", records, at)
    payloads.append(records[at + 8 : at + 8 + length])
    at += 8 + length
(corpus / "trace_records" / "seed-framed").write_bytes(b"\x01" + b"\xff\xfe".join(payloads))
for i, payload in enumerate(sorted((trace / "tensors").iterdir())):
    (corpus / "trace_payload" / f"seed-{i}").write_bytes(payload.read_bytes())
PY

# The payload target writes its own valid payload into the corpus when asked.
(cd fuzz && REPRO_FUZZ_SEED_DIR=corpus/trace_payload cargo fuzz run --sanitizer none -O trace_payload -- -runs=0) \
    >/dev/null 2>&1

total=0
for target in trace_records trace_payload; do
    log=$(mktemp)
    echo "fuzzing $target for ${seconds}s"
    if ! (cd fuzz && cargo fuzz run --sanitizer none -O "$target" -- \
        -max_total_time="$seconds" -rss_limit_mb=1024 -timeout=10 -print_final_stats=1) >"$log" 2>&1; then
        tail -40 "$log"
        echo "error: fuzz target $target failed (log above); a crashing input is kept under fuzz/artifacts/$target/" >&2
        exit 1
    fi
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    echo "  $target: ${runs:-?} executions, no failures"
    total=$((total + ${runs:-0}))
    rm -f "$log"
done
echo "fuzz: $total executions in all, no failures"
