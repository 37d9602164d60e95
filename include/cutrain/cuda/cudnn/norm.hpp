// Batch, layer and RMS normalization on cuDNN's graph API (its normalization nodes), with the
// semantics of cpu/batch_norm.hpp, cpu/layer_norm.hpp and cpu/rms_norm.hpp. x is T (f32, bf16, f16); scale, bias,
// running and saved statistics are f32 (S = float), as cuDNN's engines require and as mixed
// precision wants. Each op is a typed key and, on a miss, a fusion::Graph built with build_fusion
// (fusion_build.hpp), as the convolutions are.
// The batch-norm functions return false, having run nothing, where cuDNN has no engine for the
// signature (any odd channel count on the H200); ops/batch_norm.hpp then runs the NVRTC kernels
// of cuda/kernels/batch_norm_train.hpp.
// The RMS-norm functions return false likewise: cuDNN's engines for the node cover some row
// sizes and dtypes, not all, and ops/rms_norm.hpp then composes the op from cutrain's other GPU
// ops in f32.
// Inference forward is not here: cuDNN 9.19 had no engine for the batchnorm_inference node on
// the H200 (any layout or dtype), so it is an NVRTC kernel (cuda/kernels/batch_norm_inference.hpp).
// Nor is layer norm's forward: cuDNN's took twice PyTorch's time (cuda/kernels/layer_norm.hpp).
#pragma once

#include "cutrain/core/abi.hpp"

#include "cutrain/core/params/norm.hpp"
#include "cutrain/cuda/cudnn/fusion_build.hpp"

