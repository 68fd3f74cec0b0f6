"""How fast a GPU could fingerprint tensors with cheaper leaves than BLAKE3's, for the decision
that issue 46 leaves open (docs/results/pytorch-recorder-cost-h100.md, "What is left for 1.10x").

repro's canonical data hash is BLAKE3, whose chunk pass the GPU's integer units bound (about
1.56 TB/s on an H200, a third of its memory bandwidth). The candidate measured here hashes each
1 KiB chunk with XXH3's accumulate loop instead (per 8 bytes: an XOR with the secret, one 32 x 32
-> 64-bit multiply-add, one 64-bit add), eight lanes of a warp per chunk as XXH3's eight
accumulators, then folds the accumulators into 128 bits as XXH3 merges them. Only its speed is
measured: it is not repro's format, nor checked against the XXH3 reference. Beside it, on the
same buffer and GPU, a plain read of every byte (the memory bound). Needs CuPy and a CUDA GPU.

    python python/bench/leaf_hash_rate.py [GIB ...]     # default: 1 and 8 GiB
"""

import sys

import cupy as cp

_SOURCE = r"""
typedef unsigned long long u64;
typedef unsigned int u32;

__constant__ u64 SECRET[24];

__device__ __forceinline__ u64 fold128(u64 a, u64 b) {
  return __umul64hi(a, b) ^ (a * b);
}

// Eight lanes per 1 KiB chunk, lane i keeping XXH3's accumulator i over the chunk's 16 stripes;
// four chunks a warp. Writes 16 bytes a chunk.
extern "C" __global__ void leaf_chunks(const u64* data, u64 chunks, u64* out) {
  const unsigned lane = threadIdx.x % 32, i = lane % 8;
  const u64 warps = (u64)gridDim.x * blockDim.x / 32;
  for (u64 c = ((u64)blockIdx.x * blockDim.x + threadIdx.x) / 32 * 4 + lane / 8; c < chunks; c += warps * 4) {
    const u64* p = data + c * 128;
    u64 acc = 0x9E3779B185EBCA87ull * (i + 1);
    #pragma unroll
    for (int s = 0; s < 16; s++) {
      const u64 v = p[8 * s + i];
      const u64 key = v ^ SECRET[(s + i) % 24];
      acc += __shfl_xor_sync(0xffffffffu, v, 1);
      acc += (u64)(u32)key * (key >> 32);
    }
    // XXH3's merge: pairs of accumulators folded, summed over the four pairs; twice, for 128 bits.
    const u64 other = __shfl_xor_sync(0xffffffffu, acc, 1);
    u64 lo = (i % 2 == 0) ? fold128(acc ^ SECRET[i], other ^ SECRET[i + 1]) : 0;
    u64 hi = (i % 2 == 0) ? fold128(acc ^ SECRET[i + 8], other ^ SECRET[i + 9]) : 0;
    for (int d = 2; d < 8; d *= 2) {
      lo += __shfl_xor_sync(0xffffffffu, lo, d);
      hi += __shfl_xor_sync(0xffffffffu, hi, d);
    }
    if (i == 0) {
      lo ^= lo >> 37; lo *= 0x165667919E3779F9ull; lo ^= lo >> 32;
      hi ^= hi >> 37; hi *= 0x165667919E3779F9ull; hi ^= hi >> 32;
      out[2 * c] = lo;
      out[2 * c + 1] = hi;
    }
  }
}

// Reads every 16-byte word once: the memory bound, for comparison.
extern "C" __global__ void read_words(const uint4* p, u64 n, u32* sink) {
  u32 acc = 0;
  for (u64 k = (u64)blockIdx.x * blockDim.x + threadIdx.x; k < n; k += (u64)gridDim.x * blockDim.x) {
    const uint4 v = p[k];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;
}
"""


def rate(kernel, args, nbytes: int, blocks: int, threads: int, repeats: int = 10) -> float:
    """Bytes a second, the median of `repeats` timed launches after one untimed."""
    kernel((blocks,), (threads,), args)
    times = []
    for _ in range(repeats):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        kernel((blocks,), (threads,), args)
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end) / 1e3)
    return nbytes / sorted(times)[len(times) // 2]


def main() -> None:
    sizes = [float(a) for a in sys.argv[1:]] or [1.0, 8.0]
    module = cp.RawModule(code=_SOURCE)
    secret = cp.asarray([0xBE4BA423396CFEB8 + 0x1CAD21F72C81017C * k & (2**64 - 1) for k in range(24)],
                        dtype=cp.uint64)
    pointer = module.get_global("SECRET")
    cp.ndarray(secret.shape, cp.uint64, pointer).set(secret.get())
    leaf, read = module.get_function("leaf_chunks"), module.get_function("read_words")
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    print(f"{cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}, {sms} SMs")
    print("| buffer | XXH3-style leaves, 16 bytes a KiB | plain read | leaves / read |")
    print("|---|---|---|---|")
    for gib in sizes:
        nbytes = int(gib * 2**30)
        data = cp.arange(nbytes // 8, dtype=cp.uint64) * cp.uint64(0x9E3779B97F4A7C15)
        chunks = nbytes // 1024
        assert chunks % 4 == 0, "whole warps of chunks: a multiple of 4 KiB"  # every lane runs each loop
        out = cp.empty(2 * chunks, dtype=cp.uint64)
        sink = cp.zeros(1, dtype=cp.uint32)
        leaves = rate(leaf, (data, cp.uint64(chunks), out), nbytes, sms * 16, 256)
        plain = rate(read, (data, cp.uint64(nbytes // 16), sink), nbytes, sms * 16, 256)
        print(f"| {gib:g} GiB | {leaves / 1e9:,.0f} GB/s | {plain / 1e9:,.0f} GB/s | {leaves / plain:.0%} |", flush=True)
        del data, out


if __name__ == "__main__":
    main()
