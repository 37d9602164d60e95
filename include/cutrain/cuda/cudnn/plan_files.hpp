// Built cuDNN plans kept on disk, and the warm-start list that loads a program's plans back on
// background threads. cudnn/graph.hpp builds and runs graphs; this file is what they leave behind.
#pragma once

#include "cutrain/core/abi.hpp"
#include "cutrain/core/config.hpp"

#include <cudnn_frontend.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "cutrain/cuda/autotune/tuner.hpp"
#include "cutrain/cuda/cudnn/graph.hpp"
#include "cutrain/cuda/kernels/nvrtc.hpp"
#include "cutrain/cuda/runtime.hpp"

namespace cutrain::inline CUTRAIN_ABI::cuda::cudnn {

// ---- Built plans on disk ----------------------------------------------------------------------
// cuDNN compiles the kernels of runtime-fused engines (batch norm, pointwise graphs, some fused
// convolutions) while building their plan, in every process: on a ResNet-18 step that is most of
// the first step's 2.7 s. A built plan is written to the kernel cache directory after its first
// execute, and a later process reads it back instead of building it, for graphs the autotuner
// would not plan (heuristic mode, or graphs it leaves to the heuristics). Under a warm start (see
// below) tuned plans are written too, keyed by their choice. Files are checksummed, written
// atomically, keyed by the graph key, the GPU and the cuDNN and cudnn-frontend versions; a bad or
// foreign one is ignored and the graph is built. CUTRAIN_PLAN_CACHE=0 turns this off.
namespace detail {
using cutrain::detail::cat;

inline bool plan_files_enabled() { return config()->plan_cache; }

// A tuned plan's choice as text: what a plan file of it is keyed by.
inline std::string choice_text(const autotune::Choice& c) {
  std::string t = cat("engine ", c.engine_id);
  for (const auto& k : c.knobs) t += cat(" ", k.type, "=", k.value);
  return t;
}

// `key` is the graph's text (without the device); `choice` a tuned plan's choice_text, or empty.
inline std::string plan_file_key(int device, const std::string& key, const std::string& choice = {}) {
  return autotune::Key::make("cudnn plan", choice.empty() ? key : key + " | tuned " + choice, "cudnn",
                             autotune::environment(device))
      .text();
}
inline std::string plan_file_name(const std::string& file_key) {
  return "cudnn-plan-" + kernels::detail::hex16(kernels::detail::fnv1a(file_key)) + ".bin";
}
inline std::filesystem::path plan_dir() { return kernels::kernel_cache_dir(); }

// The payload: a format line, the record's strings (each as its length and bytes), the count of
// pointers, their order (BuiltGraph::sorted) and sizes, the workspace, then cudnn-frontend's
// serialized plan.
inline constexpr std::string_view plan_format = "cutrain cudnn plan 3\n";  // a new number whenever graphs' tensor order changes

template <class V>
void put_raw(std::vector<char>& out, const V& v) {
  const char* p = reinterpret_cast<const char*>(&v);
  out.insert(out.end(), p, p + sizeof(V));
}
inline void put_string(std::vector<char>& out, const std::string& s) {
  put_raw(out, static_cast<std::uint64_t>(s.size()));
  out.insert(out.end(), s.begin(), s.end());
}

// Writes bg's plan to its record's file; false when cuDNN cannot serialize it or the file cannot
// be written (the plan is then built again next time: never an error).
inline bool save_plan_file(const BuiltGraph& bg) noexcept {
  try {
    const PlanRecord& r = *bg.record;
    const auto dir = plan_dir();
    std::vector<std::uint8_t> blob;
    if (dir.empty() || bg.sorted.size() != bg.tensors.size() || bg.graph->serialize(blob, false).is_bad() ||
        blob.empty())
      return false;
    std::vector<char> payload(plan_format.begin(), plan_format.end());
    for (const auto* s : {&r.file_key, &r.graph_key, &r.tuned_op, &r.tuned_signature, &r.tuned_choice})
      put_string(payload, *s);
    put_raw(payload, static_cast<std::uint64_t>(bg.sorted.size()));
    for (const int i : bg.sorted) put_raw(payload, static_cast<std::int32_t>(i));
    for (const int i : bg.sorted) {
      const auto& t = *bg.tensors[static_cast<std::size_t>(i)];
      put_raw(payload, t.get_is_pass_by_value() ? std::int64_t{-1}
                                                : static_cast<std::int64_t>(autotune::detail::tensor_bytes(t)));
    }
    put_raw(payload, static_cast<std::int64_t>(bg.workspace));
    payload.insert(payload.end(), blob.begin(), blob.end());
    return kernels::detail::write_cache_file(dir / plan_file_name(r.file_key), payload);
  } catch (...) {
    return false;
  }
}

// The plan in the file `name`, ready to execute, if it is the plan of graph_key (the graph's
// "device|text") for this GPU and these library versions; nothing when there is none or it does not
// deserialize here.
inline std::optional<BuiltGraph> load_plan_file(int device, const std::string& name, const std::string& graph_key) {
  const auto dir = plan_dir();
  if (dir.empty()) return std::nullopt;
  const auto payload = kernels::detail::read_cache_file(dir / name);
  if (!payload) return std::nullopt;
  const char* p = payload->data();
  std::size_t left = payload->size();
  const auto take = [&](void* out, std::size_t n) {
    if (n > left) return false;
    std::memcpy(out, p, n);
    p += n;
    left -= n;
    return true;
  };
  const auto take_string = [&](std::string& s) {
    std::uint64_t n = 0;
    if (!take(&n, 8) || n > left) return false;
    s.assign(p, n);
    p += n;
    left -= n;
    return true;
  };
  if (left < plan_format.size() || std::string_view(p, plan_format.size()) != plan_format) return std::nullopt;
  p += plan_format.size();
  left -= plan_format.size();
  auto r = std::make_shared<PlanRecord>();
  for (auto* s : {&r->file_key, &r->graph_key, &r->tuned_op, &r->tuned_signature, &r->tuned_choice})
    if (!take_string(*s)) return std::nullopt;
  // Another graph with the same file name, or one built for another GPU or library version.
  const auto bar = graph_key.find('|');
  if (r->graph_key != graph_key || bar == std::string::npos ||
      r->file_key != plan_file_key(device, graph_key.substr(bar + 1), r->tuned_choice) ||
      name != plan_file_name(r->file_key))
    return std::nullopt;
  std::uint64_t count = 0;
  if (!take(&count, 8) || count == 0 || count > 16) return std::nullopt;
  BuiltGraph bg;
  for (std::uint64_t k = 0; k < count; ++k) {
    std::int32_t i = 0;
    if (!take(&i, 4) || i < 0 || static_cast<std::uint64_t>(i) >= count) return std::nullopt;
    bg.sorted.push_back(i);
  }
  for (std::uint64_t k = 0; k < count; ++k) {
    std::int64_t b = 0;
    if (!take(&b, 8) || b < -1) return std::nullopt;
    r->bytes.push_back(b);
  }
  if (!take(&bg.workspace, 8) || bg.workspace < 0 || left == 0) return std::nullopt;
  const std::vector<std::uint8_t> blob(reinterpret_cast<const std::uint8_t*>(p), reinterpret_cast<const std::uint8_t*>(p) + left);
  auto g = std::make_shared<fe::graph::Graph>();
  try {
    if (g->deserialize(handles(device).cudnn, blob, false, false).is_bad()) return std::nullopt;
  } catch (const std::exception&) {  // the frontend's JSON reader throws on a malformed blob
    return std::nullopt;
  }
  bg.graph = std::move(g);
  bg.tensors.resize(static_cast<std::size_t>(count));  // placeholders: the file gives the order (sorted)
  r->on_disk = true;
  bg.record = std::move(r);
  return bg;
}

// Whether a plan read from a file is what `planner` would plan for `text` now: the heuristics'
// plan where the autotuner leaves the graph to them; a tuned plan in cached mode when the cache
// still holds its choice. (Benchmark mode times every tuned graph again.)
inline bool plan_fits_now(const PlanRecord& r, int device, const std::string& text, const autotune::Planner& planner) {
  if (!planner.tunes()) return r.tuned_choice.empty();
  if (planner.mode() != autotune::Mode::cached || r.tuned_choice.empty() ||
      r.tuned_signature != text + (planner.options().deterministic_only ? " deterministic" : ""))
    return false;
  const autotune::Environment env = autotune::environment(device);
  const auto c = autotune::cache();
  autotune::detail::use_environment(*c, env);
  const auto hit = c->find(autotune::Key::make(r.tuned_op, r.tuned_signature, "cudnn", env));
  return hit && choice_text(*hit) == r.tuned_choice;
}

// The record of a tuned plan of `key` (graph_key is its "device|text"): its file is keyed
// by the choice, and may be there already from an earlier run.
inline std::shared_ptr<PlanRecord> tuned_record(int device, const std::string& key, const std::string& graph_key,
                                                const autotune::Result& tuned) {
  auto r = std::make_shared<PlanRecord>(PlanRecord{.graph_key = graph_key,
                                                   .tuned_op = tuned.key.op,
                                                   .tuned_signature = tuned.key.signature,
                                                   .tuned_choice = choice_text(tuned.choice)});
  r->file_key = plan_file_key(device, key, r->tuned_choice);
  std::error_code ec;
  r->on_disk = std::filesystem::is_regular_file(plan_dir() / plan_file_name(r->file_key), ec);
  return r;
}
}  // namespace detail

// ---- Warm start --------------------------------------------------------------------------------
// A warm-start list (cuda::warm_start) names the plan files a program used, in the order it first
// used them. A later run of the program reads the list and loads those plans on background threads,
// each run once on scratch buffers so that its kernels are loaded too, while the program sets up;
// the plan store then takes a loaded plan instead of building it (and waits for one in flight, or
// loads it itself if no thread has started it). Plans the program builds that the list lacks are
// added to it.
namespace detail {
struct WarmSlot {
  enum class State { pending, loading, ready } state = State::pending;
  std::string file_name, graph_key;
  std::optional<BuiltGraph> graph;
};
struct WarmList {
  std::mutex mutex;
  std::condition_variable ready;
  std::atomic<bool> active{false};
  std::filesystem::path path;
  std::vector<std::string> lines;            // "file name\tgraph key", as in the file
  std::unordered_set<std::string> listed;    // the file names in lines
  std::unordered_map<std::string, std::shared_ptr<WarmSlot>> slots;  // not yet taken, by graph key
  std::deque<std::shared_ptr<WarmSlot>> queue;                       // what the threads load, in order
  // What the threads did (cuda::warm_start_stats): plans queued, loaded, and of those run once;
  // how many threads, when they started, the microseconds they spent (summed) reading plans,
  // running them and warming cuBLASLt up, and when the last plan was ready; opening cuDNN's libraries.
  std::int64_t queued = 0, loaded = 0, warmed = 0;
  int threads = 0;
  std::chrono::steady_clock::time_point started{};
  std::int64_t load_us = 0, run_us = 0, cublas_us = 0, last_ready_us = 0, libraries_us = 0;
  std::int64_t cublas_ready_us = -1;         // when the cuBLASLt warm-up ended (after started); -1: not yet
  int busy = 0;                              // threads loading a plan now
  bool stopping = false;                     // the process is exiting: take no more plans
};
inline WarmList& warm_list() {
  static WarmList* w = new WarmList;  // never destroyed: its threads outlive static destruction
  return *w;
}
inline constexpr std::string_view warm_format = "cutrain warm list 1";

inline void write_warm_list(const WarmList& w) {
  std::string text(warm_format);
  for (const auto& l : w.lines) text += "\n" + l;
  (void)kernels::detail::write_cache_file(w.path, std::vector<char>(text.begin(), text.end()));
}

// Adds a plan's file to the list, if a warm start is active and the list lacks it.
inline void warm_record(const PlanRecord& r) {
  auto& w = warm_list();
  if (!w.active.load(std::memory_order_acquire)) return;
  std::lock_guard lock(w.mutex);
  const std::string name = plan_file_name(r.file_key);
  if (!w.listed.insert(name).second || w.lines.size() >= 4096) return;
  w.lines.push_back(name + "\t" + r.graph_key);
  write_warm_list(w);
}

// Forgets the warm start, after its threads finish what they hold: a test can then start another
// in the same process, as a later run would.
inline void reset_warm_start() {
  auto& w = warm_list();
  std::unique_lock lock(w.mutex);
  w.queue.clear();
  w.ready.wait(lock, [&] { return w.busy == 0; });
  w.active.store(false);
  w.path.clear();
  w.lines.clear();
  w.listed.clear();
  w.slots.clear();
  w.queued = w.loaded = w.warmed = w.load_us = w.run_us = w.cublas_us = w.last_ready_us = w.libraries_us = 0;
  w.cublas_ready_us = -1;
  w.threads = 0;
}

// The plan the warm start loaded for graph_key ("device|key"), if it loaded one and it fits now.
inline std::optional<BuiltGraph> take_warm(int device, const std::string& graph_key, const std::string& key,
                                           const autotune::Planner& planner) {
  auto& w = warm_list();
  if (!w.active.load(std::memory_order_acquire)) return std::nullopt;
  std::unique_lock lock(w.mutex);
  const auto it = w.slots.find(graph_key);
  if (it == w.slots.end()) return std::nullopt;
  const std::shared_ptr<WarmSlot> slot = it->second;
  w.slots.erase(it);
  if (slot->state == WarmSlot::State::pending) {  // no thread has it yet: load it here (no warm-up run)
    slot->state = WarmSlot::State::loading;
    lock.unlock();
    slot->graph = load_plan_file(device, slot->file_name, slot->graph_key);
    lock.lock();
    slot->state = WarmSlot::State::ready;
  }
  w.ready.wait(lock, [&] { return slot->state == WarmSlot::State::ready; });
  std::optional<BuiltGraph> g = std::move(slot->graph);
  lock.unlock();
  if (g && !plan_fits_now(*g->record, device, key, planner)) g.reset();
  return g;
}
}  // namespace detail

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::cudnn
