# Sourced by the GPU scripts of docs/results/ from the repository root on a GPU machine: unpacks
# what `make cuda` built (target/gpu-pack/pack.tar.gz: the repro binary and the GPU hashing
# library, stripped), installs the wheels carried in .whl/ (blake3, xxhash) into /tmp/site, and
# sets what the scripts and repro.torch need: REPRO_BIN, REPRO_CUDA_HASH_LIB, the CUDA runtime
# libraries, and PYTHONPATH with python/ and python/bench/.
tar -xzf target/gpu-pack/pack.tar.gz -C target
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export LD_LIBRARY_PATH="/usr/local/cuda-13.0/targets/x86_64-linux/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export REPRO_BIN=$PWD/target/cuda-bin/repro REPRO_CUDA_HASH_LIB=$PWD/target/cuda-bin/librepro_cuda_hash.so
export PYTHONPATH="python:python/bench:/tmp/site" PYTHONUNBUFFERED=1
