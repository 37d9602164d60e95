// conv2d on cuDNN's graph API: forward (with the bias add fused), backward data and backward
// filter, with the semantics of cpu/conv2d.hpp.
#pragma once

#include "cutrain/core/abi.hpp"

#include "cutrain/core/params/conv2d.hpp"
#include "cutrain/cuda/cudnn/activation.hpp"
#include "cutrain/cuda/cudnn/plan_store.hpp"

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

template <class T>
std::shared_ptr<fe::graph::Graph> new_graph() {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe_type<T>::value)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

template <class T>
bool strict_f32() {
  return std::is_same_v<T, float> && !math_options().allow_tf32;
}

// The padding, stride and dilation of p on any of the frontend's conv attribute types.
template <class Attributes>
Attributes conv_attributes(const Conv2dParams& p) {
  Attributes a;
  a.set_pre_padding({p.pad_top, p.pad_left})
      .set_post_padding({p.pad_bottom, p.pad_right})
      .set_stride({p.stride_h, p.stride_w})
      .set_dilation({p.dilation_h, p.dilation_w});
  return a;
}

// [K] bias as the [1, K, 1, 1] tensor a pointwise op broadcasts.
inline Shape bias_dims(std::int64_t k) { return {1, k, 1, 1}; }
inline Strides bias_strides(std::int64_t k) { return {k, 1, k, k}; }
}  // namespace detail

// y = act(conv(x, w) (+ bias)), one graph. y must be allocated with the output shape; bias may
// be undefined; act defaults to identity (no activation node).
template <GpuFloat T>
void conv2d_forward(const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>& bias, const Conv2dParams& p, Tensor<T>& y,
                    const ActivationParams& act = {.kind = Activation::identity}) {
  constexpr std::string_view op = "conv2d_forward";
  const int dev = x.device().index;
  const bool strict = detail::strict_f32<T>();
  const bool has_bias = bias.defined();
  GraphKey key = detail::conv_graph_key<T>(GraphOp::conv_fprop, dev, p, strict);
  key.add(x.shape(), x.strides()).add(w.shape(), w.strides()).add(y.shape(), y.strides());
  key.add(has_bias).add(static_cast<int>(act.kind)).add(act.alpha);
  PlanStore& store = plan_store();
  BuiltGraph* bg = store.find(key);
  if (!bg) {
    const std::string text = detail::conv_key<T>("fprop", p, strict) + signature(" x", x.shape(), x.strides()) +
                            signature(" w", w.shape(), w.strides()) + signature(" y", y.shape(), y.strides()) +
                            (has_bias ? " +bias" : "") +
                            (act.kind == Activation::identity ? "" : " +" + detail::activation_key(act));
    bg = &store.build(key, text, autotune::Planner::for_graph(dev, family(key.op())), [&](autotune::Planner& planner) {
      auto g = detail::new_graph<T>();
      auto X = tensor(*g, "x", x);
      auto W = tensor(*g, "w", w);
      auto Y = g->conv_fprop(X, W, detail::conv_attributes<fe::graph::Conv_fprop_attributes>(p));
      BuiltGraph b{g, {X, W}, 0};
      if (has_bias) {
        auto B = tensor(*g, "bias", detail::bias_dims(w.dim(0)), detail::bias_strides(w.dim(0)), fe_type<T>::value);
        Y = g->pointwise(Y, B, fe::graph::Pointwise_attributes().set_mode(fe::PointwiseMode_t::ADD));
        b.tensors.push_back(B);
      }
      if (act.kind != Activation::identity) Y = g->pointwise(Y, detail::activation_attributes(act, false));
      Y->set_output(true).set_dim(y.shape().dims()).set_stride(y.strides()).set_data_type(fe_type<T>::value);
      b.tensors.push_back(Y);
      build(*g, handles(dev).cudnn, op, text, strict, planner);
      b.workspace = g->get_workspace_size();
      return b;
    });
  }
  if (has_bias) execute(*bg, dev, {x.data(), w.data(), bias.data(), y.data()}, op);
  else execute(*bg, dev, {x.data(), w.data(), y.data()}, op);
}

