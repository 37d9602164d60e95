__device__ __forceinline__ unsigned long long splitmix64(unsigned long long x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

__device__ __forceinline__ double uniform_at(unsigned long long seed, unsigned long long index) {
  const unsigned long long r = splitmix64(splitmix64(seed) ^ (index * 0xd1b54a32d192ed03ull));
  return static_cast<double>(r >> 11) * 0x1.0p-53;
}

// x, y and mask are contiguous and laid out alike: row-major (nhwc == 0), or NHWC with logical
// dims [*, C, H, W], whose memory offsets are turned back into logical NCHW indices.
// keep_scale is 1 / (1 - p) already rounded to T.
extern "C" __global__ void cutrain_dropout_forward(const T* x, T* y, T* mask, long long n, double p,
                                                   unsigned long long seed, float keep_scale, int nhwc,
                                                   long long C, long long H, long long W) {
  for (long long i = thread_index(); i < n; i += grid_stride()) {
    long long logical = i;
    if (nhwc) {
      const long long c = i % C;
      const long long w = (i / C) % W;
      const long long h = (i / (C * W)) % H;
      const long long img = i / (C * W * H);
      logical = ((img * C + c) * H + h) * W + w;
    }
    const float m = uniform_at(seed, static_cast<unsigned long long>(logical)) < p ? 0.0f : keep_scale;
    store(mask + i, m);
    store(y + i, to_f32(x[i]) * m);
  }
}
