// The CUDA C++ sources of cutrain's own kernels (decision 3 of DESIGN.md), as string constants
// that NVRTC compiles at first use. This header needs no CUDA headers, so the NVRTC compile test
// and the docs can list every program without a GPU.
//
// A program is the prelude (element types and their f32 conversions, block reductions) followed
// by typedefs naming its element types (T; U for a cast's output; G for an optimizer's gradient)
// and one body. f16 and bf16 travel as raw 16-bit structs converted by hand, so the sources need
// neither cuda_fp16.h nor cuda_bf16.h (NVRTC does not ship them as built-in headers). Kernels are
// extern "C", so their names are the plain names listed in Program::kernels.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cutrain/core/dtype.hpp"

namespace cutrain::cuda::kernels {

// One NVRTC program: a name that is unique per source text (it keys the loaded-module map and
// names the cache file), the full CUDA C++ text, and the extern "C" kernels it defines.
struct Program {
  std::string name;
  std::string source;
  std::vector<std::string> kernels;
};

// The device-side name of a host element type.
template <class T> inline constexpr std::string_view device_type = "unsupported";
template <> inline constexpr std::string_view device_type<float> = "float";
template <> inline constexpr std::string_view device_type<half> = "cutrain_f16";
template <> inline constexpr std::string_view device_type<bfloat16> = "cutrain_bf16";

// Every element type the kernels are instantiated for.
inline constexpr std::string_view device_types[] = {"float", "cutrain_bf16", "cutrain_f16"};

namespace source {

inline constexpr std::string_view prelude = R"cuda(
// ---- cutrain kernel prelude ----
// f16 and bf16 as their bits; arithmetic happens in f32.
struct cutrain_f16 { unsigned short bits; };
struct cutrain_bf16 { unsigned short bits; };

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(cutrain_bf16 x) { return __uint_as_float(static_cast<unsigned>(x.bits) << 16); }
__device__ __forceinline__ float to_f32(cutrain_f16 x) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
  return f;
}

// Stores an f32 value as the element type, rounding to nearest even (as the host's half and
// bfloat16 do).
__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(cutrain_f16* p, float v) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
  p->bits = h;
}
__device__ __forceinline__ void store(cutrain_bf16* p, float v) {
  const unsigned u = __float_as_uint(v);
  if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN stays a quiet NaN
    p->bits = static_cast<unsigned short>((u >> 16) | 0x0040u);
  } else {
    p->bits = static_cast<unsigned short>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
}

// Grid-stride loops over n elements: for (long long i = thread_index(); i < n; i += grid_stride()).
__device__ __forceinline__ long long thread_index() { return static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ __forceinline__ long long grid_stride() { return static_cast<long long>(gridDim.x) * blockDim.x; }

// Butterfly reductions: every lane ends with the same bits, in a fixed order (deterministic).
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum and max over a one-dimensional block whose size is a multiple of 32; every thread gets
// the result. Every thread of the block must call them.
__device__ float block_sum(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // a previous call's readers are done with partial
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  return warp_sum(lane < warps ? partial[lane] : 0.0f);
}
__device__ float block_max(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  return warp_max(lane < warps ? partial[lane] : __uint_as_float(0xff800000u));  // -inf
}
// ---- end of prelude ----
)cuda";

// add, multiply, scale over n contiguous elements laid out alike.
inline constexpr std::string_view elementwise = R"cuda(
extern "C" __global__ void cutrain_add(const T* a, const T* b, T* y, long long n) {
  for (long long i = thread_index(); i < n; i += grid_stride()) store(y + i, to_f32(a[i]) + to_f32(b[i]));
}

extern "C" __global__ void cutrain_multiply(const T* a, const T* b, T* y, long long n) {
  for (long long i = thread_index(); i < n; i += grid_stride()) store(y + i, to_f32(a[i]) * to_f32(b[i]));
}

extern "C" __global__ void cutrain_scale(const T* a, float alpha, T* y, long long n) {
  for (long long i = thread_index(); i < n; i += grid_stride()) store(y + i, alpha * to_f32(a[i]));
}
)cuda";

// Element type conversion T -> U through f32 (exact for every T; U rounds to nearest even).
inline constexpr std::string_view cast = R"cuda(
extern "C" __global__ void cutrain_cast(const T* x, U* y, long long n) {
  for (long long i = thread_index(); i < n; i += grid_stride()) store(y + i, to_f32(x[i]));
}
)cuda";

// Inverted dropout with core/random.hpp's generator, reproduced bit for bit: element i (logical
// row-major index) is dropped when uniform_at(seed, i) < p.
inline constexpr std::string_view dropout = R"cuda(
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
)cuda";

// Softmax cross-entropy from logits [N, C] (row-major) and int32 labels [N], with label
// smoothing eps: target q = (1 - eps) onehot(label) + eps / C. One block per row computes the
// row's loss and, in the same pass, its gradient; a second one-block kernel sums the row losses
// in a fixed order (deterministic).
inline constexpr std::string_view cross_entropy = R"cuda(
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
)cuda";

// Convolution bias gradient db[k] = sum over n, h, w of dy[n, k, h, w], in two deterministic
// stages: S partial sums per channel (f32), then one thread per channel adds its S partials.
inline constexpr std::string_view bias_grad = R"cuda(
// NCHW dy viewed as [N, K, HW]: block (k, s) sums dy[n, k, :] for n = s, s + S, ... into
// partial[s * K + k]. Grid (K, S), one-dimensional blocks of a multiple of 32 threads.
extern "C" __global__ void cutrain_bias_grad_nchw(const T* dy, long long N, long long K, long long HW, float* partial) {
  const long long k = blockIdx.x, s = blockIdx.y, S = gridDim.y;
  float acc = 0.0f;
  for (long long img = s; img < N; img += S) {
    const T* p = dy + (img * K + k) * HW;
    for (long long j = threadIdx.x; j < HW; j += blockDim.x) acc += to_f32(p[j]);
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) partial[s * K + k] = acc;
}

