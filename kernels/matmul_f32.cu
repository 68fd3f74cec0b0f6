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
