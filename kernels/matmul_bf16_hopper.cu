// repro's batch-invariant bf16 matrix product for Hopper (sm_90a: H100, H200), with wgmma and
// TMA. A module of its own, compiled with NVRTC for compute_90a and loaded only on such GPUs;
// kernels/matmul_bf16.cu stays the product elsewhere.
//
// c[z] = a[z] @ b[z] for a [Z, M, K] and b given as bt [Z or 1, N, K] (both K contiguous), into
// a contiguous [Z, M, N]; inputs bf16, products summed in f32, rounded to bf16 once at the end.
//
// The reduction order of every output element is fixed by K alone: one f32 accumulator starts
// at 0 and takes the tensor core's 16-deep wgmma steps over k = 0..15, 16..31, ... in order. A
// step computes each output element from its own row of A and column of B, whatever the
// instruction's width and whichever of the tile's rows the element sits in, so the kernels
// below (two tile shapes) give the same bits, and nothing depends on M, N, Z, the tile or the
// block: no split of K, whatever the problem's size. K past the end is read as zeros (the TMA
// unit fills them), which add exact zeros, as zeros appended to K do.
//
// A block: one producer warpgroup, whose first thread feeds K slices of 64 (128 bytes, one
// 128-byte swizzle row) of both operands' tiles through a ring of STAGES shared-memory slots
// with the TMA unit, and CONSUMERS warpgroups of 64 rows each, which multiply each slot with
// wgmma, keeping DEPTH slices' multiplies in flight before giving a slot back (a tile of few
// columns waits on the tensor core's latency, not its throughput). Slots are handed over with
// mbarriers: `full` (the TMA's bytes have landed), `empty` (every consumer thread is done
// reading).
//
// Needs: K a multiple of 8 and every row of a and bt 16-byte aligned (the host pads and copies
// to make it so), K > 0.

typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned short u16;

// A TMA tensor map (the driver's CUtensorMap, made by cuTensorMapEncodeTiled), passed by value.
struct __align__(64) TensorMap {
  u64 words[16];
};

// Depth of a K slice: 64 bf16, 128 bytes.
#define HOPPER_BK 64

__device__ __forceinline__ u32 shared_address(const void* p) {
  u64 addr;
  asm("cvta.to.shared.u64 %0, %1;\n" : "=l"(addr) : "l"(p));
  return (u32)addr;
}

__device__ __forceinline__ void barrier_init(u32 bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void barrier_expect_bytes(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void barrier_arrive(u32 bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// Waits until the barrier's phase of this parity has completed.
__device__ __forceinline__ void barrier_wait(u32 bar, u32 parity) {
  u32 done = 0;
  while (!done) {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  }
}

// A box of the tensor `map` at coordinates (k, row, z) into shared memory at `dst`, counted on `bar`.
__device__ __forceinline__ void tma_load(u32 dst, const TensorMap* map, u32 bar, int k, int row, int z) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], "
      "[%2];\n" ::"r"(dst),
      "l"((u64)map), "r"(bar), "r"(k), "r"(row), "r"(z)
      : "memory");
}

// A wgmma descriptor of a K-major tile in shared memory, 128-byte swizzled: rows of 128 bytes,
// groups of 8 rows 1024 bytes apart.
__device__ __forceinline__ u64 tile_descriptor(u32 addr) {
  return (u64)((addr & 0x3FFFF) >> 4) | ((u64)(16 >> 4) << 16) | ((u64)(1024 >> 4) << 32) | (1ull << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Keeps the compiler from moving reads or writes of an accumulator across wgmma's asynchronous use.
__device__ __forceinline__ void hold(float& r) { asm volatile("" : "+f"(r)::"memory"); }

// d += a @ b for a 64 x 16 slice of A and a 256 x 16 slice of B, both K-major in shared memory
// (descriptors), into this thread's 128 f32 accumulators.
__device__ __forceinline__ void wgmma_n256(float* d, u64 a, u64 b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(a), "l"(b));
}

// d += a @ b for a 64 x 16 slice of A and a 128 x 16 slice of B, both K-major in shared memory
// (descriptors), into this thread's 64 f32 accumulators.
__device__ __forceinline__ void wgmma_n128(float* d, u64 a, u64 b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(a), "l"(b));
}

