// A user's fusion graph (core/fusion.hpp) as one cuDNN graph: built once per signature (the
// graph, dtype, TF32, every tensor's dims and strides) through the plan store and the planner
// cutrain's own ops use, so it is tuned when the autotuner's mode says so and its plan is kept
// on disk like theirs. ops/fusion.hpp checks the inputs and allocates the outputs.
#pragma once

#include "cutrain/core/abi.hpp"

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cutrain/core/fusion.hpp"
#include "cutrain/cuda/cudnn/conv.hpp"

namespace cutrain::inline CUTRAIN_ABI::cuda::cudnn {

namespace detail {
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

// Runs g on inputs (g.inputs() order) into outputs (g.outputs() order), allocated by the caller
// with the shapes infer_shapes gives (`shapes`, one per value). `id` names the graph in the plan
// store's key (ops::Fusion numbers its graphs); the graph's text names it in plan files, the
// tuning cache and messages. intermediate values are f32; `nhwc`: intermediates are NHWC.
// Throws CudnnError naming the pattern and cuDNN's first reason where no engine runs it.
template <GpuFloat T>
void fusion_forward(const fusion::Graph& g, std::uint64_t id, const std::vector<Shape>& shapes, bool nhwc,
                    std::span<const Tensor<T>> inputs, std::span<Tensor<T>> outputs) {
  constexpr std::string_view op = "fusion";
  const int dev = inputs[0].device().index;
  const bool has_conv = g.has_conv();
  // TF32 is a tensor-core matter: pointwise-only graphs are built without that filter (in f32 no
  // engine is left with it), as cutrain's activation and norm graphs are.
  const bool tensor_cores = has_conv || g.has(fusion::NodeKind::matmul);
  const bool strict = detail::strict_f32<T>() && tensor_cores;
  GraphKey key(GraphOp::fusion, dev);
  key.add(static_cast<std::int64_t>(id)).add(dtype_of<T>).add(strict).add(nhwc);
  for (const auto& t : inputs) key.add(t.shape(), t.strides());
  for (const auto& t : outputs) key.add(t.shape(), t.strides());
  PlanStore& store = plan_store();
  BuiltGraph* bg = store.find(key);
  if (!bg) {
    const bool tf32 = std::same_as<T, float> && tensor_cores && !strict;
    // describe() for the reader, key_text() (every parameter) for plan files and the tuning cache.
    std::string text = cutrain::detail::cat("fusion ", dtype_of<T>, tf32 ? "+tf32" : "", nhwc ? " nhwc " : " ", g.describe(),
                                            " {", g.key_text(), "}");
    const auto& nodes = g.nodes();
    for (std::size_t i = 0; i < inputs.size(); ++i)
      text += signature((" " + nodes[static_cast<std::size_t>(g.inputs()[i])].name).c_str(), inputs[i].shape(),
                        inputs[i].strides());
    for (std::size_t i = 0; i < outputs.size(); ++i)
      text += signature((" " + g.outputs()[i].second).c_str(), outputs[i].shape(), outputs[i].strides());
    const auto family = has_conv ? autotune::GraphFamily::convolution : autotune::GraphFamily::pointwise;
    bg = &store.build(key, text, autotune::Planner::for_graph(dev, family), [&](autotune::Planner& planner) {
      const int r = fusion::described_rank(g);
      auto fg = detail::new_graph<T>();
      BuiltGraph b{fg, {}, 0};
      std::vector<TensorAttr> v(nodes.size());
      for (std::size_t i = 0; i < inputs.size(); ++i) {
        const int in = g.inputs()[i];
        const auto [d, s] = fusion::at_rank(inputs[i].shape(), inputs[i].strides(), r);
        auto& X = v[static_cast<std::size_t>(in)];
        X = tensor(*fg, nodes[static_cast<std::size_t>(in)].name.c_str(), d, s, fe_type<T>::value);
        b.tensors.push_back(X);
      }
      namespace fg_ = fe::graph;
      for (std::size_t i = 0; i < nodes.size(); ++i) {
        const fusion::Node& n = nodes[i];
        const auto A = n.a >= 0 ? v[static_cast<std::size_t>(n.a)] : TensorAttr{};
        const auto B = n.b >= 0 ? v[static_cast<std::size_t>(n.b)] : TensorAttr{};
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
          case fusion::NodeKind::scale: {
            const std::vector<std::int64_t> ones(static_cast<std::size_t>(r), 1);
            auto S = fg->tensor(fg_::Tensor_attributes(static_cast<float>(n.alpha)).set_dim(ones).set_stride(ones));
            Y = fg->pointwise(A, S, fg_::Pointwise_attributes().set_mode(fe::PointwiseMode_t::MUL));
            break;
          }
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
            Y = fg->reduction(A, fg_::Reduction_attributes()
                                     .set_mode(fe::ReductionMode_t::ADD)
                                     .set_compute_data_type(fe::DataType_t::FLOAT));
            break;
        }
        const Shape& s = shapes[i];
        const auto [d, st] = fusion::at_rank(s, fusion::packed_strides(s, nhwc), r);
        Y->set_dim(d.dims()).set_stride(st);
        v[i] = Y;
      }
      for (std::size_t i = 0; i < outputs.size(); ++i) {
        const auto& Y = v[static_cast<std::size_t>(g.outputs()[i].first)];
        const auto [d, st] = fusion::at_rank(outputs[i].shape(), outputs[i].strides(), r);
        Y->set_output(true).set_dim(d.dims()).set_stride(st).set_data_type(fe_type<T>::value);
        b.tensors.push_back(Y);
      }
      build(*fg, handles(dev).cudnn, op, text, strict, planner);
      b.workspace = fg->get_workspace_size();
      return b;
    });
  }
  std::array<const void*, fusion::Graph::max_tensors> ptrs{};  // check_complete: inputs + outputs fit
  std::size_t n = 0;
  for (const auto& t : inputs) ptrs[n++] = t.data();
  for (auto& t : outputs) ptrs[n++] = t.data();
  execute(*bg, dev, std::span<const void* const>(ptrs.data(), n), op);
}

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::cudnn
