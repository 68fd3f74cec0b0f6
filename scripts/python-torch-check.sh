#!/usr/bin/env bash
# Runs the Python tests (python/tests: the writer, the reader, repro.torch with PyTorch on the
# CPU, the GPU hashing library's flushing through its CPU stand-in, and the studies of
# python -m repro.study at CPU sizes) against a built repro.
#
#   scripts/python-torch-check.sh          # uses target/release/repro
#   REPRO_BIN=path/to/repro scripts/python-torch-check.sh
#
# Installs pinned torch (from PyPI: about 5.4 GB with its CUDA libraries, 142 s on this
# project's 2-core machine), msgpack, safetensors, blake3, numpy, xxhash and matplotlib (the studies'
# charts; 18 s more), transformers, accelerate and lightning (the Trainer callbacks' tests;
# transformers 5.25 alone installed in 32 s into an existing torch environment here)
# into a virtual environment
# kept outside the checkout, $REPRO_TORCH_VENV (default ~/.cache/repro-torch-venv), so later runs
# on the same machine reuse it.
set -euo pipefail
cd "$(dirname "$0")/.."

PINS=(torch==2.15.0 msgpack==1.1.2 safetensors==0.8.0 blake3==1.0.11 numpy==2.4.6 xxhash==4.1.0 matplotlib==3.11.2
      transformers==5.25.0 accelerate==1.15.0 lightning==2.6.6)
REPRO_BIN=${REPRO_BIN:-target/release/repro}
VENV=${REPRO_TORCH_VENV:-$HOME/.cache/repro-torch-venv}

die() { echo "python-torch-check: $*" >&2; exit 2; }

[ -x "$REPRO_BIN" ] || die "no repro binary at $REPRO_BIN (build it with 'cargo build --release', or set REPRO_BIN)"
command -v python3 >/dev/null || die "python3 not found"

pins_ok() {
    "$VENV/bin/python" - "${PINS[@]}" <<'EOF' 2>/dev/null
import sys
from importlib.metadata import version
sys.exit(any(version(n) != v for n, v in (p.split("==") for p in sys.argv[1:])))
EOF
}
if ! { [ -x "$VENV/bin/python" ] && pins_ok; }; then
    python3 -m venv "$VENV" || die "python3 -m venv $VENV failed (install python3-venv)"
    echo "installing ${PINS[*]} into $VENV"
    started=$(date +%s)
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${PINS[@]}" ||
        die "pip could not install ${PINS[*]} into $VENV"
    echo "installed in $(( $(date +%s) - started )) s"
    pins_ok || die "the pinned packages (${PINS[*]}) are not importable from $VENV"
fi

# The native library's CPU build (its records half, without the GPU's), which the writer's tests
# load from target/release/ (a few seconds: it shares the workspace's build).
cargo build --release --locked --quiet -p repro-cuda-hash || die "cargo could not build repro-cuda-hash"

REPRO_BIN=$(realpath "$REPRO_BIN") PYTHONPATH=python \
    "$VENV/bin/python" -W ignore -m unittest discover -s python/tests
