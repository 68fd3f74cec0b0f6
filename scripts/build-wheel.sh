#!/usr/bin/env bash
# Builds the wheel (`make wheel`): the Python package `repro`, the native library as its
# extension module `repro._native`, and the `repro` command, in one file under target/wheels/.
# Needs a Rust toolchain and python3; installs the pinned maturin into a virtual environment kept
# outside the checkout ($REPRO_MATURIN_VENV, default ~/.cache/repro-maturin-venv). Who installs
# the wheel needs neither: `pip install target/wheels/repro-*.whl`.
#
# The command is built first (the release binary, shared with `make build`) and laid in the
# wheel's scripts (target/wheel-data/scripts/, python/pyproject.toml's `data`), stripped; then
# maturin builds the extension module and packs everything.
set -euo pipefail
cd "$(dirname "$0")/.."

MATURIN_PIN=maturin==1.16.0
VENV=${REPRO_MATURIN_VENV:-$HOME/.cache/repro-maturin-venv}
die() { echo "build-wheel: $*" >&2; exit 2; }

command -v cargo >/dev/null || die "cargo not found: building the wheel needs a Rust toolchain (installing it does not)"
if ! { [ -x "$VENV/bin/maturin" ] && [ "$("$VENV/bin/maturin" --version)" = "maturin ${MATURIN_PIN#maturin==}" ]; }; then
    python3 -m venv "$VENV" || die "python3 -m venv $VENV failed (install python3-venv)"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$MATURIN_PIN" || die "pip could not install $MATURIN_PIN"
fi

cargo build --release --locked --quiet --bin repro || die "cargo could not build the repro command"
rm -rf target/wheel-data target/wheels
mkdir -p target/wheel-data/scripts
cp "${CARGO_TARGET_DIR:-target}/release/repro" target/wheel-data/scripts/repro
if command -v strip >/dev/null; then strip target/wheel-data/scripts/repro; fi
(cd python && "$VENV/bin/maturin" build --release --locked --quiet --out ../target/wheels) || die "maturin could not build the wheel"
ls target/wheels/*.whl
