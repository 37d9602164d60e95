// cudnn-frontend graphs from typed tensors: the data type trait, tensor attributes from a
// Tensor<T>, the error macro, a built graph (BuiltGraph) and build(), which validates, lowers and
// plans a graph with the planner it is given. cudnn/plan_store.hpp keeps the built graphs.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cudnn_frontend.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cutrain/core/tensor.hpp"
#include "cutrain/cuda/autotune/tuner.hpp"
#include "cutrain/cuda/cudnn/graph_key.hpp"
#include "cutrain/cuda/cudnn/variant_packs.hpp"
#include "cutrain/cuda/gpu_float.hpp"
#include "cutrain/cuda/math_options.hpp"
#include "cutrain/cuda/runtime.hpp"

// Turns a cudnn-frontend error_t into a CudnnError naming the op, what was being done and the
// frontend's first reason (its whole message in CudnnError::log()).
#define CUTRAIN_FE_CHECK(expr, op, context)                                          \
  do {                                                                               \
    if (auto cutrain_fe_status_ = (expr); cutrain_fe_status_.is_bad())               \
      throw ::cutrain::CudnnError((op), (context), cutrain_fe_status_.get_message()); \
  } while (0)

namespace cutrain::inline CUTRAIN_ABI::cuda::cudnn {

template <class T> struct fe_type;
template <> struct fe_type<float> { static constexpr auto value = fe::DataType_t::FLOAT; };
template <> struct fe_type<half> { static constexpr auto value = fe::DataType_t::HALF; };
template <> struct fe_type<bfloat16> { static constexpr auto value = fe::DataType_t::BFLOAT16; };

namespace fe = cudnn_frontend;
using TensorAttr = std::shared_ptr<fe::graph::Tensor_attributes>;
using cuda::GpuFloat;

inline TensorAttr tensor(fe::graph::Graph& g, const char* name, const Shape& dims, const Strides& strides,
                         fe::DataType_t type) {
  return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_dim(dims.dims()).set_stride(strides).set_data_type(type));
}

template <class T>
TensorAttr tensor(fe::graph::Graph& g, const char* name, const Tensor<T>& t) {
  return tensor(g, name, t.shape(), t.strides(), fe_type<T>::value);
}

namespace detail {
// An empty graph of T: T in memory, f32 intermediates and compute.
template <class T>
std::shared_ptr<fe::graph::Graph> new_graph() {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe_type<T>::value)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}
}  // namespace detail

// What a plan file holds besides the plan (cudnn/plan_files.hpp).
struct PlanRecord {
  std::string file_key{};  // names the file: the graph key, a tuned plan's choice, the GPU, the library versions
  std::string graph_key{};  // the graph's "device|text"
  // A tuned plan's autotune key (op and signature) and choice ("engine 12 3=1 ..."); empty: the
  // heuristics' plan.
  std::string tuned_op{}, tuned_signature{}, tuned_choice{};
  std::vector<std::int64_t> bytes{};  // per pointer, in execution order: the bytes it spans; -1: a host value
  bool on_disk = false;             // the file is there already (the graph was read from it)
};

// A built graph, its tensors in execution order, and the workspace its plan needs.
struct BuiltGraph {
  std::shared_ptr<fe::graph::Graph> graph;
  std::vector<TensorAttr> tensors;
  std::int64_t workspace = 0;
  std::int64_t plan_index = -1;  // the plan the autotuner chose; -1: the graph's default (heuristics' choice)
  // For execute's fast path: the index in `tensors` of each pointer the graph takes, in the
  // order it takes them (its variant pack's uids, sorted); filled at the first execute.
  std::vector<int> sorted{};
  // The plan's variant packs of recent calls (see cudnn/variant_packs.hpp); made after the first
  // execute through the frontend, null where the plan does not allow them.
  std::shared_ptr<VariantPacks> packs{};
  bool packs_tried = false;
  // Set when the plan goes to (or came from) a file: written after the first execute, and named
  // in the warm-start list.
  std::shared_ptr<PlanRecord> record{};
  std::string text{};  // the graph's signature, for messages (set by the plan store)
};

// Validates, lowers and plans a graph: with cuDNN's heuristics, unless the planner plans it (the
// autotuner's benchmark and cached modes, for the graphs it tunes). `text` is the graph's
// signature, for messages and the tuning cache.
inline void build(fe::graph::Graph& g, cudnnHandle_t handle, std::string_view op, const std::string& text,
                  bool strict_f32, autotune::Planner& planner) {
  CUTRAIN_FE_CHECK(g.validate(), op, text + ": validate");
  CUTRAIN_FE_CHECK(g.build_operation_graph(handle), op, text + ": build_operation_graph");
  if (planner.plan(g, op, text, strict_f32)) return;
  CUTRAIN_FE_CHECK(g.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}), op,
                   text + ": no cuDNN engine supports this combination (create_execution_plans)");
  if (strict_f32) g.deselect_numeric_notes({fe::NumericalNote_t::TENSOR_CORE});
  CUTRAIN_FE_CHECK(g.check_support(handle), op, text + ": no cuDNN engine supports this combination");
  CUTRAIN_FE_CHECK(g.build_plans(handle, fe::BuildPlanPolicy_t::HEURISTICS_CHOICE), op, text + ": build_plans");
}

inline std::string signature(const char* name, const Shape& s, const Strides& st) {
  return cutrain::detail::cat(name, s, strides_str(st));
}

// Elementwise graphs: cuDNN's pointwise engines want fully packed NHWC-ordered tensors. An
// elementwise op does not care about dims, so a contiguous tensor (its memory is one flat array)
// is described as the NHWC-packed [1, c, n / c, 1] with c a power of two that divides n, up to
// 128 bytes of elements (64 in bf16 and f16, 32 in f32). A relu on 256x128x32x32 (H200, the
// heuristics' plan) ran at 3712 GB/s in bf16 with c = 64 against 3336-3419 GB/s with c = 128 to
// 4096 and 1638 GB/s with c = 8, and at 4012 GB/s in f32 with c = 32 against 3771 GB/s with
// c = 64. An NHWC tensor keeps its own dims unless c reaches that size (its own dims gave
// 3396 GB/s in bf16). All tensors of one elementwise graph must share the layout.
template <class T>
std::pair<Shape, Strides> elementwise_view(const Tensor<T>& t) {
  constexpr std::int64_t widest = 128 / static_cast<std::int64_t>(sizeof(T));
  const std::int64_t n = t.numel();
  std::int64_t c = 1;
  while (c < widest && n % (c * 2) == 0) c *= 2;
  if (c < widest && t.rank() == 4 && t.layout() == Layout::nhwc) return {t.shape(), t.strides()};
  return {Shape{1, c, n / c, 1}, Strides{n, 1, c, c}};
}

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::cudnn
