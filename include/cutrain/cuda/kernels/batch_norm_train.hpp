// Batch-norm training forward and backward on the GPU as NVRTC kernels (batch_norm_train.cuh).
// batch_norm_train_forward / _backward: one block per channel, any strides whose h and w merge
// (else staged): the fallback where cuDNN's graph API has no engine (odd channel counts on the
// H200). batch_norm_act_forward_fast / batch_norm_act_backward_fast: reduce, finish and apply
// kernels over dense tensors, which ops:: tries first (below). Semantics of cpu/batch_norm.hpp;
// f32 sums in a fixed order; the [C] vectors are dense f32. The outputs must not alias the inputs.
#pragma once

#include "cutrain/core/abi.hpp"
#include "cutrain/core/config.hpp"

#ifndef CUTRAIN_WITH_CUDA
#error "cutrain/cuda/ needs CUTRAIN_WITH_CUDA (link cutrain::cuda)"
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <optional>
#include <type_traits>
#include <string_view>
#include <utility>

#include "cutrain/core/params/activation.hpp"
#include "cutrain/core/params/norm.hpp"
#include "cutrain/cuda/gpu_float.hpp"
#include "cutrain/cuda/kernels/batch_norm_inference.hpp"  // NcsStrides, ncs_strides
#include "cutrain/cuda/kernels/programs.hpp"  // programs::batch_norm_train, the kernels of batch_norm_train.cuh

