// repro's CUDA kernels, compiled at run time with NVRTC (src/ops/cuda.rs).
//
// 1. BLAKE3 over device memory, for many tensor views in one launch per pass: one thread per
//    1024-byte chunk computes the chunk's chaining value, parent levels are merged pairwise (an
//    odd last node moves up unchanged; up to four levels per launch) until two nodes remain, and one thread per view makes the
//    root. This is exactly BLAKE3's left-complete tree, so the result equals the blake3 crate's
//    hash of the same bytes. A copy pass gathers views' elements for values the host keeps.
// 2. Float sums in two modes: `atomic` (float atomicAdd, order decided by the hardware) and
//    `ordered` (a fixed two-pass tree, bit-reproducible).
// 3. `expand`: a scalar broadcast to a vector, whose backward is one of the sums above.
// 4. `read_words`: a plain read of device memory, to measure bandwidth beside hashing.
//
// The file is also valid C for the host compiler when REPRO_HOST_TEST is defined, so the BLAKE3
// part can be checked against a reference without a GPU (crates/kernel-host-check).

#ifdef REPRO_HOST_TEST
#include <string.h>
#define DEVICE static
#define CONSTANT static const
#define UNROLL
#else
#define DEVICE __device__ __forceinline__
#define CONSTANT __constant__
#define UNROLL _Pragma("unroll")
#endif

typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

// LOAD(T, p): the T at p, which is aligned to sizeof(T). On the host through memcpy (no
// aliasing or alignment assumptions); on the GPU one load.
#ifdef REPRO_HOST_TEST
static u16 load_u16(const unsigned char* p) { u16 x; memcpy(&x, p, sizeof x); return x; }
static u32 load_u32(const unsigned char* p) { u32 x; memcpy(&x, p, sizeof x); return x; }
static u64 load_u64(const unsigned char* p) { u64 x; memcpy(&x, p, sizeof x); return x; }
#define LOAD(T, p) load_##T(p)
#else
#define LOAD(T, p) (*(const T*)(p))
#endif

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
// `p` is aligned to `align` bytes (16, 4 or 1): the widest loads that alignment allows.
DEVICE void load_block(const unsigned char* p, u32 avail, u32 align, u32 m[16]) {
  if (avail >= 64 && align >= 16) {
#ifndef REPRO_HOST_TEST
    const uint4* q = (const uint4*)p;
    for (int i = 0; i < 4; i++) {
      uint4 v = q[i];
      m[4 * i] = v.x; m[4 * i + 1] = v.y; m[4 * i + 2] = v.z; m[4 * i + 3] = v.w;
    }
    return;
#endif
  }
  u32 whole = 0;
  if (align >= 4) {
    whole = (avail < 64 ? avail : 64u) / 4;
    for (u32 w = 0; w < whole; w++) m[w] = LOAD(u32, p + 4 * w);
  }
  for (u32 w = whole; w < 16; w++) {
    u32 word = 0;
    for (int b = 0; b < 4; b++) {
      u32 idx = 4 * w + (u32)b;
      u32 byte = idx < avail ? p[idx] : 0u;
      word |= byte << (8 * b);
    }
    m[w] = word;
  }
}

// The (non-root) parent of two chaining values; `out` may be `left`.
DEVICE void parent_cv(const u32 left[8], const u32 right[8], u32 out[8]) {
  u32 m[16];
  for (int i = 0; i < 8; i++) { m[i] = left[i]; m[i + 8] = right[i]; }
  for (int i = 0; i < 8; i++) out[i] = BLAKE3_IV[i];
  compress(out, m, 0, 64, PARENT);
}

// 1b. Batched hashing of many tensor views at once (src/ops/device_hash.rs plans the tables).
//
// A view is described by VIEW_WORDS u64 words: the address of its element 0, the element size,
// the number of dimensions (at most VIEW_DIMS, size-1 dims dropped and contiguous dims merged),
// flags (bit 0: contiguous row-major), its byte length, then its dims and its strides in
// elements. Elements are read through the strides, so transposed, broadcast or narrowed views
// are hashed without a contiguous copy. Every thread finds its view by binary search in a
// prefix table (prefix[k] = the first work item of view k, prefix[n] = the total).
#define VIEW_WORDS 21
#define VIEW_DIMS 8
#define ROOT 8u

// The view holding work item `item`: the k with prefix[k] <= item < prefix[k + 1].
DEVICE u64 find_view(const u64* prefix, u64 n, u64 item) {
  u64 lo = 0, hi = n;
  while (hi - lo > 1) {
    u64 mid = (lo + hi) / 2;
    if (prefix[mid] <= item) lo = mid; else hi = mid;
  }
  return lo;
}