// dx = conv_transpose(dy, w); dx must be allocated with x's shape. With an activation, the
// activation's backward is fused behind the dgrad: dx = act'(act_x) * conv_transpose(dy, w),
// where act_x (x's shape) is the input of the activation whose output fed this conv.
template <GpuFloat T>
void conv2d_backward_data(const Tensor<T>& dy, const Tensor<T>& w, const Conv2dParams& p, Tensor<T>& dx,
                          const ActivationParams& act = {.kind = Activation::identity}, const Tensor<T>& act_x = {}) {
  constexpr std::string_view op = "conv2d_backward_data";
  const int dev = dy.device().index;
  const bool strict = detail::strict_f32<T>();
  const bool fused = act.kind != Activation::identity;
  GraphKey key = detail::conv_graph_key<T>(GraphOp::conv_dgrad, dev, p, strict);
  key.add(dy.shape(), dy.strides()).add(w.shape(), w.strides()).add(dx.shape(), dx.strides());
  key.add(static_cast<int>(act.kind)).add(act.alpha);
  if (fused) key.add(act_x.shape(), act_x.strides());
  PlanStore& store = plan_store();
  BuiltGraph* bg = store.find(key);
  if (!bg) {
    std::string text = detail::conv_key<T>("dgrad", p, strict) + signature(" dy", dy.shape(), dy.strides()) +
                      signature(" w", w.shape(), w.strides()) + signature(" dx", dx.shape(), dx.strides());
    if (fused) text += " +" + detail::activation_key(act) + " bwd" + signature(" act_x", act_x.shape(), act_x.strides());
    bg = &store.build(key, text, autotune::Planner::for_graph(dev, family(key.op())), [&](autotune::Planner& planner) {
      auto g = detail::new_graph<T>();
      auto DY = tensor(*g, "dy", dy);
      auto W = tensor(*g, "w", w);
      auto DX = g->conv_dgrad(DY, W, detail::conv_attributes<fe::graph::Conv_dgrad_attributes>(p));
      BuiltGraph b{g, {DY, W}, 0};
      if (fused) {
        DX->set_dim(dx.shape().dims()).set_stride(dx.strides());
        auto AX = tensor(*g, "act_x", act_x);
        DX = g->pointwise(DX, AX, detail::activation_attributes(act, true));
        b.tensors.push_back(AX);
      }
      DX->set_output(true).set_dim(dx.shape().dims()).set_stride(dx.strides()).set_data_type(fe_type<T>::value);
      b.tensors.push_back(DX);
      build(*g, handles(dev).cudnn, op, text, strict, planner);
      b.workspace = g->get_workspace_size();
      return b;
    });
  }
  if (fused) execute(*bg, dev, {dy.data(), w.data(), act_x.data(), dx.data()}, op);
  else execute(*bg, dev, {dy.data(), w.data(), dx.data()}, op);
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
  const int dev = x.device().index;
  const bool strict = detail::strict_f32<T>();
  GraphKey key = detail::conv_graph_key<T>(GraphOp::conv_dgrad_bias, dev, p, strict);
  key.add(x.shape(), x.strides()).add(w.shape(), w.strides()).add(y.shape(), y.strides());
  PlanStore& store = plan_store();
  BuiltGraph* bg = store.find(key);
  if (!bg) {
    const std::string text = detail::conv_key<T>("dgrad", p, strict) + signature(" dy", x.shape(), x.strides()) +
                             signature(" w", w.shape(), w.strides()) + signature(" dx", y.shape(), y.strides()) +
                             " +bias";
    bg = &store.build(key, text, autotune::Planner::for_graph(dev, family(key.op())), [&](autotune::Planner& planner) {
      auto g = detail::new_graph<T>();
      auto DY = tensor(*g, "dy", x);
      auto W = tensor(*g, "w", w);
      auto DX = g->conv_dgrad(DY, W, detail::conv_attributes<fe::graph::Conv_dgrad_attributes>(p));
      DX->set_dim(y.shape().dims()).set_stride(y.strides());
      const std::int64_t k = y.dim(1);
      auto B = tensor(*g, "bias", detail::bias_dims(k), detail::bias_strides(k), fe_type<T>::value);
      auto Y = g->pointwise(DX, B, fe::graph::Pointwise_attributes().set_mode(fe::PointwiseMode_t::ADD));
      Y->set_output(true).set_dim(y.shape().dims()).set_stride(y.strides()).set_data_type(fe_type<T>::value);
      build(*g, handles(dev).cudnn, op, text, strict, planner);
      return BuiltGraph{g, {DY, W, B, Y}, g->get_workspace_size()};
    });
  }
  execute(*bg, dev, {x.data(), w.data(), bias.data(), y.data()}, op);
}

// dw = correlation of x with dy; dw must be allocated with w's shape.
template <GpuFloat T>
void conv2d_backward_filter(const Tensor<T>& dy, const Tensor<T>& x, const Conv2dParams& p, Tensor<T>& dw) {
  constexpr std::string_view op = "conv2d_backward_filter";
  const int dev = dy.device().index;
  const bool strict = detail::strict_f32<T>();
  GraphKey key = detail::conv_graph_key<T>(GraphOp::conv_wgrad, dev, p, strict);
  key.add(dy.shape(), dy.strides()).add(x.shape(), x.strides()).add(dw.shape(), dw.strides());
  PlanStore& store = plan_store();
  BuiltGraph* bg = store.find(key);
  if (!bg) {
    const std::string text = detail::conv_key<T>("wgrad", p, strict) + signature(" dy", dy.shape(), dy.strides()) +
                            signature(" x", x.shape(), x.strides()) + signature(" dw", dw.shape(), dw.strides());
    bg = &store.build(key, text, autotune::Planner::for_graph(dev, family(key.op())), [&](autotune::Planner& planner) {
      auto g = detail::new_graph<T>();
      auto DY = tensor(*g, "dy", dy);
      auto X = tensor(*g, "x", x);
      auto DW = g->conv_wgrad(DY, X, detail::conv_attributes<fe::graph::Conv_wgrad_attributes>(p));
      DW->set_output(true).set_dim(dw.shape().dims()).set_stride(dw.strides()).set_data_type(fe_type<T>::value);
      build(*g, handles(dev).cudnn, op, text, strict, planner);
      return BuiltGraph{g, {DY, X, DW}, g->get_workspace_size()};
    });
  }
  execute(*bg, dev, {dy.data(), x.data(), dw.data()}, op);
}

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::cudnn