namespace cutrain::inline CUTRAIN_ABI::cuda::kernels {

namespace detail {
template <GpuFloat T>
const Program& batch_norm_train_program() {
  static const Program p = programs::batch_norm_train(device_type<T>);
  return p;
}

// t as [N, C, S] strides, staged into `l` first where its h and w do not merge.
template <class T>
std::pair<Tensor<T>, NcsStrides> bn_view(const Tensor<T>& t, Layout l) {
  if (auto v = ncs_strides(t)) return {t.view(), *v};
  Tensor<T> s = t.contiguous(l);
  const NcsStrides v = *ncs_strides(s);
  return {std::move(s), v};
}

inline void require_channels(std::string_view op, std::initializer_list<std::pair<const Tensor<float>*, const char*>> ts,
                             std::int64_t c, Device dev) {
  for (const auto& [t, name] : ts) {
    CUTRAIN_REQUIRE(t->defined() && t->shape() == Shape{c} && t->is_contiguous(), InvalidArgument, op, name,
                    " must be a dense [", c, "], got ", t->defined() ? t->describe() : std::string("undefined"));
    CUTRAIN_REQUIRE(t->device() == dev, DeviceError, op, name, " ", t->describe(), " is not on ", dev);
  }
}

inline unsigned bn_train_blocks(long long C) { return static_cast<unsigned>(std::min<long long>(C, 65535)); }
}  // namespace detail

template <GpuFloat T>
void batch_norm_train_forward(const Tensor<T>& x, const Tensor<float>& gamma, const Tensor<float>& beta,
                              const Tensor<float>& running_mean, const Tensor<float>& running_var,
                              const BatchNormParams& p, Tensor<T>& y, Tensor<float>& save_mean,
                              Tensor<float>& save_inv_std, Tensor<float>& next_mean, Tensor<float>& next_var,
                              const ActivationParams& act = {.kind = Activation::identity}) {
  constexpr std::string_view op = "cuda::kernels::batch_norm_train_forward";
  detail::require_cuda_input(op, x, "x");
  CUTRAIN_REQUIRE((x.rank() == 2 || x.rank() == 4) && x.numel() > 0 && x.numel() / x.dim(1) > 1, InvalidArgument, op,
                  "x must be a non-empty [N,C] or [N,C,H,W] with more than one value per channel, got ", x.describe());
  cutrain::detail::check_activation(op, act);
  detail::require_output(op, y, x.shape(), x.device(), "y");
  const long long C = x.dim(1);
  detail::require_channels(op, {{&gamma, "gamma"}, {&beta, "beta"}, {&running_mean, "running_mean"},
                                {&running_var, "running_var"}, {&save_mean, "save_mean"},
                                {&save_inv_std, "save_inv_std"}, {&next_mean, "next_mean"}, {&next_var, "next_var"}},
                           C, x.device());
  const auto [xs, xv] = detail::bn_view(x, y.layout());
  const detail::NcsStrides yv = *detail::ncs_strides(y);
  const long long N = x.dim(0), S = x.numel() / (N * C);
  const int kind = static_cast<int>(act.kind);
  const float alpha = static_cast<float>(act.alpha);
  const int dev = x.device().index;
  DeviceScope scope(dev);
  launch(function(dev, detail::batch_norm_train_program<T>(), "cutrain_batch_norm_train_forward"),
         detail::bn_train_blocks(C), 256, op, xs.data(), y.data(), gamma.data(), beta.data(), running_mean.data(),
         running_var.data(), save_mean.data(), save_inv_std.data(), next_mean.data(), next_var.data(), N, C, S, xv.n,
         xv.c, xv.s, yv.n, yv.c, yv.s, p.eps, p.momentum, kind, alpha);
}

template <GpuFloat T>
void batch_norm_train_backward(const Tensor<T>& x, const Tensor<T>& dy, const Tensor<float>& gamma,
                               const Tensor<float>& save_mean, const Tensor<float>& save_inv_std, Tensor<T>& dx,
                               Tensor<float>& dgamma, Tensor<float>& dbeta) {
  constexpr std::string_view op = "cuda::kernels::batch_norm_train_backward";
  detail::require_cuda_input(op, x, "x");
  detail::require_cuda_input(op, dy, "dy");
  CUTRAIN_REQUIRE((x.rank() == 2 || x.rank() == 4) && x.numel() > 0 && dy.shape() == x.shape(), InvalidArgument, op,
                  "x must be a non-empty [N,C] or [N,C,H,W] and dy of its shape, got x ", x.describe(), " and dy ",
                  dy.describe());
  CUTRAIN_REQUIRE(dy.device() == x.device(), DeviceError, op, "x ", x.describe(), " and dy ", dy.describe(),
                  " are on different devices");
  detail::require_output(op, dx, x.shape(), x.device(), "dx");
  const long long C = x.dim(1);
  detail::require_channels(op, {{&gamma, "gamma"}, {&save_mean, "save_mean"}, {&save_inv_std, "save_inv_std"},
                                {&dgamma, "dgamma"}, {&dbeta, "dbeta"}},
                           C, x.device());
  const auto [xs, xv] = detail::bn_view(x, dx.layout());
  const auto [dys, gv] = detail::bn_view(dy, dx.layout());
  const detail::NcsStrides dv = *detail::ncs_strides(dx);
  const long long N = x.dim(0), S = x.numel() / (N * C);
  const int dev = x.device().index;
  DeviceScope scope(dev);
  launch(function(dev, detail::batch_norm_train_program<T>(), "cutrain_batch_norm_train_backward"),
         detail::bn_train_blocks(C), 256, op, xs.data(), dys.data(), dx.data(), gamma.data(), save_mean.data(),
         save_inv_std.data(), dgamma.data(), dbeta.data(), N, C, S, xv.n, xv.c, xv.s, gv.n, gv.c, gv.s, dv.n, dv.c,
         dv.s);
}


namespace detail {
// Multiprocessors of device dev (asked once per device).
inline int sm_count(int dev) {
  static std::array<std::atomic<int>, 64> known{};
  if (dev < 0 || dev >= 64) return 132;
  int n = known[static_cast<std::size_t>(dev)].load(std::memory_order_relaxed);
  if (n == 0) {
    check(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev), "cuda::kernels::sm_count",
          "cudaDeviceGetAttribute");
    known[static_cast<std::size_t>(dev)].store(n, std::memory_order_relaxed);
  }
  return n;
}

// How the fast backward sees dense x: channels-last rows of C (M rows), or [N, C, S] planes.
struct BnDense {
  bool channels_last = false;
  long long rows = 0, n = 0, s = 0;
};
// Nothing when t is not dense in one of those forms, or a channels-last C is not a multiple of
// VMAX (16 / sizeof(T)).
template <class T>
std::optional<BnDense> bn_dense(const Tensor<T>& t) {
  const Shape& sh = t.shape();
  const long long N = sh[0], C = sh[1], S = t.numel() / (N * C), v = 16 / static_cast<long long>(sizeof(T));
  const Layout l = t.layout();
  if ((l == Layout::row_major || l == Layout::nchw) && S > 1) return BnDense{false, 0, N, S};
  if ((l == Layout::row_major || l == Layout::nchw || l == Layout::nhwc) && C % v == 0) return BnDense{true, N * S, N, S};
  return std::nullopt;
}
}  // namespace detail

