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
// row_loss (may be null): loss of each row, f32. dlogits (may be null): (softmax - q) * grad_scale.
extern "C" __global__ void cutrain_cross_entropy_rows(const T* logits, const int* labels, long long C, float eps,
                                                      float* row_loss, T* dlogits, float grad_scale) {
  const long long row = blockIdx.x;
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
  // The ops check labels on the host; here an out-of-range one gives NaN, never a read outside the row.
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
// w -= lr * g. buf may be null when momentum == 0.
extern "C" __global__ void cutrain_sgd_step(float* w, const G* grad, float* buf, long long n, float lr, float momentum,
                                            float dampening, float weight_decay, int nesterov, int first_step) {
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
extern "C" __global__ void cutrain_adamw_step(float* w, const G* grad, float* m, float* v, long long n, float lr,
                                              float beta1, float beta2, float eps, float weight_decay, float step_size,
                                              float bias_correction2_sqrt) {
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
  return make_program("optim", source::optim, {{"G", grad_type}}, {"cutrain_sgd_step", "cutrain_adamw_step"});
}
}  // namespace programs

// Every instantiation the CUDA backend can load: what the NVRTC compile test builds.
inline std::vector<Program> all_programs() {
  std::vector<Program> all;
  for (std::string_view t : device_types) {
    all.push_back(programs::elementwise(t));
    all.push_back(programs::dropout(t));
    all.push_back(programs::cross_entropy(t));
    all.push_back(programs::bias_grad(t));
    all.push_back(programs::optim(t));
    for (std::string_view u : device_types) all.push_back(programs::cast(t, u));
  }
  return all;
}

}  // namespace cutrain::cuda::kernels
