// The autotuner's settings: its mode (heuristic, benchmark, cached), options, statistics, the last
// result, the cache it reads and writes, and the environment a timing is valid for.
#pragma once

#include "cutrain/core/abi.hpp"
#include "cutrain/core/config.hpp"

#include <cuda_runtime.h>
#include <cudnn.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "cutrain/cuda/autotune/cache.hpp"
#include <cudnn_frontend_version.h>  // CUDNN_FRONTEND_VERSION: environment() names it
#include "cutrain/cuda/runtime.hpp"

namespace cutrain::inline CUTRAIN_ABI::cuda::autotune {

// heuristic: cuDNN's first choice, nothing timed. benchmark: time the candidates, keep the
// fastest (and write it to the cache). cached: take the cache's entry; on a miss, benchmark and
// store.
enum class Mode { heuristic, benchmark, cached };

// The engine id a cache entry has when the chosen plan is cuDNN's heuristic first choice and its
// engine config cannot be named (knobs this frontend does not know): rebuilt by the heuristics.
inline constexpr std::int64_t heuristic_engine = -1;

inline const char* to_string(Mode m) {
  switch (m) {
    case Mode::heuristic: return "heuristic";
    case Mode::benchmark: return "benchmark";
    case Mode::cached: return "cached";
  }
  return "?";
}
inline std::ostream& operator<<(std::ostream& os, Mode m) { return os << to_string(m); }

inline std::optional<Mode> parse_mode(std::string_view s) {
  for (Mode m : {Mode::heuristic, Mode::benchmark, Mode::cached})
    if (s == to_string(m)) return m;
  return std::nullopt;
}

// What a cuDNN graph computes, as far as the tuner cares: convolutions (with their fused
// epilogues) and attention are tuned; normalization and pointwise graphs only with
// Options::tune_all_graphs.
enum class GraphFamily { convolution, normalization, pointwise, attention };

struct Options {
  int max_candidates = 18;                       // distinct engine configs tried per op, the baseline included
  std::int64_t max_workspace_bytes = 1ll << 30;  // plans needing more are skipped (and counted as failed)
  double max_tuning_ms = 2000;                   // wall-time budget per op: builds and timing
  bool deterministic_only = false;               // skip engines cuDNN marks NONDETERMINISTIC
  // Every cuDNN candidate, the baseline included, is first screened (the faster of two short
  // rounds); the baseline and those within this factor of the fastest screen are then timed
  // fully, in turns (see tune()). 0 times every candidate fully, one after the other
  // (autotune_report --exhaustive does, to compare the choice with all of them).
  double screen_ratio = 1.15;
  // Convolution graphs (with their fused epilogues) and cuBLASLt matmuls are tuned; normalization
  // and pointwise graphs take cuDNN's heuristic choice unless this is set. Their candidates are
  // mostly runtime-fused engines that cuDNN compiles at build: about 1.3 s per graph to tune
  // (ResNet-18 on the H200: 16 such graphs, 21 s), against about 40 ms per convolution.
  bool tune_all_graphs = false;
  // cuDNN's heuristics mode B is asked for a graph only when the screen of mode A's (and the
  // fallback list's) candidates found one faster than mode_b_below times the baseline, A's first
  // choice (above 1: for every graph, within the time budget), and its first mode_b_first untried
  // configs are then tried next, within max_candidates. 0 for either: B is not asked, unless
  // nothing of A's or the fallback list's builds (and mode_b_first is not 0). Its query costs
  // 17-28 ms per graph on the H200, mode A's 1-2 ms; see tune().
  double mode_b_below = 0.9;
  int mode_b_first = 2;
  // How many of the fallback list's runtime-compiled configs that mode A does not list
  // are tried within max_candidates (right after A's first ones). cuDNN compiles each when it is
  // built: 30 ms to 2 s on the H200 (0.34 s at the median on a fresh machine, less once earlier
  // processes compiled such kernels), where a precompiled config builds in under 0.1 ms. Off by
  // default: on 1-2 of the benchmark suite's 91 graphs the fastest plan is one of them (3-12%
  // faster than any other), but with 1, ResNet-18's tuning took 0.8-1.3 s longer (about 20
  // compiles), which put it above PyTorch's benchmark-mode first step (docs/autotune.md).
  int fallback_compiled = 0;
};

// What tuning did in this process (for tests and reports).
struct Stats {
  std::atomic<std::int64_t> candidates_timed{0};  // plans timed, the heuristic baseline included
  std::atomic<std::int64_t> ops_tuned{0};         // graphs whose candidates were timed
  std::atomic<std::int64_t> cache_hits{0};        // graphs planned from a cache entry, nothing timed
  // Where tuning went (wall time on the tuning threads, microseconds). For cuDNN graphs: the
  // heuristics' queries and the baseline's build (plan()), the other candidates' builds, and the
  // rest of tune() (scratch buffers, runs, waiting for the GPU). For graphs and matmuls alike:
  // writing the cache file after each one tuned.
  std::atomic<std::int64_t> query_micros{0}, build_micros{0}, timing_micros{0}, save_micros{0};
  std::atomic<std::int64_t> spin_ups_skipped{0};  // baselines timed without spin_up (see tune())
  std::atomic<std::int64_t> mode_b_queries{0};    // graphs whose tuning asked heuristics mode B
};
inline Stats& stats() {
  static Stats s;
  return s;
}

// The last graph this thread tuned or planned from the cache.
struct Result {
  Key key;
  Choice choice;
  bool from_cache = false;
  // Every candidate timed (its engine id, knobs and median), the heuristics' baseline first;
  // empty for a cache hit. For reports (autotune_report --exhaustive, which turns the screen
  // off: a candidate the screen dropped has its screen estimate here).
  std::vector<RunnerUp> timed{};
  // For each of `timed`: where cuDNN listed its config, as 1-based places in heuristics mode A,
  // mode B and the fallback list ("A3 B1", "F2"), for reports that weigh the candidate order.
  std::vector<std::string> origins{};
  // For each of `timed`: cuDNN's numerical and behaviour notes on its config ("TENSOR_CORE
  // RUNTIME_COMPILATION"), and how long building its plan took (0 for the baseline, which plan()
  // built).
  std::vector<std::string> notes{};
  std::vector<double> build_ms{};
};

namespace detail {
using cutrain::detail::cat;

// One line on stderr per distinct message.
inline void warn(const std::string& message) {
  static std::mutex m;
  static std::set<std::string> said;
  {
    std::lock_guard lock(m);
    if (!said.insert(message).second) return;
  }
  std::cerr << "cutrain: autotune: " << message << std::endl;
}

// $CUTRAIN_AUTOTUNE, read once; a value that is not a mode is a warning and leaves the default.
inline Mode mode_from_environment() {
  const std::string v = config()->autotune;
  if (v.empty()) return Mode::cached;
  if (auto m = parse_mode(v)) return *m;
  warn(cat("CUTRAIN_AUTOTUNE=\"", v, "\" is not heuristic, benchmark or cached; using cached"));
  return Mode::cached;
}
inline std::atomic<Mode>& process_mode() {
  static std::atomic<Mode> m{mode_from_environment()};
  return m;
}
inline std::optional<Mode>& thread_mode() {
  thread_local std::optional<Mode> m;
  return m;
}

struct Settings {
  std::mutex mutex;
  Options options;
  std::shared_ptr<Cache> cache;  // null: global_cache()
};
inline Settings& settings() {
  static Settings s;
  return s;
}

inline std::optional<Result>& last() {
  thread_local std::optional<Result> r;
  return r;
}
}  // namespace detail


// The mode in effect on this thread: a ModeGuard's, else the process default (set_mode, else
// $CUTRAIN_AUTOTUNE, else cached).
inline Mode mode() {
  if (const auto& m = detail::thread_mode()) return *m;
  return detail::process_mode().load();
}
inline Mode default_mode() { return detail::process_mode().load(); }
inline void set_mode(Mode m) { detail::process_mode().store(m); }

// Sets this thread's mode for a scope: ModeGuard g(Mode::heuristic);
class ModeGuard {
 public:
  explicit ModeGuard(Mode m) : prev_(detail::thread_mode()) { detail::thread_mode() = m; }
  ~ModeGuard() { detail::thread_mode() = prev_; }
  ModeGuard(const ModeGuard&) = delete;
  ModeGuard& operator=(const ModeGuard&) = delete;