// Whether ops:: runs batch norm's backward with the kernels below (true, the default) or with
// cuDNN's graph first (false; CUTRAIN_BN_BACKWARD=cudnn in the environment at start): for timing
// one against the other.
inline std::atomic<bool>& fast_batch_norm_backward() {
  static std::atomic<bool> on{config()->bn_backward != "cudnn"};
  return on;
}

// The same for the forward in training (CUTRAIN_BN_FORWARD=cudnn: cuDNN's graph first). ops::
// takes the fast forward only where forward_prefers_fast says.
inline std::atomic<bool>& fast_batch_norm_forward() {
  static std::atomic<bool> on{config()->bn_forward != "cudnn"};
  return on;
}

// Whether ops:: runs the fast forward on channels-last images too (CUTRAIN_BN_FORWARD=fast at
// start, or set it). Off by default: there cuDNN's graph is the faster once built. On spares a
// fresh machine cuDNN's runtime compile of each NHWC norm graph (0.4-1 s each on an H100).
inline std::atomic<bool>& fast_batch_norm_forward_channels_last() {
  static std::atomic<bool> on{config()->bn_forward == "fast"};
  return on;
}

namespace detail {
// The grid the fast kernels share: channels-last (P, gy) with P row groups, NCHW (P, C); vec:
// NCHW planes read in packs.
struct BnGrid {
  long long P = 0, gy = 0;
  int vec = 0;
};
template <class T>
BnGrid bn_grid(const BnDense& form, long long C, int dev) {
  constexpr long long V = 16 / sizeof(T);
  const long long blocks = 4LL * sm_count(dev);
  BnGrid g;
  if (form.channels_last) {
    const long long cols = C / V, cb = std::min<long long>(cols, 256), rb = 256 / cb;
    g.gy = (cols + cb - 1) / cb;
    g.P = std::clamp<long long>((form.rows + rb - 1) / rb, 1, std::max<long long>(1, blocks / g.gy));
  } else {
    g.gy = C;
    g.P = std::clamp<long long>(blocks / C, 1, form.n);
    g.vec = form.s % V == 0 ? 1 : 0;
  }
  return g;
}
}  // namespace detail

// Whether ops:: runs the fast forward on x before cuDNN's graph: NCHW planes and [N, C] rows, and
// channels-last images only with fast_batch_norm_forward_channels_last(). There cuDNN's graph reads
// x once where the fast forward reads it twice: 0.030 against 0.039 ms a call in the ResNet-18
// step (bf16 NHWC, H100).
template <class T>
bool forward_prefers_fast(const Tensor<T>& x) {
  return fast_batch_norm_forward_channels_last() ||
         !(x.rank() == 4 && x.dim(2) * x.dim(3) > 1 && x.layout() == Layout::nhwc);
}

