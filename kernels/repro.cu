// repro's CUDA kernels, compiled at run time with NVRTC (src/ops/cuda.rs).
//
// 1. BLAKE3 over device memory: one thread per 1024-byte chunk computes the chunk's chaining
//    value, then parent levels are merged pairwise (an odd last node moves up unchanged) until
//    few remain; the host finishes the tree (src/hash.rs). This is exactly BLAKE3's
//    left-complete tree, so the result equals the blake3 crate's hash of the same bytes.
// 2. Float sums in two modes: `atomic` (float atomicAdd, order decided by the hardware) and
//    `ordered` (a fixed two-pass tree, bit-reproducible).
// 3. `expand`: a scalar broadcast to a vector, whose backward is one of the sums above.
// 4. `read_words`: a plain read of device memory, to measure bandwidth beside hashing.
//
// The file is also valid C for the host compiler when REPRO_HOST_TEST is defined, so the BLAKE3
// part can be checked against a reference without a GPU (scripts/check-kernels.sh).

#ifdef REPRO_HOST_TEST
#define DEVICE static
#define CONSTANT static const
#else
#define DEVICE __device__ __forceinline__
#define CONSTANT __constant__
#endif

typedef unsigned int u32;
typedef unsigned long long u64;

#define CHUNK_START 1u
#define CHUNK_END 2u
#define PARENT 4u

CONSTANT u32 BLAKE3_IV[8] = {0x6A09E667u, 0xBB67AE85u, 0x3C6EF372u, 0xA54FF53Au,
                             0x510E527Fu, 0x9B05688Cu, 0x1F83D9ABu, 0x5BE0CD19u};

#define ROTR32(x, n) (((x) >> (n)) | ((x) << (32 - (n))))
#define G(a, b, c, d, x, y)          \
  do {                               \
    s[a] = s[a] + s[b] + (x);        \
    s[d] = ROTR32(s[d] ^ s[a], 16);  \
    s[c] = s[c] + s[d];              \
    s[b] = ROTR32(s[b] ^ s[c], 12);  \
    s[a] = s[a] + s[b] + (y);        \
    s[d] = ROTR32(s[d] ^ s[a], 8);   \
    s[c] = s[c] + s[d];              \
    s[b] = ROTR32(s[b] ^ s[c], 7);   \
  } while (0)
// One round with the message words taken in the order of one row of BLAKE3's schedule.
#define ROUND(m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15) \
  do {                                                                              \
    G(0, 4, 8, 12, m[m0], m[m1]);                                                   \
    G(1, 5, 9, 13, m[m2], m[m3]);                                                   \
    G(2, 6, 10, 14, m[m4], m[m5]);                                                  \
    G(3, 7, 11, 15, m[m6], m[m7]);                                                  \
    G(0, 5, 10, 15, m[m8], m[m9]);                                                  \
    G(1, 6, 11, 12, m[m10], m[m11]);                                                \
    G(2, 7, 8, 13, m[m12], m[m13]);                                                 \
    G(3, 4, 9, 14, m[m14], m[m15]);                                                 \
  } while (0)

// The BLAKE3 compression function, keeping only the chaining value (first 8 output words).
DEVICE void compress(u32 cv[8], const u32 m[16], u64 counter, u32 block_len, u32 flags) {
  u32 s[16] = {cv[0], cv[1], cv[2], cv[3], cv[4], cv[5], cv[6], cv[7],
               BLAKE3_IV[0], BLAKE3_IV[1], BLAKE3_IV[2], BLAKE3_IV[3],
               (u32)counter, (u32)(counter >> 32), block_len, flags};
  ROUND(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  ROUND(2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8);
  ROUND(3, 4, 10, 12, 13, 2, 7, 14, 6, 5, 9, 0, 11, 15, 8, 1);
  ROUND(10, 7, 12, 9, 14, 3, 13, 15, 4, 0, 11, 2, 5, 8, 1, 6);
  ROUND(12, 13, 9, 11, 15, 10, 14, 8, 7, 2, 5, 3, 0, 1, 6, 4);
  ROUND(9, 14, 11, 5, 8, 12, 15, 1, 13, 3, 0, 10, 2, 6, 4, 7);
  ROUND(11, 15, 5, 0, 1, 9, 8, 6, 14, 10, 2, 12, 3, 4, 7, 13);
  for (int i = 0; i < 8; i++) cv[i] = s[i] ^ s[i + 8];
}

// Loads one 64-byte block of a chunk as 16 little-endian words, zero-padded past `avail`.
DEVICE void load_block(const unsigned char* p, u32 avail, int aligned16, u32 m[16]) {
  if (avail >= 64 && aligned16) {
#ifndef REPRO_HOST_TEST
    const uint4* q = (const uint4*)p;
    for (int i = 0; i < 4; i++) {
      uint4 v = q[i];
      m[4 * i] = v.x; m[4 * i + 1] = v.y; m[4 * i + 2] = v.z; m[4 * i + 3] = v.w;
    }
    return;
#endif
  }
  for (int w = 0; w < 16; w++) {
    u32 word = 0;
    for (int b = 0; b < 4; b++) {
      u32 idx = (u32)(4 * w + b);
      u32 byte = idx < avail ? p[idx] : 0u;
      word |= byte << (8 * b);
    }
    m[w] = word;
  }
}

// The (non-root) chaining value of chunk `index`, which holds `len` (1..1024) bytes at `p`.
DEVICE void chunk_cv(const unsigned char* p, u32 len, u64 index, int aligned16, u32 cv[8]) {
  for (int i = 0; i < 8; i++) cv[i] = BLAKE3_IV[i];
  u32 blocks = (len + 63) / 64;
  for (u32 b = 0; b < blocks; b++) {
    u32 m[16];
    u32 avail = len - 64 * b;
    load_block(p + 64 * b, avail, aligned16, m);
    u32 flags = (b == 0 ? CHUNK_START : 0u) | (b + 1 == blocks ? CHUNK_END : 0u);
    compress(cv, m, index, avail < 64 ? avail : 64u, flags);
  }
}

// The (non-root) parent of two chaining values.
DEVICE void parent_cv(const u32 left[8], const u32 right[8], u32 out[8]) {
  u32 m[16];
  for (int i = 0; i < 8; i++) { m[i] = left[i]; m[i + 8] = right[i]; out[i] = BLAKE3_IV[i]; }
  compress(out, m, 0, 64, PARENT);
}

#ifndef REPRO_HOST_TEST

// cvs[8*i .. 8*i+8] = chaining value of chunk i of data[0..len]; needs len > 1024.
extern "C" __global__ void blake3_chunks(const unsigned char* data, u64 len, u32* cvs) {
  u64 n_chunks = (len + 1023) / 1024;
  int aligned16 = (((u64)data) & 15) == 0;
  for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n_chunks; i += (u64)gridDim.x * blockDim.x) {
    u64 start = i * 1024;
    u32 n = (u32)(len - start < 1024 ? len - start : 1024);
    u32 cv[8];
    chunk_cv(data + start, n, i, aligned16, cv);
    for (int k = 0; k < 8; k++) cvs[8 * i + k] = cv[k];
  }
}

