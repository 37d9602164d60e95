// The one way cutrain describes a cuDNN graph: build_fusion turns a fusion::Graph (core/fusion.hpp)
// into a cudnn-frontend graph of T and plans it. Users' graphs (fusion.hpp) and cutrain's
// convolutions, norms and activations (conv.hpp, norm.hpp, activation.hpp, through run_graph) are
// built with it; each caller keys its graphs. Attention (attention.hpp) builds its SDPA nodes
// directly: they have no counterpart among the builder's nodes.
#pragma once

#include "cutrain/core/abi.hpp"

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cutrain/core/fusion_shapes.hpp"
#include "cutrain/core/params/activation.hpp"
#include "cutrain/cuda/api.hpp"  // FusionTensor, the entry points defined in cudnn/
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

inline fe::PointwiseMode_t binary_mode(BinaryOp op) {
  using M = fe::PointwiseMode_t;
  switch (op) {
    case BinaryOp::add: return M::ADD;
    case BinaryOp::sub: return M::SUB;
    case BinaryOp::mul: return M::MUL;
    case BinaryOp::div: return M::DIV;
    case BinaryOp::minimum: return M::MIN;
    case BinaryOp::maximum: return M::MAX;
    case BinaryOp::pow: return M::POW;
  }
  return M::ADD;
}
}  // namespace detail

// g as a cuDNN graph of T, built and planned: the one way cutrain's GPU graphs are described
// (fusion_forward for users' graphs, the conv ops of conv.hpp for cutrain's own). `shapes`: one
// per value (infer_shapes); intermediates are f32, NHWC where `nhwc`, else row-major; `strict`:
// f32 without TF32. The caller keys and stores the result (PlanStore::build).
template <GpuFloat T>
BuiltGraph build_fusion(const fusion::Graph& g, const std::vector<Shape>& shapes, bool nhwc,
                        std::span<const FusionTensor> inputs, std::span<const FusionTensor> outputs, int dev,
                        std::string_view op, const std::string& text, bool strict, autotune::Planner& planner) {
  namespace fg_ = fe::graph;
  const int r = fusion::described_rank(g);
  const auto& nodes = g.nodes();
  auto fg = detail::new_graph<T>();
  BuiltGraph b{fg, {}, 0};
  std::vector<TensorAttr> v(nodes.size());
  std::vector<std::array<TensorAttr, 5>> res(nodes.size());  // a norm's results, for its parts
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const int in = g.inputs()[i];
    const auto [d, s] = fusion::at_rank(*inputs[i].shape, *inputs[i].strides, r);
    auto& X = v[static_cast<std::size_t>(in)];
    X = tensor(*fg, nodes[static_cast<std::size_t>(in)].name.c_str(), d, s,
               inputs[i].f32 ? fe::DataType_t::FLOAT : fe_type<T>::value);
    b.tensors.push_back(X);
  }
  const std::vector<std::int64_t> ones(static_cast<std::size_t>(r), 1);
  const auto scalar = [&](double x) {
    return fg->tensor(fg_::Tensor_attributes(static_cast<float>(x)).set_dim(ones).set_stride(ones));
  };
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const fusion::Node& n = nodes[i];
    const auto at = [&](int id) { return id >= 0 ? v[static_cast<std::size_t>(id)] : TensorAttr{}; };
    auto A = at(n.a), B = at(n.b);
    auto C = at(n.c), D = at(n.d), E = at(n.e);
    TensorAttr Y;
    const auto keep = [&](auto&& results) {  // a norm's results: its value, then its parts
      std::size_t k = 0;
      for (auto& t : results) res[i][k++] = t;
      Y = res[i][0];
    };
    switch (n.kind) {
      case fusion::NodeKind::input: continue;
      case fusion::NodeKind::conv2d:
        Y = fg->conv_fprop(A, B, detail::conv_attributes<fg_::Conv_fprop_attributes>(n.conv));
        break;
      case fusion::NodeKind::matmul:
        Y = fg->matmul(A, B, fg_::Matmul_attributes().set_compute_data_type(fe::DataType_t::FLOAT));
        break;
      case fusion::NodeKind::binary:
        Y = fg->pointwise(A, B, fg_::Pointwise_attributes().set_mode(detail::binary_mode(n.binary)));
        break;
      case fusion::NodeKind::scale:
        Y = fg->pointwise(A, scalar(n.alpha), fg_::Pointwise_attributes().set_mode(fe::PointwiseMode_t::MUL));
        break;
      case fusion::NodeKind::activation: Y = fg->pointwise(A, detail::activation_attributes(n.act, false)); break;
      case fusion::NodeKind::conv2d_dgrad:
        Y = fg->conv_dgrad(A, B, detail::conv_attributes<fg_::Conv_dgrad_attributes>(n.conv));
        break;
      case fusion::NodeKind::conv2d_wgrad:
        Y = fg->conv_wgrad(A, B, detail::conv_attributes<fg_::Conv_wgrad_attributes>(n.conv));
        break;
      case fusion::NodeKind::activation_backward:
        Y = fg->pointwise(A, B, detail::activation_attributes(n.act, true));
        break;
      case fusion::NodeKind::sum_to:
        Y = fg->reduction(
            A, fg_::Reduction_attributes().set_mode(fe::ReductionMode_t::ADD).set_compute_data_type(fe::DataType_t::FLOAT));
        break;
      case fusion::NodeKind::layer_norm: {
        auto EPS = scalar(n.alpha);
        Y = fg->layernorm(A, B, C,
                          fg_::Layernorm_attributes()
                              .set_forward_phase(fe::NormFwdPhase_t::INFERENCE)
                              .set_epsilon(EPS)
                              .set_compute_data_type(fe::DataType_t::FLOAT))[0];
        break;
      }
      case fusion::NodeKind::rms_norm: {
        auto EPS = scalar(n.alpha);
        Y = fg->rmsnorm(A, B,
                        fg_::Rmsnorm_attributes()
                            .set_forward_phase(fe::NormFwdPhase_t::INFERENCE)
                            .set_epsilon(EPS)
                            .set_compute_data_type(fe::DataType_t::FLOAT))[0];
        break;
      }
      case fusion::NodeKind::batch_norm: {
        auto EPS = scalar(n.alpha), MOM = scalar(n.momentum);
        keep(fg->batchnorm(A, B, C, fg_::Batchnorm_attributes().set_epsilon(EPS).set_previous_running_stats(D, E, MOM)));
        break;
      }
      case fusion::NodeKind::layer_norm_train: {
        auto EPS = scalar(n.alpha);
        keep(fg->layernorm(
            A, B, C, fg_::Layernorm_attributes().set_forward_phase(fe::NormFwdPhase_t::TRAINING).set_epsilon(EPS)));
        break;
      }
      case fusion::NodeKind::rms_norm_train: {
        auto EPS = scalar(n.alpha);
        keep(fg->rmsnorm(A, B, fg_::Rmsnorm_attributes().set_forward_phase(fe::NormFwdPhase_t::TRAINING).set_epsilon(EPS)));
        break;
      }
      case fusion::NodeKind::batch_norm_backward:
        keep(fg->batchnorm_backward(A, B, C, fg_::Batchnorm_backward_attributes().set_saved_mean_and_inv_variance(D, E)));
        break;
      case fusion::NodeKind::layer_norm_backward:
        keep(fg->layernorm_backward(A, B, C, fg_::Layernorm_backward_attributes().set_saved_mean_and_inv_variance(D, E)));
        break;
      case fusion::NodeKind::rms_norm_backward: {
        auto [DX, DSCALE, DBIAS] = fg->rmsnorm_backward(A, B, C, D, fg_::Rmsnorm_backward_attributes().has_dbias(false));
        keep(std::array<TensorAttr, 2>{DX, DSCALE});
        break;
      }
      case fusion::NodeKind::part: Y = res[static_cast<std::size_t>(n.a)][static_cast<std::size_t>(n.part)]; break;
    }
    const Shape& s = shapes[i];
    const auto [d, st] = fusion::at_rank(s, fusion::packed_strides(s, nhwc), r);
    Y->set_dim(d.dims()).set_stride(st);
    v[i] = Y;
  }
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const auto& Y = v[static_cast<std::size_t>(g.outputs()[i].first)];
    const auto [d, st] = fusion::at_rank(*outputs[i].shape, *outputs[i].strides, r);
    Y->set_output(true).set_dim(d.dims()).set_stride(st).set_data_type(outputs[i].f32 ? fe::DataType_t::FLOAT
                                                                                      : fe_type<T>::value);
    b.tensors.push_back(Y);
  }
  build(*fg, handles(dev).cudnn, op, text, strict, planner);
  b.workspace = fg->get_workspace_size();
  return b;
}

