// Activations on cuDNN's graph API: one pointwise node forward (y = act(x)) and one backward
// (dx = dy * act'(x), cuDNN's *_BWD modes, which take dy and x). Same semantics as cpu/activation.hpp.
// Each returns false, having run nothing, where cuDNN has no engine for the signature (a tensor
// of 3 elements on the H200, among others); ops/activation.hpp then runs the NVRTC kernel of
// cuda/kernels/activation.hpp.
#pragma once

#include "cutrain/core/abi.hpp"

#include "cutrain/core/params/activation.hpp"
#include "cutrain/cuda/cudnn/plan_store.hpp"

namespace cutrain::inline CUTRAIN_ABI::cuda::cudnn {

namespace detail {
// The pointwise node for an activation, forward or backward, with its parameters.
inline fe::graph::Pointwise_attributes activation_attributes(const ActivationParams& a, bool backward) {
  using M = fe::PointwiseMode_t;
  fe::graph::Pointwise_attributes attr;
  const auto alpha = static_cast<float>(a.alpha);
  switch (a.kind) {
    case Activation::identity: attr.set_mode(M::IDENTITY); break;
    case Activation::relu: attr.set_mode(backward ? M::RELU_BWD : M::RELU_FWD); break;
    case Activation::leaky_relu:
      attr.set_mode(backward ? M::RELU_BWD : M::RELU_FWD).set_relu_lower_clip_slope(alpha);
      break;
    case Activation::elu: attr.set_mode(backward ? M::ELU_BWD : M::ELU_FWD).set_elu_alpha(alpha); break;
    case Activation::sigmoid: attr.set_mode(backward ? M::SIGMOID_BWD : M::SIGMOID_FWD); break;
    case Activation::tanh: attr.set_mode(backward ? M::TANH_BWD : M::TANH_FWD); break;
    case Activation::gelu_erf: attr.set_mode(backward ? M::GELU_BWD : M::GELU_FWD); break;
    case Activation::gelu_tanh: attr.set_mode(backward ? M::GELU_APPROX_TANH_BWD : M::GELU_APPROX_TANH_FWD); break;
    case Activation::silu: attr.set_mode(backward ? M::SWISH_BWD : M::SWISH_FWD).set_swish_beta(1.0f); break;
  }
  return attr;
}

inline std::string activation_key(const ActivationParams& a) {
  return cutrain::detail::cat(a.kind, " alpha ", a.alpha);
}

// The graph key of activation_forward or _backward in T on device `dev` over the elementwise view
// (vs, vst), and its text (direction "fwd" or "bwd").
template <GpuFloat T>
GraphKey activation_graph_key(GraphOp op, int dev, const ActivationParams& a, const Shape& vs, const Strides& vst) {
  GraphKey key(op, dev);
  key.add(dtype_of<T>).add(static_cast<int>(a.kind)).add(a.alpha).add(vs, vst);
  return key;
}
template <GpuFloat T>
std::string activation_graph_text(const char* direction, const ActivationParams& a, const Shape& vs, const Strides& vst) {
  return cutrain::detail::cat("activation ", direction, " ", activation_key(a), " ", dtype_of<T>,
                              signature(" view", vs, vst));
}
}  // namespace detail

// x and y contiguous in one layout (see elementwise_view). False: no engine, nothing ran.
template <GpuFloat T>
[[nodiscard]] bool activation_forward(const Tensor<T>& x, const ActivationParams& a, Tensor<T>& y) {
  constexpr std::string_view op = "activation_forward";
  const int dev = x.device().index;
  const auto [vs, vst] = elementwise_view(x);
  const GraphKey key = detail::activation_graph_key<T>(GraphOp::activation_forward, dev, a, vs, vst);
  PlanStore& store = plan_store();
  bool failed = false;
  BuiltGraph* bg = store.find(key, failed);
  if (!bg && !failed) {
    const std::string text = detail::activation_graph_text<T>("fwd", a, vs, vst);
    bg = store.try_build(key, text, autotune::Planner::for_graph(dev, family(key.op())), [&](autotune::Planner& planner) {
      auto g = detail::new_graph<T>();
      auto X = tensor(*g, "x", vs, vst, fe_type<T>::value);
      auto Y = g->pointwise(X, detail::activation_attributes(a, false));
      Y->set_output(true).set_dim(vs.dims()).set_stride(vst).set_data_type(fe_type<T>::value);
      build(*g, handles(dev).cudnn, op, text, false, planner);
      return BuiltGraph{g, {X, Y}, g->get_workspace_size()};
    });
  }
  if (!bg) return ++kernel_fallbacks(), false;
  execute(*bg, dev, {x.data(), y.data()}, op);
  return true;
}

// x, dy and dx contiguous in one layout (see elementwise_view). False: no engine, nothing ran.
template <GpuFloat T>
[[nodiscard]] bool activation_backward(const Tensor<T>& x, const Tensor<T>& dy, const ActivationParams& a, Tensor<T>& dx) {
  constexpr std::string_view op = "activation_backward";
  const int dev = x.device().index;
  const auto [vs, vst] = elementwise_view(x);
  const GraphKey key = detail::activation_graph_key<T>(GraphOp::activation_backward, dev, a, vs, vst);
  PlanStore& store = plan_store();
  bool failed = false;
  BuiltGraph* bg = store.find(key, failed);
  if (!bg && !failed) {
    const std::string text = detail::activation_graph_text<T>("bwd", a, vs, vst);
    bg = store.try_build(key, text, autotune::Planner::for_graph(dev, family(key.op())), [&](autotune::Planner& planner) {
      auto g = detail::new_graph<T>();
      auto X = tensor(*g, "x", vs, vst, fe_type<T>::value);
      auto DY = tensor(*g, "dy", vs, vst, fe_type<T>::value);
      auto DX = a.kind == Activation::identity ? g->pointwise(DY, detail::activation_attributes(a, true))
                                               : g->pointwise(DY, X, detail::activation_attributes(a, true));
      DX->set_output(true).set_dim(vs.dims()).set_stride(vst).set_data_type(fe_type<T>::value);
      build(*g, handles(dev).cudnn, op, text, false, planner);
      if (a.kind == Activation::identity) return BuiltGraph{g, {DY, DX}, g->get_workspace_size()};
      return BuiltGraph{g, {X, DY, DX}, g->get_workspace_size()};
    });
  }
  if (!bg) return ++kernel_fallbacks(), false;
  if (a.kind == Activation::identity) execute(*bg, dev, {dy.data(), dx.data()}, op);
  else execute(*bg, dev, {x.data(), dy.data(), dx.data()}, op);
  return true;
}

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::cudnn