// One level of the tree: out[j] = parent(in[2j], in[2j+1]), or in[2j] when it has no partner.
extern "C" __global__ void blake3_parents(const u32* in, u64 n_in, u32* out) {
  u64 n_out = (n_in + 1) / 2;
  for (u64 j = blockIdx.x * (u64)blockDim.x + threadIdx.x; j < n_out; j += (u64)gridDim.x * blockDim.x) {
    u32 cv[8];
    if (2 * j + 1 < n_in) {
      parent_cv(in + 16 * j, in + 16 * j + 8, cv);
    } else {
      for (int k = 0; k < 8; k++) cv[k] = in[16 * j + k];
    }
    for (int k = 0; k < 8; k++) out[8 * j + k] = cv[k];
  }
}

// Sum with float atomics: each warp adds its partial sum into *out (zeroed by the caller) in
// whatever order the hardware schedules the warps.
extern "C" __global__ void sum_f32_atomic(const float* x, u64 n, float* out) {
  float acc = 0.0f;
  for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) acc += x[i];
  for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_down_sync(0xffffffffu, acc, offset);
  if ((threadIdx.x & 31) == 0) atomicAdd(out, acc);
}

// Ordered sum, one pass: block b sums the b-th contiguous segment of x with a fixed tree and
// writes partials[b]. Run once over x, then once with a single block over the partials.
// blockDim.x must be 256.
extern "C" __global__ void sum_f32_ordered(const float* x, u64 n, float* partials) {
  __shared__ float shared[256];
  u64 segment = (n + gridDim.x - 1) / gridDim.x;
  u64 start = blockIdx.x * segment;
  u64 end = start + segment < n ? start + segment : n;
  float acc = 0.0f;
  for (u64 i = start + threadIdx.x; i < end; i += 256) acc += x[i];
  shared[threadIdx.x] = acc;
  __syncthreads();
  for (int stride = 128; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = shared[0];
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

// Column sums of a row-major [rows, cols] matrix, in segments of seg_rows rows: thread
// (segment s, column c) adds rows [s * seg_rows, (s + 1) * seg_rows) of column c in order.
// Adjacent threads take adjacent columns, so loads coalesce.
__device__ float segment_sum(const float* x, u64 rows, u64 cols, u64 seg_rows, u64 s, u64 c) {
  u64 end = (s + 1) * seg_rows < rows ? (s + 1) * seg_rows : rows;
  float acc = 0.0f;
  for (u64 r = s * seg_rows; r < end; r++) acc += x[r * cols + c];
  return acc;
}

// Each segment's sum is atomicAdd-ed into out[c] (zeroed by the caller): the order in which
// segments land is decided by scheduling.
extern "C" __global__ void sum_rows_f32_atomic(const float* x, u64 rows, u64 cols, u64 seg_rows, float* out) {
  u64 segments = (rows + seg_rows - 1) / seg_rows;
  for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < segments * cols; i += (u64)gridDim.x * blockDim.x) {
    atomicAdd(&out[i % cols], segment_sum(x, rows, cols, seg_rows, i / cols, i % cols));
  }
}

// Each segment's sum goes to partials[s * cols + c]: a [segments, cols] matrix whose column
// sums, taken again with one segment, give the result in an order fixed by (rows, cols).
extern "C" __global__ void sum_rows_f32_segments(const float* x, u64 rows, u64 cols, u64 seg_rows, float* partials) {
  u64 segments = (rows + seg_rows - 1) / seg_rows;
  for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < segments * cols; i += (u64)gridDim.x * blockDim.x) {
    partials[i] = segment_sum(x, rows, cols, seg_rows, i / cols, i % cols);
  }
}

// out[r * cols + c] = value[c]: a vector repeated as the rows of a matrix.
extern "C" __global__ void expand_rows_f32(const float* value, u64 rows, u64 cols, float* out) {
  for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < rows * cols; i += (u64)gridDim.x * blockDim.x) out[i] = value[i % cols];
}

#endif
