// Batch-norm training forward and backward with the semantics of cpu/batch_norm.hpp: the fallback
// where cuDNN's graph API has no engine (odd channel counts on the H200: cuda/kernels/
// batch_norm_train.hpp). x, y, dy, dx are [N, C, S] (S = H W) with their own strides; the [C]
// vectors are f32. One block per channel (grid-stride over channels), a multiple of 32 threads;
// sums in f32 per thread and then block_sum in a fixed order (deterministic). The program's text
// starts with activation.cuh, whose act_forward the forward fuses.

// Element (n, s) of channel c at n * sn + c * sc + s * ss; i = n S + s walks the channel.
__device__ __forceinline__ long long bn_offset(long long i, long long S, long long sn, long long sc, long long ss,
                                               long long c) {
  const long long n = i / S, s = i - n * S;
  return n * sn + c * sc + s * ss;
}

// Two passes over x (mean, then squared deviations, as the CPU does: no cancellation), then y.
// running statistics: next = (1 - momentum) old + momentum batch (the unbiased variance).
extern "C" __global__ void cutrain_batch_norm_train_forward(
    const T* x, T* y, const float* gamma, const float* beta, const float* running_mean, const float* running_var,
    float* save_mean, float* save_inv_std, float* next_mean, float* next_var, long long N, long long C, long long S,
    long long xn, long long xc, long long xs, long long yn, long long yc, long long ys, double eps, double momentum,
    int act_kind, float act_alpha) {
  const long long M = N * S;
  for (long long c = blockIdx.x; c < C; c += gridDim.x) {
    float sum = 0.0f;
    for (long long i = threadIdx.x; i < M; i += blockDim.x) sum += to_f32(x[bn_offset(i, S, xn, xc, xs, c)]);
    const float mean = block_sum(sum) / static_cast<float>(M);
    float sq = 0.0f;
    for (long long i = threadIdx.x; i < M; i += blockDim.x) {
      const float d = to_f32(x[bn_offset(i, S, xn, xc, xs, c)]) - mean;
      sq += d * d;
    }
    const float var = block_sum(sq) / static_cast<float>(M);
    const float inv_std = static_cast<float>(1.0 / sqrt(static_cast<double>(var) + eps));
    const float scale = gamma[c] * inv_std, shift = beta[c] - mean * scale;
    for (long long i = threadIdx.x; i < M; i += blockDim.x) {
      const float v = to_f32(x[bn_offset(i, S, xn, xc, xs, c)]) * scale + shift;
      store(y + bn_offset(i, S, yn, yc, ys, c), act_forward(act_kind, act_alpha, v));
    }
    if (threadIdx.x == 0) {
      save_mean[c] = mean;
      save_inv_std[c] = inv_std;
      const double unbiased = static_cast<double>(var) * static_cast<double>(M) / static_cast<double>(M - 1);
      next_mean[c] = static_cast<float>((1.0 - momentum) * running_mean[c] + momentum * mean);
      next_var[c] = static_cast<float>((1.0 - momentum) * running_var[c] + momentum * unbiased);
    }
  }
}

// With xhat = (x - mean) inv_std and M = N S: dbeta = sum dy, dgamma = sum dy xhat,
// dx = gamma inv_std / M (M dy - dbeta - xhat dgamma).
extern "C" __global__ void cutrain_batch_norm_train_backward(
    const T* x, const T* dy, T* dx, const float* gamma, const float* save_mean, const float* save_inv_std,
    float* dgamma, float* dbeta, long long N, long long C, long long S, long long xn, long long xc, long long xs,
    long long gn, long long gc, long long gs, long long dn, long long dc, long long ds) {
  const long long M = N * S;
  for (long long c = blockIdx.x; c < C; c += gridDim.x) {
    const float mean = save_mean[c], inv_std = save_inv_std[c];
    float sum_dy = 0.0f, sum_dy_xhat = 0.0f;
    for (long long i = threadIdx.x; i < M; i += blockDim.x) {
      const float g = to_f32(dy[bn_offset(i, S, gn, gc, gs, c)]);
      const float xhat = (to_f32(x[bn_offset(i, S, xn, xc, xs, c)]) - mean) * inv_std;
      sum_dy += g;
      sum_dy_xhat += g * xhat;
    }
    const float db = block_sum(sum_dy);
    const float dg = block_sum(sum_dy_xhat);
    const float k = gamma[c] * inv_std / static_cast<float>(M);
    const float m = static_cast<float>(M);
    for (long long i = threadIdx.x; i < M; i += blockDim.x) {
      const float g = to_f32(dy[bn_offset(i, S, gn, gc, gs, c)]);
      const float xhat = (to_f32(x[bn_offset(i, S, xn, xc, xs, c)]) - mean) * inv_std;
      store(dx + bn_offset(i, S, dn, dc, ds, c), k * (m * g - db - xhat * dg));
    }
    if (threadIdx.x == 0) {
      dgamma[c] = dg;
      dbeta[c] = db;
    }
  }
}