// NHWC dy viewed as rows [R = N*H*W, K]: block (b, s) of 32 x 8 threads; thread (x, y) sums
// channel k = 32 b + x over rows r = 8 s + y, stepping 8 S (reads of a warp are coalesced), and
// the 8 sums of a channel meet in shared memory. Grid (ceil(K / 32), S).
extern "C" __global__ void cutrain_bias_grad_nhwc(const T* dy, long long R, long long K, float* partial) {
  __shared__ float tile[8][33];
  const long long k = static_cast<long long>(blockIdx.x) * 32 + threadIdx.x;
  const long long s = blockIdx.y, S = gridDim.y;
  float acc = 0.0f;
  if (k < K)
    for (long long r = s * 8 + threadIdx.y; r < R; r += S * 8) acc += to_f32(dy[r * K + k]);
  tile[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && k < K) {
    float t = 0.0f;
    for (int j = 0; j < 8; ++j) t += tile[j][threadIdx.x];
    partial[s * K + k] = t;
  }
}

// db[k] = sum over s of partial[s * K + k], in order.
extern "C" __global__ void cutrain_bias_grad_finish(const float* partial, long long K, long long S, T* db) {
  for (long long k = thread_index(); k < K; k += grid_stride()) {
    float t = 0.0f;
    for (long long s = 0; s < S; ++s) t += partial[s * K + k];
    store(db + k, t);
  }
}
)cuda";

// Optimizer updates, in place on f32 master weights and f32 state, with gradients in G.
// Same rules as PyTorch's SGD and AdamW (single-tensor, non-fused), computed in f32.
inline constexpr std::string_view optim = R"cuda(
// g = grad + weight_decay * w; with momentum: buf = g on the first step, else
// buf = momentum * buf + (1 - dampening) * g, and g = buf (or g + momentum * buf, Nesterov);
// w -= lr * g. buf may be null when momentum == 0. hyper (may be null): lr and first_step read
// from device memory instead ({lr, first_step != 0}), for steps replayed from a CUDA graph.
extern "C" __global__ void cutrain_sgd_step(float* w, const G* grad, float* buf, long long n, float lr, float momentum,
                                            float dampening, float weight_decay, int nesterov, int first_step,
                                            const float* hyper) {
  if (hyper != 0) {
    lr = hyper[0];
    first_step = hyper[1] != 0.0f;
  }
  for (long long i = thread_index(); i < n; i += grid_stride()) {
    const float wi = w[i];
    float g = to_f32(grad[i]);
    if (weight_decay != 0.0f) g += weight_decay * wi;
    if (momentum != 0.0f) {
      const float b = first_step ? g : momentum * buf[i] + (1.0f - dampening) * g;
      buf[i] = b;
      g = nesterov ? g + momentum * b : b;
    }
    w[i] = wi - lr * g;
  }
}

// w *= 1 - lr * weight_decay; m = beta1 m + (1 - beta1) g; v = beta2 v + (1 - beta2) g^2;
// w -= step_size * m / (sqrt(v) / bias_correction2_sqrt + eps), with step_size =
// lr / (1 - beta1^t) and bias_correction2_sqrt = sqrt(1 - beta2^t) computed on the host.
// hyper (may be null): {lr, step_size, bias_correction2_sqrt} read from device memory instead,
// for steps replayed from a CUDA graph.
extern "C" __global__ void cutrain_adamw_step(float* w, const G* grad, float* m, float* v, long long n, float lr,
                                              float beta1, float beta2, float eps, float weight_decay, float step_size,
                                              float bias_correction2_sqrt, const float* hyper) {
  if (hyper != 0) {
    lr = hyper[0];
    step_size = hyper[1];
    bias_correction2_sqrt = hyper[2];
  }
  for (long long i = thread_index(); i < n; i += grid_stride()) {
    const float g = to_f32(grad[i]);
    const float wi = w[i] * (1.0f - lr * weight_decay);
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    w[i] = wi - step_size * mi / (sqrtf(vi) / bias_correction2_sqrt + eps);
  }
}

// Dynamic loss scaling: g *= inv_scale in place, and *found_inf = 1 when a result is inf or NaN
// (never cleared here; every writer writes 1).
extern "C" __global__ void cutrain_unscale_check(G* g, long long n, float inv_scale, int* found_inf) {
  int bad = 0;
  for (long long i = thread_index(); i < n; i += grid_stride()) {
    const float v = to_f32(g[i]) * inv_scale;
    bad |= !(fabsf(v) <= 3.402823466e38f);  // false for NaN too
    store(g + i, v);
  }
  if (bad) *found_inf = 1;
}
)cuda";

// 2-d max and average pooling and global average pooling, forward and backward, with the
// semantics of cpu/pool2d.hpp (cuda/kernels/pool2d.hpp says why kernels and not cuDNN). Every
// tensor is indexed by its own strides, so x, y, dy and dx may each be NCHW, NHWC or a strided
// view. Threads walk the tensor they write in its memory order (NHWC: channels fastest), so
// writes and most reads are coalesced. Where channels are innermost and dense in every tensor a
// kernel touches (and C, the strides and the pointers allow it) the _vec kernels move VMAX
// adjacent channels per thread with 16-byte loads and stores; the others one element. Sums in f32.
// Index math is 32-bit (divisions by a multiply-high and a shift) below 2^31 elements, 64-bit
// from there on.
inline constexpr std::string_view pool2d = R"cuda(
// n / d for 0 <= n < 2^31 and 1 <= d < 2^31 by a multiply-high, an add and a shift (Granlund and
// Montgomery; PyTorch's IntDivider). magic = m | s << 32 comes from the host (fast_div_magic).
struct FastDiv {
  unsigned d, m, s;
  __device__ FastDiv(long long divisor, unsigned long long magic)
      : d(static_cast<unsigned>(divisor)), m(static_cast<unsigned>(magic)), s(static_cast<unsigned>(magic >> 32)) {}
  __device__ __forceinline__ unsigned div(unsigned n) const { return (__umulhi(n, m) + n) >> s; }
};
// Plain 64-bit division, for tensors of 2^31 elements or more.
struct WideDiv {
  long long d;
  __device__ WideDiv(long long divisor, unsigned long long) : d(divisor) {}
  __device__ __forceinline__ long long div(long long n) const { return n / d; }
};

