// The row's maximum and sum of exp(x - max): the shift keeps exp() finite for large logits, and
// the sum is >= 1 (the maximum contributes exp(0)). Every thread of the block gets both.
__device__ __forceinline__ void softmax_row_stats(const T* x, long long C, float* mx, float* sum) {
  float m = __uint_as_float(0xff800000u);  // -inf
  for (long long c = threadIdx.x; c < C; c += blockDim.x) m = fmaxf(m, to_f32(x[c]));
  m = block_max(m);
  float s = 0.0f;
  for (long long c = threadIdx.x; c < C; c += blockDim.x) s += expf(to_f32(x[c]) - m);
  *sum = block_sum(s);
  *mx = m;
}

// y = exp(x - max) / sum exp(x - max).
extern "C" __global__ void cutrain_softmax_forward(const T* x, T* y, long long C) {
  const long long off = static_cast<long long>(blockIdx.x) * C;
  x += off;
  y += off;
  float mx, sum;
  softmax_row_stats(x, C, &mx, &sum);
  for (long long c = threadIdx.x; c < C; c += blockDim.x) store(y + c, expf(to_f32(x[c]) - mx) / sum);
}

// y = x - max - log(sum exp(x - max)).
extern "C" __global__ void cutrain_log_softmax_forward(const T* x, T* y, long long C) {
  const long long off = static_cast<long long>(blockIdx.x) * C;
  x += off;
  y += off;
  float mx, sum;
  softmax_row_stats(x, C, &mx, &sum);
  const float log_sum = logf(sum);
  for (long long c = threadIdx.x; c < C; c += blockDim.x) store(y + c, (to_f32(x[c]) - mx) - log_sum);
}

// y = softmax(x): dx = y (dy - sum_k dy_k y_k).
extern "C" __global__ void cutrain_softmax_backward(const T* y, const T* dy, T* dx, long long C) {
  const long long off = static_cast<long long>(blockIdx.x) * C;
  y += off;
  dy += off;
  dx += off;
  float dot = 0.0f;
  for (long long c = threadIdx.x; c < C; c += blockDim.x) dot += to_f32(dy[c]) * to_f32(y[c]);
  dot = block_sum(dot);
  for (long long c = threadIdx.x; c < C; c += blockDim.x) store(dx + c, to_f32(y[c]) * (to_f32(dy[c]) - dot));
}

// y = log_softmax(x): dx = dy - exp(y) sum_k dy_k.
extern "C" __global__ void cutrain_log_softmax_backward(const T* y, const T* dy, T* dx, long long C) {
  const long long off = static_cast<long long>(blockIdx.x) * C;
  y += off;
  dy += off;
  dx += off;
  float sum = 0.0f;
  for (long long c = threadIdx.x; c < C; c += blockDim.x) sum += to_f32(dy[c]);
  sum = block_sum(sum);
  for (long long c = threadIdx.x; c < C; c += blockDim.x) store(dx + c, to_f32(dy[c]) - expf(to_f32(y[c])) * sum);
}
