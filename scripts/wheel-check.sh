#!/usr/bin/env bash
# Checks the wheel as a PyTorch user meets it (issue 68): installs target/wheels/repro-*.whl
# (`make wheel`) into a fresh virtual environment, with no Rust toolchain and no nvcc on PATH and
# outside the checkout, then records the Trainer example (python/examples/trainer_gpt2.py) twice
# through the installed `repro record -- python ...` and diffs the runs with the installed `repro
# diff` (IDENTICAL), and once more with a planted fault, which the diff finds at its step (exit 1).
# Prints the install's time and size.
#
# The wheel's own dependencies come from PyPI; torch, transformers and accelerate are the user's
# own, here the test environment's ($REPRO_TORCH_VENV, default ~/.cache/repro-torch-venv, which
# scripts/python-torch-check.sh installs), seen through a .pth file, after the fresh
# environment's own packages.
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VENV=${REPRO_TORCH_VENV:-$HOME/.cache/repro-torch-venv}
die() { echo "wheel-check: $*" >&2; exit 2; }

shopt -s nullglob
wheels=(target/wheels/repro-*.whl)
[ ${#wheels[@]} -eq 1 ] || die "expected one wheel in target/wheels/ (build it with 'make wheel'), found ${#wheels[@]}"
wheel=$(realpath "${wheels[0]}")
example=$(realpath python/examples/trainer_gpt2.py)
[ -x "$TORCH_VENV/bin/python" ] || die "no torch environment at $TORCH_VENV (scripts/python-torch-check.sh installs it)"
torch_site=$("$TORCH_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m venv "$work/venv" || die "python3 -m venv failed (install python3-venv)"
started=$(date +%s.%N)
"$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check "$wheel" || die "pip could not install $wheel"
seconds=$(python3 -c "import time; print(f'{time.time() - $started:.1f}')")
site=$("$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$torch_site" > "$site/zz-users-torch.pth"
echo "installed $(basename "$wheel") ($(du -k "$wheel" | cut -f1) KiB) and its dependencies in $seconds s:" \
    "$(du -sk "$work/venv" | cut -f1) KiB in the environment"

# The user's shell: the environment's bin first, the system's after it, nothing of the checkout.
cd "$work"
export PATH="$work/venv/bin:/usr/local/bin:/usr/bin:/bin"
unset PYTHONPATH REPRO_BIN REPRO_CUDA_HASH_LIB
for tool in cargo rustc nvcc; do
    if command -v "$tool" >/dev/null; then die "$tool is on PATH ($(command -v $tool)): the check needs a machine without it"; fi
done
[ "$(command -v repro)" = "$work/venv/bin/repro" ] || die "the installed repro command is not on PATH: $(command -v repro || echo none)"
python -c '
import repro.torch, repro._native, repro_torch
assert repro_torch is repro.torch, "the old name is not the same module"
assert repro.torch.cuda_hash_library_path() == repro._native.__file__, "the recorder does not use the installed native library"
print("imports: repro.torch, repro_torch (the same), repro._native at", repro._native.__file__.split("site-packages/")[1])'

repro record --out runs/a -- python "$example" runs/a out-a >/dev/null
repro record --out runs/b -- python "$example" runs/b out-b >/dev/null
repro diff runs/a runs/b || die "two same-seed runs of the installed wheel differ"
REPRO_PERTURB=1:transformer.h.1.mlp:100000 repro record --out runs/p -- python "$example" runs/p out-p >/dev/null
status=0
repro diff runs/a runs/p > diff.txt || status=$?
head -3 diff.txt
[ $status -eq 1 ] || die "the planted fault was not found (repro diff exited $status)"
grep -q "first at step 1" diff.txt || die "the planted fault was not placed at step 1"
echo "wheel-check: 3 passed, 0 failed"
