// Softmax and log-softmax over one axis of a row-major tensor viewed as [outer, C, inner]: the
// C elements of a row lie `s` apart (s = inner). Three kernel shapes (cuda/kernels/softmax.hpp
// picks one): rows (inner == 1, one block per row, s = 1: the [N, C] fast path), strided rows
// (one block per row, elements s apart: few long rows) and columns (one thread per row, threads of
// a warp on neighbouring rows so every read is coalesced: many rows along a non-last axis).

// The row's maximum and sum of exp(x - max): the shift keeps exp() finite for large logits, and
// the sum is >= 1 (the maximum contributes exp(0)). Every thread of the block gets both.
__device__ __forceinline__ void softmax_row_stats(const T* x, long long C, long long s, float* mx, float* sum) {
  float m = __uint_as_float(0xff800000u);  // -inf
  for (long long c = threadIdx.x; c < C; c += blockDim.x) m = fmaxf(m, to_f32(x[c * s]));
  m = block_max(m);
  float t = 0.0f;
  for (long long c = threadIdx.x; c < C; c += blockDim.x) t += expf(to_f32(x[c * s]) - m);
  *sum = block_sum(t);
  *mx = m;
}

// Row r of [outer, C, inner] starts at (r / inner) * C * inner + r % inner.
__device__ __forceinline__ long long softmax_row_base(long long r, long long C, long long inner) {
  return (r / inner) * C * inner + r % inner;
}

// ---- block per row, elements s apart (s == 1 in the rows kernels) ---------------------------

__device__ __forceinline__ void softmax_fwd_block(const T* x, T* y, long long C, long long s, bool log) {
  float mx, sum;
  softmax_row_stats(x, C, s, &mx, &sum);
  const float log_sum = logf(sum);
  for (long long c = threadIdx.x; c < C; c += blockDim.x) {
    const float v = to_f32(x[c * s]) - mx;
    store(y + c * s, log ? v - log_sum : expf(v) / sum);
  }
}

// softmax: dx = y (dy - sum_k dy_k y_k); log-softmax: dx = dy - exp(y) sum_k dy_k.
__device__ __forceinline__ void softmax_bwd_block(const T* y, const T* dy, T* dx, long long C, long long s, bool log) {
  float acc = 0.0f;
  for (long long c = threadIdx.x; c < C; c += blockDim.x)
    acc += log ? to_f32(dy[c * s]) : to_f32(dy[c * s]) * to_f32(y[c * s]);
  acc = block_sum(acc);
  for (long long c = threadIdx.x; c < C; c += blockDim.x) {
    const float yv = to_f32(y[c * s]), g = to_f32(dy[c * s]);
    store(dx + c * s, log ? g - expf(yv) * acc : yv * (g - acc));
  }
}

// y = exp(x - max) / sum exp(x - max), row by row of [N, C].
extern "C" __global__ void cutrain_softmax_forward(const T* x, T* y, long long C) {
  const long long off = static_cast<long long>(blockIdx.x) * C;
  softmax_fwd_block(x + off, y + off, C, 1, false);
}

// y = x - max - log(sum exp(x - max)), row by row of [N, C].
extern "C" __global__ void cutrain_log_softmax_forward(const T* x, T* y, long long C) {
  const long long off = static_cast<long long>(blockIdx.x) * C;
  softmax_fwd_block(x + off, y + off, C, 1, true);
}

extern "C" __global__ void cutrain_softmax_backward(const T* y, const T* dy, T* dx, long long C) {
  const long long off = static_cast<long long>(blockIdx.x) * C;
  softmax_bwd_block(y + off, dy + off, dx + off, C, 1, false);
}

extern "C" __global__ void cutrain_log_softmax_backward(const T* y, const T* dy, T* dx, long long C) {
  const long long off = static_cast<long long>(blockIdx.x) * C;
  softmax_bwd_block(y + off, dy + off, dx + off, C, 1, true);
}

// Strided rows: grid = outer * inner blocks (one per row), log selects log-softmax.
extern "C" __global__ void cutrain_softmax_forward_strided(const T* x, T* y, long long C, long long inner, int log) {
  const long long off = softmax_row_base(blockIdx.x, C, inner);
  softmax_fwd_block(x + off, y + off, C, inner, log != 0);
}

extern "C" __global__ void cutrain_softmax_backward_strided(const T* y, const T* dy, T* dx, long long C,
                                                            long long inner, int log) {
  const long long off = softmax_row_base(blockIdx.x, C, inner);
  softmax_bwd_block(y + off, dy + off, dx + off, C, inner, log != 0);
}

// ---- thread per row (columns) ---------------------------------------------------------------

// rows = outer * inner; a grid-stride loop over them. The maximum and the sum come from one pass
// (the running sum is rescaled when the maximum grows), then a second pass writes.
extern "C" __global__ void cutrain_softmax_forward_cols(const T* x, T* y, long long C, long long inner,
                                                        long long rows, int log) {
  for (long long r = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; r < rows;
       r += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long off = softmax_row_base(r, C, inner);
    const T* xr = x + off;
    T* yr = y + off;
    float m = __uint_as_float(0xff800000u), sum = 0.0f;
    for (long long c = 0; c < C; ++c) {
      const float v = to_f32(xr[c * inner]);
      if (v > m) {
        sum = sum * expf(m - v) + 1.0f;
        m = v;
      } else {
        sum += expf(v - m);
      }
    }
    const float log_sum = logf(sum);
    for (long long c = 0; c < C; ++c) {
      const float v = to_f32(xr[c * inner]) - m;
      store(yr + c * inner, log ? v - log_sum : expf(v) / sum);
    }
  }
}

extern "C" __global__ void cutrain_softmax_backward_cols(const T* y, const T* dy, T* dx, long long C, long long inner,
                                                         long long rows, int log) {
  for (long long r = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; r < rows;
       r += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long off = softmax_row_base(r, C, inner);
    float acc = 0.0f;
    for (long long c = 0; c < C; ++c) {
      const long long i = off + c * inner;
      acc += log ? to_f32(dy[i]) : to_f32(dy[i]) * to_f32(y[i]);
    }
    for (long long c = 0; c < C; ++c) {
      const long long i = off + c * inner;
      const float yv = to_f32(y[i]), g = to_f32(dy[i]);
      store(dx + i, log ? g - expf(yv) * acc : yv * (g - acc));
    }
  }
}