// The address of element `e` (in row-major order) of a view.
DEVICE const unsigned char* view_element(const u64* v, u64 e) {
  u64 esize = v[1];
  if (v[3] & 1u) return (const unsigned char*)(v[0] + e * esize);
  u64 off = 0;
  for (int k = (int)v[2] - 1; k >= 0; k--) {
    u64 dim = v[5 + k];
    off += (e % dim) * v[5 + VIEW_DIMS + k];
    e /= dim;
  }
  return (const unsigned char*)(v[0] + off * esize);
}

// A walk through a strided view in row-major order: the current element's index in each
// dimension and its offset in elements. Dividing an element number into indices costs a
// division per dimension, so it is done once per chunk; the next element is then one addition
// (and a carry into the dimension before at the end of a row).
typedef struct {
  u64 idx[VIEW_DIMS];
  u64 off;
} Cursor;

DEVICE void cursor_at(const u64* v, u64 e, Cursor* c) {
  int nd = (int)v[2];
  c->off = 0;
  UNROLL for (int k = VIEW_DIMS - 1; k >= 0; k--) {
    c->idx[k] = 0;
    if (k >= nd) continue;
    u64 dim = v[5 + k];
    c->idx[k] = e % dim;
    c->off += c->idx[k] * v[5 + VIEW_DIMS + k];
    e /= dim;
  }
}

// Moves to the next element (after the last one it wraps to element 0, which no caller reads).
DEVICE void cursor_next(const u64* v, Cursor* c) {
  int nd = (int)v[2];
  UNROLL for (int k = VIEW_DIMS - 1; k >= 0; k--) {
    if (k >= nd) continue;
    u64 stride = v[5 + VIEW_DIMS + k];
    c->off += stride;
    if (++c->idx[k] < v[5 + k]) return;
    c->off -= c->idx[k] * stride;
    c->idx[k] = 0;
  }
}

// Loads the next 64-byte block (`avail` bytes of it, zero-padded) of a strided view from the
// cursor, one element per load; elements are aligned to their size.
DEVICE void load_strided_block(const u64* v, Cursor* c, u32 avail, u32 m[16]) {
  const unsigned char* base = (const unsigned char*)v[0];
  u32 esize = (u32)v[1];
  u32 count = (avail < 64 ? avail : 64u) / esize;
  for (int w = 0; w < 16; w++) m[w] = 0;
  if (esize == 4) {
    for (u32 j = 0; j < count; j++, cursor_next(v, c)) m[j] = LOAD(u32, base + 4 * c->off);
  } else if (esize == 2) {
    for (u32 j = 0; j < count; j++, cursor_next(v, c)) m[j / 2] |= (u32)LOAD(u16, base + 2 * c->off) << (16 * (j % 2));
  } else if (esize == 8) {
    for (u32 j = 0; j < count; j++, cursor_next(v, c)) {
      u64 x = LOAD(u64, base + 8 * c->off);
      m[2 * j] = (u32)x;
      m[2 * j + 1] = (u32)(x >> 32);
    }
  } else {
    for (u32 j = 0; j < count; j++, cursor_next(v, c)) {
      const unsigned char* p = base + esize * c->off;
      for (u32 b = 0; b < esize; b++) {
        u32 idx = j * esize + b;
        m[idx / 4] |= (u32)p[b] << (8 * (idx % 4));
      }
    }
  }
}

// Work item `item` of the chunk pass: the chaining value of one 1024-byte chunk of one view,
// written to cvs[8 * item ..]. Views hold more than one chunk.
DEVICE void batch_chunk(const u64* views, const u64* prefix, u64 n, u64 item, u32* cvs) {
  u64 k = find_view(prefix, n, item);
  const u64* v = views + VIEW_WORDS * k;
  u64 index = item - prefix[k];
  u64 start = index * 1024;
  u64 len = v[4] - start < 1024 ? v[4] - start : 1024;
  int contiguous = (int)(v[3] & 1u);
  u64 address = v[0] + start;
  u32 align = (address & 15u) == 0 ? 16u : (address & 3u) == 0 ? 4u : 1u;
  Cursor c;
  cursor_at(v, start / v[1], &c);
  u32 cv[8];
  for (int i = 0; i < 8; i++) cv[i] = BLAKE3_IV[i];
  u32 blocks = (u32)((len + 63) / 64);
  for (u32 b = 0; b < blocks; b++) {
    u32 m[16];
    u32 avail = (u32)(len - 64 * b);
    if (contiguous) load_block((const unsigned char*)(address + 64 * b), avail, align, m);
    else load_strided_block(v, &c, avail, m);
    u32 flags = (b == 0 ? CHUNK_START : 0u) | (b + 1 == blocks ? CHUNK_END : 0u);
    compress(cv, m, index, avail < 64 ? avail : 64u, flags);
  }
  for (int i = 0; i < 8; i++) cvs[8 * item + i] = cv[i];
}

