#!/usr/bin/env bash
# Checks the independent Python reader of the trace format (python/repro/trace.py) against
# traces recorded by repro (format 1.9), one rewritten by the Python writer with the data hash
# xxh3-1k (format 2.0) and the committed fixtures (formats 1.0 to 1.5).
#
#   scripts/python-reader-check.sh          # uses target/release/repro
#   REPRO_BIN=path/to/repro scripts/python-reader-check.sh
#
# Needs a built repro binary (it does not build one) and python3 with pip. Installs pinned
# msgpack, safetensors, blake3, numpy and xxhash into a virtual environment under target/
# (reused on later runs; PYTHON_READER_VENV overrides the path), or with `pip --user` where venv
# is missing.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

PINS=(msgpack==1.1.2 safetensors==0.8.0 blake3==1.0.11 numpy==2.4.6 xxhash==4.1.0)
REPRO_BIN=${REPRO_BIN:-target/release/repro}
VENV=${PYTHON_READER_VENV:-target/python-reader-venv}
READER=(-m repro.trace)  # python/repro/trace.py, with python/ on PYTHONPATH

die() { echo "python-reader-check: $*" >&2; exit 2; }

[ -x "$REPRO_BIN" ] || die "no repro binary at $REPRO_BIN (build it with 'cargo build --release', or set REPRO_BIN)"
command -v python3 >/dev/null || die "python3 not found"

# --- Python environment -------------------------------------------------------------------
pins_ok() { # $1: python; true if the pinned versions are importable
    "$1" - "${PINS[@]}" <<'EOF' 2>/dev/null
import sys
from importlib.metadata import version
sys.exit(any(version(n) != v for n, v in (p.split("==") for p in sys.argv[1:])))
EOF
}
if [ -x "$VENV/bin/python" ] && pins_ok "$VENV/bin/python"; then
    PY=$VENV/bin/python
elif python3 -m venv "$VENV" >/dev/null 2>&1 && [ -x "$VENV/bin/python" ]; then
    PY=$VENV/bin/python
    "$PY" -m pip --version >/dev/null 2>&1 || die "pip is not available in the virtual environment $VENV (install python3-pip / python3-venv)"
    echo "installing ${PINS[*]} into $VENV"
    "$PY" -m pip install --quiet --disable-pip-version-check "${PINS[@]}" || die "pip could not install ${PINS[*]}"
else
    PY=python3
    if ! pins_ok "$PY"; then
        python3 -m pip --version >/dev/null 2>&1 || die "neither venv nor pip is available for python3: install python3-pip (and python3-venv)"
        echo "python3 -m venv failed; installing ${PINS[*]} with pip --user"
        python3 -m pip install --quiet --user --disable-pip-version-check "${PINS[@]}" || die "pip --user could not install ${PINS[*]}"
    fi
fi
pins_ok "$PY" || die "the pinned packages (${PINS[*]}) are not importable by $PY"