// Index i of a 4-d tensor in memory order -> (n, c, h, w). d0, d1, d2 divide by its three inner
// extents, innermost first: (C, W, H) when channels_last (NHWC order), else (W, H, C) (NCHW).
template <class I, class D>
__device__ __forceinline__ void unravel4(I i, const D& d0, const D& d1, const D& d2, int channels_last, I& n, I& c,
                                         I& h, I& w) {
  const I q0 = d0.div(i), a0 = i - q0 * static_cast<I>(d0.d);
  const I q1 = d1.div(q0), a1 = q0 - q1 * static_cast<I>(d1.d);
  const I q2 = d2.div(q1), a2 = q1 - q2 * static_cast<I>(d2.d);
  n = q2;
  if (channels_last) {
    c = a0; w = a1; h = a2;
  } else {
    w = a0; h = a1; c = a2;
  }
}

__device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ int imax(int a, int b) { return a > b ? a : b; }
__device__ __forceinline__ bool is_nan(float v) { return v != v; }

// V adjacent elements moved by one load or store (V * sizeof(T) <= 16 bytes, aligned to that).
constexpr int VMAX = 16 / sizeof(T);
template <int V>
struct alignas(V * sizeof(T)) Pack {
  T v[V];
};
template <int V>
struct alignas(V * sizeof(int)) IntPack {
  int v[V];
};
template <int V>
__device__ __forceinline__ void load_f32(const T* p, float (&out)[V]) {
  const Pack<V> pk = *reinterpret_cast<const Pack<V>*>(p);
#pragma unroll
  for (int k = 0; k < V; ++k) out[k] = to_f32(pk.v[k]);
}
template <int V>
__device__ __forceinline__ void store_f32(T* p, const float (&in)[V]) {
  Pack<V> pk;
#pragma unroll
  for (int k = 0; k < V; ++k) store(&pk.v[k], in[k]);
  *reinterpret_cast<Pack<V>*>(p) = pk;
}

struct Strides4 {
  long long n, c, h, w;
  __device__ __forceinline__ long long at(long long in, long long ic, long long ih, long long iw) const {
    return in * n + ic * c + ih * h + iw * w;
  }
};

// Pooling parameters with the strides resolved (never 0); the host checks that every spatial
// quantity fits in an int.
struct PoolGeom {
  int H, W, OH, OW, kh, kw, sh, sw, pt, pb, pl, pr, avg, count_include_pad;
};

// The part of output (i, j)'s window inside the input, rows [h0, h1) and columns [w0, w1), and
// what an average divides by: count_include_pad counts the padding but not the ceil-mode
// overhang past it (as PyTorch and cpu/pool2d.hpp's pool_window).
struct PoolWin {
  int h0, h1, w0, w1;
  float divisor;
};

__device__ __forceinline__ PoolWin pool_window(const PoolGeom& g, int i, int j) {
  const int hs = i * g.sh - g.pt, ws = j * g.sw - g.pl;
  PoolWin win;
  win.h0 = imax(hs, 0);
  win.h1 = imin(hs + g.kh, g.H);
  win.w0 = imax(ws, 0);
  win.w1 = imin(ws + g.kw, g.W);
  const int padded = (imin(hs + g.kh, g.H + g.pb) - hs) * (imin(ws + g.kw, g.W + g.pr) - ws);
  win.divisor = static_cast<float>(g.count_include_pad ? padded : (win.h1 - win.h0) * (win.w1 - win.w0));
  return win;
}

// For each of V adjacent channels, the window's maximum and its position (br, bq): the first
// maximum in row-then-column order, or the first NaN (cpu/pool2d.hpp's pool_argmax). Padding never
// wins: it is not visited. xp points at channel c of image n.
template <int V>
__device__ __forceinline__ void window_max(const T* xp, long long xh, long long xw, const PoolWin& win, float (&best)[V],
                                           int (&br)[V], int (&bq)[V]) {
  bool done[V];  // a NaN was found: the lane keeps it
  load_f32<V>(xp + win.h0 * xh + win.w0 * xw, best);
#pragma unroll
  for (int k = 0; k < V; ++k) {
    br[k] = win.h0;
    bq[k] = win.w0;
    done[k] = is_nan(best[k]);
  }
  for (int r = win.h0; r < win.h1; ++r)
    for (int q = win.w0; q < win.w1; ++q) {
      float v[V];
      load_f32<V>(xp + r * xh + q * xw, v);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        if (done[k]) continue;
        if (is_nan(v[k]) || v[k] > best[k]) {
          best[k] = v[k];
          br[k] = r;
          bq[k] = q;
          done[k] = is_nan(v[k]);
        }
      }
    }
}

// One thread per V adjacent outputs, in y's memory order; total counts those packs.
template <int V, class I, class D>
__device__ __forceinline__ void pool2d_forward_loop(const T* x, T* y, const PoolGeom& g, const Strides4& xs,
                                                    const Strides4& ys, I total, int channels_last, const D& d0,
                                                    const D& d1, const D& d2) {
  for (I i = static_cast<I>(thread_index()); i < total; i += static_cast<I>(grid_stride())) {
    I n, cv, oh, ow;
    unravel4(i, d0, d1, d2, channels_last, n, cv, oh, ow);
    const long long c = static_cast<long long>(cv) * V;
    const PoolWin win = pool_window(g, static_cast<int>(oh), static_cast<int>(ow));
    const T* xp = x + static_cast<long long>(n) * xs.n + c * xs.c;
    float v[V];
    if (g.avg) {
      float sum[V];
#pragma unroll
      for (int k = 0; k < V; ++k) sum[k] = 0.0f;
      for (int r = win.h0; r < win.h1; ++r)
        for (int q = win.w0; q < win.w1; ++q) {
          float e[V];
          load_f32<V>(xp + r * xs.h + q * xs.w, e);
#pragma unroll
          for (int k = 0; k < V; ++k) sum[k] += e[k];
        }
#pragma unroll
      for (int k = 0; k < V; ++k) v[k] = sum[k] / win.divisor;
    } else {
      int br[V], bq[V];
      window_max<V>(xp, xs.h, xs.w, win, v, br, bq);
    }
    store_f32<V>(y + ys.at(n, c, oh, ow), v);
  }
}

