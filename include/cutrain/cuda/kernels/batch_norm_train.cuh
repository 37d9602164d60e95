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

// ---- The fast backward of y = act(batch_norm(x) [+ residual]), act relu (relu = 1) or identity:
// dz = act'(y) dy, dbeta = sum dz, dgamma = sum dz xhat, dx = A dz + B x + K per channel (A = gamma
// inv_std, B = -A inv_std dgamma / M, K = -A dbeta / M - B mean). Three kernels over dense
// tensors: reduce (per-block partial sums, writing dz when asked), finish (the partials summed in
// a fixed order: deterministic; dgamma, dbeta and A, B, K), apply. Channels-last (_cl): rows of C
// with C a multiple of VMAX, 16-byte packs of VMAX channels, each thread on one pack column (its
// channels' coefficients in registers); channels-first (_cf): [N, C, S] planes, a block per
// channel and group of planes, packs along S where S is a multiple of VMAX (vec = 1), else one
// element at a time. The apply passes walk the rows (planes) backwards: the reduce read the last
// ones last, so they are still in L2. No 64-bit division in the loops.

// dz of one element: dy where relu passes it, else 0.
__device__ __forceinline__ float bn_dz(float g, const T* y, long long i, int relu) {
  return relu && !(to_f32(y[i]) > 0.0f) ? 0.0f : g;
}

// part[b C + c] and part[P C + b C + c]: block b's sums of dz and dz (x - mean) for channel c.
// 256 threads; grid (P, ceil(C / VMAX / 256)).
extern "C" __global__ void __launch_bounds__(256) cutrain_bn_bwd_reduce_cl(const T* x, const T* y, const T* dy, T* dz,
                                                                         const float* mean, long long M, int C,
                                                                         int relu, float* part) {
  __shared__ float sh[2][256 * VMAX];
  const int cols = C / VMAX, cb = min(cols, 256), rb = 256 / cb;
  const int lc = threadIdx.x % cb, lr = threadIdx.x / cb, col = blockIdx.y * cb + lc;
  const bool active = lr < rb && col < cols;
  float s[VMAX], sx[VMAX], mu[VMAX];
#pragma unroll
  for (int k = 0; k < VMAX; ++k) {
    s[k] = sx[k] = 0.0f;
    mu[k] = active ? mean[col * VMAX + k] : 0.0f;
  }
  if (active)
    for (long long r = static_cast<long long>(blockIdx.x) * rb + lr; r < M; r += static_cast<long long>(gridDim.x) * rb) {
      const long long p = r * cols + col;
      const Pack<VMAX> px = reinterpret_cast<const Pack<VMAX>*>(x)[p], pg = reinterpret_cast<const Pack<VMAX>*>(dy)[p];
      Pack<VMAX> py{};
      if (relu) py = reinterpret_cast<const Pack<VMAX>*>(y)[p];
      Pack<VMAX> pz;
#pragma unroll
      for (int k = 0; k < VMAX; ++k) {
        const float g = relu && !(to_f32(py.v[k]) > 0.0f) ? 0.0f : to_f32(pg.v[k]);
        s[k] += g;
        sx[k] += g * (to_f32(px.v[k]) - mu[k]);
        pz.v[k] = relu && !(to_f32(py.v[k]) > 0.0f) ? T{} : pg.v[k];
      }
      if (dz) reinterpret_cast<Pack<VMAX>*>(dz)[p] = pz;
    }
#pragma unroll
  for (int k = 0; k < VMAX; ++k) {
    sh[0][threadIdx.x * VMAX + k] = s[k];
    sh[1][threadIdx.x * VMAX + k] = sx[k];
  }
  __syncthreads();
  if (lr != 0 || col >= cols) return;
  for (int j = 1; j < rb; ++j)
#pragma unroll
    for (int k = 0; k < VMAX; ++k) {
      s[k] += sh[0][(j * cb + lc) * VMAX + k];
      sx[k] += sh[1][(j * cb + lc) * VMAX + k];
    }
  const long long P = gridDim.x;
#pragma unroll
  for (int k = 0; k < VMAX; ++k) {
    part[blockIdx.x * static_cast<long long>(C) + col * VMAX + k] = s[k];
    part[(P + blockIdx.x) * static_cast<long long>(C) + col * VMAX + k] = sx[k];
  }
}