# --- helpers --------------------------------------------------------------------------------
WORK=$(mktemp -d "${TMPDIR:-/tmp}/python-reader-check.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
PASSED=0
FAILED=0
ok() { PASSED=$((PASSED + 1)); echo "ok   $*"; }
fail() { FAILED=$((FAILED + 1)); echo "FAIL $*"; }

# run_reader OUTVAR RCVAR ARGS...: runs the reader, keeping its combined output and exit code.
run_reader() {
    local __out=$1 __rc=$2
    shift 2
    local o r
    o=$(PYTHONPATH=python "$PY" "${READER[@]}" "$@" 2>&1)
    r=$?
    printf -v "$__out" '%s' "$o"
    printf -v "$__rc" '%s' "$r"
}

# expect_verify TRACE: the reader verifies it (exit 0); for traces repro can also verify, the
# step, tensor and value counts of both readers must agree.
expect_verify() {
    local out rc rust
    run_reader out rc verify "$1"
    if [ "$rc" != 0 ]; then
        fail "verify $1 (exit $rc): $out"
        return
    fi
    rust=$("$REPRO_BIN" inspect --verify "$1" 2>&1 >/dev/null | grep -o '[0-9]* steps, [0-9]* tensors, [0-9]* stored values' | head -1)
    if [ -n "$rust" ] && [[ "$out" != *"$rust"* ]]; then
        fail "verify $1: repro counts '$rust', the Python reader printed: $out"
        return
    fi
    ok "verify $1: ${out#OK "$1": }"
}

# expect_rejected TRACE FILE: verify exits 1 or 2 with a message naming FILE.
expect_rejected() {
    local out rc
    run_reader out rc verify "$1"
    if [ "$rc" != 1 ] && [ "$rc" != 2 ]; then
        fail "damaged $1 was not rejected (exit $rc): $out"
    elif [[ "$out" != *"$2"* ]]; then
        fail "damaged $1 rejected (exit $rc) without naming $2: $out"
    else
        ok "damaged trace rejected (exit $rc): $(grep -m1 -F "$2" <<<"$out")"
    fi
}

flip_byte() { # FILE OFFSET (negative: from the end)
    "$PY" - "$1" "$2" <<'EOF'
import sys
path, off = sys.argv[1], int(sys.argv[2])
data = bytearray(open(path, "rb").read())
data[off] ^= 0x01
open(path, "wb").write(bytes(data))
EOF
}

record() { # OUT ARGS...
    local out=$1
    shift
    if ! "$REPRO_BIN" record --out "$WORK/$out" "$@" >"$WORK/$out.log" 2>&1; then
        echo "repro record $* failed:" >&2
        cat "$WORK/$out.log" >&2
        die "could not record the test traces"
    fi
}

# --- traces ---------------------------------------------------------------------------------
START=$SECONDS
record adder-a --capture all --steps 5
record adder-b --capture all --steps 5
record adder-perturbed --capture all --steps 5 --perturb 3:loss:1
record adder-hashes --capture none --steps 5
record gpt --workload gpt --capture all --steps 3 --layers 1 --width 32 --context 16 --batch 2
mkdir "$WORK/lone" && cp "$WORK/adder-hashes/records.rpr" "$WORK/lone/baseline.rpr"
# A lone copy of a record file whose steps refer to payloads: hashes only there, no error.
cp "$WORK/adder-a/records.rpr" "$WORK/lone/with-payloads.rpr"
# Format 2.0: the first run rewritten by the Python writer with the data hash xxh3-1k (repro's
# built-in workloads record with blake3 only), which both readers verify below.
PYTHONPATH=python "$PY" - "$WORK/adder-a" "$WORK/adder-xxh3" <<'PYEOF' || die "could not write the xxh3-1k trace"
import sys
from repro.trace import Trace
from repro.writer import Environment, Record, TraceWriter
with Trace(sys.argv[1]) as t:
    h = t.header
    w = TraceWriter(sys.argv[2], h["run"], h["capture"]["full"], h["capture"]["inline_max_bytes"],
                    environment=Environment(**h["environment"]), producer=h["producer"], data_hash="xxh3-1k")
    for s in t.steps():
        w.write_step(s.step, [Record(x.name, x.kind, x.dtype, x.shape, t.values(s, x), x.phase, x.inputs, x.node,
                                     x.source) for x in s.tensors], s.no_gradient)
    w.finish()
PYEOF

for t in adder-a adder-b adder-perturbed adder-hashes adder-xxh3 gpt; do
    expect_verify "$WORK/$t"
done
expect_verify "$WORK/lone/baseline.rpr"
expect_verify "$WORK/lone/with-payloads.rpr"
# A trace's own record file opens the whole trace, payloads included.
expect_verify "$WORK/gpt/records.rpr"
while IFS= read -r dir; do
    expect_verify "$dir"
done < <(find fixtures -name records.rpr -printf '%h\n' | sort)

# Fixture formats: all of 1.0 to 1.3 must have been read.
versions=$(for f in $(find fixtures -name records.rpr); do head -c 12 "$f" | od -An -tu2 -j8 | awk '{print $1"."$2}'; done | sort -u | paste -sd' ')
if [ "$versions" = "1.0 1.1 1.2 1.3 1.4 1.5" ]; then ok "fixtures cover formats $versions"; else fail "fixtures cover formats '$versions', expected 1.0 1.1 1.2 1.3 1.4 1.5"; fi

# A data-parallel rank stream (1.3): its place in the run, and the sums across ranks.
out=$(PYTHONPATH=python "$PY" - "fixtures/gpu-h200x2-dp/gpt-2gpu/rank-1" <<'PYEOF' 2>&1
import sys
from repro.trace import Trace
t = Trace(sys.argv[1])
d = t.header["distributed"]
sums = [x for s in t.steps() for x in s.tensors if x.collective == "all_reduce_sum"]
assert d["rank"] == 1 and d["world_size"] == 2 and d["backend"] == "nccl", d
assert sums and all(len(x.inputs) == 1 and x.inputs[0] == x.name + ".local" for x in sums)
print(f"rank {d['rank']} of {d['world_size']} ({d['backend']} {d['backend_version']}), {len(sums)} sums")
PYEOF
)
if [ $? = 0 ]; then ok "data-parallel rank stream: $out"; else fail "data-parallel rank stream: $out"; fi

# Format 1.4: a captured node carries where its scope was opened. Format 1.5: a node that reads
# an earlier tensor's memory is a view of it, its values gathered from that tensor's.
out=$(PYTHONPATH=python "$PY" - "$WORK/gpt" <<'PYEOF' 2>&1
import sys
from repro.trace import Trace
from repro.writer import BLAKE3, FORMATS
t = Trace(sys.argv[1])
assert t.version == FORMATS[BLAKE3], t.version  # the current format, as repro writes it too
steps = list(t.steps())
nodes = [x for s in steps for x in s.tensors if x.node is not None]
sourced = [x for x in nodes if x.source]
assert sourced and all(x.source.startswith("src/workloads/gpt/model.rs:") for x in sourced), sourced[:3]
views = [(s, x) for s in steps for x in s.tensors if x.view is not None]
assert views, "no views"
assert all(len(t.values(s, x)) == x.nbytes for s, x in views)
print(f"format 1.4: {len(sourced)} of {len(nodes)} captured nodes name their scope's source line; "
      f"format 1.5: {len(views)} are views, read through their owners' values")
PYEOF
)
if [ $? = 0 ]; then ok "$out"; else fail "captured nodes' source (1.4) and views (1.5): $out"; fi

# --- diff -----------------------------------------------------------------------------------
run_reader out rc diff "$WORK/adder-a" "$WORK/adder-b"
if [ "$rc" = 0 ]; then ok "diff of same-seed runs: $out"; else fail "diff of same-seed runs exited $rc: $out"; fi

run_reader out rc diff "$WORK/adder-a" "$WORK/adder-perturbed"
if [ "$rc" = 1 ] && [[ "$out" == *"step 3"* ]] && [[ "$out" == *'`loss`'* ]]; then
    ok "diff against the perturbed run: $(head -1 <<<"$out") / $(tail -1 <<<"$out" | sed 's/^ *//')"
else
    fail "diff against the perturbed run (exit $rc, expected 1 naming step 3 and \`loss\`): $out"
fi

# Format 2.0: hashes of the data hashes blake3 and xxh3-1k never agree, and are not compared.
run_reader out rc diff "$WORK/adder-a" "$WORK/adder-xxh3"
if [ "$rc" = 2 ] && [[ "$out" == *"data hash blake3"*"xxh3-1k"* ]]; then ok "diff refuses traces of two data hashes (exit 2)"; else fail "diff of traces of two data hashes (exit $rc, expected 2 naming both): $out"; fi

run_reader out rc diff fixtures/gpu-h100/adder-atomic-r0 fixtures/gpu-h100/adder-atomic-r0
if [ "$rc" = 0 ]; then ok "diff of a fixture with itself: $out"; else fail "diff of a fixture with itself exited $rc: $out"; fi

# --- writer -------------------------------------------------------------------------------
# The Python writer and PyTorch recorder (python/tests): what they write, repro verifies; a run
# rewritten from Python is byte-identical; torch's tests are skipped where torch is missing. The
# writer packs through the native library's CPU build too, which its tests load from
# target/release/ (seconds: it shares the workspace's build).
cargo build --release --locked --quiet -p repro-cuda-hash || die "cargo could not build repro-cuda-hash"
out=$(REPRO_BIN="$REPRO_BIN" PYTHONPATH=python "$PY" -W ignore -m unittest discover -s python/tests 2>&1)
if [ $? = 0 ]; then ok "python writer: $(tail -1 <<<"$out") ($(grep -c '' <<<"$out") lines)"; else fail "python writer: $out"; fi

# --- damage ---------------------------------------------------------------------------------
cp -r "$WORK/adder-a" "$WORK/payload-flip"
flip_byte "$WORK/payload-flip/tensors/step-00000002.safetensors" -1
expect_rejected "$WORK/payload-flip" "step-00000002.safetensors"

cp -r "$WORK/adder-xxh3" "$WORK/xxh3-payload-flip"
flip_byte "$WORK/xxh3-payload-flip/tensors/step-00000002.safetensors" -1
expect_rejected "$WORK/xxh3-payload-flip" "step-00000002.safetensors"

cp -r "$WORK/adder-a" "$WORK/payload-header-flip"
flip_byte "$WORK/payload-header-flip/tensors/step-00000001.safetensors" 12
expect_rejected "$WORK/payload-header-flip" "step-00000001.safetensors"

cp -r "$WORK/adder-a" "$WORK/records-flip"
size=$(stat -c %s "$WORK/records-flip/records.rpr")
flip_byte "$WORK/records-flip/records.rpr" $((size / 2))
expect_rejected "$WORK/records-flip" "records.rpr"

run_reader out rc diff "$WORK/adder-a" "$WORK/records-flip"
if [ "$rc" = 2 ] && [[ "$out" == *records.rpr* ]]; then ok "diff refuses the damaged trace (exit 2)"; else fail "diff with a damaged trace (exit $rc, expected 2): $out"; fi

cp -r "$WORK/adder-a" "$WORK/truncated"
truncate -s $((size - 5)) "$WORK/truncated/records.rpr"
run_reader out rc verify "$WORK/truncated"
if [ "$rc" = 0 ] && [[ "$out" == *incomplete* ]]; then ok "a cut-short trace reads as incomplete: ${out#OK "$WORK/truncated": }"; else fail "cut-short trace (exit $rc, expected 0 and incomplete): $out"; fi

echo "python reader check: $((SECONDS - START)) s (traces recorded and checked)"
echo "$PASSED passed, $FAILED failed"
[ "$FAILED" = 0 ]
