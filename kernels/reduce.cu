// Float sums in two modes, `atomic` (float atomicAdd, the order decided by the hardware) and
// `ordered` (a fixed two-pass tree, bit-reproducible); column sums of a matrix in both modes;
// a vector repeated as a matrix's rows (whose backward is a column sum); and the row sum of the
// batch-invariant softmax, in an order fixed by the columns.

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

// The softmax over the last dimension of a contiguous [rows, cols] matrix, one warp a row, in
// f32 (bf16 rows read exactly and rounded to nearest even once at the end): the row's maximum
// (exact in any order), then e = exp(x - max) summed exactly as sum_last_f32_fixed adds a row
// (lane l takes columns l, l + 32, ... in order, then the same tree), then e / sum. These are
// the operations, in the same order and precision, that the unfused softmax of
// `ops::invariant` launches one kernel each for (candle's max, subtraction, exp and division,
// and sum_last_f32_fixed), so it gives the same bits, reading each row from memory a few times
// instead of writing and reading five whole tensors.
DEVICE float softmax_in(const float* p) { return *p; }
DEVICE float softmax_in(const u16* p) { return __uint_as_float(((u32)*p) << 16); }
DEVICE void softmax_out(float* p, float v) { *p = v; }
// Rounded to the nearest bf16, ties to even, as candle's cast does (cvt.rn.bf16.f32, which this
// module's compute_75 lacks); NaN as its canonical 0x7fff.
DEVICE void softmax_out(u16* p, float v) {
  const u32 b = __float_as_uint(v);
  *p = (b & 0x7fffffffu) > 0x7f800000u ? (u16)0x7fff : (u16)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

template <typename T>
DEVICE void softmax_rows(const T* x, u64 rows, u64 cols, T* out) {
  const int lane = threadIdx.x % 32;
  const u64 warps = (u64)gridDim.x * blockDim.x / 32;
  for (u64 r = (blockIdx.x * (u64)blockDim.x + threadIdx.x) / 32; r < rows; r += warps) {
    const T* row = x + r * cols;
    float top = __int_as_float(0xff800000);  // -inf
    for (u64 c = lane; c < cols; c += 32) top = fmaxf(top, softmax_in(row + c));
    for (int offset = 16; offset > 0; offset /= 2) top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, offset));
    float acc = 0.0f;
    for (u64 c = lane; c < cols; c += 32) acc += expf(softmax_in(row + c) - top);
    for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_down_sync(0xffffffffu, acc, offset);
    const float sum = __shfl_sync(0xffffffffu, acc, 0);
    for (u64 c = lane; c < cols; c += 32) softmax_out(out + r * cols + c, expf(softmax_in(row + c) - top) / sum);
  }
}

extern "C" __global__ void softmax_last_f32_fixed(const float* x, u64 rows, u64 cols, float* out) {
  softmax_rows(x, rows, cols, out);
}

extern "C" __global__ void softmax_last_bf16_fixed(const u16* x, u64 rows, u64 cols, u16* out) {
  softmax_rows(x, rows, cols, out);
}