// Position of a block's threads over its planes n = b, b + P, ... of [N, C, S]: plane k and
// unit q (a pack or an element) of per units; next() moves both by the block's size.
struct PlaneWalk {
  long long k, q, per, dk, dq;
  __device__ PlaneWalk(long long per_) : k(threadIdx.x / per_), q(threadIdx.x % per_), per(per_), dk(blockDim.x / per_),
                                         dq(blockDim.x % per_) {}
  __device__ void next() {
    k += dk;
    q += dq;
    if (q >= per) q -= per, ++k;
  }
};

// The same over [N, C, S]: block (b, c) sums planes n = b, b + P, ... of channel c, its threads
// spread over all of them at once (packs of VMAX where vec, else elements).
extern "C" __global__ void __launch_bounds__(256) cutrain_bn_bwd_reduce_cf(const T* x, const T* y, const T* dy, T* dz,
                                                                         const float* mean, long long N, int C,
                                                                         long long S, int relu, int vec, float* part) {
  const int c = blockIdx.y;
  const float mu = mean[c];
  const long long P = gridDim.x, planes = (N - blockIdx.x + P - 1) / P;
  float s = 0.0f, sx = 0.0f;
  for (PlaneWalk w(vec ? S / VMAX : S); w.k < planes; w.next()) {
    const long long n = blockIdx.x + w.k * P;
    if (vec) {
      const long long p = (n * C + c) * w.per + w.q;
      const Pack<VMAX> px = reinterpret_cast<const Pack<VMAX>*>(x)[p], pg = reinterpret_cast<const Pack<VMAX>*>(dy)[p];
      Pack<VMAX> py{};
      if (relu) py = reinterpret_cast<const Pack<VMAX>*>(y)[p];
      Pack<VMAX> pz;
#pragma unroll
      for (int e = 0; e < VMAX; ++e) {
        const bool off = relu && !(to_f32(py.v[e]) > 0.0f);
        const float g = off ? 0.0f : to_f32(pg.v[e]);
        s += g;
        sx += g * (to_f32(px.v[e]) - mu);
        pz.v[e] = off ? T{} : pg.v[e];
      }
      if (dz) reinterpret_cast<Pack<VMAX>*>(dz)[p] = pz;
    } else {
      const long long i = (n * C + c) * S + w.q;
      const float g = bn_dz(to_f32(dy[i]), y, i, relu);
      s += g;
      sx += g * (to_f32(x[i]) - mu);
      if (dz) store(dz + i, g);
    }
  }
  s = block_sum(s);
  sx = block_sum(sx);
  if (threadIdx.x == 0) {
    part[blockIdx.x * static_cast<long long>(C) + c] = s;
    part[(P + blockIdx.x) * static_cast<long long>(C) + c] = sx;
  }
}

// Block c adds channel c's P partials (threads stride over them, then block_sum: a fixed order)
// and writes dbeta, dgamma and coef[c], coef[C + c], coef[2 C + c] = A, B, K.
extern "C" __global__ void cutrain_bn_bwd_finish(const float* part, long long P, int C, long long M,
                                                 const float* gamma, const float* mean, const float* inv_std,
                                                 float* dgamma, float* dbeta, float* coef) {
  for (int c = blockIdx.x; c < C; c += gridDim.x) {
    float s = 0.0f, sx = 0.0f;
    for (long long b = threadIdx.x; b < P; b += blockDim.x) {
      s += part[b * C + c];
      sx += part[(P + b) * C + c];
    }
    s = block_sum(s);
    sx = block_sum(sx);
    if (threadIdx.x == 0) {
      const float is = inv_std[c], dg = sx * is, a = gamma[c] * is, m = static_cast<float>(M);
      const float b = -a * is * dg / m;
      dbeta[c] = s;
      dgamma[c] = dg;
      coef[c] = a;
      coef[C + c] = b;
      coef[2 * C + c] = -a * s / m - b * mean[c];
    }
  }
}

