// What every kernel file of repro shares: integer types, and the few definitions that differ
// between the GPU and the host build of the hashing functions (kernels/host_test.c defines
// REPRO_HOST_TEST and includes this file and kernels/hash.cu, as C).
//
// The GPU kernels are compiled at run time with NVRTC (src/cuda/kernels.rs): this file, then
// hash.cu, hash_kernels.cu, reduce.cu and matmul_f32.cu, as one module; matmul_bf16.cu, which
// needs sm_80, and matmul_bf16_hopper.cu, which needs sm_90a, are modules of their own.

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

// load16(p, w): the four little-endian words at p, which is 16-byte aligned: one 16-byte load
// on the GPU.
#ifdef REPRO_HOST_TEST
static void load16(const unsigned char* p, u32 w[4]) { memcpy(w, p, 16); }
#else
__device__ __forceinline__ void load16(const unsigned char* p, u32 w[4]) {
  const uint4 v = *(const uint4*)p;
  w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w;
}
#endif

// store32(p, w): eight words to p, which is 32-byte aligned: two 16-byte stores on the GPU.
#ifdef REPRO_HOST_TEST
static void store32(u32* p, const u32 w[8]) { memcpy(p, w, 32); }
#else
__device__ __forceinline__ void store32(u32* p, const u32 w[8]) {
  ((uint4*)p)[0] = make_uint4(w[0], w[1], w[2], w[3]);
  ((uint4*)p)[1] = make_uint4(w[4], w[5], w[6], w[7]);
}
#endif
