# repro: the one entry point for building, running, testing and benchmarking.
# CI runs `bash .ci/run`, which calls `make test` (the README's test command).

CARGO ?= cargo
REPRO := target/release/repro

.PHONY: build run test gate lint fmt fuzz bench bench-huge bench-gpu cuda cuda-check gpu-experiments clean-runs wheel

## build: the release binary at target/release/repro
build:
	$(CARGO) build --release --locked

## run: the main job on the built-in default (CPU): record two adder runs and diff them
## (IDENTICAL), then a third with a 1-ULP fault planted in the loss at step 5, which the diff
## finds (DIVERGED: exit 1, which the job expects)
run: build
	$(REPRO) record --workload adder --seed 0 --out runs/a --force
	$(REPRO) record --workload adder --seed 0 --out runs/b --force
	$(REPRO) diff runs/a runs/b
	$(REPRO) record --workload adder --seed 0 --perturb 5:loss:1 --out runs/p --force
	$(REPRO) diff runs/a runs/p; test $$? -eq 1

## test: unit, integration and doc tests of every crate in the workspace (release profile)
test:
	$(CARGO) test --workspace --release --locked

## gate: the determinism gate on the built-in workload, in both formulations and ordered reductions
gate: build
	$(REPRO) gate --steps 50
	$(REPRO) gate --steps 50 --formulation matmul
	$(REPRO) gate --steps 50 --reductions ordered --runs 3

## lint: formatting and clippy, warnings as errors
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --release --locked --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

## bench: throughput and overhead table (also written to target/bench/core.md)
bench:
	$(CARGO) bench --locked --bench core

## wheel: one wheel for PyTorch users (the `repro` command, the Python package `repro`, the native
## library as its extension module) at target/wheels/: `pip install target/wheels/repro-*.whl`
wheel:
	scripts/build-wheel.sh

## cuda: the CUDA build (pinned nvcc from PyPI, link stubs; no GPU needed) at target/cuda/release/repro,
## with the examples, and beside it the PyTorch recorder's GPU hashing library (librepro_cuda_hash.so)
cuda:
	scripts/build-cuda.sh

## cuda-check: type-check the `cuda` feature and compile the GPU kernels to PTX and sm_90 code
## (what CI runs; the toolchain and build are cached)
cuda-check:
	REPRO_CUDA_TARGET=$${REPRO_CUDA_CACHE:-$$HOME/.cache/repro-cuda}/target scripts/build-cuda.sh check

## gpu-experiments: on a GPU machine, after `make cuda`: OUT=dir make gpu-experiments
gpu-experiments:
	scripts/gpu-experiments.sh $${OUT:?set OUT to an output folder}

## bench-gpu: on a GPU machine, after `make cuda`: the scale ladder (recording's time and memory
## from the default gpt to GPT-2-medium and 1B parameters, ResNet-18 to batch 1024, Qwen2-0.5B)
## into $OUT/ladder.md: OUT=dir make bench-gpu
bench-gpu:
	scripts/bench-gpu.sh $${OUT:?set OUT to an output folder}

## fuzz: cargo-fuzz on the trace reader, FUZZ_SECONDS per target (default 60; stable toolchain)
fuzz:
	scripts/fuzz.sh

## bench-huge: the bench plus a diff of two traces holding 5 GiB of full tensors each (10 GiB of disk)
bench-huge:
	REPRO_BENCH_HUGE=1 $(CARGO) bench --locked --bench core

clean-runs:
	rm -rf runs
