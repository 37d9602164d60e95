// This thread's built cuDNN graphs, and the one way an op gets one. An op's GPU function reads:
//
//   const GraphKey key = ...;                        // typed, hashed: no string on this path
//   PlanStore& store = plan_store();
//   BuiltGraph* bg = store.find(key);                // a hash lookup
//   if (!bg) bg = &store.build(key, text, autotune::Planner::for_graph(dev, family(key.op())),
//                              [&](autotune::Planner& planner) { ... build(g, ..., planner) ... });
//   execute(*bg, dev, {pointers...}, op);
//
// Behind build(): a plan the warm start loaded (cudnn/plan_files.hpp), else a plan file on disk
// where the planner would take the heuristics' plan anyway, else the op's own build with the
// planner (which may time the candidates: the autotuner's benchmark mode). A signature cuDNN
// cannot build is remembered, so that asking again fails at once.
#pragma once

#include "cutrain/core/abi.hpp"
#include "cutrain/core/config.hpp"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "cutrain/cuda/autotune/tuner.hpp"
#include "cutrain/cuda/cudnn/graph.hpp"
#include "cutrain/cuda/cudnn/graph_key.hpp"
#include "cutrain/cuda/cudnn/plan_files.hpp"
#include "cutrain/cuda/runtime.hpp"

namespace cutrain::inline CUTRAIN_ABI::cuda::cudnn {

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

// CUTRAIN_PLAN_LOG=1: each graph build (or plan file or warm-start load) is printed to stderr with
// its wall time and where the plan came from: where a cold start spends its time.
inline bool plan_log_enabled() { return config()->plan_log; }

// Calls that ran cutrain's own NVRTC kernel because cuDNN could not build the op's graph (no
// engine for that signature on this GPU): see try_build. For reports and tests.
inline std::atomic<std::int64_t>& kernel_fallbacks() {
  static std::atomic<std::int64_t> n{0};
  return n;
}

class PlanStore {
 public:
  // The built graph of `key`, or null when this thread has none. A signature that failed to
  // build throws its error again.
  BuiltGraph* find(const GraphKey& key) {
    if (auto it = built_.find(key); it != built_.end()) return &it->second;
    if (auto f = failed_.find(key); f != failed_.end()) throw f->second;
    return nullptr;
  }

  // The built graph of `key`, or null: either this thread has none yet (failed stays false) or
  // the signature failed to build (failed is set), for ops that fall back to a kernel.
  BuiltGraph* find(const GraphKey& key, bool& failed) {
    if (auto it = built_.find(key); it != built_.end()) return &it->second;
    failed = failed_.contains(key);
    return nullptr;
  }

  // As build, for ops with a kernel of their own to fall back to: null (and the failure
  // remembered, and kernel_fallbacks() counted) when cuDNN cannot build the graph.
  template <class Make>
  BuiltGraph* try_build(const GraphKey& key, const std::string& text, autotune::Planner planner, Make&& make) {
    try {
      return &build(key, text, std::move(planner), std::forward<Make>(make));
    } catch (const CudnnError&) {
      return nullptr;
    }
  }