// Each kernel comes twice: NAME with one element per thread and NAME_vec with VMAX (the host's
// pool_vec decides), as separate kernels so that the scalar one keeps the scalar path's register
// count (and occupancy).
//
// y [N, C, OH, OW] from x [N, C, H, W]. total = N C OH OW / V; m0, m1, m2: fast_div_magic of the
// inner extents in the order unravel4 takes them, with C / V for C (unused from 2^31 on).
#define POOL2D_FORWARD_PARAMS                                                                                       \
  const T *x, T *y, long long C, int H, int W, int OH, int OW, int kh, int kw, int sh, int sw, int pt, int pb, int pl, \
      int pr, int avg, int count_include_pad, long long xn, long long xc, long long xh, long long xw, long long yn,    \
      long long yc, long long yh, long long yw, long long total, int channels_last, unsigned long long m0,           \
      unsigned long long m1, unsigned long long m2
template <int V>
__device__ __forceinline__ void pool2d_forward_entry(POOL2D_FORWARD_PARAMS) {
  const PoolGeom g = {H, W, OH, OW, kh, kw, sh, sw, pt, pb, pl, pr, avg, count_include_pad};
  const Strides4 xs = {xn, xc, xh, xw}, ys = {yn, yc, yh, yw};
  const long long Cv = C / V;
  const long long e0 = channels_last ? Cv : OW, e1 = channels_last ? OW : OH, e2 = channels_last ? OH : Cv;
  if (total < 0x80000000LL)
    pool2d_forward_loop<V, unsigned>(x, y, g, xs, ys, static_cast<unsigned>(total), channels_last, FastDiv(e0, m0),
                                     FastDiv(e1, m1), FastDiv(e2, m2));
  else
    pool2d_forward_loop<V, long long>(x, y, g, xs, ys, total, channels_last, WideDiv(e0, m0), WideDiv(e1, m1),
                                      WideDiv(e2, m2));
}
#define POOL2D_FORWARD_ARGS \
  x, y, C, H, W, OH, OW, kh, kw, sh, sw, pt, pb, pl, pr, avg, count_include_pad, xn, xc, xh, xw, yn, yc, yh, yw, total, \
      channels_last, m0, m1, m2
extern "C" __global__ void cutrain_pool2d_forward(POOL2D_FORWARD_PARAMS) { pool2d_forward_entry<1>(POOL2D_FORWARD_ARGS); }
extern "C" __global__ void cutrain_pool2d_forward_vec(POOL2D_FORWARD_PARAMS) {
  pool2d_forward_entry<VMAX>(POOL2D_FORWARD_ARGS);
}

// The first half of a max-pool backward whose windows overlap or leave gaps: each output's argmax,
// as its offset (r - hs) kw + (q - ws) inside the unclipped window (hs, ws: the window's first
// row and column), into arg[] indexed like the outputs walked densely in memory order
// (channels_last: NHWC order, else NCHW). One thread per V adjacent outputs.
template <int V, class I, class D>
__device__ __forceinline__ void pool2d_argmax_loop(const T* x, int* arg, const PoolGeom& g, const Strides4& xs, I total,
                                                   int channels_last, const D& d0, const D& d1, const D& d2) {
  for (I i = static_cast<I>(thread_index()); i < total; i += static_cast<I>(grid_stride())) {
    I n, cv, oh, ow;
    unravel4(i, d0, d1, d2, channels_last, n, cv, oh, ow);
    const long long c = static_cast<long long>(cv) * V;
    const int ohi = static_cast<int>(oh), owi = static_cast<int>(ow);
    const PoolWin win = pool_window(g, ohi, owi);
    float best[V];
    int br[V], bq[V];
    window_max<V>(x + static_cast<long long>(n) * xs.n + c * xs.c, xs.h, xs.w, win, best, br, bq);
    const int hs = ohi * g.sh - g.pt, ws = owi * g.sw - g.pl;
    IntPack<V> out;
#pragma unroll
    for (int k = 0; k < V; ++k) out.v[k] = (br[k] - hs) * g.kw + (bq[k] - ws);
    *reinterpret_cast<IntPack<V>*>(arg + static_cast<long long>(i) * V) = out;
  }
}

// total = N C OH OW / V; m0, m1, m2 as for the forward.
#define POOL2D_ARGMAX_PARAMS                                                                                          \
  const T *x, int *arg, long long C, int H, int W, int OH, int OW, int kh, int kw, int sh, int sw, int pt, int pb,    \
      int pl, int pr, long long xn, long long xc, long long xh, long long xw, long long total, int channels_last,      \
      unsigned long long m0, unsigned long long m1, unsigned long long m2
template <int V>
__device__ __forceinline__ void pool2d_argmax_entry(POOL2D_ARGMAX_PARAMS) {
  const PoolGeom g = {H, W, OH, OW, kh, kw, sh, sw, pt, pb, pl, pr, 0, 0};
  const Strides4 xs = {xn, xc, xh, xw};
  const long long Cv = C / V;
  const long long e0 = channels_last ? Cv : OW, e1 = channels_last ? OW : OH, e2 = channels_last ? OH : Cv;
  if (total < 0x80000000LL)
    pool2d_argmax_loop<V, unsigned>(x, arg, g, xs, static_cast<unsigned>(total), channels_last, FastDiv(e0, m0),
                                    FastDiv(e1, m1), FastDiv(e2, m2));
  else
    pool2d_argmax_loop<V, long long>(x, arg, g, xs, total, channels_last, WideDiv(e0, m0), WideDiv(e1, m1),
                                     WideDiv(e2, m2));
}
#define POOL2D_ARGMAX_ARGS \
  x, arg, C, H, W, OH, OW, kh, kw, sh, sw, pt, pb, pl, pr, xn, xc, xh, xw, total, channels_last, m0, m1, m2
