constexpr int VMAX = 16 / sizeof(T);
template <int V>
struct alignas(V * sizeof(T)) Pack {
  T v[V];
};

__device__ __forceinline__ float bn_scale(const float* gamma, const float* var, double eps, long long c) {
  return static_cast<float>(static_cast<double>(gamma[c]) / sqrt(static_cast<double>(var[c]) + eps));
}

// Channels innermost (NHWC, [N, C]): rows r = n S + s of C channels, at r * rs + c * cs. Blocks of
// bx x by threads: thread (tx, ty) takes channels V (bx blockIdx.x + tx) .. + V - 1 and rows
// by blockIdx.y + ty, stepping by gridDim.y.
template <int V>
__device__ __forceinline__ void bn_rows(const T* x, T* y, const float* gamma, const float* beta, const float* mean,
                                        const float* var, double eps, long long R, long long C, long long x_rs,
                                        long long x_cs, long long y_rs, long long y_cs) {
  const long long c = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  if (c >= C) return;
  float m[V], scale[V], shift[V];
#pragma unroll
  for (int k = 0; k < V; ++k) {
    m[k] = mean[c + k];
    scale[k] = bn_scale(gamma, var, eps, c + k);
    shift[k] = beta[c + k];
  }
  const long long step = static_cast<long long>(gridDim.y) * blockDim.y;
  for (long long r = static_cast<long long>(blockIdx.y) * blockDim.y + threadIdx.y; r < R; r += step) {
    const Pack<V> in = *reinterpret_cast<const Pack<V>*>(x + r * x_rs + c * x_cs);
    Pack<V> out;
#pragma unroll
    for (int k = 0; k < V; ++k) store(&out.v[k], (to_f32(in.v[k]) - m[k]) * scale[k] + shift[k]);
    *reinterpret_cast<Pack<V>*>(y + r * y_rs + c * y_cs) = out;
  }
}

// NAME moves one element per thread, NAME_vec VMAX (separate kernels: separate register counts).
#define BN_ROWS_PARAMS                                                                                               \
  const T *x, T *y, const float *gamma, const float *beta, const float *mean, const float *var, double eps,         \
      long long R, long long C, long long x_rs, long long x_cs, long long y_rs, long long y_cs
#define BN_ROWS_ARGS x, y, gamma, beta, mean, var, eps, R, C, x_rs, x_cs, y_rs, y_cs
extern "C" __global__ void cutrain_batch_norm_inference_rows(BN_ROWS_PARAMS) { bn_rows<1>(BN_ROWS_ARGS); }
extern "C" __global__ void cutrain_batch_norm_inference_rows_vec(BN_ROWS_PARAMS) { bn_rows<VMAX>(BN_ROWS_ARGS); }

// Channels outer (NCHW): one block per (n, c) plane of S elements at s * ss, grid-stride over
// the N C planes; each thread moves V adjacent elements of the plane at a time.
template <int V>
__device__ __forceinline__ void bn_planes(const T* x, T* y, const float* gamma, const float* beta, const float* mean,
                                          const float* var, double eps, long long N, long long C, long long S,
                                          long long xn, long long xc, long long xs, long long yn, long long yc,
                                          long long ys) {
  for (long long p = blockIdx.x; p < N * C; p += gridDim.x) {
    const long long n = p / C, c = p - n * C;
    const float m = mean[c], scale = bn_scale(gamma, var, eps, c), shift = beta[c];
    const T* xp = x + n * xn + c * xc;
    T* yp = y + n * yn + c * yc;
    for (long long s = static_cast<long long>(threadIdx.x) * V; s < S; s += static_cast<long long>(blockDim.x) * V) {
      const Pack<V> in = *reinterpret_cast<const Pack<V>*>(xp + s * xs);
      Pack<V> out;
#pragma unroll
      for (int k = 0; k < V; ++k) store(&out.v[k], (to_f32(in.v[k]) - m) * scale + shift);
      *reinterpret_cast<Pack<V>*>(yp + s * ys) = out;
    }
  }
}

#define BN_PLANES_PARAMS                                                                                             \
  const T *x, T *y, const float *gamma, const float *beta, const float *mean, const float *var, double eps,         \
      long long N, long long C, long long S, long long xn, long long xc, long long xs, long long yn, long long yc,    \
      long long ys
#define BN_PLANES_ARGS x, y, gamma, beta, mean, var, eps, N, C, S, xn, xc, xs, yn, yc, ys
extern "C" __global__ void cutrain_batch_norm_inference_planes(BN_PLANES_PARAMS) { bn_planes<1>(BN_PLANES_ARGS); }
extern "C" __global__ void cutrain_batch_norm_inference_planes_vec(BN_PLANES_PARAMS) {
  bn_planes<VMAX>(BN_PLANES_ARGS);
}