// Parent levels merged by one launch, at most: 2^LEVELS_PER_LAUNCH input nodes per work item.
#define LEVELS_PER_LAUNCH 4

// Work item `item` of one parent pass. Row r of `rows` is (first input node, input node count,
// first output node, depth) of one view's tree, nodes counted in 8-word chaining values of
// `nodes`. Output j of a view is inputs [j * 2^depth, (j + 1) * 2^depth) merged `depth` levels
// up, one level at a time: node i of a level is parent(node 2i, node 2i + 1) of the level
// below, or node 2i when it has no partner. The groups are aligned to 2^depth, so a group's
// pairs are the tree's pairs, and only the last group can hold the odd last node.
DEVICE void batch_parent(const u64* rows, const u64* prefix, u64 n, u64 item, u32* nodes) {
  u64 r = find_view(prefix, n, item);
  u64 in = rows[4 * r], n_in = rows[4 * r + 1], out = rows[4 * r + 2], depth = rows[4 * r + 3];
  u64 j = item - prefix[r];
  u64 first = j << depth;
  u64 group = (u64)1 << depth;
  u64 count = n_in - first < group ? n_in - first : group;
  u32 level[8 << LEVELS_PER_LAUNCH];
  for (u64 i = 0; i < 8 * count; i++) level[i] = nodes[8 * (in + first) + i];
  for (u64 d = 0; d < depth; d++) {
    u64 next = (count + 1) / 2;
    // In place: node i is written after nodes 2i and 2i + 1 are read, and i <= 2i.
    for (u64 i = 0; i < next; i++) {
      if (2 * i + 1 < count) {
        parent_cv(level + 16 * i, level + 16 * i + 8, level + 8 * i);
      } else if (i > 0) {
        for (int w = 0; w < 8; w++) level[8 * i + w] = level[16 * i + w];
      }
    }
    count = next;
  }
  for (int w = 0; w < 8; w++) nodes[8 * (out + j) + w] = level[w];
}

// The BLAKE3 hash of view `k`: the root parent of its last two nodes, which start at node
// roots[k] of `nodes`.
DEVICE void batch_root(const u64* roots, u64 k, const u32* nodes, u32* hashes) {
  const u32* left = nodes + 8 * roots[k];
  u32 m[16], cv[8];
  for (int i = 0; i < 8; i++) { m[i] = left[i]; m[i + 8] = left[i + 8]; cv[i] = BLAKE3_IV[i]; }
  compress(cv, m, 0, 64, PARENT | ROOT);
  for (int i = 0; i < 8; i++) hashes[8 * k + i] = cv[i];
}

// Work item `item` of the copy pass: one element of one view, written in row-major order at
// byte offset out_at[k] of `out`.
DEVICE void batch_copy(const u64* views, const u64* prefix, const u64* out_at, u64 n, u64 item, unsigned char* out) {
  u64 k = find_view(prefix, n, item);
  const u64* v = views + VIEW_WORDS * k;
  u64 e = item - prefix[k];
  const unsigned char* p = view_element(v, e);
  unsigned char* q = out + out_at[k] + e * v[1];
  for (u64 b = 0; b < v[1]; b++) q[b] = p[b];
}

#ifndef REPRO_HOST_TEST

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

