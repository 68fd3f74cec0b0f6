// The GPU entry points of the hashing passes (kernels/hash.cu), one thread per work item, and a
// plain read of device memory to measure bandwidth beside hashing (`repro gpu-check`).

#define GRID_STRIDE(i, n) for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < (n); i += (u64)gridDim.x * blockDim.x)

// Threads per block of hash_chunks (src/record/device/batch.rs launches it so).
#define CHUNK_THREADS 128
// Blocks of hash_chunks each SM keeps resident: ptxas then fits a thread in 48 registers (64
// unbounded), a few bytes spilled, and the extra warps hide more of the loads' latency: 1 GiB
// hashed at 1511 to 1568 GB/s against 1496 to 1513 on H100s, in the same calls (9 blocks: 1533
// to 1546; 12: 1447 to 1454, spilling more).
#define CHUNK_MIN_BLOCKS 10
// Bytes of each whole chunk staged at once: one memory line, two BLAKE3 blocks.
#define STAGE_BYTES 128
// Lanes that load one chunk's staged bytes, 16 each.
#define STAGE_LANES (STAGE_BYTES / 16)
// A staged chunk takes a row of 9 16-byte words: the pad word puts the rows of neighbouring
// lanes on different shared-memory banks.
#define STAGE_ROW 9

// One work item per chunk. Whole contiguous chunks (see whole_chunk) are read by their warp
// together: eight lanes load one chunk's next 128 bytes, a memory line, into shared memory, and
// each lane then hashes its own chunk from there. One thread reading its own chunk alone would
// touch 32 lines per load instruction, each thread 1 KiB from the next, and use half of each
// sector it fetched; staged, every sector fetched is used whole. Other chunks (a view's last,
// strided views) take the one-thread path, batch_chunk. Every lane of a warp runs the same
// iterations (the warp's first item decides), so the whole warp takes part in each staged load.
extern "C" __global__ void __launch_bounds__(CHUNK_THREADS, CHUNK_MIN_BLOCKS) hash_chunks(const u64* views, const u64* prefix, u64 n, u32* cvs) {
  __shared__ uint4 stage[CHUNK_THREADS / 32][32][STAGE_ROW];
  const u64 total = prefix[n];
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const u64 stride = (u64)gridDim.x * blockDim.x;
  for (u64 first = blockIdx.x * (u64)blockDim.x + warp * 32; first < total; first += stride) {
    const u64 item = first + lane;
    u64 index = 0;
    const u64 address = item < total ? whole_chunk(views, prefix, n, item, &index) : 0;
    if (item < total && address == 0) batch_chunk(views, prefix, n, item, cvs);
    if (__ballot_sync(0xffffffffu, address != 0) == 0) continue;
    u32 cv[8];
    for (int i = 0; i < 8; i++) cv[i] = BLAKE3_IV[i];
    for (unsigned round = 0; round < 1024 / STAGE_BYTES; round++) {
      __syncwarp();
      for (unsigned r = 0; r < STAGE_LANES; r++) {
        const unsigned chunk = (32 / STAGE_LANES) * r + lane / STAGE_LANES;
        const u64 from = __shfl_sync(0xffffffffu, address, chunk);
        if (from != 0) stage[warp][chunk][lane % STAGE_LANES] = *(const uint4*)(from + STAGE_BYTES * round + 16 * (lane % STAGE_LANES));
      }
      __syncwarp();
      if (address == 0) continue;
      for (unsigned half = 0; half < STAGE_BYTES / 64; half++) {
        u32 m[16];
        for (int q = 0; q < 4; q++) {
          const uint4 w = stage[warp][lane][4 * half + q];
          m[4 * q] = w.x; m[4 * q + 1] = w.y; m[4 * q + 2] = w.z; m[4 * q + 3] = w.w;
        }
        const unsigned b = (STAGE_BYTES / 64) * round + half;
        compress(cv, m, index, 64, (b == 0 ? CHUNK_START : 0u) | (b == 15 ? CHUNK_END : 0u));
      }
    }
    if (address != 0) store32(cvs + 8 * item, cv);
  }
}