extern "C" __global__ void cutrain_pool2d_argmax(POOL2D_ARGMAX_PARAMS) { pool2d_argmax_entry<1>(POOL2D_ARGMAX_ARGS); }
extern "C" __global__ void cutrain_pool2d_argmax_vec(POOL2D_ARGMAX_PARAMS) {
  pool2d_argmax_entry<VMAX>(POOL2D_ARGMAX_ARGS);
}

// The gather backward: one thread per V adjacent dx elements, in dx's memory order, visits the
// output windows that hold them (in row-major order, as the CPU adds them) and adds their dy:
// average dy / divisor; max dy where the window's argmax (arg[], from cutrain_pool2d_argmax in
// the order arg_channels_last) is this element. No atomics: the result is deterministic. by_sh,
// by_sw divide by the pooling strides.
template <int V, class I, class D>
__device__ __forceinline__ void pool2d_backward_loop(const int* arg, int arg_channels_last, const T* dy, T* dx,
                                                     const PoolGeom& g, long long C, const Strides4& dys,
                                                     const Strides4& dxs, I total, int channels_last, const D& d0,
                                                     const D& d1, const D& d2, const FastDiv& by_sh,
                                                     const FastDiv& by_sw) {
  for (I i = static_cast<I>(thread_index()); i < total; i += static_cast<I>(grid_stride())) {
    I n, cv, h, w;
    unravel4(i, d0, d1, d2, channels_last, n, cv, h, w);
    const long long c = static_cast<long long>(cv) * V, nl = static_cast<long long>(n);
    const int hi = static_cast<int>(h), wi = static_cast<int>(w);
    // Output rows oi whose window holds row hi: oi sh - pt <= hi < oi sh - pt + kh; columns alike.
    const int ah = hi + g.pt - g.kh + 1, aw = wi + g.pl - g.kw + 1;
    const int i0 = ah <= 0 ? 0 : static_cast<int>(by_sh.div(static_cast<unsigned>(ah + g.sh - 1)));
    const int i1 = imin(g.OH - 1, static_cast<int>(by_sh.div(static_cast<unsigned>(hi + g.pt))));
    const int j0 = aw <= 0 ? 0 : static_cast<int>(by_sw.div(static_cast<unsigned>(aw + g.sw - 1)));
    const int j1 = imin(g.OW - 1, static_cast<int>(by_sw.div(static_cast<unsigned>(wi + g.pl))));
    const T* dyp = dy + nl * dys.n + c * dys.c;
    // arg[] of (n, c, oi, oj) at abase + oi * a_h + oj * a_w
    const long long a_w = arg_channels_last ? C : 1, a_h = a_w * g.OW;
    const long long abase = arg_channels_last ? nl * g.OH * a_h + c : (nl * C + c) * g.OH * a_h;
    float acc[V];
#pragma unroll
    for (int k = 0; k < V; ++k) acc[k] = 0.0f;
    for (int oi = i0; oi <= i1; ++oi)
      for (int oj = j0; oj <= j1; ++oj) {
        if (g.avg) {
          const PoolWin win = pool_window(g, oi, oj);
          float d[V];
          load_f32<V>(dyp + oi * dys.h + oj * dys.w, d);
#pragma unroll
          for (int k = 0; k < V; ++k) acc[k] += d[k] / win.divisor;
        } else {
          const int rel = (hi - (oi * g.sh - g.pt)) * g.kw + (wi - (oj * g.sw - g.pl));
          const IntPack<V> a = *reinterpret_cast<const IntPack<V>*>(arg + abase + oi * a_h + oj * a_w);
          bool any = false;
#pragma unroll
          for (int k = 0; k < V; ++k) any |= a.v[k] == rel;
          if (any) {
            float d[V];
            load_f32<V>(dyp + oi * dys.h + oj * dys.w, d);
#pragma unroll
            for (int k = 0; k < V; ++k)
              if (a.v[k] == rel) acc[k] += d[k];
          }
        }
      }
    store_f32<V>(dx + dxs.at(n, c, h, w), acc);
  }
}

// dx [N, C, H, W]; total = N C H W / V; m0, m1, m2 as for the forward but of dx's extents; mh,
// mw: fast_div_magic(sh), fast_div_magic(sw). arg: null for average pooling. For the _vec kernel
// arg's order must be channels-last too (V adjacent channels are V adjacent ints).
#define POOL2D_BACKWARD_PARAMS                                                                                       \
  const int *arg, int arg_channels_last, const T *dy, T *dx, long long C, int H, int W, int OH, int OW, int kh,      \
      int kw, int sh, int sw, int pt, int pb, int pl, int pr, int avg, int count_include_pad, long long dyn,          \
      long long dyc, long long dyh, long long dyw, long long dxn, long long dxc, long long dxh, long long dxw,        \
      long long total, int channels_last, unsigned long long m0, unsigned long long m1, unsigned long long m2,        \
      unsigned long long mh, unsigned long long mw
