// cuDNN variant packs kept between calls of a built graph. cudnn-frontend's execute creates,
// fills and finalizes a backend variant pack (the pointers one execution takes) on every call and
// destroys it afterwards: about 1.5 µs of a cached op's host time on the H200's host, a quarter
// of a small op's whole cost. A training loop hands an op the same buffers step after step (the
// caching allocator returns the same blocks), so a graph keeps the packs of the last few pointer
// sets it ran with, and a repeated set goes straight to cudnnBackendExecute.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cudnn_frontend.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cutrain/cuda/runtime.hpp"

namespace cutrain::inline CUTRAIN_ABI::cuda::cudnn {

namespace fe = cudnn_frontend;

namespace detail {
// cudnn-frontend keeps a graph's built plans in a protected member and offers no accessor for one
// plan's backend descriptor; a pointer to the member, formed in a derived class, reads it.
struct PlanList : fe::graph::Graph {
  // Plan `index` of g (-1: its default plan, the heuristics' choice) and its index, or null.
  static std::shared_ptr<fe::ExecutionPlan> plan(fe::graph::Graph& g, std::int64_t& index) {
    const auto& list = g.*(&PlanList::plans);
    if (index < 0) index = list.candidate;
    if (index < 0 || index >= static_cast<std::int64_t>(list.execution_plans.size())) return nullptr;
    return list.execution_plans[static_cast<std::size_t>(index)];
  }
};
}  // namespace detail

// This thread's executions through kept variant packs, and the packs made for them (a run whose
// pointer set was seen before makes none). For tests and reports.
struct VariantPackStats {
  std::int64_t runs = 0;
  std::int64_t made = 0;
};
inline VariantPackStats& variant_pack_stats() {
  thread_local VariantPackStats s;
  return s;
}

class VariantPacks {
 public:
  static constexpr std::size_t max_pointers = 16;  // graph tensors; execute's fast path takes at most this many
  static constexpr std::size_t slots = 4;          // pointer sets remembered per graph

  // The packs of graph g's plan `plan_index` (-1: its default plan), or null where the graph's
  // execution is not just "the user's pointers and the workspace to the plan": the frontend
  // places tensors in the workspace, slices pointers or leaves some out (none of cutrain's graphs
  // do today), or the plan is not a cuDNN backend plan. Call after the graph has run once through
  // the frontend, which prepares its variant-pack template.
  static std::unique_ptr<VariantPacks> make(fe::graph::Graph& g, std::int64_t plan_index) {
    // The frontend dumps tensors from its execute when its logging asks for that.
    if (fe::isLoggingTensorDumpEnabled()) return nullptr;
    const auto& t = g.varpack_template;
    if (!t.workspace_slots.empty() || !t.replacement_slots.empty() || !t.backend_slots.empty()) return nullptr;
    if (t.user_slots.size() > max_pointers || t.all_uids.size() != t.template_ptrs.size()) return nullptr;
    auto plan = detail::PlanList::plan(g, plan_index);
    if (!plan || !plan->get_raw_desc()) return nullptr;
    // The frontend's own workspace (for workspace modifications) would shift the engine's.
    std::int64_t total = 0;
    if (g.get_workspace_size_plan_at_index(plan_index, total).is_bad() || total != plan->getWorkspaceSize())
      return nullptr;
    return std::unique_ptr<VariantPacks>(new VariantPacks(g, std::move(plan)));
  }

  VariantPacks(const VariantPacks&) = delete;
  VariantPacks& operator=(const VariantPacks&) = delete;
  ~VariantPacks() {
    for (auto& e : entries_)
      if (e.pack) cudnnBackendDestroyDescriptor(e.pack);
  }

