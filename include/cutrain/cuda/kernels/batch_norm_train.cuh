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
// dz = act'(y) dy, dbeta = sum dz, dgamma = sum dz xhat, dx = A dz + B (x - mean) + K per channel
// (A = gamma inv_std, B = -A inv_std dgamma / M, K = -A dbeta / M). Three kernels over dense
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

// dz of pack p: dy's pack with the elements relu stops (y <= 0) zeroed; y is read only for relu.
__device__ __forceinline__ Pack<VMAX> bn_dz_pack(const T* dy, const T* y, long long p, int relu) {
  Pack<VMAX> g = reinterpret_cast<const Pack<VMAX>*>(dy)[p];
  if (relu) {
    const Pack<VMAX> py = reinterpret_cast<const Pack<VMAX>*>(y)[p];
#pragma unroll
    for (int k = 0; k < VMAX; ++k)
      if (!(to_f32(py.v[k]) > 0.0f)) g.v[k] = T{};
  }
  return g;
}

// A channels-last block's threads: rb = 256 / cb row groups (lr) of cb pack columns (lc); col is
// the thread's column of 16-byte packs in a row of C, in range where active().
struct ClThreads {
  int cols, cb, rb, lc, lr, col;
  __device__ explicit ClThreads(int C)
      : cols(C / VMAX), cb(min(cols, 256)), rb(256 / cb), lc(threadIdx.x % cb), lr(threadIdx.x / cb),
        col(blockIdx.y * cb + lc) {}
  __device__ bool active() const { return lr < rb && col < cols; }
};

// Block b's two sums of its VMAX channels (s, u: each thread's over its rows) into part[b C + c] and
// part[P C + b C + c], the row groups added in a fixed order. Every thread of the block calls it.
__device__ void cl_partials(const ClThreads& t, float (&s)[VMAX], float (&u)[VMAX], int C, float* part) {
  __shared__ float sh[2][256 * VMAX];
#pragma unroll
  for (int k = 0; k < VMAX; ++k) {
    sh[0][threadIdx.x * VMAX + k] = s[k];
    sh[1][threadIdx.x * VMAX + k] = u[k];
  }
  __syncthreads();
  if (t.lr != 0 || t.col >= t.cols) return;
  for (int j = 1; j < t.rb; ++j)
#pragma unroll
    for (int k = 0; k < VMAX; ++k) {
      s[k] += sh[0][(j * t.cb + t.lc) * VMAX + k];
      u[k] += sh[1][(j * t.cb + t.lc) * VMAX + k];
    }
  const long long P = gridDim.x;
#pragma unroll
  for (int k = 0; k < VMAX; ++k) {
    part[blockIdx.x * static_cast<long long>(C) + t.col * VMAX + k] = s[k];
    part[(P + blockIdx.x) * static_cast<long long>(C) + t.col * VMAX + k] = u[k];
  }
}

// The same for a channels-first block (b, c): its threads' sums added (block_sum, a fixed order).
__device__ void cf_partials(float s, float u, int c, int C, float* part) {
  s = block_sum(s);
  u = block_sum(u);
  if (threadIdx.x == 0) {
    part[blockIdx.x * static_cast<long long>(C) + c] = s;
    part[(gridDim.x + blockIdx.x) * static_cast<long long>(C) + c] = u;
  }
}