template <int V>
__device__ __forceinline__ void pool2d_backward_entry(POOL2D_BACKWARD_PARAMS) {
  const PoolGeom g = {H, W, OH, OW, kh, kw, sh, sw, pt, pb, pl, pr, avg, count_include_pad};
  const Strides4 dys = {dyn, dyc, dyh, dyw}, dxs = {dxn, dxc, dxh, dxw};
  const long long Cv = C / V;
  const long long e0 = channels_last ? Cv : W, e1 = channels_last ? W : H, e2 = channels_last ? H : Cv;
  const FastDiv by_sh(sh, mh), by_sw(sw, mw);
  if (total < 0x80000000LL)
    pool2d_backward_loop<V, unsigned>(arg, arg_channels_last, dy, dx, g, C, dys, dxs, static_cast<unsigned>(total),
                                      channels_last, FastDiv(e0, m0), FastDiv(e1, m1), FastDiv(e2, m2), by_sh, by_sw);
  else
    pool2d_backward_loop<V, long long>(arg, arg_channels_last, dy, dx, g, C, dys, dxs, total, channels_last,
                                       WideDiv(e0, m0), WideDiv(e1, m1), WideDiv(e2, m2), by_sh, by_sw);
}
#define POOL2D_BACKWARD_ARGS                                                                                         \
  arg, arg_channels_last, dy, dx, C, H, W, OH, OW, kh, kw, sh, sw, pt, pb, pl, pr, avg, count_include_pad, dyn, dyc, \
      dyh, dyw, dxn, dxc, dxh, dxw, total, channels_last, m0, m1, m2, mh, mw
extern "C" __global__ void cutrain_pool2d_backward(POOL2D_BACKWARD_PARAMS) {
  pool2d_backward_entry<1>(POOL2D_BACKWARD_ARGS);
}
extern "C" __global__ void cutrain_pool2d_backward_vec(POOL2D_BACKWARD_PARAMS) {
  pool2d_backward_entry<VMAX>(POOL2D_BACKWARD_ARGS);
}

// The backward when the windows tile the input exactly (stride = kernel, no padding, H = OH kh,
// W = OW kw: every dx element lies in exactly one window): one thread per V adjacent windows, in
// dx's memory order, writes their kh x kw dx elements. The same values as the gather, x read once.
template <int V, class I, class D>
__device__ __forceinline__ void pool2d_backward_tiled_loop(const T* x, const T* dy, T* dx, const PoolGeom& g,
                                                           const Strides4& xs, const Strides4& dys,
                                                           const Strides4& dxs, I total, int channels_last, const D& d0,
                                                           const D& d1, const D& d2) {
  for (I i = static_cast<I>(thread_index()); i < total; i += static_cast<I>(grid_stride())) {
    I n, cv, oh, ow;
    unravel4(i, d0, d1, d2, channels_last, n, cv, oh, ow);
    const long long c = static_cast<long long>(cv) * V, nl = static_cast<long long>(n);
    PoolWin win;
    win.h0 = static_cast<int>(oh) * g.kh;
    win.h1 = win.h0 + g.kh;
    win.w0 = static_cast<int>(ow) * g.kw;
    win.w1 = win.w0 + g.kw;
    float d[V], v[V];  // 0 + ..., as the gather's sum, so that even the sign of a zero agrees
    load_f32<V>(dy + dys.at(n, c, oh, ow), d);
    int br[V], bq[V];
#pragma unroll
    for (int k = 0; k < V; ++k) br[k] = bq[k] = -1;
    if (g.avg) {
#pragma unroll
      for (int k = 0; k < V; ++k) v[k] = 0.0f + d[k] / static_cast<float>(g.kh * g.kw);
    } else {
      float best[V];
      window_max<V>(x + nl * xs.n + c * xs.c, xs.h, xs.w, win, best, br, bq);
#pragma unroll
      for (int k = 0; k < V; ++k) v[k] = 0.0f + d[k];
    }
    T* dxp = dx + nl * dxs.n + c * dxs.c;
    for (int r = win.h0; r < win.h1; ++r)
      for (int q = win.w0; q < win.w1; ++q) {
        float o[V];
#pragma unroll
        for (int k = 0; k < V; ++k) o[k] = (g.avg || (r == br[k] && q == bq[k])) ? v[k] : 0.0f;
        store_f32<V>(dxp + r * dxs.h + q * dxs.w, o);
      }
  }
}

// total = N C OH OW / V; m0, m1, m2: fast_div_magic of dy's inner extents in dx's order.
#define POOL2D_TILED_PARAMS                                                                                           \
  const T *x, const T *dy, T *dx, long long C, int H, int W, int OH, int OW, int kh, int kw, int avg, long long xn,   \
      long long xc, long long xh, long long xw, long long dyn, long long dyc, long long dyh, long long dyw,            \
      long long dxn, long long dxc, long long dxh, long long dxw, long long total, int channels_last,                 \
      unsigned long long m0, unsigned long long m1, unsigned long long m2
template <int V>
__device__ __forceinline__ void pool2d_backward_tiled_entry(POOL2D_TILED_PARAMS) {
  const PoolGeom g = {H, W, OH, OW, kh, kw, kh, kw, 0, 0, 0, 0, avg, 1};
  const Strides4 xs = {xn, xc, xh, xw}, dys = {dyn, dyc, dyh, dyw}, dxs = {dxn, dxc, dxh, dxw};
  const long long Cv = C / V;
  const long long e0 = channels_last ? Cv : OW, e1 = channels_last ? OW : OH, e2 = channels_last ? OH : Cv;
  if (total < 0x80000000LL)
    pool2d_backward_tiled_loop<V, unsigned>(x, dy, dx, g, xs, dys, dxs, static_cast<unsigned>(total), channels_last,
                                            FastDiv(e0, m0), FastDiv(e1, m1), FastDiv(e2, m2));
  else
    pool2d_backward_tiled_loop<V, long long>(x, dy, dx, g, xs, dys, dxs, total, channels_last, WideDiv(e0, m0),
                                             WideDiv(e1, m1), WideDiv(e2, m2));
}
#define POOL2D_TILED_ARGS                                                                                              \
  x, dy, dx, C, H, W, OH, OW, kh, kw, avg, xn, xc, xh, xw, dyn, dyc, dyh, dyw, dxn, dxc, dxh, dxw, total, channels_last, \
      m0, m1, m2
extern "C" __global__ void cutrain_pool2d_backward_tiled(POOL2D_TILED_PARAMS) {
  pool2d_backward_tiled_entry<1>(POOL2D_TILED_ARGS);
}
extern "C" __global__ void cutrain_pool2d_backward_tiled_vec(POOL2D_TILED_PARAMS) {
  pool2d_backward_tiled_entry<VMAX>(POOL2D_TILED_ARGS);
}

