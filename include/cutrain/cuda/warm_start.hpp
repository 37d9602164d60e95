// Warm start: a program names itself once, and its later runs load the cuDNN plans its earlier
// runs used on background threads while it sets up, so that its first training step does not
// wait for plan builds, plan files or kernel loading.
//
//   cutrain::cuda::warm_start("resnet18-b256");  // first thing in main()
//
// The list of plans lives next to the plan files (cudnn/plan_files.hpp, "Warm start"), as
// warm-<name>.list in the kernel cache directory. What a thread loads is used only if it is what
// the op would plan now (the same autotune mode, and for a tuned plan the same cache entry);
// otherwise the op builds its graph as without a warm start. Off with CUTRAIN_PLAN_CACHE=0.
#pragma once

#include "cutrain/core/abi.hpp"

#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <string>
#include <string_view>
#include <thread>

#include "cutrain/core/error.hpp"
#include "cutrain/cuda/cublas/algo.hpp"
#include "cutrain/cuda/cudnn/plan_files.hpp"
#include "cutrain/cuda/runtime.hpp"

namespace cutrain::inline CUTRAIN_ABI::cuda {

namespace detail {
// Runs a loaded plan once on zeroed scratch buffers on stream s (stream-ordered allocations: no
// device-wide synchronization), which loads its kernels. False when anything fails.
inline bool warm_run(cudnn::BuiltGraph& bg, const std::vector<std::int64_t>& bytes, int device, cudaStream_t s) {
  const std::size_t n = bytes.size();
  if (n != bg.sorted.size() || n > 16) return false;
  std::vector<void*> ptrs(n, nullptr), owned;
  std::int64_t host[16][4] = {};  // host values (pass-by-value scalars): zero
  bool ok = true;
  for (std::size_t i = 0; i < n && ok; ++i) {
    if (bytes[i] < 0) {
      ptrs[i] = host[i];
      continue;
    }
    const auto size = static_cast<std::size_t>(std::max<std::int64_t>(bytes[i], 16));
    ok = cudaMallocAsync(&ptrs[i], size, s) == cudaSuccess && cudaMemsetAsync(ptrs[i], 0, size, s) == cudaSuccess;
    if (ptrs[i]) owned.push_back(ptrs[i]);
  }
  void* ws = nullptr;
  if (ok && bg.workspace > 0) {
    ok = cudaMallocAsync(&ws, static_cast<std::size_t>(bg.workspace), s) == cudaSuccess;
    if (ws) owned.push_back(ws);
  }
  if (ok) ok = bg.graph->execute(handles(device).cudnn, ptrs.data(), static_cast<int>(n), ws).is_good();
  for (void* p : owned) (void)cudaFreeAsync(p, s);
  ok = cudaStreamSynchronize(s) == cudaSuccess && ok;
  if (!ok) (void)cudaGetLastError();
  return ok;
}

// cuDNN 9 opens its engine and operation libraries (libcudnn_engines_precompiled and others,
// about 380 MB) at their first use, and a plan of theirs waits for that: on the GPU machine the
// first convolution plan read by a warm start waited 90-100 ms for it, after the CUDA context.
// This opens them on a thread of their own from the start, while the workers wait for the context
// (30-40 ms), from the directory of the libcudnn this process loaded (never another copy); cuDNN's
// own dlopen by name then finds them open. A library not there is skipped: cuDNN opens it as before.
inline void open_cudnn_libraries() {
  std::string core;  // the path of the loaded libcudnn.so.<major>
  dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* out) {
        const std::string_view name = info->dlpi_name ? info->dlpi_name : "";
        if (name.find("/libcudnn.so") == std::string_view::npos) return 0;
        *static_cast<std::string*>(out) = name;
        return 1;
      },
      &core);
  if (core.empty()) return;
  const auto dir = std::filesystem::path(core).parent_path();
  for (const char* part : {"graph", "engines_precompiled", "engines_runtime_compiled", "heuristic", "cnn", "ops"}) {
    const auto lib = dir / cutrain::detail::cat("libcudnn_", part, ".so.", CUDNN_MAJOR);
    std::error_code ec;
    if (std::filesystem::is_regular_file(lib, ec)) (void)dlopen(lib.c_str(), RTLD_LAZY | RTLD_LOCAL);  // never closed
  }
}

