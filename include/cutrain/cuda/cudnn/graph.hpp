// cudnn-frontend graphs from typed tensors: the data type trait, tensor attributes from a
// Tensor<T>, the error macro, and a per-thread cache of built graphs keyed by op signature.
#pragma once

#include <cudnn_frontend.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>

#include "cutrain/core/tensor.hpp"
#include "cutrain/cuda/autotune/tuner.hpp"
#include "cutrain/cuda/cudnn/plan_files.hpp"
#include "cutrain/cuda/gpu_float.hpp"
#include "cutrain/cuda/runtime.hpp"

// Turns a cudnn-frontend error_t into a CudnnError naming the op and what was being done.
#define CUTRAIN_FE_CHECK(expr, op, context)                                                    \
  do {                                                                                         \
    if (auto cutrain_fe_status_ = (expr); cutrain_fe_status_.is_bad())                         \
      throw ::cutrain::CudnnError((op), ::cutrain::detail::cat((context), ": ",                \
                                                                cutrain_fe_status_.get_message())); \
  } while (0)

namespace cutrain::cuda::cudnn {

template <class T> struct fe_type;
template <> struct fe_type<float> { static constexpr auto value = fe::DataType_t::FLOAT; };
template <> struct fe_type<half> { static constexpr auto value = fe::DataType_t::HALF; };
template <> struct fe_type<bfloat16> { static constexpr auto value = fe::DataType_t::BFLOAT16; };

using cuda::GpuFloat;

// Per-thread math options. TF32 for f32 convolutions is off unless asked for.
struct MathOptions {
  bool allow_tf32 = false;
};
inline MathOptions& math_options() {
  thread_local MathOptions o;
  return o;
}

inline TensorAttr tensor(fe::graph::Graph& g, const char* name, const Shape& dims, const Strides& strides,
                         fe::DataType_t type) {
  return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_dim(dims.dims()).set_stride(strides).set_data_type(type));
}

template <class T>
TensorAttr tensor(fe::graph::Graph& g, const char* name, const Tensor<T>& t) {
  return tensor(g, name, t.shape(), t.strides(), fe_type<T>::value);
}

// A signature cuDNN could not build, remembered so that asking again fails at once (and a
// caller with a fallback pays for the failed build only once).
struct FailedGraph {
  std::string op, message;
};

// Validates, lowers and plans a graph with cuDNN's heuristics; in the autotuner's benchmark and
// cached modes the autotuner plans it instead (cuda/autotune/tuner.hpp).
inline void build(fe::graph::Graph& g, cudnnHandle_t handle, std::string_view op, const std::string& key, bool strict_f32) {
  CUTRAIN_FE_CHECK(g.validate(), op, key + ": validate");
  CUTRAIN_FE_CHECK(g.build_operation_graph(handle), op, key + ": build_operation_graph");
  if (autotune::detail::plan(g, op, key, strict_f32)) return;
  CUTRAIN_FE_CHECK(g.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}), op,
                   key + ": no cuDNN engine supports this combination (create_execution_plans)");
  if (strict_f32) g.deselect_numeric_notes({fe::NumericalNote_t::TENSOR_CORE});
  CUTRAIN_FE_CHECK(g.check_support(handle), op, key + ": no cuDNN engine supports this combination");
  CUTRAIN_FE_CHECK(g.build_plans(handle, fe::BuildPlanPolicy_t::HEURISTICS_CHOICE), op, key + ": build_plans");
}

namespace detail {
// This thread's built graphs, and the signatures that failed, by "device|key".
struct GraphCache {
  std::unordered_map<std::string, BuiltGraph> built;
  std::unordered_map<std::string, FailedGraph> failed;
};
inline GraphCache& graph_cache() {
  thread_local GraphCache c;
  return c;
}
}  // namespace detail

// Graphs this process built (each signature's first use on each thread) and the wall time the
// builds took, plan choice and tuning included. For reports; never affects behaviour.
struct BuildStats {
  std::atomic<std::int64_t> graphs{0};       // built, or read from a plan file
  std::atomic<std::int64_t> from_files{0};   // of those, read from a plan file (see "Built plans on disk")
  std::atomic<std::int64_t> warm{0};         // of those, loaded by a warm start's threads (see "Warm start")
  std::atomic<std::int64_t> micros{0};
};
inline BuildStats& build_stats() {
  static BuildStats s;
  return s;
}

// Forgets this thread's built graphs (and failed signatures): the next call of each op builds,
// and in a tuning mode tunes or looks up, its graph again.
inline void clear_graph_cache() {
  detail::graph_cache().built.clear();
  detail::graph_cache().failed.clear();
}