// part[b C + c] and part[P C + b C + c]: block b's sums of dz and dz (x - mean) for channel c.
// 256 threads; grid (P, ceil(C / VMAX / 256)).
extern "C" __global__ void __launch_bounds__(256) cutrain_bn_bwd_reduce_cl(const T* x, const T* y, const T* dy, T* dz,
                                                                         const float* mean, long long M, int C,
                                                                         int relu, float* part) {
  const ClThreads t(C);
  float s[VMAX], sx[VMAX], mu[VMAX];
#pragma unroll
  for (int k = 0; k < VMAX; ++k) {
    s[k] = sx[k] = 0.0f;
    mu[k] = t.active() ? mean[t.col * VMAX + k] : 0.0f;
  }
  if (t.active())
    for (long long r = static_cast<long long>(blockIdx.x) * t.rb + t.lr; r < M;
         r += static_cast<long long>(gridDim.x) * t.rb) {
      const long long p = r * t.cols + t.col;
      const Pack<VMAX> px = reinterpret_cast<const Pack<VMAX>*>(x)[p], pz = bn_dz_pack(dy, y, p, relu);
#pragma unroll
      for (int k = 0; k < VMAX; ++k) {
        const float g = to_f32(pz.v[k]);
        s[k] += g;
        sx[k] += g * (to_f32(px.v[k]) - mu[k]);
      }
      if (dz) reinterpret_cast<Pack<VMAX>*>(dz)[p] = pz;
    }
  cl_partials(t, s, sx, C, part);
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
      const Pack<VMAX> px = reinterpret_cast<const Pack<VMAX>*>(x)[p], pz = bn_dz_pack(dy, y, p, relu);
#pragma unroll
      for (int e = 0; e < VMAX; ++e) {
        const float g = to_f32(pz.v[e]);
        s += g;
        sx += g * (to_f32(px.v[e]) - mu);
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
  cf_partials(s, sx, c, C, part);
}

// Block c adds channel c's P partials (threads stride over them, then block_sum: a fixed order)
// and writes dbeta, dgamma and coef[c], coef[C + c], coef[2 C + c] = A, B, K of
// dx = A dz + B (x - mean) + K (x centred first: no cancellation where |mean| >> std).
extern "C" __global__ void cutrain_bn_bwd_finish(const float* part, long long P, int C, long long M,
                                                 const float* gamma, const float* inv_std,
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
      coef[2 * C + c] = -a * s / m;
    }
  }
}

// dx = A dz + B (x - mean) + K; dz read from dz when the reduce wrote it, else from dy and y.
// Threads laid out as the reduce's (grid (P, ceil(C / VMAX / 256))), rows taken from the last.
extern "C" __global__ void __launch_bounds__(256) cutrain_bn_bwd_apply_cl(const T* x, const T* y, const T* dy,
                                                                        const T* dz, T* dx, const float* coef,
                                                                        const float* mean, long long M, int C,
                                                                        int relu) {
  const ClThreads t(C);
  if (!t.active()) return;
  const T* g_src = dz ? dz : dy;
  const int rl = relu && !dz;
  float a[VMAX], b[VMAX], k0[VMAX], mu[VMAX];
#pragma unroll
  for (int k = 0; k < VMAX; ++k) {
    const int c = t.col * VMAX + k;
    a[k] = coef[c], b[k] = coef[C + c], k0[k] = coef[2 * C + c], mu[k] = mean[c];
  }
  for (long long r = static_cast<long long>(blockIdx.x) * t.rb + t.lr; r < M;
       r += static_cast<long long>(gridDim.x) * t.rb) {
    const long long p = (M - 1 - r) * t.cols + t.col;
    const Pack<VMAX> px = reinterpret_cast<const Pack<VMAX>*>(x)[p], pg = bn_dz_pack(g_src, y, p, rl);
    Pack<VMAX> pd;
#pragma unroll
    for (int k = 0; k < VMAX; ++k) store(&pd.v[k], a[k] * to_f32(pg.v[k]) + b[k] * (to_f32(px.v[k]) - mu[k]) + k0[k]);
    reinterpret_cast<Pack<VMAX>*>(dx)[p] = pd;
  }
}

// The same over [N, C, S], a block per channel (grid (P, C)) and planes n = N - 1 - (b + k P).
extern "C" __global__ void __launch_bounds__(256) cutrain_bn_bwd_apply_cf(const T* x, const T* y, const T* dy,
                                                                        const T* dz, T* dx, const float* coef,
                                                                        const float* mean, long long N, int C,
                                                                        long long S, int relu, int vec) {
  const int c = blockIdx.y;
  const float a = coef[c], b = coef[C + c], k0 = coef[2 * C + c], mu = mean[c];
  const T* g_src = dz ? dz : dy;
  const int rl = relu && !dz;
  const long long P = gridDim.x, planes = (N - blockIdx.x + P - 1) / P;
  for (PlaneWalk w(vec ? S / VMAX : S); w.k < planes; w.next()) {
    const long long n = N - 1 - (blockIdx.x + w.k * P);
    if (vec) {
      const long long p = (n * C + c) * w.per + w.q;
      const Pack<VMAX> px = reinterpret_cast<const Pack<VMAX>*>(x)[p], pg = bn_dz_pack(g_src, y, p, rl);
      Pack<VMAX> pd;
#pragma unroll
      for (int e = 0; e < VMAX; ++e) store(&pd.v[e], a * to_f32(pg.v[e]) + b * (to_f32(px.v[e]) - mu) + k0);
      reinterpret_cast<Pack<VMAX>*>(dx)[p] = pd;
    } else {
      const long long i = (n * C + c) * S + w.q;
      store(dx + i, a * bn_dz(to_f32(g_src[i]), y, i, rl) + b * (to_f32(x[i]) - mu) + k0);
    }
  }
}