namespace cutrain::inline CUTRAIN_ABI::cuda::cudnn {

namespace detail {
// x as a 4-d tensor: [N, C] is seen as [N, C, 1, 1].
template <class T>
std::pair<Shape, Strides> as_4d(const Tensor<T>& x) {
  if (x.rank() == 4) return {x.shape(), x.strides()};
  const auto& st = x.strides();
  return {Shape{x.dim(0), x.dim(1), 1, 1}, Strides{st[0], st[1], st[1], st[1]}};
}

// A [C] vector as the [1, C, 1, 1] tensor the normalization nodes broadcast.
inline std::pair<Shape, Strides> channel_view(std::int64_t c) { return {Shape{1, c, 1, 1}, Strides{c, 1, c, c}}; }
// A per-row statistic ([N]) as [N, 1, 1, 1].
inline std::pair<Shape, Strides> row_stat_view(std::int64_t n) { return {Shape{n, 1, 1, 1}, Strides{1, 1, 1, 1}}; }

// dx, dscale and dbias of batch norm (batch) or layer norm from dy, x, scale, mean and inv_std.
inline fusion::Graph norm_backward_graph(bool batch) {
  fusion::Graph g;
  auto DY = g.input("dy"), X = g.input("x"), G = g.input("scale");
  auto M = g.input("mean"), INV = g.input("inv_std");
  const auto r = batch ? g.batch_norm_backward(DY, X, G, M, INV) : g.layer_norm_backward(DY, X, G, M, INV);
  g.output(r.dx, "dx");
  g.output(r.dgamma, "dscale");
  g.output(r.dbeta, "dbias");
  return g;
}

// A view's shape and strides, kept while a FusionTensor points at them, with data.
struct NormArg {
  Shape shape;
  Strides strides;
  FusionTensor at(const void* data, bool f32) const { return {&shape, &strides, data, f32}; }
};
inline NormArg norm_arg(std::pair<Shape, Strides> v) { return {std::move(v.first), std::move(v.second)}; }
}  // namespace detail

// y = act(gamma (x - mean) inv_std + beta [+ residual]) with batch statistics; writes save_mean,
// save_inv_std ([C]) and next_mean / next_var ([C], the updated running statistics, unbiased
// variance). The residual add (none: nullptr) and the activation (identity by default) are
// pointwise nodes of the same graph: a residual block's tail in one pass. False: no engine.
template <GpuFloat T>
[[nodiscard]] bool batch_norm_forward_training(const Tensor<T>& x, const Tensor<float>& gamma, const Tensor<float>& beta,
                                 const Tensor<float>& running_mean, const Tensor<float>& running_var,
                                 const BatchNormParams& p, Tensor<T>& y, Tensor<float>& save_mean,
                                 Tensor<float>& save_inv_std, Tensor<float>& next_mean, Tensor<float>& next_var,
                                 const ActivationParams& act,
                                 const Tensor<T>* residual) {
  constexpr std::string_view op = "batch_norm_forward_training";
  const auto xv = detail::norm_arg(detail::as_4d(x)), yv = detail::norm_arg(detail::as_4d(y));
  const auto cv = detail::norm_arg(detail::channel_view(x.dim(1)));
  const auto rv = detail::norm_arg(residual ? detail::as_4d(*residual) : detail::as_4d(x));
  GraphKey key(GraphOp::batch_norm_forward_training, x.device().index);
  key.add(dtype_of<T>).add(p.eps).add(p.momentum).add(xv.shape, xv.strides).add(yv.shape, yv.strides);
  key.add(static_cast<int>(act.kind)).add(act.alpha).add(residual != nullptr);
  if (residual) key.add(rv.shape, rv.strides);
  const FusionTensor in[] = {xv.at(x.data(), false),          cv.at(gamma.data(), true),
                             cv.at(beta.data(), true),        cv.at(running_mean.data(), true),
                             cv.at(running_var.data(), true), rv.at(residual ? residual->data() : nullptr, false)};
  const FusionTensor out[] = {yv.at(y.data(), false),           cv.at(save_mean.data(), true),
                              cv.at(save_inv_std.data(), true), cv.at(next_mean.data(), true),
                              cv.at(next_var.data(), true)};
  const auto text = [&] {
    return cutrain::detail::cat("bn fwd train ", dtype_of<T>, " ", p, signature(" x", xv.shape, xv.strides),
                                signature(" y", yv.shape, yv.strides),
                                residual ? signature(" + residual", rv.shape, rv.strides) : std::string(), " +",
                                detail::activation_key(act));
  };
  const auto describe = [&] {
    fusion::Graph g;
    auto X = g.input("x"), G = g.input("scale"), B = g.input("bias");
    auto RM = g.input("running_mean"), RV = g.input("running_var");
    const auto r = g.batch_norm(X, G, B, RM, RV, p.eps, p.momentum);
    fusion::Value v = r.y;
    if (residual) {
      auto R = g.input("residual");
      v = g.add(v, R);
    }
    g.output(act.kind == Activation::identity ? v : g.activation(v, act), "y");
    g.output(r.mean, "mean");
    g.output(r.inv_std, "inv_std");
    g.output(r.running_mean, "next_mean");
    g.output(r.running_var, "next_var");
    return g;
  };
  return run_graph<T>(key, op, text, describe, std::span(in, residual ? 6 : 5), out, y.layout() == Layout::nhwc, false,
                      true);
}

// The backward of y = act(batch_norm(x) [+ residual]) with act relu or identity (whose derivative
// reads from y): dz = act'(y) dy, the residual's gradient, written to *dz when it is given; then
// batch norm's backward of dz. One graph: act's backward and the norm's reduction and apply in
// the passes of the norm's backward alone. False, having run nothing: no engine.
template <GpuFloat T>
[[nodiscard]] bool batch_norm_act_backward(const Tensor<T>& x, const Tensor<T>& y, const Tensor<T>& dy,
                                           const Tensor<float>& gamma, const Tensor<float>& save_mean,
                                           const Tensor<float>& save_inv_std, const ActivationParams& act,
                                           Tensor<T>& dx, Tensor<float>& dgamma, Tensor<float>& dbeta, Tensor<T>* dz) {
  constexpr std::string_view op = "batch_norm_act_backward";
  const auto xv = detail::norm_arg(detail::as_4d(x)), yv = detail::norm_arg(detail::as_4d(y));
  const auto dyv = detail::norm_arg(detail::as_4d(dy)), dxv = detail::norm_arg(detail::as_4d(dx));
  const auto cv = detail::norm_arg(detail::channel_view(x.dim(1)));
  const auto dzv = detail::norm_arg(dz ? detail::as_4d(*dz) : detail::as_4d(dx));
  GraphKey key(GraphOp::batch_norm_act_backward, x.device().index);
  key.add(dtype_of<T>).add(xv.shape, xv.strides).add(yv.shape, yv.strides).add(dyv.shape, dyv.strides);
  key.add(dxv.shape, dxv.strides).add(static_cast<int>(act.kind)).add(act.alpha).add(dz != nullptr);
  if (dz) key.add(dzv.shape, dzv.strides);
  const FusionTensor in[] = {dyv.at(dy.data(), false),      yv.at(y.data(), false),
                             xv.at(x.data(), false),        cv.at(gamma.data(), true),
                             cv.at(save_mean.data(), true), cv.at(save_inv_std.data(), true)};
  const FusionTensor out[] = {dxv.at(dx.data(), false), cv.at(dgamma.data(), true), cv.at(dbeta.data(), true),
                              dzv.at(dz ? dz->data() : nullptr, false)};
  const auto text = [&] {
    return cutrain::detail::cat("bn act bwd ", dtype_of<T>, " ", detail::activation_key(act),
                                signature(" x", xv.shape, xv.strides), signature(" y", yv.shape, yv.strides),
                                signature(" dy", dyv.shape, dyv.strides), signature(" dx", dxv.shape, dxv.strides),
                                dz ? signature(" dz", dzv.shape, dzv.strides) : std::string());
  };
  const auto describe = [&] {
    fusion::Graph g;
    auto DY = g.input("dy"), Y = g.input("y"), X = g.input("x"), G = g.input("scale");
    auto M = g.input("mean"), INV = g.input("inv_std");
    const auto DZ = g.activation_backward(DY, Y, act);
    const auto r = g.batch_norm_backward(DZ, X, G, M, INV);
    g.output(r.dx, "dx");
    g.output(r.dgamma, "dscale");
    g.output(r.dbeta, "dbias");
    if (dz) g.output(DZ, "dz");
    return g;
  };
  return run_graph<T>(key, op, text, describe, in, std::span(out, dz ? 4 : 3), dx.layout() == Layout::nhwc, false,
                      true);
}

template <GpuFloat T>
[[nodiscard]] bool batch_norm_backward(const Tensor<T>& x, const Tensor<T>& dy, const Tensor<float>& gamma,
                         const Tensor<float>& save_mean, const Tensor<float>& save_inv_std, Tensor<T>& dx,
                         Tensor<float>& dgamma, Tensor<float>& dbeta) {
  constexpr std::string_view op = "batch_norm_backward";
  const auto xv = detail::norm_arg(detail::as_4d(x)), dyv = detail::norm_arg(detail::as_4d(dy));
  const auto dxv = detail::norm_arg(detail::as_4d(dx)), cv = detail::norm_arg(detail::channel_view(x.dim(1)));
  GraphKey key(GraphOp::batch_norm_backward, x.device().index);
  key.add(dtype_of<T>).add(xv.shape, xv.strides).add(dyv.shape, dyv.strides).add(dxv.shape, dxv.strides);
  const FusionTensor in[] = {dyv.at(dy.data(), false), xv.at(x.data(), false), cv.at(gamma.data(), true),
                             cv.at(save_mean.data(), true), cv.at(save_inv_std.data(), true)};
  const FusionTensor out[] = {dxv.at(dx.data(), false), cv.at(dgamma.data(), true), cv.at(dbeta.data(), true)};
  const auto text = [&] {
    return cutrain::detail::cat("bn bwd ", dtype_of<T>, signature(" x", xv.shape, xv.strides),
                                signature(" dy", dyv.shape, dyv.strides), signature(" dx", dxv.shape, dxv.strides));
  };
  const auto describe = [] { return detail::norm_backward_graph(true); };
  return run_graph<T>(key, op, text, describe, in, out, dx.layout() == Layout::nhwc, false, true);
}

namespace detail {
// Layer norm sees x [N, ...] as [N, D, 1, 1] over its contiguous trailing elements when x is
// row-major, and as [N, C, H, W] otherwise; gamma/beta ([...], row-major) as [1, ...].
template <class T>
std::pair<Shape, Strides> ln_view(const Tensor<T>& t) {
  if (t.rank() == 4) return {t.shape(), t.strides()};
  const std::int64_t n = t.dim(0), d = t.numel() / std::max<std::int64_t>(n, 1);
  return {Shape{n, d, 1, 1}, Strides{d, 1, d, d}};
}
inline std::pair<Shape, Strides> ln_param_view(const Shape& x4) {
  const std::int64_t c = x4[1], h = x4[2], w = x4[3];
  return {Shape{1, c, h, w}, Strides{c * h * w, h * w, w, 1}};
}
}  // namespace detail

template <GpuFloat T>
void layer_norm_backward(const Tensor<T>& x, const Tensor<T>& dy, const Tensor<float>& gamma, const Tensor<float>& mean,
                         const Tensor<float>& inv_std, Tensor<T>& dx, Tensor<float>& dgamma, Tensor<float>& dbeta) {
  constexpr std::string_view op = "layer_norm_backward";
  const auto xv = detail::norm_arg(detail::ln_view(x)), dyv = detail::norm_arg(detail::ln_view(dy));
  const auto dxv = detail::norm_arg(detail::ln_view(dx));
  const auto pv = detail::norm_arg(detail::ln_param_view(xv.shape)), sv = detail::norm_arg(detail::row_stat_view(xv.shape[0]));
  GraphKey key(GraphOp::layer_norm_backward, x.device().index);
  key.add(dtype_of<T>).add(xv.shape, xv.strides).add(dyv.shape, dyv.strides).add(dxv.shape, dxv.strides);
  const FusionTensor in[] = {dyv.at(dy.data(), false), xv.at(x.data(), false), pv.at(gamma.data(), true),
                             sv.at(mean.data(), true), sv.at(inv_std.data(), true)};
  const FusionTensor out[] = {dxv.at(dx.data(), false), pv.at(dgamma.data(), true), pv.at(dbeta.data(), true)};
  const auto text = [&] {
    return cutrain::detail::cat("ln bwd ", dtype_of<T>, signature(" x", xv.shape, xv.strides),
                                signature(" dy", dyv.shape, dyv.strides), signature(" dx", dxv.shape, dxv.strides));
  };
  const auto describe = [] { return detail::norm_backward_graph(false); };
  run_graph<T>(key, op, text, describe, in, out, false, false);
}

namespace detail {
// A row-major x [N, ...] as [N, D, 1, 1]; gamma ([...], row-major) as [1, D, 1, 1].
template <class T>
std::pair<Shape, Strides> rms_view(std::string_view op, const Tensor<T>& t, std::string_view name) {
  const Layout l = t.layout();
  CUTRAIN_REQUIRE(l == Layout::row_major || l == Layout::nchw, InvalidArgument, op, name, " ", t.describe(),
                  " must be contiguous row-major here (ops/rms_norm.hpp stages it)");
  const std::int64_t n = t.dim(0), d = t.numel() / std::max<std::int64_t>(n, 1);
  return {Shape{n, d, 1, 1}, Strides{d, 1, d, d}};
}
}  // namespace detail

// y = gamma * x * inv_rms, inv_rms = 1 / sqrt(mean(x^2) + eps) over each row of x [N, ...]
// (row-major, everything after dim 0): cuDNN's rmsnorm node in training phase, whose
// INV_VARIANCE output is inv_rms ([N], f32). False, having run nothing: no engine.
template <GpuFloat T>
[[nodiscard]] bool rms_norm_forward(const Tensor<T>& x, const Tensor<float>& gamma, double eps, Tensor<T>& y,
                                    Tensor<float>& inv_rms) {
  constexpr std::string_view op = "rms_norm_forward";
  const auto xv = detail::norm_arg(detail::rms_view(op, x, "x")), yv = detail::norm_arg(detail::rms_view(op, y, "y"));
  const auto pv = detail::norm_arg(detail::ln_param_view(xv.shape)), sv = detail::norm_arg(detail::row_stat_view(xv.shape[0]));
  GraphKey key(GraphOp::rms_norm_forward, x.device().index);
  key.add(dtype_of<T>).add(eps).add(xv.shape, xv.strides).add(yv.shape, yv.strides);
  const FusionTensor in[] = {xv.at(x.data(), false), pv.at(gamma.data(), true)};
  const FusionTensor out[] = {yv.at(y.data(), false), sv.at(inv_rms.data(), true)};
  const auto text = [&] {
    return cutrain::detail::cat("rms fwd ", dtype_of<T>, " eps ", eps, signature(" x", xv.shape, xv.strides),
                                signature(" y", yv.shape, yv.strides));
  };
  const auto describe = [&] {
    fusion::Graph g;
    auto X = g.input("x"), G = g.input("scale");
    const auto r = g.rms_norm_train(X, G, eps);
    g.output(r.y, "y");
    g.output(r.inv_std, "inv_rms");
    return g;
  };
  return run_graph<T>(key, op, text, describe, in, out, false, false, true);
}

// dx and dgamma of rms_norm_forward from its inv_rms: cuDNN's rmsnorm_backward node without a
// bias gradient. False, having run nothing: no engine.
template <GpuFloat T>
[[nodiscard]] bool rms_norm_backward(const Tensor<T>& x, const Tensor<T>& dy, const Tensor<float>& gamma,
                                     const Tensor<float>& inv_rms, Tensor<T>& dx, Tensor<float>& dgamma) {
  constexpr std::string_view op = "rms_norm_backward";
  const auto xv = detail::norm_arg(detail::rms_view(op, x, "x")), dyv = detail::norm_arg(detail::rms_view(op, dy, "dy"));
  const auto dxv = detail::norm_arg(detail::rms_view(op, dx, "dx"));
  const auto pv = detail::norm_arg(detail::ln_param_view(xv.shape)), sv = detail::norm_arg(detail::row_stat_view(xv.shape[0]));
  GraphKey key(GraphOp::rms_norm_backward, x.device().index);
  key.add(dtype_of<T>).add(xv.shape, xv.strides).add(dyv.shape, dyv.strides).add(dxv.shape, dxv.strides);
  const FusionTensor in[] = {dyv.at(dy.data(), false), xv.at(x.data(), false), pv.at(gamma.data(), true),
                             sv.at(inv_rms.data(), true)};
  const FusionTensor out[] = {dxv.at(dx.data(), false), pv.at(dgamma.data(), true)};
  const auto text = [&] {
    return cutrain::detail::cat("rms bwd ", dtype_of<T>, signature(" x", xv.shape, xv.strides),
                                signature(" dy", dyv.shape, dyv.strides), signature(" dx", dxv.shape, dxv.strides));
  };
  const auto describe = [&] {
    fusion::Graph g;
    auto DY = g.input("dy"), X = g.input("x"), G = g.input("scale"), INV = g.input("inv_rms");
    const auto r = g.rms_norm_backward(DY, X, G, INV);
    g.output(r.dx, "dx");
    g.output(r.dgamma, "dscale");
    return g;
  };
  return run_graph<T>(key, op, text, describe, in, out, false, false, true);
}

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::cudnn