// y = act(batch_norm(x) + *residual) in training (residual null: none), in three kernels
// (batch_norm_train.cuh's fast forward): save_mean, save_inv_std (1 / sqrt(var + eps), the biased
// variance), next_mean and next_var (the running statistics updated with the unbiased variance;
// they may be running_mean and running_var themselves) and y. Runs where x, y and *residual are
// dense alike (as batch_norm_act_backward_fast) and 16-byte aligned; false, having run nothing,
// otherwise. The sums are in f32 in a fixed order, about each channel's first value.
template <GpuFloat T>
[[nodiscard]] bool batch_norm_act_forward_fast(const Tensor<T>& x, const Tensor<float>& gamma,
                                               const Tensor<float>& beta, const Tensor<float>& running_mean,
                                               const Tensor<float>& running_var, const BatchNormParams& p,
                                               const ActivationParams& act,
                                               std::type_identity_t<const Tensor<T>>* residual, Tensor<T>& y,
                                               Tensor<float>& save_mean, Tensor<float>& save_inv_std,
                                               Tensor<float>& next_mean, Tensor<float>& next_var) {
  constexpr std::string_view op = "cuda::kernels::batch_norm_act_forward_fast";
  detail::require_cuda_input(op, x, "x");
  CUTRAIN_REQUIRE((x.rank() == 2 || x.rank() == 4) && x.numel() > 0 && x.numel() / x.dim(1) > 1, InvalidArgument, op,
                  "x must be a non-empty [N,C] or [N,C,H,W] with more than one value per channel, got ", x.describe());
  cutrain::detail::check_activation(op, act);
  detail::require_output(op, y, x.shape(), x.device(), "y");
  if (residual) {
    detail::require_cuda_input(op, *residual, "residual");
    CUTRAIN_REQUIRE(residual->shape() == x.shape(), InvalidArgument, op, "residual ", residual->describe(),
                    " must have x's shape ", x.shape());
  }
  const long long C = x.dim(1);
  detail::require_channels(op, {{&gamma, "gamma"}, {&beta, "beta"}, {&running_mean, "running_mean"},
                                {&running_var, "running_var"}, {&save_mean, "save_mean"},
                                {&save_inv_std, "save_inv_std"}, {&next_mean, "next_mean"}, {&next_var, "next_var"}},
                           C, x.device());
  const auto form = detail::bn_dense(x);
  if (!form || C > 65535) return false;
  const auto alike = [&](const Tensor<T>& t) {
    return t.device() == x.device() && t.layout() == x.layout() && reinterpret_cast<std::uintptr_t>(t.data()) % 16 == 0;
  };
  if (!alike(x) || !alike(y) || (residual && !alike(*residual))) return false;
  const int dev = x.device().index;
  DeviceScope scope(dev);
  const Program& prog = detail::batch_norm_train_program<T>();
  const int c = static_cast<int>(C), kind = static_cast<int>(act.kind);
  const float alpha = static_cast<float>(act.alpha);
  const T* rp = residual ? residual->data() : nullptr;
  const detail::BnGrid g = detail::bn_grid<T>(*form, C, dev);
  const dim3 grid(static_cast<unsigned>(g.P), static_cast<unsigned>(g.gy));
  // One scratch buffer: the reduce's partial sums (2 P C), then the finish's coefficients (2 C).
  Tensor<float> scratch(Shape{2 * g.P * C + 2 * C}, {.device = x.device()});
  float* const part = scratch.data();
  float* const coef = part + 2 * g.P * C;
  if (form->channels_last)
    launch(function(dev, prog, "cutrain_bn_fwd_reduce_cl"), grid, dim3(256), op, x.data(), form->rows, c, part);
  else
    launch(function(dev, prog, "cutrain_bn_fwd_reduce_cf"), grid, dim3(256), op, x.data(), form->n, c, form->s, g.vec,
           part);
  const long long M = x.numel() / C, k_stride = form->channels_last ? 1 : form->s;
  launch(function(dev, prog, "cutrain_bn_fwd_finish"), dim3(static_cast<unsigned>(std::min<long long>(C, 65535))),
         dim3(256), op, static_cast<const float*>(part), g.P, c, M, x.data(), k_stride, gamma.data(),
         running_mean.data(), running_var.data(), save_mean.data(), save_inv_std.data(), next_mean.data(),
         next_var.data(), coef, p.eps, p.momentum);
  if (form->channels_last)
    launch(function(dev, prog, "cutrain_bn_fwd_apply_cl"), grid, dim3(256), op, x.data(), rp, y.data(),
           static_cast<const float*>(coef), beta.data(), form->rows, c, kind, alpha);
  else
    launch(function(dev, prog, "cutrain_bn_fwd_apply_cf"), grid, dim3(256), op, x.data(), rp, y.data(),
           static_cast<const float*>(coef), beta.data(), form->n, c, form->s, g.vec, kind, alpha);
  return true;
}

