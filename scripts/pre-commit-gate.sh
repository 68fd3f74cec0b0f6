#!/usr/bin/env bash
# The pre-commit hooks' entry point (.pre-commit-hooks.yaml): builds repro from this checkout
# of its repository with the committed Cargo.lock (`--locked`, so a gate's binary is the one
# its tests ran with, never a fresh resolution of its dependencies), once, then runs
# `repro gate` with the hook's arguments in the user's repository. The build goes to this
# checkout's own target/ whatever CARGO_TARGET_DIR says (the binary is looked for there).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
repro="$here/target/release/repro"
if [ ! -x "$repro" ] || [ "$here/Cargo.lock" -nt "$repro" ]; then
    command -v cargo >/dev/null || { echo "repro pre-commit hook: cargo not found; install Rust (rustup)" >&2; exit 2; }
    echo "repro pre-commit hook: building repro once, with its locked dependencies (about 10 minutes on 2 cores;" \
        "cargo's progress follows)" >&2
    cargo build --release --locked --manifest-path "$here/Cargo.toml" --target-dir "$here/target" --bin repro >&2
    touch "$repro"  # newer than Cargo.lock now, also where cargo had nothing to rebuild
fi
exec "$repro" gate "$@"