// A parent pass (up to BLOCK_LEVELS tree levels): one block per output node merges its group of
// nodes level by level in shared memory, a thread per node of the level above, where a thread
// per output would merge them one compression after another (parent_group, level_node; the
// host runs merge_levels). Launched with 2^(BLOCK_LEVELS - 1) threads a block, one per pair of
// the first level's nodes (`PARENT_BLOCK_THREADS` in src/record/device/batch.rs).
extern "C" __global__ void hash_parents(const u64* rows, const u64* prefix, u64 n, u32* nodes) {
  __shared__ __align__(32) u32 level[8 << BLOCK_LEVELS];
  for (u64 item = blockIdx.x; item < prefix[n]; item += gridDim.x) {
    u64 from, count, to;
    const u64 depth = parent_group(rows, prefix, n, item, &from, &count, &to);
    for (u64 w = threadIdx.x; w < 8 * count; w += blockDim.x) level[w] = nodes[8 * from + w];
    __syncthreads();
    for (u64 d = 0; d < depth; d++) {
      const u64 next = (count + 1) / 2;
      const bool mine = threadIdx.x < next;
      u32 cv[8];
      if (mine) level_node(level, count, threadIdx.x, cv);
      __syncthreads();
      if (mine) store32(level + 8 * threadIdx.x, cv);
      __syncthreads();
      count = next;
    }
    if (threadIdx.x < 8) nodes[8 * to + threadIdx.x] = level[threadIdx.x];
    __syncthreads();
  }
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

// The leaf pass of the data hash xxh3-1k (kernels/hash.cu, 1c): four lanes per 1 KiB chunk,
// lane j keeping XXH3's accumulators 2j and 2j + 1, so that the four read a 64-byte stripe
// together, 16 bytes each (the two words those accumulators take, each adding the other), and a
// warp eight chunks at once; each lane merges its pair, and the sum of the four merges is the
// leaf. The secret's words a lane takes are read into registers once (constant memory serves
// one address at a time, and the lanes want four). Chunks that are not whole and 16-byte
// aligned take one lane's path (batch_leaf). Every lane of a warp runs the same iterations, for
// the shuffles.
__device__ void leaves_of_pieces(const u64* pieces, const u64* prefix, u64 n) {
  const u64 total = prefix[n];
  const unsigned lane = threadIdx.x % 32, j = lane % 4;
  // Stripe s (< 15): accumulator 2j takes window[s], 2j + 1 window[s + 1]; the last stripe's apart.
  u64 window[16];
  UNROLL for (u32 s = 0; s < 16; s++) window[s] = XXH3_STRIPE_KEYS[2 * j + s];
  const u64 last0 = XXH3_LAST_KEYS[2 * j], last1 = XXH3_LAST_KEYS[2 * j + 1];
  const u64 init0 = XXH3_INIT_ACC[2 * j], init1 = XXH3_INIT_ACC[2 * j + 1];
  const u64 merge0 = XXH3_MERGE_KEYS[2 * j], merge1 = XXH3_MERGE_KEYS[2 * j + 1];
  const u64 stride = (u64)gridDim.x * blockDim.x / 4;
  for (u64 first = ((u64)blockIdx.x * blockDim.x + threadIdx.x) / 32 * 8; first < total; first += stride) {
    const u64 item = first + lane / 4;
    u64* leaf = 0;
    const u64 address = item < total ? whole_leaf_chunk(pieces, prefix, n, item, &leaf) : 0;
    if (item < total && address == 0 && j == 0) batch_leaf(pieces, prefix, n, item);
    if (__ballot_sync(0xffffffffu, address != 0) == 0) continue;
    const ulonglong2* p = (const ulonglong2*)address;
    u64 acc0 = init0, acc1 = init1;
    UNROLL for (u32 s = 0; s < 16; s++) {
      const ulonglong2 v = address != 0 ? p[4 * s + j] : make_ulonglong2(0, 0);
      acc0 = xxh3_accumulate(acc0, v.x, v.y, s < 15 ? window[s] : last0);
      acc1 = xxh3_accumulate(acc1, v.y, v.x, s < 15 ? window[s + 1] : last1);
    }
    u64 merged = mul128_fold64(acc0 ^ merge0, acc1 ^ merge1);
    merged += __shfl_xor_sync(0xffffffffu, merged, 1);
    merged += __shfl_xor_sync(0xffffffffu, merged, 2);
    if (address != 0 && j == 0) *leaf = xxh3_leaf_finish(merged);
  }
}

// The leaf pass over pieces described by a table in device memory (a flush's).
extern "C" __global__ void xxh3_leaves(const u64* pieces, const u64* prefix, u64 n) { leaves_of_pieces(pieces, prefix, n); }

// The leaf pass over one piece given by value: no table to upload, so that a tensor the program
// changes in place next can be read where it is, at once (`launch_leaves_of` in
// src/record/device/leaves.rs).
extern "C" __global__ void xxh3_leaves_of(u64 address, u64 len, u64 leaves) {
  const u64 piece[3] = {address, len, leaves};
  const u64 prefix[2] = {0, (len + 1023) / 1024};
  leaves_of_pieces(piece, prefix, 1);
}