// ---- The fast forward in training, y = act(batch_norm(x) [+ r]), in the backward's layouts and
// grids: reduce (per-block partial sums of x - k and (x - k)^2, k = the channel's first value, so
// that no digits cancel where |mean| >> std), finish (the partials in a fixed order: mean, inv_std,
// the running statistics, scale), apply (y = act(scale ((x - k) - (mean - k)) + beta [+ r]), rows
// from the last: x - k is exact where x is near k, so y loses nothing to a mean far from zero).

// part[b C + c], part[P C + b C + c]: block b's sums of x - k and (x - k)^2 for channel c.
extern "C" __global__ void __launch_bounds__(256) cutrain_bn_fwd_reduce_cl(const T* x, long long M, int C,
                                                                         float* part) {
  const ClThreads t(C);
  float s[VMAX], sq[VMAX], k0[VMAX];
  const Pack<VMAX> first = t.active() ? reinterpret_cast<const Pack<VMAX>*>(x)[t.col] : Pack<VMAX>{};
#pragma unroll
  for (int k = 0; k < VMAX; ++k) {
    s[k] = sq[k] = 0.0f;
    k0[k] = to_f32(first.v[k]);
  }
  if (t.active())
    for (long long r = static_cast<long long>(blockIdx.x) * t.rb + t.lr; r < M;
         r += static_cast<long long>(gridDim.x) * t.rb) {
      const Pack<VMAX> px = reinterpret_cast<const Pack<VMAX>*>(x)[r * t.cols + t.col];
#pragma unroll
      for (int k = 0; k < VMAX; ++k) {
        const float d = to_f32(px.v[k]) - k0[k];
        s[k] += d;
        sq[k] += d * d;
      }
    }
  cl_partials(t, s, sq, C, part);
}

// The same over [N, C, S]: block (b, c) sums planes n = b, b + P, ... of channel c.
extern "C" __global__ void __launch_bounds__(256) cutrain_bn_fwd_reduce_cf(const T* x, long long N, int C,
                                                                         long long S, int vec, float* part) {
  const int c = blockIdx.y;
  const float k0 = to_f32(x[static_cast<long long>(c) * S]);
  const long long P = gridDim.x, planes = (N - blockIdx.x + P - 1) / P;
  float s = 0.0f, sq = 0.0f;
  for (PlaneWalk w(vec ? S / VMAX : S); w.k < planes; w.next()) {
    const long long n = blockIdx.x + w.k * P;
    if (vec) {
      const Pack<VMAX> px = reinterpret_cast<const Pack<VMAX>*>(x)[(n * C + c) * w.per + w.q];
#pragma unroll
      for (int e = 0; e < VMAX; ++e) {
        const float d = to_f32(px.v[e]) - k0;
        s += d;
        sq += d * d;
      }
    } else {
      const float d = to_f32(x[(n * C + c) * S + w.q]) - k0;
      s += d;
      sq += d * d;
    }
  }
  cf_partials(s, sq, c, C, part);
}

// Block c adds channel c's P partials in a fixed order and writes save_mean, save_inv_std, the
// running statistics (next = (1 - momentum) running + momentum batch, the unbiased variance;
// next may be running itself), coef[c] = gamma inv_std and coef[C + c] = mean - k. k_stride:
// where channel c's first value is (x[c k_stride]: 1 channels-last, S planes).
extern "C" __global__ void cutrain_bn_fwd_finish(const float* part, long long P, int C, long long M, const T* x,
                                                 long long k_stride, const float* gamma, const float* running_mean,
                                                 const float* running_var, float* save_mean, float* save_inv_std,
                                                 float* next_mean, float* next_var, float* coef, double eps,
                                                 double momentum) {
  for (int c = blockIdx.x; c < C; c += gridDim.x) {
    float s = 0.0f, sq = 0.0f;
    for (long long b = threadIdx.x; b < P; b += blockDim.x) {
      s += part[b * C + c];
      sq += part[(P + b) * C + c];
    }
    s = block_sum(s);
    sq = block_sum(sq);
    if (threadIdx.x == 0) {
      const double m = static_cast<double>(M), d = s / m, var = fmax(sq / m - d * d, 0.0);
      const double mean = to_f32(x[c * k_stride]) + d, inv_std = 1.0 / sqrt(var + eps);
      save_mean[c] = static_cast<float>(mean);
      save_inv_std[c] = static_cast<float>(inv_std);
      coef[c] = static_cast<float>(gamma[c] * inv_std);
      coef[C + c] = static_cast<float>(d);
      next_mean[c] = static_cast<float>((1.0 - momentum) * running_mean[c] + momentum * mean);
      next_var[c] = static_cast<float>((1.0 - momentum) * running_var[c] + momentum * var * m / (m - 1.0));
    }
  }
}