// Batch-invariant matrix product, c[z] = a[z] @ b[z] for z < gridDim.z, with a [M, K] and
// b [K, N] read through their strides (a batch stride of 0 shares one matrix) and c a
// contiguous [Z, M, N]. Every output element is one thread's sum over k = 0, 1, ..., K-1 in
// order (one fused multiply-add each, starting from 0): its bits depend on its own row and
// column and on K only, never on M, N, the batch, the tile size or which block computed it.
// Tiles of TILE x TILE outputs, BK k at a time through shared memory; each of the 256 threads
// owns R x R outputs, at rows ty + 16 i and columns tx + 16 j of the tile (so that a warp's
// shared-memory reads and global stores fall on consecutive addresses). Tiles are loaded with
// consecutive threads along whichever of the operand's dimensions is contiguous.
template <int TILE, int BK, int R>
__device__ __forceinline__ void matmul_fixed(const float* a, const float* b, float* c, u64 m_len, u64 n_len,
                                             u64 k_len, u64 a_z, u64 a_m, u64 a_k, u64 b_z, u64 b_k, u64 b_n) {
  __shared__ float a_tile[BK][TILE];
  __shared__ float b_tile[BK][TILE];
  const u64 z = blockIdx.z;
  const u64 m0 = (u64)blockIdx.y * TILE, n0 = (u64)blockIdx.x * TILE;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const float* az = a + z * a_z;
  const float* bz = b + z * b_z;
  float acc[R][R];
  for (int i = 0; i < R; i++)
    for (int j = 0; j < R; j++) acc[i][j] = 0.0f;
  for (u64 k0 = 0; k0 < k_len; k0 += BK) {
    for (int l = threadIdx.x; l < TILE * BK; l += 256) {
      const int mm = a_k == 1 ? l / BK : l % TILE, kk = a_k == 1 ? l % BK : l / TILE;
      const u64 m = m0 + mm, k = k0 + kk;
      a_tile[kk][mm] = (m < m_len && k < k_len) ? az[m * a_m + k * a_k] : 0.0f;
      const int nn = b_n == 1 ? l % TILE : l / BK, kb = b_n == 1 ? l / TILE : l % BK;
      const u64 n = n0 + nn, k2 = k0 + kb;
      b_tile[kb][nn] = (n < n_len && k2 < k_len) ? bz[k2 * b_k + n * b_n] : 0.0f;
    }
    __syncthreads();
    const int k_here = k_len - k0 < BK ? (int)(k_len - k0) : BK;
    for (int kk = 0; kk < k_here; kk++) {
      float ar[R], br[R];
      for (int i = 0; i < R; i++) ar[i] = a_tile[kk][ty + 16 * i];
      for (int j = 0; j < R; j++) br[j] = b_tile[kk][tx + 16 * j];
      for (int i = 0; i < R; i++)
        for (int j = 0; j < R; j++) acc[i][j] = fmaf(ar[i], br[j], acc[i][j]);
    }
    __syncthreads();
  }
  float* cz = c + z * m_len * n_len;
  for (int i = 0; i < R; i++) {
    const u64 m = m0 + ty + 16 * i;
    if (m >= m_len) continue;
    for (int j = 0; j < R; j++) {
      const u64 n = n0 + tx + 16 * j;
      if (n < n_len) cz[m * n_len + n] = acc[i][j];
    }
  }
}

// 32 x 32 tiles (2 x 2 outputs a thread): enough blocks to fill the GPU for small products.
extern "C" __global__ void matmul_f32_fixed_32(const float* a, const float* b, float* c, u64 m_len, u64 n_len,
                                               u64 k_len, u64 a_z, u64 a_m, u64 a_k, u64 b_z, u64 b_k, u64 b_n) {
  matmul_fixed<32, 32, 2>(a, b, c, m_len, n_len, k_len, a_z, a_m, a_k, b_z, b_k, b_n);
}

// 64 x 64 tiles (4 x 4 outputs a thread).
extern "C" __global__ void matmul_f32_fixed_64(const float* a, const float* b, float* c, u64 m_len, u64 n_len,
                                               u64 k_len, u64 a_z, u64 a_m, u64 a_k, u64 b_z, u64 b_k, u64 b_n) {
  matmul_fixed<64, 16, 4>(a, b, c, m_len, n_len, k_len, a_z, a_m, a_k, b_z, b_k, b_n);
}