// How cutrain's own ops run a graph: on a miss of `key`, describe() (a fusion::Graph over `in`,
// in order, and `out`, its outputs in order) built with build_fusion and kept by the plan store;
// then run on the tensors' data. nhwc: the intermediates' layout. may_fail: where cuDNN cannot
// build the graph, false (remembered; the op runs a kernel of its own, counted in
// kernel_fallbacks) instead of the CudnnError.
template <GpuFloat T, class Text, class Describe>
bool run_graph(const GraphKey& key, std::string_view op, const Text& text, const Describe& describe,
               std::span<const FusionTensor> in, std::span<const FusionTensor> out, bool nhwc, bool strict,
               bool may_fail = false) {
  PlanStore& store = plan_store();
  bool failed = false;
  BuiltGraph* bg = may_fail ? store.find(key, failed) : store.find(key);
  if (!bg && !failed) {
    const int dev = key.device();
    const fusion::Graph g = describe();
    std::vector<Shape> in_shapes;
    for (const auto& t : in) in_shapes.push_back(*t.shape);
    const auto shapes = fusion::infer_shapes(g, in_shapes, op);
    const std::string t = text();
    const auto make = [&](autotune::Planner& planner) {
      return build_fusion<T>(g, shapes, nhwc, in, out, dev, op, t, strict, planner);
    };
    auto planner = autotune::Planner::for_graph(dev, family(key.op()));
    bg = may_fail ? store.try_build(key, t, std::move(planner), make) : &store.build(key, t, std::move(planner), make);
  }
  if (!bg) return ++kernel_fallbacks(), false;
  std::array<const void*, fusion::Graph::max_tensors> ptrs{};
  std::size_t n = 0;
  for (const auto& t : in) ptrs[n++] = t.data;
  for (const auto& t : out) ptrs[n++] = t.data;
  execute(*bg, key.device(), std::span<const void* const>(ptrs.data(), n), op);
  return true;
}

template <class T>
FusionTensor fusion_arg(const Tensor<T>& t, bool f32 = false) {
  return {&t.shape(), &t.strides(), t.data(), f32};
}

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::cudnn