// The graph for `key` on `device`, built by `make` at first use; later calls are a hash lookup.
// The first build is where the autotuner picks the plan (in benchmark and cached modes).
// (make is a template parameter, not a std::function: no allocation on the lookup path.)
template <class Make>
BuiltGraph& cached_graph(int device, const std::string& key, Make&& make) {
  auto& [cache, failed] = detail::graph_cache();
  std::string full = std::to_string(device);  // "device|key", built in place: this runs on every op call
  full += '|';
  full += key;
  auto it = cache.find(full);
  if (it != cache.end()) return it->second;
  if (auto f = failed.find(full); f != failed.end()) throw CudnnError(f->second.op, f->second.message);
  require_not_capturing("cuda::cudnn", "building the cuDNN graph " + key);
  try {
    const auto t0 = std::chrono::steady_clock::now();
    const auto done = [&](BuiltGraph&& bg) -> BuiltGraph& {
      build_stats().graphs += 1;
      build_stats().micros += cutrain::cuda::detail::micros_since(t0);
      return cache.emplace(full, std::move(bg)).first->second;
    };
    if (auto warm = detail::take_warm(device, full, key)) {  // see "Warm start"
      build_stats().from_files += 1;
      build_stats().warm += 1;
      return done(std::move(*warm));
    }
    // A plan the autotuner will not choose may come from its file (see "Built plans on disk").
    std::string file_key;
    if (detail::plan_files_enabled() &&
        (autotune::mode() == autotune::Mode::heuristic || !autotune::tunes_graph(key, autotune::options()))) {
      file_key = detail::plan_file_key(device, key);
      if (auto loaded = detail::load_plan_file(device, detail::plan_file_name(file_key), full)) {
        build_stats().from_files += 1;
        detail::warm_record(*loaded->record);
        return done(std::move(*loaded));
      }
    }
    autotune::PlanScope tuning(device, key);
    BuiltGraph bg = make();
    tuning.finish(*bg.graph, bg.tensors, bg.plan_index, bg.workspace);
    if (bg.tensors.size() <= 16) {
      if (!file_key.empty() && bg.plan_index < 0) {
        bg.record = std::make_shared<PlanRecord>(PlanRecord{.file_key = std::move(file_key), .graph_key = full});
      } else if (const auto& tuned = tuning.result();
                 tuned && detail::plan_files_enabled() && detail::warm_list().active.load()) {
        // A tuned plan goes to a file only for a warm start: building one from its cache entry
        // (about 0.5 ms) is quicker than reading it back, except on a background thread.
        bg.record = detail::tuned_record(device, key, full, *tuned);
      }
    }
    return done(std::move(bg));
  } catch (const CudnnError& e) {
    // Keep the reason (the text after "cutrain::<op>: ") for the next caller.
    const std::string what = e.what();
    const auto colon = what.find(": ");
    failed.emplace(full, FailedGraph{e.op(), colon == std::string::npos ? what : what.substr(colon + 2)});
    throw;
  }
}

// Whether cuDNN can build the graph for `key` (building it if not yet tried).
template <class Make>
bool graph_supported(int device, const std::string& key, Make&& make) {
  try {
    cached_graph(device, key, std::forward<Make>(make));
    return true;
  } catch (const CudnnError&) {
    return false;
  }
}

// Runs a built graph with the device pointers of its tensors, in the order of bg.tensors. The
// first call goes through the frontend's map interface, which prepares the variant pack's order;
// the second passes the pointers to the frontend as an array in that order (no maps: this runs on
// every op call); later calls go through the graph's kept variant packs (see
// cudnn/variant_packs.hpp) straight to cuDNN.
inline void execute(BuiltGraph& bg, int device, std::initializer_list<const void*> ptrs, std::string_view op,
                    const std::string& key) {
  const std::size_t n = bg.tensors.size();
  CUTRAIN_REQUIRE(ptrs.size() == n, Error, op, key, ": ", ptrs.size(), " pointers for a graph of ", n, " tensors");
  void* ws = workspace(device, static_cast<std::size_t>(bg.workspace));
  cudnnHandle_t handle = handles(device).cudnn;
  constexpr std::size_t max_fast = 16;
  if (bg.sorted.size() == n && n <= max_fast) {
    void* sorted[max_fast];
    const void* const* p = ptrs.begin();
    for (std::size_t i = 0; i < n; ++i) sorted[i] = const_cast<void*>(p[bg.sorted[i]]);
    if (bg.packs) {
      bg.packs->execute(handle, sorted, n, ws, op, key);
      return;
    }
    const int count = static_cast<int>(n);
    if (bg.plan_index >= 0)
      CUTRAIN_FE_CHECK(bg.graph->execute_plan_at_index(handle, sorted, count, ws, bg.plan_index), op, key + ": execute");
    else
      CUTRAIN_FE_CHECK(bg.graph->execute(handle, sorted, count, ws), op, key + ": execute");
    if (!bg.packs_tried) {  // the frontend has prepared the graph's variant-pack template now
      bg.packs_tried = true;
      bg.packs = VariantPacks::make(*bg.graph, bg.plan_index);
    }
    return;
  }
  std::unordered_map<TensorAttr, void*> pack;
  auto p = ptrs.begin();
  for (const auto& t : bg.tensors) pack.emplace(t, const_cast<void*>(*p++));
  if (bg.plan_index >= 0)
    CUTRAIN_FE_CHECK(bg.graph->execute_plan_at_index(handle, pack, ws, bg.plan_index), op, key + ": execute");
  else
    CUTRAIN_FE_CHECK(bg.graph->execute(handle, pack, ws), op, key + ": execute");
  // The graph now has its variant pack prepared: learn its order for the next calls.
  const std::vector<std::int64_t> uids = bg.graph->get_variant_pack_uids_sorted();
  if (uids.size() != n) return;  // another shape of pack: keep the map path
  std::vector<int> order;
  for (const std::int64_t uid : uids) {
    int found = -1;
    for (std::size_t i = 0; i < n; ++i)
      if (bg.tensors[i]->get_uid() == uid) found = static_cast<int>(i);
    if (found < 0) return;
    order.push_back(found);
  }
  bg.sorted = std::move(order);
  if (bg.record) {  // see "Built plans on disk"
    if (bg.record->on_disk || detail::save_plan_file(bg)) detail::warm_record(*bg.record);
    bg.record.reset();
  }
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

}  // namespace cutrain::cuda::cudnn
