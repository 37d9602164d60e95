// row_loss (may be null): loss of each row, f32. dlogits (may be null): (softmax - q) * grad_scale
// (times *dloss when dloss is not null: the upstream gradient, read on the device so that a
// backward pass needs no copy to the host).
extern "C" __global__ void cutrain_cross_entropy_rows(const T* logits, const int* labels, long long C, float eps,
                                                      float* row_loss, T* dlogits, float grad_scale, const T* dloss) {
  const long long row = blockIdx.x;
  if (dloss != 0) grad_scale *= to_f32(*dloss);
  const T* x = logits + row * C;
  float mx = __uint_as_float(0xff800000u);  // -inf
  for (long long c = threadIdx.x; c < C; c += blockDim.x) mx = fmaxf(mx, to_f32(x[c]));
  mx = block_max(mx);
  float sum_exp = 0.0f, sum_x = 0.0f;
  for (long long c = threadIdx.x; c < C; c += blockDim.x) {
    const float v = to_f32(x[c]);
    sum_exp += expf(v - mx);
    sum_x += v;
  }
  sum_exp = block_sum(sum_exp);
  sum_x = block_sum(sum_x);
  const float lse = mx + logf(sum_exp);  // log sum exp: log_softmax(x)_c = x_c - lse
  const int label = labels[row];
  // The ops check labels on the host (except under CUDA graph capture); here an out-of-range one
  // gives NaN, never a read outside the row.
  const bool bad_label = label < 0 || label >= C;
  const float nan = __uint_as_float(0x7fc00000u);
  if (row_loss != 0 && threadIdx.x == 0) {
    const float picked = bad_label ? nan : to_f32(x[label]) - lse;
    const float sum_logp = sum_x - static_cast<float>(C) * lse;
    row_loss[row] = -((1.0f - eps) * picked + eps / static_cast<float>(C) * sum_logp);
  }
  if (dlogits != 0) {
    T* d = dlogits + row * C;
    const float off = eps / static_cast<float>(C);
    for (long long c = threadIdx.x; c < C; c += blockDim.x) {
      float g = expf(to_f32(x[c]) - lse) - off;
      if (c == label) g -= 1.0f - eps;
      store(d + c, bad_label ? nan : g * grad_scale);
    }
  }
}

// loss[0] = sum of row_loss[0..N) (divided by N when mean != 0), summed in f64. Needs exactly
// 256 threads in one block.
extern "C" __global__ void cutrain_cross_entropy_reduce(const float* row_loss, long long N, int mean, T* loss) {
  __shared__ double part[256];
  double s = 0.0;
  for (long long i = threadIdx.x; i < N; i += blockDim.x) s += row_loss[i];
  part[threadIdx.x] = s;
  __syncthreads();
  for (unsigned half_size = 128; half_size > 0; half_size >>= 1) {
    if (threadIdx.x < half_size) part[threadIdx.x] += part[threadIdx.x + half_size];
    __syncthreads();
  }
  if (threadIdx.x == 0) store(loss, static_cast<float>(mean ? part[0] / static_cast<double>(N) : part[0]));
}