// Global average pooling, x's planes contiguous or nearly (NCHW): one warp per (n, c) plane,
// lanes striding over its H W elements; y[n, c] = sum / (H W). Blocks of a multiple of 32 threads.
extern "C" __global__ void cutrain_global_avg_pool_planes(const T* x, T* y, long long N, long long C, long long H,
                                                          long long W, long long xn, long long xc, long long xh,
                                                          long long xw, long long yn, long long yc) {
  const long long warps = static_cast<long long>(gridDim.x) * (blockDim.x >> 5);
  const int lane = threadIdx.x & 31;
  const long long HW = H * W;
  const bool merged = xh == W * xw;  // the plane as one stride: no division per element
  for (long long p = static_cast<long long>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5); p < N * C;
       p += warps) {
    const long long n = p / C, c = p - n * C;
    const T* xp = x + n * xn + c * xc;
    float s = 0.0f;
    if (merged) {
      for (long long k = lane; k < HW; k += 32) s += to_f32(xp[k * xw]);
    } else {
      for (long long k = lane; k < HW; k += 32) {
        const long long h = k / W;
        s += to_f32(xp[h * xh + (k - h * W) * xw]);
      }
    }
    s = warp_sum(s);
    if (lane == 0) store(y + n * yn + c * yc, s / static_cast<float>(HW));
  }
}

// Global average pooling, channels innermost in x (NHWC): blocks of 32 x 8 threads; thread
// (tx, ty) sums channel 32 blockIdx.x + tx over positions ty, ty + 8, ... (a warp reads 32
// adjacent channels), and the 8 partial sums meet in shared memory. Grid (ceil(C / 32), images).
extern "C" __global__ void cutrain_global_avg_pool_channels(const T* x, T* y, long long N, long long C, long long H,
                                                            long long W, long long xn, long long xc, long long xh,
                                                            long long xw, long long yn, long long yc) {
  __shared__ float tile[8][33];
  const long long c = static_cast<long long>(blockIdx.x) * 32 + threadIdx.x;
  const long long HW = H * W;
  const bool merged = xh == W * xw;
  for (long long n = blockIdx.y; n < N; n += gridDim.y) {
    float s = 0.0f;
    if (c < C) {
      const T* xp = x + n * xn + c * xc;
      if (merged) {
        for (long long k = threadIdx.y; k < HW; k += 8) s += to_f32(xp[k * xw]);
      } else {
        for (long long k = threadIdx.y; k < HW; k += 8) {
          const long long h = k / W;
          s += to_f32(xp[h * xh + (k - h * W) * xw]);
        }
      }
    }
    tile[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
      float t = 0.0f;
      for (int j = 0; j < 8; ++j) t += tile[j][threadIdx.x];
      store(y + n * yn + c * yc, t / static_cast<float>(HW));
    }
    __syncthreads();  // the tile is reused by the next image
  }
}

// dx[n, c, h, w] = dy[n, c] / (H W): one thread per dx element, in dx's memory order.
template <class I, class D>
__device__ __forceinline__ void global_avg_pool_backward_loop(const T* dy, T* dx, long long dyn, long long dyc,
                                                              const Strides4& dxs, float hw, I total,
                                                              int channels_last, const D& d0, const D& d1,
                                                              const D& d2) {
  for (I i = static_cast<I>(thread_index()); i < total; i += static_cast<I>(grid_stride())) {
    I n, c, h, w;
    unravel4(i, d0, d1, d2, channels_last, n, c, h, w);
    store(dx + dxs.at(n, c, h, w), to_f32(dy[static_cast<long long>(n) * dyn + static_cast<long long>(c) * dyc]) / hw);
  }
}

extern "C" __global__ void cutrain_global_avg_pool_backward(const T* dy, T* dx, long long C, long long H, long long W,
                                                            long long dyn, long long dyc, long long dxn, long long dxc,
                                                            long long dxh, long long dxw, long long total,
                                                            int channels_last, unsigned long long m0,
                                                            unsigned long long m1, unsigned long long m2) {
  const Strides4 dxs = {dxn, dxc, dxh, dxw};
  const float hw = static_cast<float>(H * W);
  const long long e0 = channels_last ? C : W, e1 = channels_last ? W : H, e2 = channels_last ? H : C;
  if (total < 0x80000000LL)
    global_avg_pool_backward_loop<unsigned>(dy, dx, dyn, dyc, dxs, hw, static_cast<unsigned>(total), channels_last,
                                            FastDiv(e0, m0), FastDiv(e1, m1), FastDiv(e2, m2));
  else
    global_avg_pool_backward_loop<long long>(dy, dx, dyn, dyc, dxs, hw, total, channels_last, WideDiv(e0, m0),
                                             WideDiv(e1, m1), WideDiv(e2, m2));
}
)cuda";

// Batch-norm inference, y = (x - mean[c]) * gamma[c] / sqrt(var[c] + eps) + beta[c], x and y in
// T, the four [C] vectors in f32 (cuda/kernels/batch_norm_inference.hpp says why not cuDNN). Each
// thread computes its channels' scales once, in f64 as the CPU does; the rest is f32. x and y are
// seen as [N, C, S] (S = H W, 1 for a 2-d x), each with its own strides. The _vec kernels move
// VMAX adjacent elements per thread with 16-byte loads and stores (the host checks density and
// alignment); the others one.
inline constexpr std::string_view batch_norm_inference = R"cuda(
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
)cuda";

// ==== softmax / log-softmax (softmax helper's block; cuda/kernels/softmax.hpp) ====
// Softmax and log-softmax over rows of C elements (row-major [N, C]), forward and backward, with
// the semantics of cpu/softmax.hpp. One block per row (grid N), one-dimensional, a multiple of 32
// threads; f32 arithmetic and accumulation, sums in a fixed order (deterministic). Each pass reads
// the row from global memory again; after the first, the reads mostly hit L1/L2.
inline constexpr std::string_view softmax = R"cuda(
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
)cuda";
// ==== end of softmax block ====

