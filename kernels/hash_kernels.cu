// The GPU entry points of the hashing passes (kernels/hash.cu), one thread per work item, and a
// plain read of device memory to measure bandwidth beside hashing (`repro gpu-check`).

#define GRID_STRIDE(i, n) for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < (n); i += (u64)gridDim.x * blockDim.x)

extern "C" __global__ void hash_chunks(const u64* views, const u64* prefix, u64 n, u32* cvs) {
  GRID_STRIDE(item, prefix[n]) batch_chunk(views, prefix, n, item, cvs);
}

extern "C" __global__ void hash_parents(const u64* rows, const u64* prefix, u64 n, u32* nodes) {
  GRID_STRIDE(item, prefix[n]) batch_parent(rows, prefix, n, item, nodes);
}

extern "C" __global__ void hash_roots(const u64* roots, u64 n, const u32* nodes, u32* hashes) {
  GRID_STRIDE(k, n) batch_root(roots, k, nodes, hashes);
}

extern "C" __global__ void copy_views(const u64* views, const u64* prefix, const u64* out_at, u64 n, unsigned char* out) {
  GRID_STRIDE(item, prefix[n]) batch_copy(views, prefix, out_at, n, item, out);
}

// Reads n 16-byte words and folds them into one value: the device's read bandwidth, for
// comparison with hashing throughput (`repro gpu-check`). The store is never taken unless the
// data XORs to the sentinel, but keeps the loads from being optimized away.
extern "C" __global__ void read_words(const uint4* p, u64 n, u32* sink) {
  u32 acc = 0;
  for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
    uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;
}
