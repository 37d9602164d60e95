// Activations, the semantics of cpu/activation.hpp in f32: the fallback where cuDNN's graph API
// has no engine for the pointwise node (cuda/kernels/activation.hpp). kind is the Activation enum
// as an int: 0 identity, 1 relu, 2 leaky_relu, 3 elu, 4 sigmoid, 5 tanh, 6 gelu_erf, 7 gelu_tanh,
// 8 silu. The batch-norm fallback (batch_norm_train.cuh) fuses act_forward too.
__device__ __forceinline__ float act_forward(int kind, float alpha, float x) {
  switch (kind) {
    case 1: return x > 0.0f ? x : 0.0f;
    case 2: return x > 0.0f ? x : alpha * x;
    case 3: return x > 0.0f ? x : alpha * expm1f(x);
    case 4: return 1.0f / (1.0f + expf(-x));
    case 5: return tanhf(x);
    case 6: return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    case 7: return 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
    case 8: return x / (1.0f + expf(-x));
    default: return x;
  }
}

// d act(x) / dx
__device__ __forceinline__ float act_derivative(int kind, float alpha, float x) {
  switch (kind) {
    case 1: return x > 0.0f ? 1.0f : 0.0f;
    case 2: return x > 0.0f ? 1.0f : alpha;
    case 3: return x > 0.0f ? 1.0f : alpha * expf(x);
    case 4: {
      const float s = 1.0f / (1.0f + expf(-x));
      return s * (1.0f - s);
    }
    case 5: {
      const float t = tanhf(x);
      return 1.0f - t * t;
    }
    case 6: {
      const float cdf = 0.5f * (1.0f + erff(x * 0.70710678118654752f));
      const float pdf = expf(-0.5f * x * x) * 0.39894228040143268f;
      return cdf + x * pdf;
    }
    case 7: {
      const float k = 0.79788456080286536f;
      const float t = tanhf(k * (x + 0.044715f * x * x * x));
      const float du = k * (1.0f + 3.0f * 0.044715f * x * x);
      return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
    }
    case 8: {
      const float s = 1.0f / (1.0f + expf(-x));
      return s * (1.0f + x * (1.0f - s));
    }
    default: return 1.0f;
  }
}

constexpr int VMAX = 16 / sizeof(T);
template <int V>
struct alignas(V * sizeof(T)) Pack {
  T v[V];
};

// y = act(x) over n elements of x and y laid out alike.
extern "C" __global__ void cutrain_activation_forward(const T* x, T* y, long long n, int kind, float alpha) {
  for (long long i = thread_index(); i < n; i += grid_stride()) store(y + i, act_forward(kind, alpha, to_f32(x[i])));
}

// dx = dy * act'(x) over n elements of x, dy and dx laid out alike.
extern "C" __global__ void cutrain_activation_backward(const T* x, const T* dy, T* dx, long long n, int kind,
                                                       float alpha) {
  for (long long i = thread_index(); i < n; i += grid_stride())
    store(dx + i, to_f32(dy[i]) * act_derivative(kind, alpha, to_f32(x[i])));
}

// The two above with VMAX elements (16 bytes) per thread over n / VMAX packs: the host launches
// them where n is a multiple of VMAX and every pointer is 16-byte aligned.
extern "C" __global__ void cutrain_activation_forward_vec(const T* x, T* y, long long packs, int kind, float alpha) {
  for (long long i = thread_index(); i < packs; i += grid_stride()) {
    const Pack<VMAX> px = reinterpret_cast<const Pack<VMAX>*>(x)[i];
    Pack<VMAX> py;
#pragma unroll
    for (int k = 0; k < VMAX; ++k) store(&py.v[k], act_forward(kind, alpha, to_f32(px.v[k])));
    reinterpret_cast<Pack<VMAX>*>(y)[i] = py;
  }
}
extern "C" __global__ void cutrain_activation_backward_vec(const T* x, const T* dy, T* dx, long long packs, int kind,
                                                           float alpha) {
  for (long long i = thread_index(); i < packs; i += grid_stride()) {
    const Pack<VMAX> px = reinterpret_cast<const Pack<VMAX>*>(x)[i], pd = reinterpret_cast<const Pack<VMAX>*>(dy)[i];
    Pack<VMAX> pdx;
#pragma unroll
    for (int k = 0; k < VMAX; ++k) store(&pdx.v[k], to_f32(pd.v[k]) * act_derivative(kind, alpha, to_f32(px.v[k])));
    reinterpret_cast<Pack<VMAX>*>(dx)[i] = pdx;
  }
}