  // Builds the graph of `key`, whose signature is `text`: make(planner) returns it built with
  // `planner`, which then chooses its plan (planner.finish). Kept for later find()s, as is a
  // CudnnError it throws.
  template <class Make>
  BuiltGraph& build(const GraphKey& key, const std::string& text, autotune::Planner planner, Make&& make) {
    const int device = key.device();
    const std::string full = cutrain::detail::cat(device, "|", text);
    require_not_capturing("cuda::cudnn", "building the cuDNN graph " + text);
    const auto t0 = std::chrono::steady_clock::now();
    const auto keep = [&](BuiltGraph&& bg, const char* source) -> BuiltGraph& {
      const std::int64_t us = cutrain::cuda::detail::micros_since(t0);
      build_stats().graphs += 1;
      build_stats().micros += us;
      if (plan_log_enabled())
        std::fprintf(stderr, "cutrain: cuDNN graph %8.1f ms (%s) %s\n", static_cast<double>(us) / 1e3, source,
                     text.c_str());
      bg.text = text;
      return built_.insert_or_assign(key, std::move(bg)).first->second;
    };
    try {
      if (auto warm = detail::take_warm(device, full, text, planner)) {  // see "Warm start"
        build_stats().from_files += 1;
        build_stats().warm += 1;
        return keep(std::move(*warm), "warm start");
      }
      // A plan the autotuner will not choose may come from its file (see "Built plans on disk").
      std::string file_key;
      if (detail::plan_files_enabled() && !planner.tunes()) {
        file_key = detail::plan_file_key(device, text);
        if (auto loaded = detail::load_plan_file(device, detail::plan_file_name(file_key), full)) {
          build_stats().from_files += 1;
          detail::warm_record(*loaded->record);
          return keep(std::move(*loaded), "plan file");
        }
      }
      BuiltGraph bg = make(planner);
      planner.finish(*bg.graph, bg.tensors, bg.plan_index, bg.workspace);
      if (bg.tensors.size() <= VariantPacks::max_pointers) bg.record = record_for(device, text, full, file_key, bg, planner);
      return keep(std::move(bg), planner.tunes() ? "built, tuned" : "built");
    } catch (const CudnnError& e) {
      failed_.insert_or_assign(key, e);
      throw;
    }
  }

  // Forgets every built graph and failed signature: the next call of each op builds, and in a
  // tuning mode tunes or looks up, its graph again.
  void clear() {
    built_.clear();
    failed_.clear();
  }

 private:
  // The plan file a newly built graph goes to after its first execute: the heuristics' plan of a
  // graph the tuner leaves alone, or (only for a warm start: building one from its cache entry,
  // about 0.5 ms, is quicker than reading it back, except on a background thread) a tuned plan.
  static std::shared_ptr<PlanRecord> record_for(int device, const std::string& text, const std::string& full,
                                                std::string& file_key, const BuiltGraph& bg,
                                                const autotune::Planner& planner) {
    if (!file_key.empty() && bg.plan_index < 0)
      return std::make_shared<PlanRecord>(PlanRecord{.file_key = std::move(file_key), .graph_key = full});
    if (const auto& tuned = planner.result(); tuned && detail::plan_files_enabled() && detail::warm_list().active.load())
      return detail::tuned_record(device, text, full, *tuned);
    return nullptr;
  }

  std::unordered_map<GraphKey, BuiltGraph, GraphKeyHash> built_;
  std::unordered_map<GraphKey, CudnnError, GraphKeyHash> failed_;
};

// This thread's plan store.
inline PlanStore& plan_store() {
  thread_local PlanStore s;
  return s;
}

// Forgets this thread's built graphs (and failed signatures).
inline void clear_graph_cache() { plan_store().clear(); }

// Runs a built graph with the device pointers of its tensors, in the order of bg.tensors. The
// first call goes through the frontend's map interface, which prepares the variant pack's order;
// the second passes the pointers to the frontend as an array in that order (no maps: this runs on
// every op call); later calls go through the graph's kept variant packs (see
// cudnn/variant_packs.hpp) straight to cuDNN. After the first call a plan with a record goes to
// its file (see "Built plans on disk").
inline void execute(BuiltGraph& bg, int device, std::span<const void* const> ptrs, std::string_view op) {
  const std::size_t n = bg.tensors.size();
  const std::string& key = bg.text;
  CUTRAIN_REQUIRE(ptrs.size() == n, Error, op, key, ": ", ptrs.size(), " pointers for a graph of ", n, " tensors");
  void* ws = workspace(device, static_cast<std::size_t>(bg.workspace));
  cudnnHandle_t handle = handles(device).cudnn;
  constexpr std::size_t max_fast = VariantPacks::max_pointers;
  if (bg.sorted.size() == n && n <= max_fast) {
    void* sorted[max_fast];
    for (std::size_t i = 0; i < n; ++i) sorted[i] = const_cast<void*>(ptrs[bg.sorted[i]]);
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
  if (bg.record) {
    if (bg.record->on_disk || detail::save_plan_file(bg)) detail::warm_record(*bg.record);
    bg.record.reset();
  }
}

inline void execute(BuiltGraph& bg, int device, std::initializer_list<const void*> ptrs, std::string_view op) {
  execute(bg, device, std::span<const void* const>(ptrs.begin(), ptrs.size()), op);
}

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::cudnn