// One background thread: loads and runs the queued plans, then parks. Its cuDNN handle (the one
// the plans were loaded with) lives as long as the process.
inline void warm_worker(int device, bool cublas_first) {
  auto& w = cudnn::detail::warm_list();
  try {
    cutrain::detail::DeviceGuard on(device);
    Stream stream(device);
    StreamGuard guard(stream.get());
    if (cublas_first) {  // counted as busy, as a plan is: exit waits for it
      {
        std::lock_guard lock(w.mutex);
        cublas_first = !w.stopping;
        w.busy += cublas_first ? 1 : 0;
      }
      if (cublas_first) {
        struct Done {
          cudnn::detail::WarmList& w;
          std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
          ~Done() {
            std::lock_guard lock(w.mutex);
            w.cublas_us += micros_since(t0);
            w.cublas_ready_us = micros_since(w.started);
            --w.busy;
            w.ready.notify_all();
          }
        } done{w};
        cublas::detail::warm_up(device);
      }
    }
    for (;;) {
      std::shared_ptr<cudnn::detail::WarmSlot> slot;
      {
        std::lock_guard lock(w.mutex);
        while (!w.stopping && !w.queue.empty() && !slot) {
          if (w.queue.front()->state == cudnn::detail::WarmSlot::State::pending) slot = w.queue.front();
          w.queue.pop_front();
        }
        if (!slot) break;
        slot->state = cudnn::detail::WarmSlot::State::loading;
        ++w.busy;
      }
      std::optional<cudnn::BuiltGraph> g;
      bool warmed = false;
      std::int64_t load_us = 0, run_us = 0;
      try {
        const auto t0 = std::chrono::steady_clock::now();
        g = cudnn::detail::load_plan_file(device, slot->file_name, slot->graph_key);
        load_us = micros_since(t0);
        const auto t1 = std::chrono::steady_clock::now();
        warmed = g && warm_run(*g, g->record->bytes, device, stream.get());
        run_us = micros_since(t1);
      } catch (...) {  // the slot must still become ready: an op may be waiting for it
        g.reset();
      }
      std::lock_guard lock(w.mutex);
      w.loaded += g ? 1 : 0;
      w.warmed += warmed ? 1 : 0;
      w.load_us += load_us;
      w.run_us += run_us;
      w.last_ready_us = micros_since(w.started);
      slot->graph = std::move(g);
      slot->state = cudnn::detail::WarmSlot::State::ready;
      --w.busy;
      w.ready.notify_all();
    }
  } catch (...) {  // a warm start never fails the program: what is not loaded is built
  }
  // Park: the handles this thread loaded plans with must outlive the plans.
  std::unique_lock lock(w.mutex);
  w.ready.wait(lock, [] { return false; });
}
}  // namespace detail