// d += a @ b for a 64 x 16 slice of A and a 64 x 16 slice of B, both K-major in shared memory
// (descriptors), into this thread's 32 f32 accumulators.
__device__ __forceinline__ void wgmma_n64(float* d, u64 a, u64 b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a), "l"(b));
}

// d += a @ b for a 64 x 16 slice of A and a 32 x 16 slice of B, both K-major in shared memory
// (descriptors), into this thread's 16 f32 accumulators.
__device__ __forceinline__ void wgmma_n32(float* d, u64 a, u64 b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
      "}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(a), "l"(b));
}

template <int BN>
__device__ __forceinline__ void wgmma_step(float* d, u64 a, u64 b);
template <>
__device__ __forceinline__ void wgmma_step<256>(float* d, u64 a, u64 b) { wgmma_n256(d, a, b); }
template <>
__device__ __forceinline__ void wgmma_step<128>(float* d, u64 a, u64 b) { wgmma_n128(d, a, b); }
template <>
__device__ __forceinline__ void wgmma_step<64>(float* d, u64 a, u64 b) { wgmma_n64(d, a, b); }
template <>
__device__ __forceinline__ void wgmma_step<32>(float* d, u64 a, u64 b) { wgmma_n32(d, a, b); }

// Round to nearest even, as __float2bfloat16_rn (NaN stays NaN).
__device__ __forceinline__ u32 bf16_bits(float x) {
  u16 r;
  asm("cvt.rn.bf16.f32 %0, %1;\n" : "=h"(r) : "f"(x));
  return r;
}

// One block: the [64 * CONSUMERS, BN] tile of output (blockIdx.y, blockIdx.x) of batch entry
// blockIdx.z. `b_batched`: bt has a batch entry per entry of a (else one, shared).
template <int BN, int CONSUMERS, int STAGES, int DEPTH>
__device__ __forceinline__ void hopper_matmul(const TensorMap& a_map, const TensorMap& b_map, u16* __restrict__ c,
                                              u64 m, u64 n, u64 k, int b_batched) {
  constexpr int BM = 64 * CONSUMERS;
  constexpr u32 A_BYTES = BM * HOPPER_BK * 2, B_BYTES = BN * HOPPER_BK * 2, SLOT_BYTES = A_BYTES + B_BYTES;
  extern __shared__ unsigned char shared_raw[];
  __shared__ __align__(8) u64 full[STAGES], empty[STAGES];
  // 128-byte swizzled tiles start 1024-byte aligned (the host asks for 1024 bytes more).
  const u32 base = (shared_address(shared_raw) + 1023) & ~1023u;
  const int n0 = blockIdx.x * BN, m0 = blockIdx.y * BM, z = blockIdx.z;
  const int slices = (int)((k + HOPPER_BK - 1) / HOPPER_BK);
  const int group = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      barrier_init(shared_address(&full[s]), 1);
      barrier_init(shared_address(&empty[s]), CONSUMERS * 128);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  }
  __syncthreads();
  if (group == CONSUMERS) {  // the producer
    if (threadIdx.x % 128 == 0) {
      for (int i = 0; i < slices; ++i) {
        const int s = i % STAGES;
        const u32 slot = base + s * SLOT_BYTES, bar = shared_address(&full[s]);
        barrier_wait(shared_address(&empty[s]), ((i / STAGES) & 1) ^ 1);
        barrier_expect_bytes(bar, SLOT_BYTES);
        tma_load(slot, &a_map, bar, i * HOPPER_BK, m0, z);
        tma_load(slot + A_BYTES, &b_map, bar, i * HOPPER_BK, n0, b_batched ? z : 0);
      }
    }
    return;
  }
  float d[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) d[i] = 0.0f;
  for (int i = 0; i < slices; ++i) {
    const int s = i % STAGES;
    barrier_wait(shared_address(&full[s]), (i / STAGES) & 1);
    const u32 a = base + s * SLOT_BYTES + group * 64 * HOPPER_BK * 2, b = base + s * SLOT_BYTES + A_BYTES;
#pragma unroll
    for (int r = 0; r < BN / 2; ++r) hold(d[r]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < HOPPER_BK / 16; ++kk) wgmma_step<BN>(d, tile_descriptor(a + 32 * kk), tile_descriptor(b + 32 * kk));
    wgmma_commit();
    // The slice DEPTH before this one is done: its slot goes back to the producer.
    wgmma_wait<DEPTH>();
#pragma unroll
    for (int r = 0; r < BN / 2; ++r) hold(d[r]);
    if (i >= DEPTH) barrier_arrive(shared_address(&empty[(i - DEPTH) % STAGES]));
  }
  wgmma_wait<0>();