// 128 x 128 tiles for large products: the same sums in the same order as matmul_fixed, with
// more arithmetic per load. Each thread owns the 8 x 8 outputs at rows {4 ty .. 4 ty + 3,
// 64 + 4 ty .. 64 + 4 ty + 3} and the same columns for tx, read from shared memory four at a
// time; the next k-slice is fetched into registers while the current one is multiplied, and
// shared memory holds two slices so that one barrier per slice suffices.
#define BIG_TILE 128
#define BIG_K 8
extern "C" __global__ void matmul_f32_fixed_128(const float* a, const float* b, float* c, u64 m_len, u64 n_len,
                                                u64 k_len, u64 a_z, u64 a_m, u64 a_k, u64 b_z, u64 b_k, u64 b_n) {
  __shared__ __align__(16) float a_tile[2][BIG_K][BIG_TILE];
  __shared__ __align__(16) float b_tile[2][BIG_K][BIG_TILE];
  const u64 z = blockIdx.z;
  const u64 m0 = (u64)blockIdx.y * BIG_TILE, n0 = (u64)blockIdx.x * BIG_TILE;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const float* az = a + z * a_z;
  const float* bz = b + z * b_z;
  // This thread's 4 elements of each slice: (row or column, k) within the tile.
  int a_mm[4], a_kk[4], b_nn[4], b_kk[4];
  for (int q = 0; q < 4; q++) {
    const int l = threadIdx.x + 256 * q;
    a_mm[q] = a_k == 1 ? l / BIG_K : l % BIG_TILE;
    a_kk[q] = a_k == 1 ? l % BIG_K : l / BIG_TILE;
    b_nn[q] = b_n == 1 ? l % BIG_TILE : l / BIG_K;
    b_kk[q] = b_n == 1 ? l / BIG_TILE : l % BIG_K;
  }
  float next_a[4], next_b[4];
  auto fetch = [&](u64 k0) {
    for (int q = 0; q < 4; q++) {
      const u64 m = m0 + a_mm[q], k = k0 + a_kk[q];
      next_a[q] = (m < m_len && k < k_len) ? az[m * a_m + k * a_k] : 0.0f;
      const u64 n = n0 + b_nn[q], k2 = k0 + b_kk[q];
      next_b[q] = (n < n_len && k2 < k_len) ? bz[k2 * b_k + n * b_n] : 0.0f;
    }
  };
  auto stash = [&](int buf) {
    for (int q = 0; q < 4; q++) {
      a_tile[buf][a_kk[q]][a_mm[q]] = next_a[q];
      b_tile[buf][b_kk[q]][b_nn[q]] = next_b[q];
    }
  };
  float acc[8][8];
  for (int i = 0; i < 8; i++)
    for (int j = 0; j < 8; j++) acc[i][j] = 0.0f;
  fetch(0);
  stash(0);
  __syncthreads();
  int buf = 0;
  for (u64 k0 = 0; k0 < k_len; k0 += BIG_K) {
    const bool more = k0 + BIG_K < k_len;
    if (more) fetch(k0 + BIG_K);
    const int k_here = k_len - k0 < BIG_K ? (int)(k_len - k0) : BIG_K;
    for (int kk = 0; kk < k_here; kk++) {
      const float4 a0 = *(const float4*)&a_tile[buf][kk][4 * ty];
      const float4 a1 = *(const float4*)&a_tile[buf][kk][64 + 4 * ty];
      const float4 b0 = *(const float4*)&b_tile[buf][kk][4 * tx];
      const float4 b1 = *(const float4*)&b_tile[buf][kk][64 + 4 * tx];
      const float ar[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
      const float br[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
      for (int i = 0; i < 8; i++)
        for (int j = 0; j < 8; j++) acc[i][j] = fmaf(ar[i], br[j], acc[i][j]);
    }
    if (more) stash(buf ^ 1);
    __syncthreads();
    buf ^= 1;
  }
  float* cz = c + z * m_len * n_len;
  for (int i = 0; i < 8; i++) {
    const u64 m = m0 + (i < 4 ? 4 * ty + i : 64 + 4 * ty + i - 4);
    if (m >= m_len) continue;
    for (int j = 0; j < 8; j++) {
      const u64 n = n0 + (j < 4 ? 4 * tx + j : 64 + 4 * tx + j - 4);
      if (n < n_len) cz[m * n_len + n] = acc[i][j];
    }
  }
}

// out[r] = the sum of row r of a contiguous [rows, cols] matrix, one warp a row: lane l adds
// elements l, l + 32, l + 64, ... in order, then the 32 lane sums meet in a fixed tree. Which
// lane takes an element depends on its column only, so the row's sum is the same whatever the
// number of rows, and zeros appended to the row (a padded softmax row, keys a decoding step has
// not reached) change nothing. blockDim.x must be a multiple of 32.
extern "C" __global__ void sum_last_f32_fixed(const float* x, u64 rows, u64 cols, float* out) {
  const int lane = threadIdx.x % 32;
  const u64 warps = (u64)gridDim.x * blockDim.x / 32;
  for (u64 r = (blockIdx.x * (u64)blockDim.x + threadIdx.x) / 32; r < rows; r += warps) {
    float acc = 0.0f;
    for (u64 c = lane; c < cols; c += 32) acc += x[r * cols + c];
    for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_down_sync(0xffffffffu, acc, offset);
    if (lane == 0) out[r] = acc;
  }
}

#endif