// Strided copy (cuda/kernels/copy.hpp; the host passes core/storage.hpp's StridedCopy::Dims as
// cutrain_copy_args): element i of the logical row-major order goes from
// src + sum(c_d * src_d) to dst + sum(c_d * dst_d), c its multi-index; one kernel per element size.
inline constexpr std::string_view copy = R"cuda(
struct cutrain_copy_args {
  long long shape[8], dst[8], src[8];
  int rank;
};
template <typename E>
__device__ void strided_copy(E* dst, const E* src, long long n, const cutrain_copy_args& a) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    long long rest = i, od = 0, os = 0;
    for (int d = a.rank - 1; d >= 0; --d) {
      const long long c = rest % a.shape[d];
      rest /= a.shape[d];
      od += c * a.dst[d];
      os += c * a.src[d];
    }
    dst[od] = src[os];
  }
}
extern "C" __global__ void cutrain_copy_1(unsigned char* dst, const unsigned char* src, long long n, cutrain_copy_args a) {
  strided_copy(dst, src, n, a);
}
extern "C" __global__ void cutrain_copy_2(unsigned short* dst, const unsigned short* src, long long n, cutrain_copy_args a) {
  strided_copy(dst, src, n, a);
}
extern "C" __global__ void cutrain_copy_4(unsigned int* dst, const unsigned int* src, long long n, cutrain_copy_args a) {
  strided_copy(dst, src, n, a);
}
extern "C" __global__ void cutrain_copy_8(unsigned long long* dst, const unsigned long long* src, long long n,
                                          cutrain_copy_args a) {
  strided_copy(dst, src, n, a);
}
)cuda";

}  // namespace source

// The full text of one instantiation: prelude, typedefs, body.
inline Program make_program(std::string_view name, std::string_view body,
                            std::vector<std::pair<std::string_view, std::string_view>> types,
                            std::vector<std::string> kernels) {
  Program p;
  p.name = std::string(name);
  p.source = "// cutrain kernel program ";
  p.source += name;
  p.source += source::prelude;
  for (const auto& [alias, type] : types) {
    p.name += "_";
    p.name += type;
    p.source += "typedef ";
    p.source += type;
    p.source += " ";
    p.source += alias;
    p.source += ";\n";
  }
  p.source += body;
  p.kernels = std::move(kernels);
  return p;
}

// One factory per source; the arguments are device type names (device_type<T>).
namespace programs {
inline Program elementwise(std::string_view t) {
  return make_program("elementwise", source::elementwise, {{"T", t}}, {"cutrain_add", "cutrain_multiply", "cutrain_scale"});
}
inline Program cast(std::string_view from, std::string_view to) {
  return make_program("cast", source::cast, {{"T", from}, {"U", to}}, {"cutrain_cast"});
}
inline Program dropout(std::string_view t) {
  return make_program("dropout", source::dropout, {{"T", t}}, {"cutrain_dropout_forward"});
}
inline Program cross_entropy(std::string_view t) {
  return make_program("cross_entropy", source::cross_entropy, {{"T", t}},
                      {"cutrain_cross_entropy_rows", "cutrain_cross_entropy_reduce"});
}
inline Program bias_grad(std::string_view t) {
  return make_program("bias_grad", source::bias_grad, {{"T", t}},
                      {"cutrain_bias_grad_nchw", "cutrain_bias_grad_nhwc", "cutrain_bias_grad_finish"});
}
inline Program optim(std::string_view grad_type) {
  return make_program("optim", source::optim, {{"G", grad_type}}, {"cutrain_sgd_step", "cutrain_adamw_step", "cutrain_unscale_check"});
}
inline Program pool2d(std::string_view t) {
  return make_program("pool2d", source::pool2d, {{"T", t}},
                      {"cutrain_pool2d_forward", "cutrain_pool2d_forward_vec", "cutrain_pool2d_argmax",
                       "cutrain_pool2d_argmax_vec", "cutrain_pool2d_backward", "cutrain_pool2d_backward_vec",
                       "cutrain_pool2d_backward_tiled", "cutrain_pool2d_backward_tiled_vec",
                       "cutrain_global_avg_pool_planes", "cutrain_global_avg_pool_channels",
                       "cutrain_global_avg_pool_backward"});
}
inline Program batch_norm_inference(std::string_view t) {
  return make_program("batch_norm_inference", source::batch_norm_inference, {{"T", t}},
                      {"cutrain_batch_norm_inference_rows", "cutrain_batch_norm_inference_rows_vec",
                       "cutrain_batch_norm_inference_planes", "cutrain_batch_norm_inference_planes_vec"});
}
inline Program copy() {
  return make_program("copy", source::copy, {}, {"cutrain_copy_1", "cutrain_copy_2", "cutrain_copy_4", "cutrain_copy_8"});
}
// ==== softmax (softmax helper's block) ====
inline Program softmax(std::string_view t) {
  return make_program("softmax", source::softmax, {{"T", t}},
                      {"cutrain_softmax_forward", "cutrain_log_softmax_forward", "cutrain_softmax_backward",
                       "cutrain_log_softmax_backward"});
}
// ==== end of softmax block ====
}  // namespace programs

// Every instantiation the CUDA backend can load: what the NVRTC compile test builds.
inline std::vector<Program> all_programs() {
  std::vector<Program> all{programs::copy()};
  for (std::string_view t : device_types) {
    all.push_back(programs::elementwise(t));
    all.push_back(programs::dropout(t));
    all.push_back(programs::cross_entropy(t));
    all.push_back(programs::bias_grad(t));
    all.push_back(programs::optim(t));
    all.push_back(programs::pool2d(t));
    all.push_back(programs::batch_norm_inference(t));
    all.push_back(programs::softmax(t));
    for (std::string_view u : device_types) all.push_back(programs::cast(t, u));
  }
  return all;
}

}  // namespace cutrain::cuda::kernels