// dx = A dz + B x + K; dz read from dz when the reduce wrote it, else from dy and y. Threads laid
// out as the reduce's (grid (P, ceil(C / VMAX / 256))), rows taken from the last.
extern "C" __global__ void __launch_bounds__(256) cutrain_bn_bwd_apply_cl(const T* x, const T* y, const T* dy,
                                                                        const T* dz, T* dx, const float* coef,
                                                                        long long M, int C, int relu) {
  const int cols = C / VMAX, cb = min(cols, 256), rb = 256 / cb;
  const int lc = threadIdx.x % cb, lr = threadIdx.x / cb, col = blockIdx.y * cb + lc;
  if (lr >= rb || col >= cols) return;
  const T* g_src = dz ? dz : dy;
  const int rl = relu && !dz;
  float a[VMAX], b[VMAX], k0[VMAX];
#pragma unroll
  for (int k = 0; k < VMAX; ++k) {
    const int c = col * VMAX + k;
    a[k] = coef[c], b[k] = coef[C + c], k0[k] = coef[2 * C + c];
  }
  for (long long r = static_cast<long long>(blockIdx.x) * rb + lr; r < M; r += static_cast<long long>(gridDim.x) * rb) {
    const long long p = (M - 1 - r) * cols + col;
    const Pack<VMAX> px = reinterpret_cast<const Pack<VMAX>*>(x)[p], pg = reinterpret_cast<const Pack<VMAX>*>(g_src)[p];
    Pack<VMAX> py{};
    if (rl) py = reinterpret_cast<const Pack<VMAX>*>(y)[p];
    Pack<VMAX> pd;
#pragma unroll
    for (int k = 0; k < VMAX; ++k) {
      const float g = rl && !(to_f32(py.v[k]) > 0.0f) ? 0.0f : to_f32(pg.v[k]);
      store(&pd.v[k], a[k] * g + b[k] * to_f32(px.v[k]) + k0[k]);
    }
    reinterpret_cast<Pack<VMAX>*>(dx)[p] = pd;
  }
}

// The same over [N, C, S], a block per channel (grid (P, C)) and planes n = N - 1 - (b + k P).
extern "C" __global__ void __launch_bounds__(256) cutrain_bn_bwd_apply_cf(const T* x, const T* y, const T* dy,
                                                                        const T* dz, T* dx, const float* coef,
                                                                        long long N, int C, long long S, int relu,
                                                                        int vec) {
  const int c = blockIdx.y;
  const float a = coef[c], b = coef[C + c], k0 = coef[2 * C + c];
  const T* g_src = dz ? dz : dy;
  const int rl = relu && !dz;
  const long long P = gridDim.x, planes = (N - blockIdx.x + P - 1) / P;
  for (PlaneWalk w(vec ? S / VMAX : S); w.k < planes; w.next()) {
    const long long n = N - 1 - (blockIdx.x + w.k * P);
    if (vec) {
      const long long p = (n * C + c) * w.per + w.q;
      const Pack<VMAX> px = reinterpret_cast<const Pack<VMAX>*>(x)[p], pg = reinterpret_cast<const Pack<VMAX>*>(g_src)[p];
      Pack<VMAX> py{};
      if (rl) py = reinterpret_cast<const Pack<VMAX>*>(y)[p];
      Pack<VMAX> pd;
#pragma unroll
      for (int e = 0; e < VMAX; ++e) {
        const float g = rl && !(to_f32(py.v[e]) > 0.0f) ? 0.0f : to_f32(pg.v[e]);
        store(&pd.v[e], a * g + b * to_f32(px.v[e]) + k0);
      }
      reinterpret_cast<Pack<VMAX>*>(dx)[p] = pd;
    } else {
      const long long i = (n * C + c) * S + w.q;
      store(dx + i, a * bn_dz(to_f32(g_src[i]), y, i, rl) + b * to_f32(x[i]) + k0);
    }
  }
}
