// A user's fusion graph (core/fusion.hpp) as one cuDNN graph (described by fusion_build.hpp's
// build_fusion, as cutrain's convolutions are). fusion_forward runs a user's graph, built once per
// signature (the graph, dtype, TF32, every tensor's dims and strides) through the plan store and
// the planner cutrain's own ops use, so it is tuned when the autotuner's mode says so and its
// plan is kept on disk like theirs. ops/fusion.hpp checks the inputs and allocates the outputs.
#pragma once

#include "cutrain/core/abi.hpp"

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cutrain/core/fusion_shapes.hpp"
#include "cutrain/cuda/cudnn/fusion_build.hpp"

namespace cutrain::inline CUTRAIN_ABI::cuda::cudnn {

// Runs a user's g on device `dev`, on inputs (g.inputs() order) into outputs (g.outputs() order),
// allocated by the caller with the shapes infer_shapes gives (`shapes`, one per value). `id` names the graph
// in the plan store's key (ops::Fusion numbers its graphs); the graph's text names it in plan
// files, the tuning cache and messages. Throws CudnnError naming the pattern and cuDNN's first
// reason where no engine runs it.
template <GpuFloat T>
void fusion_forward(const fusion::Graph& g, std::uint64_t id, const std::vector<Shape>& shapes, bool nhwc,
                    std::span<const FusionTensor> inputs, std::span<const FusionTensor> outputs, int dev) {
  constexpr std::string_view op = "fusion";
  const bool has_conv = g.has_conv();
  // TF32 is a tensor-core matter: pointwise-only graphs are built without that filter (in f32 no
  // engine is left with it), as cutrain's activation and norm graphs are.
  const bool tensor_cores = has_conv || g.has(fusion::NodeKind::matmul);
  const bool strict = detail::strict_f32<T>() && tensor_cores;
  GraphKey key(GraphOp::fusion, dev);
  key.add(static_cast<std::int64_t>(id)).add(dtype_of<T>).add(strict).add(nhwc);
  for (const auto& t : inputs) key.add(*t.shape, *t.strides);
  for (const auto& t : outputs) key.add(*t.shape, *t.strides);
  PlanStore& store = plan_store();
  BuiltGraph* bg = store.find(key);
  if (!bg) {
    const bool tf32 = std::same_as<T, float> && tensor_cores && !strict;
    // describe() for the reader, key_text() (every parameter) for plan files and the tuning cache.
    std::string text = cutrain::detail::cat("fusion ", dtype_of<T>, tf32 ? "+tf32" : "", nhwc ? " nhwc " : " ",
                                            g.describe(), " {", g.key_text(), "}");
    const auto& nodes = g.nodes();
    for (std::size_t i = 0; i < inputs.size(); ++i)
      text += signature((" " + nodes[static_cast<std::size_t>(g.inputs()[i])].name).c_str(), *inputs[i].shape,
                        *inputs[i].strides);
    for (std::size_t i = 0; i < outputs.size(); ++i)
      text += signature((" " + g.outputs()[i].second).c_str(), *outputs[i].shape, *outputs[i].strides);
    const auto family = has_conv         ? autotune::GraphFamily::convolution
                        : g.has_norm()   ? autotune::GraphFamily::normalization
                                         : autotune::GraphFamily::pointwise;
    bg = &store.build(key, text, autotune::Planner::for_graph(dev, family), [&](autotune::Planner& planner) {
      return build_fusion<T>(g, shapes, nhwc, inputs, outputs, dev, op, text, strict, planner);
    });
  }
  std::array<const void*, fusion::Graph::max_tensors> ptrs{};  // check_complete: inputs + outputs fit
  std::size_t n = 0;
  for (const auto& t : inputs) ptrs[n++] = t.data;
  for (const auto& t : outputs) ptrs[n++] = t.data;
  execute(*bg, dev, std::span<const void* const>(ptrs.data(), n), op);
}

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::cudnn