// y = act(scale ((x - k) - d) + beta [+ r]) over rows of C (the reduce's grid; coef = scale, d as
// the finish wrote them), rows from the last.
extern "C" __global__ void __launch_bounds__(256) cutrain_bn_fwd_apply_cl(const T* x, const T* res, T* y,
                                                                        const float* coef, const float* beta,
                                                                        long long M, int C, int act_kind,
                                                                        float act_alpha) {
  const ClThreads t(C);
  if (!t.active()) return;
  const Pack<VMAX> first = reinterpret_cast<const Pack<VMAX>*>(x)[t.col];
  float a[VMAX], k0[VMAX], d[VMAX], b[VMAX];
#pragma unroll
  for (int k = 0; k < VMAX; ++k) {
    const int c = t.col * VMAX + k;
    a[k] = coef[c], k0[k] = to_f32(first.v[k]), d[k] = coef[C + c], b[k] = beta[c];
  }
  for (long long r = static_cast<long long>(blockIdx.x) * t.rb + t.lr; r < M;
       r += static_cast<long long>(gridDim.x) * t.rb) {
    const long long p = (M - 1 - r) * t.cols + t.col;
    const Pack<VMAX> px = reinterpret_cast<const Pack<VMAX>*>(x)[p];
    Pack<VMAX> pr{};
    if (res) pr = reinterpret_cast<const Pack<VMAX>*>(res)[p];
    Pack<VMAX> py;
#pragma unroll
    for (int k = 0; k < VMAX; ++k) {
      const float v = a[k] * ((to_f32(px.v[k]) - k0[k]) - d[k]) + b[k] + (res ? to_f32(pr.v[k]) : 0.0f);
      store(&py.v[k], act_forward(act_kind, act_alpha, v));
    }
    reinterpret_cast<Pack<VMAX>*>(y)[p] = py;
  }
}

// The same over [N, C, S], a block per channel (grid (P, C)) and planes n = N - 1 - (b + k P).
extern "C" __global__ void __launch_bounds__(256) cutrain_bn_fwd_apply_cf(const T* x, const T* res, T* y,
                                                                        const float* coef, const float* beta,
                                                                        long long N, int C, long long S, int vec,
                                                                        int act_kind, float act_alpha) {
  const int c = blockIdx.y;
  const float a = coef[c], k0 = to_f32(x[static_cast<long long>(c) * S]), d = coef[C + c], b = beta[c];
  const long long P = gridDim.x, planes = (N - blockIdx.x + P - 1) / P;
  for (PlaneWalk w(vec ? S / VMAX : S); w.k < planes; w.next()) {
    const long long n = N - 1 - (blockIdx.x + w.k * P);
    if (vec) {
      const long long p = (n * C + c) * w.per + w.q;
      const Pack<VMAX> px = reinterpret_cast<const Pack<VMAX>*>(x)[p];
      Pack<VMAX> pr{};
      if (res) pr = reinterpret_cast<const Pack<VMAX>*>(res)[p];
      Pack<VMAX> py;
#pragma unroll
      for (int e = 0; e < VMAX; ++e) {
        const float v = a * ((to_f32(px.v[e]) - k0) - d) + b + (res ? to_f32(pr.v[e]) : 0.0f);
        store(&py.v[e], act_forward(act_kind, act_alpha, v));
      }
      reinterpret_cast<Pack<VMAX>*>(y)[p] = py;
    } else {
      const long long i = (n * C + c) * S + w.q;
      const float v = a * ((to_f32(x[i]) - k0) - d) + b + (res ? to_f32(res[i]) : 0.0f);
      store(y + i, act_forward(act_kind, act_alpha, v));
    }
  }
}