// The backward of y = act(batch_norm(x) [+ residual]) with act relu (relu) or identity (y may be
// undefined then), in three kernels (batch_norm_train.cuh's fast backward): dbeta, dgamma, dx,
// and *dz = act'(y) dy (the residual's gradient) when dz is given. Runs where x, y, dy, dx and
// *dz are dense alike (channels-last with C a multiple of 16 / sizeof(T), or NCHW / [N, C]) and
// 16-byte aligned; false, having run nothing, otherwise. The sums are in f32 in a fixed order.
template <GpuFloat T>
[[nodiscard]] bool batch_norm_act_backward_fast(const Tensor<T>& x, const Tensor<T>& y, const Tensor<T>& dy,
                                                const Tensor<float>& gamma, const Tensor<float>& save_mean,
                                                const Tensor<float>& save_inv_std, bool relu, Tensor<T>& dx,
                                                Tensor<float>& dgamma, Tensor<float>& dbeta,
                                                std::type_identity_t<Tensor<T>>* dz) {
  constexpr std::string_view op = "cuda::kernels::batch_norm_act_backward_fast";
  detail::require_cuda_input(op, x, "x");
  detail::require_cuda_input(op, dy, "dy");
  CUTRAIN_REQUIRE((x.rank() == 2 || x.rank() == 4) && x.numel() > 0 && dy.shape() == x.shape(), InvalidArgument, op,
                  "x must be a non-empty [N,C] or [N,C,H,W] and dy of its shape, got x ", x.describe(), " and dy ",
                  dy.describe());
  CUTRAIN_REQUIRE(!relu || (y.defined() && y.shape() == x.shape()), InvalidArgument, op,
                  "relu's backward needs y of x's shape ", x.shape(), ", got ", y.defined() ? y.describe() : "none");
  detail::require_output(op, dx, x.shape(), x.device(), "dx");
  if (dz) detail::require_output(op, *dz, x.shape(), x.device(), "dz");
  const long long C = x.dim(1);
  detail::require_channels(op, {{&gamma, "gamma"}, {&save_mean, "save_mean"}, {&save_inv_std, "save_inv_std"},
                                {&dgamma, "dgamma"}, {&dbeta, "dbeta"}},
                           C, x.device());
  const auto form = detail::bn_dense(x);
  if (!form || C > 65535) return false;
  const auto alike = [&](const Tensor<T>& t) {
    return t.device() == x.device() && t.layout() == x.layout() && reinterpret_cast<std::uintptr_t>(t.data()) % 16 == 0;
  };
  if (!alike(x) || !alike(dy) || !alike(dx) || (relu && !alike(y)) || (dz && !alike(*dz))) return false;
  const int dev = x.device().index;
  DeviceScope scope(dev);
  const Program& prog = detail::batch_norm_train_program<T>();
  const int c = static_cast<int>(C), r = relu ? 1 : 0;
  const T* yp = relu ? y.data() : nullptr;
  T* zp = dz ? dz->data() : nullptr;
  const detail::BnGrid g = detail::bn_grid<T>(*form, C, dev);  // the reduce's and the apply's
  const long long P = g.P;
  const int vec = g.vec;
  const dim3 grid(static_cast<unsigned>(P), static_cast<unsigned>(g.gy));
  // One scratch buffer: the reduce's partial sums (2 P C), then the finish's coefficients (3 C).
  Tensor<float> scratch(Shape{2 * P * C + 3 * C}, {.device = x.device()});
  float* const part = scratch.data();
  float* const coef = part + 2 * P * C;
  if (form->channels_last)
    launch(function(dev, prog, "cutrain_bn_bwd_reduce_cl"), grid, dim3(256), op, x.data(), yp, dy.data(), zp,
           save_mean.data(), form->rows, c, r, part);
  else
    launch(function(dev, prog, "cutrain_bn_bwd_reduce_cf"), grid, dim3(256), op, x.data(), yp, dy.data(), zp,
           save_mean.data(), form->n, c, form->s, r, vec, part);
  const long long M = x.numel() / C;
  launch(function(dev, prog, "cutrain_bn_bwd_finish"), dim3(static_cast<unsigned>(std::min<long long>(C, 65535))),
         dim3(256), op, part, P, c, M, gamma.data(), save_inv_std.data(), dgamma.data(), dbeta.data(), coef);
  if (form->channels_last)
    launch(function(dev, prog, "cutrain_bn_bwd_apply_cl"), grid, dim3(256), op, x.data(), yp, dy.data(),
           static_cast<const T*>(zp), dx.data(), static_cast<const float*>(coef), save_mean.data(), form->rows, c, r);
  else
    launch(function(dev, prog, "cutrain_bn_bwd_apply_cf"), grid, dim3(256), op, x.data(), yp, dy.data(),
           static_cast<const T*>(zp), dx.data(), static_cast<const float*>(coef), save_mean.data(), form->n, c,
           form->s, r, vec);
  return true;
}

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::kernels
