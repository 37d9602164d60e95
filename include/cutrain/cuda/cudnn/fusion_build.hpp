// The one way cutrain describes a cuDNN graph: build_fusion turns a fusion::Graph (core/fusion.hpp)
// into a cudnn-frontend graph of T and plans it. Users' graphs (fusion.hpp) and cutrain's
// convolutions (conv.hpp) are built with it; each caller keys and stores its graphs.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cutrain/core/fusion.hpp"
#include "cutrain/cuda/cudnn/activation.hpp"
#include "cutrain/cuda/cudnn/plan_store.hpp"

namespace cutrain::inline CUTRAIN_ABI::cuda::cudnn {

namespace detail {
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
  }
  return M::ADD;
}
}  // namespace detail

// A tensor of a fusion graph's call as the GPU graph sees it: dims, strides, data; f32 for a
// norm's gamma and beta (cuDNN's norm engines take them in f32), the graph's dtype otherwise.
struct FusionTensor {
  const Shape* shape = nullptr;
  const Strides* strides = nullptr;
  const void* data = nullptr;
  bool f32 = false;
};

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
    TensorAttr Y;
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
        auto C = at(n.c), EPS = scalar(n.alpha);
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
    }
    const Shape& s = shapes[i];
    const auto [d, st] = fusion::at_rank(s, fusion::packed_strides(s, nhwc), r);
    Y->set_dim(d.dims()).set_stride(st);
    v[i] = Y;
  }
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const auto& Y = v[static_cast<std::size_t>(g.outputs()[i].first)];
    const auto [d, st] = fusion::at_rank(*outputs[i].shape, *outputs[i].strides, r);
    Y->set_output(true).set_dim(d.dims()).set_stride(st).set_data_type(fe_type<T>::value);
    b.tensors.push_back(Y);
  }
  build(*fg, handles(dev).cudnn, op, text, strict, planner);
  b.workspace = fg->get_workspace_size();
  return b;
}

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::cudnn