  // Runs the plan with the user's pointers (in the graph's sorted-uid order) and the workspace.
  // Unlike the frontend's execute it does not check that the thread has a CUDA context: a graph
  // first runs through the frontend on each thread (graph caches are per thread), which makes one.
  void execute(cudnnHandle_t handle, void* const* user, std::size_t n, void* workspace, std::string_view op,
               const std::string& key) {
    CUTRAIN_REQUIRE(n == user_slots_.size(), CudnnError, op, key, ": ", n, " pointers for a plan of ",
                    user_slots_.size());
    Entry& e = find_or_make(user, n, workspace, op, key);
    // A runtime-compiled plan must outlive the CUDA graph a capture records it into, as the
    // frontend's execute arranges (its check is one capture-status query). The messages are
    // built only on failure: this runs on every op call.
    if (plan_->needs_cuda_graph_retention())
      if (const cudaError_t st = plan_->retain_on_capturing_stream(current_stream()); st != cudaSuccess)
        check(st, op, key + ": keeping the plan for the CUDA graph");
    if (const cudnnStatus_t st = cudnnBackendExecute(handle, plan_->get_raw_desc(), e.pack); st != CUDNN_STATUS_SUCCESS)
      check(st, op, key + ": cudnnBackendExecute");
    ++variant_pack_stats().runs;
  }

 private:
  struct Entry {
    std::array<void*, max_pointers + 1> pointers{};  // the user's, then the workspace
    cudnnBackendDescriptor_t pack = nullptr;
  };

  VariantPacks(fe::graph::Graph& g, std::shared_ptr<fe::ExecutionPlan> plan)
      : plan_(std::move(plan)),
        uids_(g.varpack_template.all_uids),
        template_(g.varpack_template.template_ptrs),
        user_slots_(g.varpack_template.user_slots),
        aligned_slots_(g.varpack_template.aligned_slots) {}

  Entry& find_or_make(void* const* user, std::size_t n, void* workspace, std::string_view op, const std::string& key) {
    std::array<void*, max_pointers + 1> want{};
    for (std::size_t i = 0; i < n; ++i) want[i] = user[i];
    want[n] = workspace;
    for (auto& e : entries_)
      if (e.pack && e.pointers == want) return e;
    // A new set: the frontend's checks, then a pack in the oldest slot.
    std::vector<void*> all(template_);
    for (std::size_t i = 0; i < n; ++i) all[static_cast<std::size_t>(user_slots_[i])] = user[i];
    for (const auto& [slot, alignment] : aligned_slots_)
      CUTRAIN_REQUIRE(reinterpret_cast<std::uintptr_t>(all[static_cast<std::size_t>(slot)]) %
                              static_cast<std::uintptr_t>(alignment) == 0,
                      CudnnError, op, key, ": the pointer of tensor uid ", uids_[static_cast<std::size_t>(slot)],
                      " is not aligned to ", alignment, " bytes");
    cudnnBackendDescriptor_t pack = nullptr;
    check(cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack), op, key + ": variant pack");
    const auto fill = [&] {
      void* ws = workspace;
      check(cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws), op,
            key + ": variant pack workspace");
      check(cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
                                     static_cast<std::int64_t>(all.size()), all.data()),
            op, key + ": variant pack pointers");
      check(cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
                                     static_cast<std::int64_t>(uids_.size()), uids_.data()),
            op, key + ": variant pack uids");
      check(cudnnBackendFinalize(pack), op, key + ": variant pack finalize");
    };
    try {
      fill();
    } catch (...) {
      cudnnBackendDestroyDescriptor(pack);
      throw;
    }
    Entry& e = entries_[next_];
    next_ = (next_ + 1) % slots;
    if (e.pack) cudnnBackendDestroyDescriptor(e.pack);
    e.pack = pack;
    e.pointers = want;
    ++variant_pack_stats().made;
    return e;
  }

  std::shared_ptr<fe::ExecutionPlan> plan_;
  std::vector<std::int64_t> uids_;
  std::vector<void*> template_;  // pointers to host values the graph passes by value, nulls for the user's
  std::vector<int> user_slots_;
  std::vector<std::pair<int, std::int64_t>> aligned_slots_;
  std::array<Entry, slots> entries_{};
  std::size_t next_ = 0;
};

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::cudnn
