// Batch, layer and RMS normalization on cuDNN's graph API (its normalization nodes), with the
// semantics of cpu/batch_norm.hpp, cpu/layer_norm.hpp and cpu/rms_norm.hpp. x is T (f32, bf16, f16); scale, bias,
// running and saved statistics are f32 (S = float), as cuDNN's engines require and as mixed
// precision wants.
// The batch-norm functions return false, having run nothing, where cuDNN has no engine for the
// signature (any odd channel count on the H200); ops/batch_norm.hpp then runs the NVRTC kernels
// of cuda/kernels/batch_norm_train.hpp.
// The RMS-norm functions return false likewise: cuDNN's engines for the node cover some row
// sizes and dtypes, not all, and ops/rms_norm.hpp then composes the op from cutrain's other GPU
// ops in f32.
// Inference forward is not here: cuDNN 9.19 had no engine for the batchnorm_inference node on
// the H200 (any layout or dtype), so it is an NVRTC kernel (cuda/kernels/batch_norm_inference.hpp).
#pragma once

#include "cutrain/core/abi.hpp"

#include "cutrain/core/params/norm.hpp"
#include "cutrain/cuda/cudnn/activation.hpp"
#include "cutrain/cuda/cudnn/plan_store.hpp"

namespace cutrain::inline CUTRAIN_ABI::cuda::cudnn {

namespace detail {
// A [C] vector as the [1, C, 1, 1] tensor the normalization nodes broadcast.
inline TensorAttr channel_tensor(fe::graph::Graph& g, const char* name, std::int64_t c) {
  return tensor(g, name, Shape{1, c, 1, 1}, Strides{c, 1, c, c}, fe::DataType_t::FLOAT);
}

// x as a 4-d tensor: [N, C] is seen as [N, C, 1, 1].
template <class T>
std::pair<Shape, Strides> as_4d(const Tensor<T>& x) {
  if (x.rank() == 4) return {x.shape(), x.strides()};
  const auto& st = x.strides();
  return {Shape{x.dim(0), x.dim(1), 1, 1}, Strides{st[0], st[1], st[1], st[1]}};
}

inline TensorAttr scalar(fe::graph::Graph& g, float v) {
  return g.tensor(fe::graph::Tensor_attributes(v).set_dim({1, 1, 1, 1}).set_stride({1, 1, 1, 1}));
}

inline void output(const TensorAttr& t, const Shape& s, const Strides& st, fe::DataType_t type) {
  t->set_output(true).set_dim(s.dims()).set_stride(st).set_data_type(type);
}
}  // namespace detail

// y = act(gamma (x - mean) inv_std + beta) with batch statistics; writes save_mean, save_inv_std
// ([C]) and next_mean / next_var ([C], the updated running statistics, unbiased variance). The
// activation (identity by default) is a pointwise node of the same graph. False: no engine.
template <GpuFloat T>
[[nodiscard]] bool batch_norm_forward_training(const Tensor<T>& x, const Tensor<float>& gamma, const Tensor<float>& beta,
                                 const Tensor<float>& running_mean, const Tensor<float>& running_var,
                                 const BatchNormParams& p, Tensor<T>& y, Tensor<float>& save_mean,
                                 Tensor<float>& save_inv_std, Tensor<float>& next_mean, Tensor<float>& next_var,
                                 const ActivationParams& act = {.kind = Activation::identity}) {
  constexpr std::string_view op = "batch_norm_forward_training";
  const int dev = x.device().index;
  const auto [xs, xst] = detail::as_4d(x);
  const auto [ys, yst] = detail::as_4d(y);
  const std::int64_t c = x.dim(1);
  GraphKey key(GraphOp::batch_norm_forward_training, dev);
  key.add(dtype_of<T>).add(p.eps).add(p.momentum).add(xs, xst).add(ys, yst).add(static_cast<int>(act.kind)).add(act.alpha);
  PlanStore& store = plan_store();
  bool failed = false;
  BuiltGraph* bg = store.find(key, failed);
  if (!bg && !failed) {
    const std::string text = cutrain::detail::cat("bn fwd train ", dtype_of<T>, " ", p, signature(" x", xs, xst),
                                                 signature(" y", ys, yst), " +", detail::activation_key(act));
    bg = store.try_build(key, text, autotune::Planner::for_graph(dev, family(key.op())), [&](autotune::Planner& planner) {
      auto g = detail::new_graph<T>();
      auto X = tensor(*g, "x", xs, xst, fe_type<T>::value);
      auto SCALE = detail::channel_tensor(*g, "scale", c);
      auto BIAS = detail::channel_tensor(*g, "bias", c);
      auto RM = detail::channel_tensor(*g, "running_mean", c);
      auto RV = detail::channel_tensor(*g, "running_var", c);
      auto EPS = detail::scalar(*g, static_cast<float>(p.eps));
      auto MOM = detail::scalar(*g, static_cast<float>(p.momentum));
      auto [Y, MEAN, INV, NEXT_M, NEXT_V] = g->batchnorm(
          X, SCALE, BIAS, fe::graph::Batchnorm_attributes().set_epsilon(EPS).set_previous_running_stats(RM, RV, MOM));
      if (act.kind != Activation::identity) Y = g->pointwise(Y, detail::activation_attributes(act, false));
      detail::output(Y, ys, yst, fe_type<T>::value);
      for (const auto& s : {MEAN, INV, NEXT_M, NEXT_V}) detail::output(s, {1, c, 1, 1}, {c, 1, c, c}, fe::DataType_t::FLOAT);
      build(*g, handles(dev).cudnn, op, text, false, planner);
      return BuiltGraph{g, {X, SCALE, BIAS, RM, RV, Y, MEAN, INV, NEXT_M, NEXT_V}, g->get_workspace_size()};
    });
  }
  if (!bg) return ++kernel_fallbacks(), false;
  execute(*bg, dev,
          {x.data(), gamma.data(), beta.data(), running_mean.data(), running_var.data(), y.data(), save_mean.data(),
           save_inv_std.data(), next_mean.data(), next_var.data()}, op);
  return true;
}

template <GpuFloat T>
[[nodiscard]] bool batch_norm_backward(const Tensor<T>& x, const Tensor<T>& dy, const Tensor<float>& gamma,
                         const Tensor<float>& save_mean, const Tensor<float>& save_inv_std, Tensor<T>& dx,
                         Tensor<float>& dgamma, Tensor<float>& dbeta) {
  constexpr std::string_view op = "batch_norm_backward";
  const int dev = x.device().index;
  const auto [xs, xst] = detail::as_4d(x);
  const auto [dys, dyst] = detail::as_4d(dy);
  const auto [dxs, dxst] = detail::as_4d(dx);
  const std::int64_t c = x.dim(1);
  GraphKey key(GraphOp::batch_norm_backward, dev);
  key.add(dtype_of<T>).add(xs, xst).add(dys, dyst).add(dxs, dxst);
  PlanStore& store = plan_store();
  bool failed = false;
  BuiltGraph* bg = store.find(key, failed);
  if (!bg && !failed) {
    const std::string text = cutrain::detail::cat("bn bwd ", dtype_of<T>, signature(" x", xs, xst),
                                                 signature(" dy", dys, dyst), signature(" dx", dxs, dxst));
    bg = store.try_build(key, text, autotune::Planner::for_graph(dev, family(key.op())), [&](autotune::Planner& planner) {
      auto g = detail::new_graph<T>();
      auto X = tensor(*g, "x", xs, xst, fe_type<T>::value);
      auto DY = tensor(*g, "dy", dys, dyst, fe_type<T>::value);
      auto SCALE = detail::channel_tensor(*g, "scale", c);
      auto MEAN = detail::channel_tensor(*g, "mean", c);
      auto INV = detail::channel_tensor(*g, "inv_std", c);
      auto [DX, DSCALE, DBIAS] =
          g->batchnorm_backward(DY, X, SCALE, fe::graph::Batchnorm_backward_attributes().set_saved_mean_and_inv_variance(MEAN, INV));
      detail::output(DX, dxs, dxst, fe_type<T>::value);
      detail::output(DSCALE, {1, c, 1, 1}, {c, 1, c, c}, fe::DataType_t::FLOAT);
      detail::output(DBIAS, {1, c, 1, 1}, {c, 1, c, c}, fe::DataType_t::FLOAT);
      build(*g, handles(dev).cudnn, op, text, false, planner);
      return BuiltGraph{g, {X, DY, SCALE, MEAN, INV, DX, DSCALE, DBIAS}, g->get_workspace_size()};
    });
  }
  if (!bg) return ++kernel_fallbacks(), false;
  execute(*bg, dev,
          {x.data(), dy.data(), gamma.data(), save_mean.data(), save_inv_std.data(), dx.data(), dgamma.data(),
           dbeta.data()}, op);
  return true;
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
void layer_norm_forward(const Tensor<T>& x, const Tensor<float>& gamma, const Tensor<float>& beta, double eps, Tensor<T>& y,
                        Tensor<float>& mean, Tensor<float>& inv_std) {
  constexpr std::string_view op = "layer_norm_forward";
  const int dev = x.device().index;
  const auto [xs, xst] = detail::ln_view(x);
  const auto [ys, yst] = detail::ln_view(y);
  const auto [ps, pst] = detail::ln_param_view(xs);
  const std::int64_t n = xs[0];
  GraphKey key(GraphOp::layer_norm_forward, dev);
  key.add(dtype_of<T>).add(eps).add(xs, xst).add(ys, yst);
  PlanStore& store = plan_store();
  BuiltGraph* bg = store.find(key);
  if (!bg) {
    const std::string text = cutrain::detail::cat("ln fwd ", dtype_of<T>, " eps ", eps, signature(" x", xs, xst),
                                                 signature(" y", ys, yst));
    bg = &store.build(key, text, autotune::Planner::for_graph(dev, family(key.op())), [&](autotune::Planner& planner) {
      auto g = detail::new_graph<T>();
      auto X = tensor(*g, "x", xs, xst, fe_type<T>::value);
      auto SCALE = tensor(*g, "scale", ps, pst, fe::DataType_t::FLOAT);
      auto BIAS = tensor(*g, "bias", ps, pst, fe::DataType_t::FLOAT);
      auto EPS = detail::scalar(*g, static_cast<float>(eps));
      auto [Y, MEAN, INV] = g->layernorm(
          X, SCALE, BIAS, fe::graph::Layernorm_attributes().set_forward_phase(fe::NormFwdPhase_t::TRAINING).set_epsilon(EPS));
      detail::output(Y, ys, yst, fe_type<T>::value);
      detail::output(MEAN, {n, 1, 1, 1}, {1, 1, 1, 1}, fe::DataType_t::FLOAT);
      detail::output(INV, {n, 1, 1, 1}, {1, 1, 1, 1}, fe::DataType_t::FLOAT);
      build(*g, handles(dev).cudnn, op, text, false, planner);
      return BuiltGraph{g, {X, SCALE, BIAS, Y, MEAN, INV}, g->get_workspace_size()};
    });
  }
  execute(*bg, dev, {x.data(), gamma.data(), beta.data(), y.data(), mean.data(), inv_std.data()}, op);
}

template <GpuFloat T>
void layer_norm_backward(const Tensor<T>& x, const Tensor<T>& dy, const Tensor<float>& gamma, const Tensor<float>& mean,
                         const Tensor<float>& inv_std, Tensor<T>& dx, Tensor<float>& dgamma, Tensor<float>& dbeta) {
  constexpr std::string_view op = "layer_norm_backward";
  const int dev = x.device().index;
  const auto [xs, xst] = detail::ln_view(x);
  const auto [dys, dyst] = detail::ln_view(dy);
  const auto [dxs, dxst] = detail::ln_view(dx);
  const auto [ps, pst] = detail::ln_param_view(xs);
  const std::int64_t n = xs[0];
  GraphKey key(GraphOp::layer_norm_backward, dev);
  key.add(dtype_of<T>).add(xs, xst).add(dys, dyst).add(dxs, dxst);
  PlanStore& store = plan_store();
  BuiltGraph* bg = store.find(key);
  if (!bg) {
    const std::string text = cutrain::detail::cat("ln bwd ", dtype_of<T>, signature(" x", xs, xst),
                                                 signature(" dy", dys, dyst), signature(" dx", dxs, dxst));
    bg = &store.build(key, text, autotune::Planner::for_graph(dev, family(key.op())), [&](autotune::Planner& planner) {
      auto g = detail::new_graph<T>();
      auto X = tensor(*g, "x", xs, xst, fe_type<T>::value);
      auto DY = tensor(*g, "dy", dys, dyst, fe_type<T>::value);
      auto SCALE = tensor(*g, "scale", ps, pst, fe::DataType_t::FLOAT);
      auto MEAN = tensor(*g, "mean", Shape{n, 1, 1, 1}, Strides{1, 1, 1, 1}, fe::DataType_t::FLOAT);
      auto INV = tensor(*g, "inv_std", Shape{n, 1, 1, 1}, Strides{1, 1, 1, 1}, fe::DataType_t::FLOAT);
      auto [DX, DSCALE, DBIAS] = g->layernorm_backward(
          DY, X, SCALE, fe::graph::Layernorm_backward_attributes().set_saved_mean_and_inv_variance(MEAN, INV));
      detail::output(DX, dxs, dxst, fe_type<T>::value);
      detail::output(DSCALE, ps, pst, fe::DataType_t::FLOAT);
      detail::output(DBIAS, ps, pst, fe::DataType_t::FLOAT);
      build(*g, handles(dev).cudnn, op, text, false, planner);
      return BuiltGraph{g, {X, DY, SCALE, MEAN, INV, DX, DSCALE, DBIAS}, g->get_workspace_size()};
    });
  }
  execute(*bg, dev,
          {x.data(), dy.data(), gamma.data(), mean.data(), inv_std.data(), dx.data(), dgamma.data(), dbeta.data()}, op);
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
  const int dev = x.device().index;
  const auto [xs, xst] = detail::rms_view(op, x, "x");
  const auto [ys, yst] = detail::rms_view(op, y, "y");
  const std::int64_t n = xs[0], d = xs[1];
  GraphKey key(GraphOp::rms_norm_forward, dev);
  key.add(dtype_of<T>).add(eps).add(xs, xst).add(ys, yst);
  PlanStore& store = plan_store();
  bool failed = false;
  BuiltGraph* bg = store.find(key, failed);
  if (!bg && !failed) {
    const std::string text = cutrain::detail::cat("rms fwd ", dtype_of<T>, " eps ", eps, signature(" x", xs, xst),
                                                 signature(" y", ys, yst));
    bg = store.try_build(key, text, autotune::Planner::for_graph(dev, family(key.op())), [&](autotune::Planner& planner) {
      auto g = detail::new_graph<T>();
      auto X = tensor(*g, "x", xs, xst, fe_type<T>::value);
      auto SCALE = tensor(*g, "scale", Shape{1, d, 1, 1}, Strides{d, 1, d, d}, fe::DataType_t::FLOAT);
      auto EPS = detail::scalar(*g, static_cast<float>(eps));
      auto [Y, INV] = g->rmsnorm(
          X, SCALE, fe::graph::Rmsnorm_attributes().set_forward_phase(fe::NormFwdPhase_t::TRAINING).set_epsilon(EPS));
      detail::output(Y, ys, yst, fe_type<T>::value);
      detail::output(INV, {n, 1, 1, 1}, {1, 1, 1, 1}, fe::DataType_t::FLOAT);
      build(*g, handles(dev).cudnn, op, text, false, planner);
      return BuiltGraph{g, {X, SCALE, Y, INV}, g->get_workspace_size()};
    });
  }
  if (!bg) return ++kernel_fallbacks(), false;
  execute(*bg, dev, {x.data(), gamma.data(), y.data(), inv_rms.data()}, op);
  return true;
}

// dx and dgamma of rms_norm_forward from its inv_rms: cuDNN's rmsnorm_backward node without a
// bias gradient. False, having run nothing: no engine.
template <GpuFloat T>
[[nodiscard]] bool rms_norm_backward(const Tensor<T>& x, const Tensor<T>& dy, const Tensor<float>& gamma,
                                     const Tensor<float>& inv_rms, Tensor<T>& dx, Tensor<float>& dgamma) {
  constexpr std::string_view op = "rms_norm_backward";
  const int dev = x.device().index;
  const auto [xs, xst] = detail::rms_view(op, x, "x");
  const auto [dys, dyst] = detail::rms_view(op, dy, "dy");
  const auto [dxs, dxst] = detail::rms_view(op, dx, "dx");
  const std::int64_t n = xs[0], d = xs[1];
  GraphKey key(GraphOp::rms_norm_backward, dev);
  key.add(dtype_of<T>).add(xs, xst).add(dys, dyst).add(dxs, dxst);
  PlanStore& store = plan_store();
  bool failed = false;
  BuiltGraph* bg = store.find(key, failed);
  if (!bg && !failed) {
    const std::string text = cutrain::detail::cat("rms bwd ", dtype_of<T>, signature(" x", xs, xst),
                                                 signature(" dy", dys, dyst), signature(" dx", dxs, dxst));
    bg = store.try_build(key, text, autotune::Planner::for_graph(dev, family(key.op())), [&](autotune::Planner& planner) {
      auto g = detail::new_graph<T>();
      auto X = tensor(*g, "x", xs, xst, fe_type<T>::value);
      auto DY = tensor(*g, "dy", dys, dyst, fe_type<T>::value);
      auto SCALE = tensor(*g, "scale", Shape{1, d, 1, 1}, Strides{d, 1, d, d}, fe::DataType_t::FLOAT);
      auto INV = tensor(*g, "inv_rms", Shape{n, 1, 1, 1}, Strides{1, 1, 1, 1}, fe::DataType_t::FLOAT);
      auto [DX, DSCALE, DBIAS] =
          g->rmsnorm_backward(DY, X, SCALE, INV, fe::graph::Rmsnorm_backward_attributes().has_dbias(false));
      detail::output(DX, dxs, dxst, fe_type<T>::value);
      detail::output(DSCALE, {1, d, 1, 1}, {d, 1, d, d}, fe::DataType_t::FLOAT);
      build(*g, handles(dev).cudnn, op, text, false, planner);
      return BuiltGraph{g, {X, DY, SCALE, INV, DX, DSCALE}, g->get_workspace_size()};
    });
  }
  if (!bg) return ++kernel_fallbacks(), false;
  execute(*bg, dev, {x.data(), dy.data(), gamma.data(), inv_rms.data(), dx.data(), dgamma.data()}, op);
  return true;
}

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::cudnn
