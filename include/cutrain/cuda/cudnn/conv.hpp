// conv2d on cuDNN's graph API: forward (with the bias add and an activation fused), backward data
// (with an activation's backward fused), backward filter and conv_transpose2d with a bias, with
// the semantics of cpu/conv2d.hpp. Each is a typed key and, on a miss, a fusion::Graph built
// with build_fusion (fusion_build.hpp).
#pragma once

#include "cutrain/core/abi.hpp"

#include "cutrain/core/params/conv2d.hpp"
#include "cutrain/cuda/cudnn/fusion_build.hpp"

namespace cutrain::inline CUTRAIN_ABI::cuda::cudnn {

namespace detail {
template <class T>
std::string conv_key(const char* op, const Conv2dParams& p, bool strict) {
  return cutrain::detail::cat(op, " ", dtype_of<T>, strict ? "" : "+tf32", " stride ", p.stride_h, "x", p.stride_w, " pad ",
                              p.pad_top, ",", p.pad_bottom, ",", p.pad_left, ",", p.pad_right, " dil ", p.dilation_h, "x",
                              p.dilation_w, " groups ", p.groups);
}

// The typed key of a convolution graph (its tensors are added by the op): direction, dtype,
// TF32, stride, padding, dilation, groups.
template <class T>
GraphKey conv_graph_key(GraphOp op, int device, const Conv2dParams& p, bool strict) {
  GraphKey k(op, device);
  k.add(dtype_of<T>).add(strict).add(p.stride_h).add(p.stride_w).add(p.pad_top).add(p.pad_bottom);
  k.add(p.pad_left).add(p.pad_right).add(p.dilation_h).add(p.dilation_w).add(p.groups);
  return k;
}

// [K] bias as the [1, K, 1, 1] tensor a pointwise op broadcasts.
inline Shape bias_dims(std::int64_t k) { return {1, k, 1, 1}; }
inline Strides bias_strides(std::int64_t k) { return {k, 1, k, k}; }

}  // namespace detail

// y = act(conv(x, w) (+ bias)), one graph. y must be allocated with the output shape; bias may
// be undefined; act defaults to identity (no activation node).
template <GpuFloat T>
void conv2d_forward(const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>& bias, const Conv2dParams& p, Tensor<T>& y,
                    const ActivationParams& act) {
  constexpr std::string_view op = "conv2d_forward";
  const bool strict = detail::strict_f32<T>();
  const bool has_bias = bias.defined(), has_act = act.kind != Activation::identity;
  GraphKey key = detail::conv_graph_key<T>(GraphOp::conv_fprop, x.device().index, p, strict);
  key.add(x.shape(), x.strides()).add(w.shape(), w.strides()).add(y.shape(), y.strides());
  key.add(has_bias).add(static_cast<int>(act.kind)).add(act.alpha);
  const Shape bs = detail::bias_dims(w.dim(0));
  const Strides bst = detail::bias_strides(w.dim(0));
  const FusionTensor in[] = {fusion_arg(x), fusion_arg(w), {&bs, &bst, bias.data()}};
  const auto text = [&] {
    return detail::conv_key<T>("fprop", p, strict) + signature(" x", x.shape(), x.strides()) +
           signature(" w", w.shape(), w.strides()) + signature(" y", y.shape(), y.strides()) +
           (has_bias ? " +bias" : "") + (has_act ? " +" + detail::activation_key(act) : "");
  };
  const auto describe = [&] {
    fusion::Graph g;
    auto X = g.input("x"), W = g.input("w");  // inputs in the order of `in` (not inside one call:
    auto v = g.conv2d(X, W, p);               // the order of a call's arguments is unspecified)
    if (has_bias) v = g.add(v, g.input("bias"));
    if (has_act) v = g.activation(v, act);
    g.output(v, "y");
    return g;
  };
  run_graph<T>(key, op, text, describe, std::span(in, has_bias ? 3 : 2), std::array{fusion_arg(y)},
               y.layout() == Layout::nhwc, strict);
}

// dx = conv_transpose(dy, w); dx must be allocated with x's shape. With an activation, the
// activation's backward is fused behind the dgrad: dx = act'(act_x) * conv_transpose(dy, w),
// where act_x (x's shape) is the input of the activation whose output fed this conv.
template <GpuFloat T>
void conv2d_backward_data(const Tensor<T>& dy, const Tensor<T>& w, const Conv2dParams& p, Tensor<T>& dx,
                          const ActivationParams& act, const Tensor<T>& act_x) {
  constexpr std::string_view op = "conv2d_backward_data";
  const bool strict = detail::strict_f32<T>();
  const bool fused = act.kind != Activation::identity;
  GraphKey key = detail::conv_graph_key<T>(GraphOp::conv_dgrad, dy.device().index, p, strict);
  key.add(dy.shape(), dy.strides()).add(w.shape(), w.strides()).add(dx.shape(), dx.strides());
  key.add(static_cast<int>(act.kind)).add(act.alpha);
  if (fused) key.add(act_x.shape(), act_x.strides());
  const FusionTensor in[] = {fusion_arg(dy), fusion_arg(w), fusion_arg(act_x)};
  const auto text = [&] {
    std::string t = detail::conv_key<T>("dgrad", p, strict) + signature(" dy", dy.shape(), dy.strides()) +
                    signature(" w", w.shape(), w.strides()) + signature(" dx", dx.shape(), dx.strides());
    if (fused) t += " +" + detail::activation_key(act) + " bwd" + signature(" act_x", act_x.shape(), act_x.strides());
    return t;
  };
  const auto describe = [&] {
    fusion::Graph g;
    auto DY = g.input("dy"), W = g.input("w");
    auto v = g.conv2d_dgrad(DY, W, p, dx.shape());
    if (fused) v = g.activation_backward(v, g.input("act_x"), act);
    g.output(v, "dx");
    return g;
  };
  run_graph<T>(key, op, text, describe, std::span(in, fused ? 3 : 2), std::array{fusion_arg(dx)},
               dx.layout() == Layout::nhwc, strict);
}

// y = conv_transpose(x, w) + bias, one graph: the dgrad of the conv2d p (dy := x, its filter w
// [Cin, Cout/groups, R, S] read as [K, C/groups, R, S], dx := y) with the bias add fused behind it.
// y must be allocated with the transposed conv's output shape; bias [Cout] must be defined (without
// one, conv2d_backward_data(x, w, p, y) is the whole op). Throws CudnnError where cuDNN has no
// engine for the fusion.
template <GpuFloat T>
void conv_transpose2d_forward(const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>& bias, const Conv2dParams& p,
                              Tensor<T>& y) {
  constexpr std::string_view op = "conv_transpose2d_forward";
  CUTRAIN_REQUIRE(bias.defined() && bias.is_contiguous(), InvalidArgument, op,
                  "needs a contiguous bias (without one, conv2d_backward_data is the op), got ", bias.describe());
  const bool strict = detail::strict_f32<T>();
  GraphKey key = detail::conv_graph_key<T>(GraphOp::conv_dgrad_bias, x.device().index, p, strict);
  key.add(x.shape(), x.strides()).add(w.shape(), w.strides()).add(y.shape(), y.strides());
  const Shape bs = detail::bias_dims(y.dim(1));
  const Strides bst = detail::bias_strides(y.dim(1));
  const FusionTensor in[] = {fusion_arg(x), fusion_arg(w), {&bs, &bst, bias.data()}};
  const auto text = [&] {
    return detail::conv_key<T>("dgrad", p, strict) + signature(" dy", x.shape(), x.strides()) +
           signature(" w", w.shape(), w.strides()) + signature(" dx", y.shape(), y.strides()) + " +bias";
  };
  const auto describe = [&] {
    fusion::Graph g;
    auto DY = g.input("dy"), W = g.input("w"), B = g.input("bias");
    g.output(g.add(g.conv2d_dgrad(DY, W, p, y.shape()), B), "dx");
    return g;
  };
  run_graph<T>(key, op, text, describe, in, std::array{fusion_arg(y)}, y.layout() == Layout::nhwc, strict);
}

// dw = correlation of x with dy; dw must be allocated with w's shape.
template <GpuFloat T>
void conv2d_backward_filter(const Tensor<T>& dy, const Tensor<T>& x, const Conv2dParams& p, Tensor<T>& dw) {
  constexpr std::string_view op = "conv2d_backward_filter";
  const bool strict = detail::strict_f32<T>();
  GraphKey key = detail::conv_graph_key<T>(GraphOp::conv_wgrad, dy.device().index, p, strict);
  key.add(dy.shape(), dy.strides()).add(x.shape(), x.strides()).add(dw.shape(), dw.strides());
  const FusionTensor in[] = {fusion_arg(dy), fusion_arg(x)};
  const auto text = [&] {
    return detail::conv_key<T>("wgrad", p, strict) + signature(" dy", dy.shape(), dy.strides()) +
           signature(" x", x.shape(), x.strides()) + signature(" dw", dw.shape(), dw.strides());
  };
  const auto describe = [&] {
    fusion::Graph g;
    auto DY = g.input("dy"), X = g.input("x");
    g.output(g.conv2d_wgrad(DY, X, p, dw.shape()), "dw");
    return g;
  };
  run_graph<T>(key, op, text, describe, in, std::array{fusion_arg(dw)}, dw.layout() == Layout::nhwc, strict);
}

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::cudnn
