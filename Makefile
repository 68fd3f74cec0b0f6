# repro: the one entry point for building, running, testing and benchmarking.
# CI runs `bash .ci/run`, which calls `make test` (the README's test command).

CARGO ?= cargo
REPRO := target/release/repro

.PHONY: build run test lint fmt bench clean-runs

## build: the release binary at target/release/repro
build:
	$(CARGO) build --release --locked

## run: the main job on the built-in default (CPU): record two adder runs and diff them
run: build
	$(REPRO) record --workload adder --seed 0 --out runs/a --force
	$(REPRO) record --workload adder --seed 0 --out runs/b --force
	$(REPRO) diff runs/a runs/b

## test: unit, integration and doc tests (release profile: the same build `make run` uses)
test:
	$(CARGO) test --release --locked

## lint: formatting and clippy, warnings as errors
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --release --locked --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

## bench: throughput and overhead table (also written to target/bench/core.md)
bench:
	$(CARGO) bench --locked --bench core

clean-runs:
	rm -rf runs
