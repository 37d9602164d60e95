// Layer norm forward over the rows of a row-major [R, d] tensor (cuda/kernels/layer_norm.hpp):
// one warp per row, a grid-stride loop over rows. Per row: the mean, then the mean of the squared
// deviations (two passes, as cpu/layer_norm.hpp; the second pass and the write read the row again,
// from L1), y = (x - mean) * inv_std * gamma + beta. f32 arithmetic, sums in a fixed order
// (deterministic), y rounded once to T; mean and inv_std written in f32 when given.

constexpr int VMAX = 16 / sizeof(T);
template <int V>
struct alignas(V * sizeof(T)) Pack {
  T v[V];
};

// Row x of d elements (d a multiple of V, x and y 16-byte aligned when V > 1), by the calling warp.
template <int V>
__device__ __forceinline__ void ln_row(const T* x, T* y, const float* gamma, const float* beta, long long d, float eps,
                                       float* mean_out, float* inv_std_out) {
  const int lane = threadIdx.x & 31;
  float s = 0.0f;
  for (long long c = lane * V; c < d; c += 32 * V) {
    const Pack<V> p = *reinterpret_cast<const Pack<V>*>(x + c);
#pragma unroll
    for (int k = 0; k < V; ++k) s += to_f32(p.v[k]);
  }
  const float mean = warp_sum(s) / static_cast<float>(d);
  float q = 0.0f;
  for (long long c = lane * V; c < d; c += 32 * V) {
    const Pack<V> p = *reinterpret_cast<const Pack<V>*>(x + c);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float t = to_f32(p.v[k]) - mean;
      q += t * t;
    }
  }
  const float inv_std = 1.0f / sqrtf(warp_sum(q) / static_cast<float>(d) + eps);
  for (long long c = lane * V; c < d; c += 32 * V) {
    const Pack<V> p = *reinterpret_cast<const Pack<V>*>(x + c);
    Pack<V> out;
#pragma unroll
    for (int k = 0; k < V; ++k) store(&out.v[k], (to_f32(p.v[k]) - mean) * inv_std * gamma[c + k] + beta[c + k]);
    *reinterpret_cast<Pack<V>*>(y + c) = out;
  }
  if (lane == 0 && mean_out) {
    *mean_out = mean;
    *inv_std_out = inv_std;
  }
}

// Warp w of the grid takes rows w, w + warps, ...; blocks of a multiple of 32 threads. mean and
// inv_std: [R] in f32, or both null.
template <int V>
__device__ __forceinline__ void ln_rows(const T* x, T* y, const float* gamma, const float* beta, float* mean,
                                        float* inv_std, long long R, long long d, float eps) {
  const long long warps = grid_stride() >> 5;
  for (long long r = thread_index() >> 5; r < R; r += warps)
    ln_row<V>(x + r * d, y + r * d, gamma, beta, d, eps, mean ? mean + r : nullptr, inv_std ? inv_std + r : nullptr);
}

// NAME moves one element per lane and access, NAME_vec VMAX (16-byte loads and stores).
extern "C" __global__ void cutrain_layer_norm_forward(const T* x, T* y, const float* gamma, const float* beta,
                                                      float* mean, float* inv_std, long long R, long long d, float eps) {
  ln_rows<1>(x, y, gamma, beta, mean, inv_std, R, d, eps);
}

extern "C" __global__ void cutrain_layer_norm_forward_vec(const T* x, T* y, const float* gamma, const float* beta,
                                                          float* mean, float* inv_std, long long R, long long d,
                                                          float eps) {
  ln_rows<VMAX>(x, y, gamma, beta, mean, inv_std, R, d, eps);
}