#pragma unroll
  for (int r = 0; r < BN / 2; ++r) hold(d[r]);
  // The accumulators' layout: warp w of the group holds rows 16w + lane/4 and 8 below; for each
  // 8 columns j, registers 4j, 4j+1 (that row, columns 8j + 2 (lane % 4) and one right) and 4j+2, 4j+3
  // (the row 8 below).
  const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
  const u64 row0 = (u64)m0 + group * 64 + warp * 16 + lane / 4;
  u16* out = c + (u64)z * m * n;
  const bool pairs = (n % 2) == 0;
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
    const u64 col = (u64)n0 + j * 8 + 2 * (lane % 4);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const u64 row = row0 + 8 * h;
      if (row >= m || col >= n) continue;
      const u32 lo = bf16_bits(d[4 * j + 2 * h]), hi = bf16_bits(d[4 * j + 2 * h + 1]);
      u16* p = out + row * n + col;
      if (pairs) {
        *(u32*)p = lo | (hi << 16);
      } else {
        p[0] = (u16)lo;
        if (col + 1 < n) p[1] = (u16)hi;
      }
    }
  }
}

// Wide tiles (128 x 256, two consumer warpgroups, 4 slots of 48 KiB): products that give every SM
// a tile at least.
extern "C" __global__ void __launch_bounds__(384, 1)
    matmul_bf16_hopper_wide(const __grid_constant__ TensorMap a_map, const __grid_constant__ TensorMap b_map,
                            u16* c, u64 m, u64 n, u64 k, int b_batched) {
  hopper_matmul<256, 2, 4, 1>(a_map, b_map, c, m, n, k, b_batched);
}

// Medium tiles (128 x 128, two consumer warpgroups, 4 slots of 32 KiB).
extern "C" __global__ void __launch_bounds__(384, 1)
    matmul_bf16_hopper_medium(const __grid_constant__ TensorMap a_map, const __grid_constant__ TensorMap b_map,
                              u16* c, u64 m, u64 n, u64 k, int b_batched) {
  hopper_matmul<128, 2, 4, 1>(a_map, b_map, c, m, n, k, b_batched);
}

// Small tiles (64 x 64, one consumer warpgroup, 6 slots of 16 KiB, two blocks an SM, 2 slices
// in flight).
extern "C" __global__ void __launch_bounds__(256, 2)
    matmul_bf16_hopper_small(const __grid_constant__ TensorMap a_map, const __grid_constant__ TensorMap b_map,
                             u16* c, u64 m, u64 n, u64 k, int b_batched) {
  hopper_matmul<64, 1, 6, 2>(a_map, b_map, c, m, n, k, b_batched);
}

// Narrow tiles (64 x 32, one consumer warpgroup, 8 slots of 12 KiB, two blocks an SM, 4 slices
// in flight): few rows (decoding, small batches), where every SM streams its own columns of the
// weight.
extern "C" __global__ void __launch_bounds__(256, 2)
    matmul_bf16_hopper_narrow(const __grid_constant__ TensorMap a_map, const __grid_constant__ TensorMap b_map,
                              u16* c, u64 m, u64 n, u64 k, int b_batched) {
  hopper_matmul<32, 1, 8, 4>(a_map, b_map, c, m, n, k, b_batched);
}