// Starts the warm start named `name` (letters, digits, '.', '-', '_') on `device`: reads the
// list of plans earlier runs of that name used and loads them on background threads; from now on
// plans this process uses are added to the list. Returns how many plans it queued (0 on the first
// run, or with no kernel cache directory, or with CUTRAIN_PLAN_CACHE=0). Call it once, before the
// first op, and before ops run on other threads; a second call with the same name returns 0, with
// another name it throws. threads: how many load plans (0: one per two plans, at most 8 and at
// most half the cores).
inline std::size_t warm_start(const std::string& name, int device = 0, int threads = 0) {
  constexpr std::string_view op = "cuda::warm_start";
  CUTRAIN_REQUIRE(!name.empty() && name.size() <= 100 &&
                      std::all_of(name.begin(), name.end(),
                                  [](char c) {
                                    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                                           c == '.' || c == '-' || c == '_';
                                  }),
                  InvalidArgument, op, "name \"", name, "\" must be 1-100 letters, digits, '.', '-' or '_'");
  CUTRAIN_REQUIRE(device >= 0 && device < device_count(), InvalidArgument, op, "device ", device, " is not one of the ",
                  device_count(), " CUDA devices");
  CUTRAIN_REQUIRE(threads >= 0 && threads <= 64, InvalidArgument, op, "threads ", threads, " must be 0 (automatic) to 64");
  auto& w = cudnn::detail::warm_list();
  const auto dir = cudnn::detail::plan_dir();
  const auto path = dir.empty() ? dir : dir / ("warm-" + name + ".list");
  std::unique_lock lock(w.mutex);
  if (w.active.load()) {
    CUTRAIN_REQUIRE(w.path == path, InvalidArgument, op, "already started as ", w.path.filename().string(),
                    "; one warm start per process");
    return 0;
  }
  if (dir.empty() || !cudnn::detail::plan_files_enabled()) return 0;
  w.path = path;
  if (const auto text = kernels::detail::read_cache_file(path)) {
    const std::string_view all(text->data(), text->size());
    if (all.starts_with(cudnn::detail::warm_format)) {
      std::size_t at = cudnn::detail::warm_format.size();
      while (at < all.size() && all[at] == '\n') {
        const std::size_t end = std::min(all.find('\n', at + 1), all.size());
        const std::string_view line = all.substr(at + 1, end - at - 1);
        const std::size_t tab = line.find('\t');
        at = end;
        if (tab == std::string_view::npos || !w.listed.insert(std::string(line.substr(0, tab))).second) continue;
        auto slot = std::make_shared<cudnn::detail::WarmSlot>();
        slot->file_name = line.substr(0, tab);
        slot->graph_key = line.substr(tab + 1);
        w.lines.emplace_back(line);
        if (w.slots.emplace(slot->graph_key, slot).second) w.queue.push_back(std::move(slot));
      }
    }
  }
  w.active.store(true, std::memory_order_release);
  const std::size_t queued = w.queue.size();
  w.queued = static_cast<std::int64_t>(queued);
  if (queued == 0) return 0;
  // At exit, threads stop taking plans, and exit waits (up to 5 s) for those loading one: CUDA and
  // cuDNN must not be torn down under them. (Constructed after CUDA's own exit handlers: runs first.)
  static struct Drain {
    ~Drain() {
      auto& w = cudnn::detail::warm_list();
      std::unique_lock lock(w.mutex);
      w.stopping = true;
      w.ready.wait_for(lock, std::chrono::seconds(5), [&] { return w.busy == 0; });
    }
  } drain;
  // Plan loads are host work (deserializing, loading modules): a thread per two plans, up to half
  // the cores (at most 8); the first thread warms cuBLASLt up first.
  const unsigned cores = std::max(2u, std::thread::hardware_concurrency());
  const std::size_t n = threads > 0 ? static_cast<std::size_t>(threads)
                                    : std::clamp<std::size_t>(queued / 2, 1, std::min(8u, cores / 2));
  w.started = std::chrono::steady_clock::now();
  w.threads = static_cast<int>(n);
  ++w.busy;  // exit waits for the libraries too
  try {
    std::thread([] {
      auto& w = cudnn::detail::warm_list();
      const auto t0 = std::chrono::steady_clock::now();
      try {
        detail::open_cudnn_libraries();
      } catch (...) {  // a warm start never fails the program
      }
      std::lock_guard lock(w.mutex);
      w.libraries_us = detail::micros_since(t0);
      --w.busy;
      w.ready.notify_all();
    }).detach();
  } catch (...) {  // no thread to be had: cuDNN opens its libraries itself, as without a warm start
    --w.busy;
  }
  for (std::size_t t = 0; t < n; ++t) std::thread(detail::warm_worker, device, t == 0).detach();
  return queued;
}

// What the warm start's threads did so far: plans loaded, and of those run once (kernels loaded);
// the threads, the time they spent reading plans, running them and warming cuBLASLt up (summed
// over threads), when the last plan was ready (ms after warm_start), how long opening cuDNN's
// libraries took, and when the cuBLASLt warm-up ended.
struct WarmStartStats {
  std::int64_t queued = 0, loaded = 0, warmed = 0;
  int threads = 0;
  double load_ms = 0, run_ms = 0, cublas_ms = 0, last_ready_ms = 0;
  double libraries_ms = 0;  // opening cuDNN's libraries (open_cudnn_libraries)
  double cublas_ready_ms = -1;  // when the cuBLASLt warm-up ended (ms after warm_start); -1: not (yet)
};
inline WarmStartStats warm_start_stats() {
  auto& w = cudnn::detail::warm_list();
  std::lock_guard lock(w.mutex);
  return {w.queued, w.loaded, w.warmed, w.threads, w.load_us / 1e3, w.run_us / 1e3, w.cublas_us / 1e3,
          w.last_ready_us / 1e3, w.libraries_us / 1e3, w.cublas_ready_us < 0 ? -1.0 : w.cublas_ready_us / 1e3};
}

}  // namespace cutrain::inline CUTRAIN_ABI::cuda