 private:
  std::optional<Mode> prev_;
};

inline Options options() {
  auto& s = detail::settings();
  std::lock_guard lock(s.mutex);
  return s.options;
}
inline void set_options(const Options& o) {
  CUTRAIN_REQUIRE(o.max_candidates >= 1, InvalidArgument, "autotune::set_options", "max_candidates ",
                  o.max_candidates, " must be at least 1");
  CUTRAIN_REQUIRE(o.screen_ratio == 0 || o.screen_ratio >= 1, InvalidArgument, "autotune::set_options",
                  "screen_ratio ", o.screen_ratio, " must be 0 (no screen) or at least 1");
  CUTRAIN_REQUIRE(o.max_workspace_bytes >= 0, InvalidArgument, "autotune::set_options", "max_workspace_bytes ",
                  o.max_workspace_bytes, " is negative");
  CUTRAIN_REQUIRE(std::isfinite(o.max_tuning_ms) && o.max_tuning_ms > 0, InvalidArgument, "autotune::set_options",
                  "max_tuning_ms ", o.max_tuning_ms, " must be a positive time");
  CUTRAIN_REQUIRE(o.mode_b_first >= 0, InvalidArgument, "autotune::set_options", "mode_b_first ", o.mode_b_first,
                  " is negative");
  CUTRAIN_REQUIRE(std::isfinite(o.mode_b_below) && o.mode_b_below >= 0, InvalidArgument, "autotune::set_options",
                  "mode_b_below ", o.mode_b_below, " must be a finite factor, 0 or more");
  CUTRAIN_REQUIRE(o.fallback_compiled >= 0, InvalidArgument, "autotune::set_options", "fallback_compiled ",
                  o.fallback_compiled, " is negative");
  auto& s = detail::settings();
  std::lock_guard lock(s.mutex);
  s.options = o;
}

// The cache the tuner reads and writes: global_cache() unless set_cache gave another one (a
// null pointer goes back to global_cache()).
inline std::shared_ptr<Cache> cache() {
  auto& s = detail::settings();
  std::lock_guard lock(s.mutex);
  if (s.cache) return s.cache;
  return std::shared_ptr<Cache>(std::shared_ptr<Cache>{}, &global_cache());  // not owned
}
inline void set_cache(std::shared_ptr<Cache> c) {
  auto& s = detail::settings();
  std::lock_guard lock(s.mutex);
  s.cache = std::move(c);
}

inline std::optional<Result> last_result() { return detail::last(); }
inline void clear_last_result() { detail::last().reset(); }

// What a timing is valid for: the GPU (name, SM count, compute capability) and the cuDNN and
// cudnn-frontend versions.
inline Environment environment(int device) {
  static std::mutex m;
  static std::unordered_map<int, Environment> known;
  std::lock_guard lock(m);
  if (auto it = known.find(device); it != known.end()) return it->second;
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device), "autotune::environment", "cudaGetDeviceProperties");
  Environment env{.gpu_name = prop.name,
                  .sm_count = prop.multiProcessorCount,
                  .compute_capability = cutrain::detail::cat(prop.major, ".", prop.minor),
                  .cudnn_version = static_cast<std::int64_t>(cudnnGetVersion()),
                  .frontend_version = CUDNN_FRONTEND_VERSION};
  known.emplace(device, env);
  return env;
}

namespace detail {
using cutrain::cuda::detail::micros_since;

// find() answers only for the cache's environment: make it this device's (a process that uses
// two kinds of GPU switches it back and forth).
inline void use_environment(Cache& c, const Environment& env) {
  if (!(c.environment() == env)) c.set_environment(env);
}

// Records a newly tuned choice in the tuner's cache (in the key's environment) and writes the file
// (atomic, merged). A failure to write is a warning ("<what> was not stored"), never the op's
// failure. Counts Stats::save_micros. Used for cuDNN graphs and cuBLASLt matmuls alike.
inline void store_choice(const Key& key, const Choice& choice, std::string_view what) {
  const auto t0 = std::chrono::steady_clock::now();
  try {
    const auto store = cache();
    use_environment(*store, key.environment());
    store->insert(key, choice);
    store->save();
  } catch (const cutrain::Error& e) {
    warn(cat(what, " was not stored (", e.what(), ")"));
  }
  stats().save_micros.fetch_add(micros_since(t0));
}

}  // namespace detail

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::autotune
