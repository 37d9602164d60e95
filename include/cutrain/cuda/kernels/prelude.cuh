// ---- cutrain kernel prelude ----
// f16 and bf16 as their bits; arithmetic happens in f32.
struct cutrain_f16 { unsigned short bits; };
struct cutrain_bf16 { unsigned short bits; };

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(cutrain_bf16 x) { return __uint_as_float(static_cast<unsigned>(x.bits) << 16); }
__device__ __forceinline__ float to_f32(cutrain_f16 x) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
  return f;
}

// Stores an f32 value as the element type, rounding to nearest even (as the host's half and
// bfloat16 do).
__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(cutrain_f16* p, float v) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
  p->bits = h;
}
__device__ __forceinline__ void store(cutrain_bf16* p, float v) {
  const unsigned u = __float_as_uint(v);
  if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN stays a quiet NaN
    p->bits = static_cast<unsigned short>((u >> 16) | 0x0040u);
  } else {
    p->bits = static_cast<unsigned short>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
}

// Grid-stride loops over n elements: for (long long i = thread_index(); i < n; i += grid_stride()).
__device__ __forceinline__ long long thread_index() { return static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ __forceinline__ long long grid_stride() { return static_cast<long long>(gridDim.x) * blockDim.x; }

// Butterfly reductions: every lane ends with the same bits, in a fixed order (deterministic).
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum and max over a one-dimensional block whose size is a multiple of 32; every thread gets
// the result. Every thread of the block must call them.
__device__ float block_sum(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // a previous call's readers are done with partial
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  return warp_sum(lane < warps ? partial[lane] : 0.0f);
}
__device__ float block_max(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  return warp_max(lane < warps ? partial[lane] : __uint_as_float(0xff800000u));  // -inf
}
// ---- end of prelude ----
