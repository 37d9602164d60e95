// x / scale as FP8 e4m3 bytes, rounded to nearest even and saturated to +-448 (NaN stays NaN):
// bit for bit core/fp8.hpp's e4m3_from_float.
__device__ __forceinline__ unsigned e4m3_from_f32(float f) {
  const unsigned u = __float_as_uint(f);
  const unsigned sign = (u >> 24) & 0x80u;
  if (f != f) return sign | 0x7fu;
  const float a = fabsf(f);
  if (a >= 448.0f) return sign | 0x7eu;
  if (a < 0.015625f) return sign | static_cast<unsigned>(rintf(a * 512.0f));
  const unsigned b = __float_as_uint(a);
  const unsigned r = b + 0x7ffffu + ((b >> 20) & 1u);
  const int e = static_cast<int>(r >> 23) - 127 + 7;
  const unsigned code = (static_cast<unsigned>(e) << 3) | ((r >> 20) & 7u);
  return sign | (code < 0x7eu ? code : 0x7eu);
}

// packed (y 4-byte aligned): four elements per thread and one 32-bit store, then the tail.
extern "C" __global__ void cutrain_quantize_e4m3(const T* x, unsigned char* y, float inv_scale, long long n, int packed) {
  long long start = 0;
  if (packed) {
    const long long n4 = n / 4;
    unsigned* y4 = reinterpret_cast<unsigned*>(y);
    for (long long i = thread_index(); i < n4; i += grid_stride()) {
      const T* p = x + i * 4;
      y4[i] = e4m3_from_f32(to_f32(p[0]) * inv_scale) | (e4m3_from_f32(to_f32(p[1]) * inv_scale) << 8) |
              (e4m3_from_f32(to_f32(p[2]) * inv_scale) << 16) | (e4m3_from_f32(to_f32(p[3]) * inv_scale) << 24);
    }
    start = n4 * 4;
  }
  for (long long i = start + thread_index(); i < n; i += grid_stride())
    y[i] = static_cast<unsigned char>(e4m3_from_f32(to_f32(x[i]) * inv_scale));
}
