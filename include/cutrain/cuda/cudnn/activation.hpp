// Activations on cuDNN's graph API: one pointwise node forward (y = act(x)) and one backward
// (dx = dy * act'(x), cuDNN's *_BWD modes, which take dy and x), described as fusion::Graphs and
// built with build_fusion (fusion_build.hpp). Same semantics as cpu/activation.hpp.
// Each returns false, having run nothing, where cuDNN has no engine for the signature (a tensor
// of 3 elements on the H200, among others); ops/activation.hpp then runs the NVRTC kernel of
// cuda/kernels/activation.hpp.
#pragma once

#include "cutrain/core/abi.hpp"

#include "cutrain/cuda/cudnn/fusion_build.hpp"

namespace cutrain::inline CUTRAIN_ABI::cuda::cudnn {

namespace detail {
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
  const auto [vs, vst] = elementwise_view(x);
  const GraphKey key = detail::activation_graph_key<T>(GraphOp::activation_forward, x.device().index, a, vs, vst);
  const auto text = [&] { return detail::activation_graph_text<T>("fwd", a, vs, vst); };
  const auto describe = [&] {
    fusion::Graph g;
    g.output(g.activation(g.input("x"), a), "y");
    return g;
  };
  const FusionTensor in[] = {{&vs, &vst, x.data()}}, out[] = {{&vs, &vst, y.data()}};
  return run_graph<T>(key, "activation_forward", text, describe, in, out, false, false, true);
}

// x, dy and dx contiguous in one layout (see elementwise_view). False: no engine, nothing ran.
// The identity's backward (dx = dy) reads dy alone.
template <GpuFloat T>
[[nodiscard]] bool activation_backward(const Tensor<T>& x, const Tensor<T>& dy, const ActivationParams& a, Tensor<T>& dx) {
  const auto [vs, vst] = elementwise_view(x);
  const GraphKey key = detail::activation_graph_key<T>(GraphOp::activation_backward, x.device().index, a, vs, vst);
  const bool identity = a.kind == Activation::identity;
  const auto text = [&] { return detail::activation_graph_text<T>("bwd", a, vs, vst); };
  const auto describe = [&] {
    fusion::Graph g;
    auto DY = g.input("dy");
    g.output(identity ? g.activation(DY, a) : g.activation_backward(DY, g.input("x"), a), "dx");
    return g;
  };
  const FusionTensor in[] = {{&vs, &vst, dy.data()}, {&vs, &vst, x.data()}}, out[] = {{&vs, &vst, dx.data()}};
  return run_graph<T>(key, "activation_backward", text, describe, std::span(in, identity ? 1 : 2), out, false, false,
                      true);
}

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::cudnn
