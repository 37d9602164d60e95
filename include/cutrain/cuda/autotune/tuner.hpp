// The autotuner's timing part: picks the fastest cuDNN execution plan of a graph by timing the
// candidates on the real GPU, and remembers the winner (engine id and knobs) in the persistent
// cache (cache.hpp), so that a signature is tuned once per machine, not once per run.
//
// cudnn/graph.hpp calls it where a graph is first built: cached_graph() opens a PlanScope,
// build() hands the lowered graph to plan(), which either replays the cached engine or queries
// the candidates, and PlanScope::finish() times them on scratch buffers once the op has listed
// its tensors. Executing a built graph afterwards costs what it did before: one launch.
#pragma once

#include <cudnn_frontend.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <iostream>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "cutrain/core/storage.hpp"
#include "cutrain/cuda/autotune/cache.hpp"
#include "cutrain/cuda/runtime.hpp"

namespace cutrain::cuda::autotune {

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
namespace fe = cudnn_frontend;
using TensorAttr = std::shared_ptr<fe::graph::Tensor_attributes>;

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
  const char* v = std::getenv("CUTRAIN_AUTOTUNE");
  if (!v || !*v) return Mode::cached;
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

// Whether the autotuner plans the graph of this key (cudnn::cached_graph's key) under options o:
// convolutions (their keys start with the direction), or every graph with tune_all_graphs.
inline bool tunes_graph(std::string_view graph_key, const Options& o) {
  return o.tune_all_graphs || graph_key.starts_with("fprop ") || graph_key.starts_with("dgrad ") ||
         graph_key.starts_with("wgrad ");
}

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

inline void fe_check(fe::error_t status, std::string_view op, const std::string& context) {
  if (status.is_bad()) throw CudnnError(op, cat(context, ": ", status.get_message()));
}

// find() answers only for the cache's environment: make it this device's (a process that uses
// two kinds of GPU switches it back and forth).
inline void use_environment(Cache& c, const Environment& env) {
  if (!(c.environment() == env)) c.set_environment(env);
}

inline std::vector<Knob> sorted_knobs(const std::unordered_map<fe::KnobType_t, std::int64_t>& map) {
  std::vector<Knob> knobs;
  for (const auto& [type, value] : map) knobs.push_back({static_cast<std::int64_t>(type), value});
  std::sort(knobs.begin(), knobs.end(), [](const Knob& a, const Knob& b) { return a.type < b.type; });
  return knobs;
}
inline std::unordered_map<fe::KnobType_t, std::int64_t> knob_map(const std::vector<Knob>& knobs) {
  std::unordered_map<fe::KnobType_t, std::int64_t> map;
  for (const auto& k : knobs) map[static_cast<fe::KnobType_t>(k.type)] = k.value;
  return map;
}

// cudnn-frontend keeps a graph's lowered operation graph and its list of engine configs
// protected; create_plan() needs both. Naming the members through a derived class is how C++
// reaches a protected member of a base object.
struct GraphInternals : fe::graph::Graph {
  static std::shared_ptr<fe::OperationGraph_v8> op_graph_of(const fe::graph::Graph& g) {
    return g.*(&GraphInternals::operation_graph);
  }
  static fe::graph::Execution_plan_list& plans_of(fe::graph::Graph& g) { return g.*(&GraphInternals::plans); }
};

// The engine id and knobs of plan i of g as the cache stores them (Knob, raw_knob_type_base);
// false when they cannot be read. The frontend maps knob types it has no name for to NOT_SET;
// those configs are read from the plan's name, "eng<id>_k<backend type>=<value>..." (sorted by
// type: cudnn-frontend's get_engine_tag), which keeps the backend's types.
inline bool engine_config_of(fe::graph::Graph& g, std::int64_t i, std::int64_t& engine_id, std::vector<Knob>& knobs) {
  std::unordered_map<fe::KnobType_t, std::int64_t> named;
  if (g.get_engine_and_knobs_at_index(i, engine_id, named).is_bad()) return false;
  if (!named.contains(fe::KnobType_t::NOT_SET)) {
    knobs = sorted_knobs(named);
    return true;
  }
  std::string name;
  if (g.get_plan_name_at_index(i, name).is_bad()) return false;
  const char* at = name.data();
  const char* const end = name.data() + name.size();
  const auto number = [&](std::int64_t& v) {
    const auto [p, ec] = std::from_chars(at, end, v);
    at = p;
    return ec == std::errc();
  };
  std::int64_t id = -1;
  if (!name.starts_with("eng") || (at += 3, !number(id)) || id != engine_id) return false;
  knobs.clear();
  while (at != end) {
    std::int64_t type = 0, value = 0;
    if (end - at < 2 || at[0] != '_' || at[1] != 'k' || (at += 2, !number(type)) || at == end || *at++ != '=' ||
        !number(value) || type < 0 || type >= raw_knob_type_base)
      return false;
    const auto named_type = fe::convert_from_backend_knob_type(static_cast<cudnnBackendKnobType_t>(type));
    knobs.push_back({named_type == fe::KnobType_t::NOT_SET ? raw_knob_type_base + type : static_cast<std::int64_t>(named_type),
                     value});
  }
  std::sort(knobs.begin(), knobs.end(), [](const Knob& a, const Knob& b) { return a.type < b.type; });
  return true;
}

// Adds the engine config (engine id and knobs as the cache stores them) to g's candidates, as
// Graph::create_execution_plan does, and also where a knob type has only the backend's number.
// False when cuDNN refuses the config.
inline bool create_plan(fe::graph::Graph& g, std::int64_t engine_id, const std::vector<Knob>& knobs,
                        std::string_view op, const std::string& graph_key) {
  if (std::none_of(knobs.begin(), knobs.end(), [](const Knob& k) { return k.type >= raw_knob_type_base; }))
    return g.create_execution_plan(engine_id, knob_map(knobs)).is_good();
  const auto og = GraphInternals::op_graph_of(g);
  if (!og) return false;
  fe::detail::backend_descriptor engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  if (engine.get_status() != CUDNN_STATUS_SUCCESS || fe::detail::create_engine(engine, engine_id, og->get_raw_desc()).is_bad())
    return false;
  std::vector<fe::detail::backend_descriptor> choices;
  for (const Knob& k : knobs) {
    cudnnBackendKnobType_t type;
    if (k.type >= raw_knob_type_base) type = static_cast<cudnnBackendKnobType_t>(k.type - raw_knob_type_base);
    else if (fe::convert_to_backend_knob_type(static_cast<fe::KnobType_t>(k.type), type) != CUDNN_STATUS_SUCCESS)
      return false;
    std::int64_t value = k.value;
    auto& choice = choices.emplace_back(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR);
    if (choice.get_status() != CUDNN_STATUS_SUCCESS ||
        fe::detail::set_attribute(choice.get_ptr(), CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &type) !=
            CUDNN_STATUS_SUCCESS ||
        fe::detail::set_attribute(choice.get_ptr(), CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1, &value) !=
            CUDNN_STATUS_SUCCESS ||
        fe::detail::finalize(choice.get_ptr()) != CUDNN_STATUS_SUCCESS)
      return false;
  }
  auto config = fe::make_shared_backend_pointer(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
  if (fe::detail::create_engine_config(config, engine, choices).is_bad()) return false;
  auto& plans = GraphInternals::plans_of(g);
  plans.enqueue_engine_configs({config});
  // A config whose notes cannot be read would leave the list half described, which the filters
  // read: an error, as for a failed heuristics query.
  fe_check(plans.query_properties(), op, graph_key + ": reading a stored engine config's notes failed");
  return true;
}

using cutrain::cuda::detail::micros_since;

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

// Appends heuristics mode `mode`'s engine configs to g's candidates; returns where they end. A
// mode with no engine for the graph leaves its status in `last`.
inline std::int64_t add_heuristics(fe::graph::Graph& g, fe::HeurMode_t mode, std::string_view op,
                                   const std::string& graph_key, fe::error_t& last) {
  const std::int64_t before = g.get_execution_plan_count();
  if (auto st = g.create_execution_plans({mode}); st.is_bad()) {
    // A failure after configs were added left them half described (their notes unread), which
    // the filters would read: an error, as for one query of all three modes.
    if (g.get_execution_plan_count() != before)
      fe_check(st, op, graph_key + ": create_execution_plans failed while reading the candidates");
    last = st;
  }
  return g.get_execution_plan_count();
}

// cuDNN's notes on plan i of g, by their frontend names, space-separated (Result::notes).
inline std::string notes_of(fe::graph::Graph& g, std::int64_t i) {
  const auto& plans = GraphInternals::plans_of(g);
  const auto k = static_cast<std::size_t>(i);
  std::string out;
  const auto add = [&](const auto& note) {
    const std::string name = nlohmann::json(note).template get<std::string>();
    if (name != "NOT_SET") out += cat(out.empty() ? "" : " ", name);
  };
  if (k < plans.numeric_notes.size())
    for (const auto n : plans.numeric_notes[k]) add(n);
  if (k < plans.behavior_notes.size())
    for (const auto n : plans.behavior_notes[k]) add(n);
  return out;
}

// What every candidate must satisfy: no tensor cores in strict f32, determinism when asked for.
inline void base_filters(fe::graph::Graph& g, bool strict_f32, bool deterministic_only) {
  if (strict_f32) g.deselect_numeric_notes({fe::NumericalNote_t::TENSOR_CORE});
  if (deterministic_only) g.deselect_numeric_notes({fe::NumericalNote_t::NONDETERMINISTIC});
}

// Timing favours the fastest plan, so engines that trade accuracy for speed are left out where
// others exist (plan()): reductions in less than f32, and (strict f32) inputs converted down.
inline void speed_filters(fe::graph::Graph& g, bool strict_f32) {
  g.deselect_numeric_notes({fe::NumericalNote_t::REDUCED_PRECISION_REDUCTION});
  if (strict_f32) g.deselect_numeric_notes({fe::NumericalNote_t::DOWN_CONVERT_INPUTS});
}

// What cached_graph() asked for (through PlanScope) and what build() found (through plan()).
struct Request {
  int device = 0;
  std::string graph_key;
  Mode mode = Mode::heuristic;
  Options options;
  bool planned = false;             // plan() ran for this graph
  std::string op;                   // build()'s op name: the cache key's op
  Key key;                          // where the choice is stored
  std::optional<Choice> hit;        // the cache entry replayed
  std::int64_t plan_index = -1;     // the replayed engine's plan, when hit
  std::int64_t first = 0;           // the heuristics' candidates are [first, plan count):
  std::int64_t end_a = 0, end_f = 0;  // mode A's [first, end_a), the fallback list's [end_a, end_f),
  std::int64_t end_b = -1;          // mode B's [end_f, end_b) once asked (-1: not asked; see tune())
  bool speed_filtered = false;      // speed_filters() is on (plan(); off when nothing else was left)
  bool strict_f32 = false;          // TF32 off: no tensor-core engines (plan())
  std::int64_t baseline = -1;       // the heuristics' first choice that builds
};
inline Request*& current_request() {
  thread_local Request* r = nullptr;
  return r;
}

// Called by cudnn::build() once the graph is validated and lowered. Returns false when no tuning
// mode asked for this graph (build() then plans with the heuristics, as always). Otherwise plans
// it: replays the cached engine (cached mode, hit), or queries the candidates of heuristics mode
// A and the fallback list (mode B only when those have none, or none builds; tune() may ask it
// later) and builds the first that builds, the baseline that finish() times the others against.
// Strict f32 excludes tensor-core engines, as build() does; plans needing more workspace than the
// options allow are excluded too.
inline bool plan(fe::graph::Graph& g, std::string_view op, const std::string& graph_key, bool strict_f32) {
  Request* r = current_request();
  if (!r || r->planned || r->graph_key != graph_key) return false;
  if (!tunes_graph(graph_key, r->options)) return false;  // see Options::tune_all_graphs
  r->planned = true;
  r->op = std::string(op);
  const Options& o = r->options;
  const Environment env = environment(r->device);
  r->key = Key::make(r->op, graph_key + (o.deterministic_only ? " deterministic" : ""), "cudnn", env);

  g.deselect_workspace_greater_than(o.max_workspace_bytes);
  const auto filter = [&] { base_filters(g, strict_f32, o.deterministic_only); };

  std::optional<Choice> heuristic_hit;  // a cache entry that says "cuDNN's heuristic choice"
  if (r->mode == Mode::cached) {
    const auto c = cache();
    use_environment(*c, env);
    if (auto hit = c->find(r->key); hit && hit->engine_id == heuristic_engine) {
      heuristic_hit = std::move(hit);
    } else if (hit && hit->workspace_bytes <= o.max_workspace_bytes) {
      const std::int64_t index = g.get_execution_plan_count();
      if (create_plan(g, hit->engine_id, hit->knobs, op, graph_key)) {
        filter();
        if (g.check_support().is_good() && g.build_plan_at_index(index).is_good()) {
          r->hit = std::move(hit);
          r->plan_index = index;
          return true;
        }
      }
      // The stored engine no longer builds here (another cuDNN, say): tune again, replace the entry.
    }
  }

  // Timing favours the fastest plan, so engines that trade accuracy for speed are left out where
  // others exist: reductions in less than f32, and (strict f32) inputs converted down. If nothing
  // is left, the candidates are queried again with the usual filters only.
  // One query per mode, so that tune() knows which list a candidate came from: mode A and the
  // fallback list here, mode B (about 17-28 ms per graph on the H200, A's 1-2 ms) only when tune()
  // finds it worth asking, or here when the other two have nothing (or nothing that builds) and
  // mode_b_first allows it. A mode with no engine for the graph is not an error; all of them
  // without one is.
  r->strict_f32 = strict_f32;
  const auto query = [&] {
    r->first = g.get_execution_plan_count();
    fe::error_t last;
    r->end_a = add_heuristics(g, fe::HeurMode_t::A, op, graph_key, last);
    r->end_f = add_heuristics(g, fe::HeurMode_t::FALLBACK, op, graph_key, last);
    r->end_b = -1;
    if (g.get_execution_plan_count() == r->first && o.mode_b_first > 0) {
      r->end_b = add_heuristics(g, fe::HeurMode_t::B, op, graph_key, last);
      stats().mode_b_queries.fetch_add(1);
    }
    if (g.get_execution_plan_count() == r->first)
      fe_check(last, op, graph_key + ": no cuDNN engine supports this combination (create_execution_plans)");
    filter();
  };
  // The first candidate that builds: what build_plans(HEURISTICS_CHOICE) would take, at an index
  // we know. It is the baseline.
  std::string failures;
  const auto build_baseline = [&] {
    const std::int64_t count = g.get_execution_plan_count();
    for (std::int64_t i = r->first; i < count && r->baseline < 0; ++i) {
      if (auto st = g.build_plan_at_index(i); st.is_good()) r->baseline = i;
      else failures += cat("\nplan ", i, ": ", st.get_message());
    }
    return r->baseline >= 0;
  };
  const auto t_query = std::chrono::steady_clock::now();
  query();
  speed_filters(g, strict_f32);
  r->speed_filtered = true;
  if (!build_baseline()) {
    r->speed_filtered = false;
    query();
    // Nothing of A's or the fallback list's builds: mode B's configs are candidates too.
    if (!build_baseline() && r->end_b < 0 && o.mode_b_first > 0) {
      fe::error_t none;
      r->end_b = add_heuristics(g, fe::HeurMode_t::B, op, graph_key, none);
      stats().mode_b_queries.fetch_add(1);
      filter();
    }
    if (r->baseline < 0 && !build_baseline()) {
      fe_check(g.check_support(), op, graph_key + ": no cuDNN engine supports this combination");
      throw CudnnError(op, cat(graph_key, ": build_plans: no plan built", failures));
    }
  }
  stats().query_micros.fetch_add(micros_since(t_query));
  if (heuristic_hit) {  // the baseline is the stored choice: nothing to time
    r->hit = std::move(heuristic_hit);
    r->plan_index = r->baseline;
  }
  return true;
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// How every candidate (cuDNN plan or cuBLASLt algorithm) is timed, after a warm-up run: one run
// alone sets how many go in a round (about round_ms of work, at most max_reps); rounds repeat, at
// least min_rounds, at most max_rounds, until the median of the rounds so far moves by less than
// `stable` over the last three. Past the deadline it stops after min_rounds, unless told to
// finish. run() returns false when a run fails; the result is the median ms per run, or nothing.
// A screen stops after two rounds and gives the faster: an estimate that decides whether a
// candidate is worth timing fully.
struct Rounds {
  static constexpr double round_ms = 1.0;
  static constexpr int max_reps = 10;
  static constexpr int min_rounds = 5;
  static constexpr int max_rounds = 30;
  static constexpr double stable = 0.02;
  // Executions per round for a plan that takes ms per execution.
  static int reps(double ms) {
    return std::clamp(static_cast<int>(std::ceil(round_ms / std::max(ms, 1e-4))), 1, max_reps);
  }
  // Whether the medians so far (one per round from min_rounds on) moved by less than `stable`
  // over the last three.
  static bool settled(const std::vector<double>& medians) {
    if (medians.size() < 3) return false;
    const auto [lo, hi] = std::minmax_element(medians.end() - 3, medians.end());
    return *hi - *lo < stable * *lo;
  }
};
template <class Run>
std::optional<double> time_rounds(Run&& run, cudaStream_t stream, Event& start, Event& stop,
                                  std::chrono::steady_clock::time_point deadline, bool finish, bool screen = false) {
  start.record(stream);
  if (!run()) return std::nullopt;
  stop.record(stream);
  stop.synchronize();
  const int reps = Rounds::reps(stop.elapsed_ms(start));
  std::vector<double> rounds, medians;
  while (static_cast<int>(rounds.size()) < Rounds::max_rounds) {
    start.record(stream);
    for (int k = 0; k < reps; ++k)
      if (!run()) return std::nullopt;
    stop.record(stream);
    stop.synchronize();
    rounds.push_back(stop.elapsed_ms(start) / reps);
    if (screen && rounds.size() == 2) return std::min(rounds[0], rounds[1]);
    if (static_cast<int>(rounds.size()) < Rounds::min_rounds) continue;
    medians.push_back(median(rounds));
    if (Rounds::settled(medians)) break;
    if (!finish && std::chrono::steady_clock::now() > deadline) break;
  }
  return median(rounds);
}

// The bytes a tensor of a graph spans in memory (its strides' reach), in its data type.
inline std::size_t element_bytes(fe::DataType_t t) {
  using D = fe::DataType_t;
  switch (t) {
    case D::HALF: case D::BFLOAT16: return 2;
    case D::FLOAT: case D::INT32: case D::INT8x4: case D::UINT8x4: return 4;
    case D::INT8: case D::UINT8: case D::BOOLEAN: case D::BYTE_BOOLEAN: case D::FP8_E4M3: case D::FP8_E5M2:
    case D::FP8_E8M0: case D::FP8_E5M3: case D::FP4_E2M1: case D::INT4: return 1;
    case D::INT8x32: return 32;
    case D::COMPLEX_FP64: return 16;
    default: return 8;  // DOUBLE, INT64, COMPLEX_FP32, and anything unknown: the widest guess
  }
}
inline std::size_t tensor_bytes(const fe::graph::Tensor_attributes& t) {
  const auto dim = t.get_dim();
  const auto stride = t.get_stride();
  std::int64_t span = 0;
  if (stride.size() != dim.size()) {
    span = t.get_volume();
  } else {
    for (std::size_t i = 0; i < dim.size(); ++i) {
      if (dim[i] <= 0) return 0;
      span += (dim[i] - 1) * stride[i];
    }
    span += 1;
  }
  return static_cast<std::size_t>(span) * element_bytes(t.get_data_type());
}

struct Timed {
  std::int64_t index = -1;
  std::int64_t engine_id = 0;
  std::vector<Knob> knobs;
  std::int64_t workspace = 0;
  double median_ms = 0;
  bool replayable = false;  // its engine id and knobs were read (engine_config_of): create_plan rebuilds it
  bool screened = false;    // median_ms is only the screen's estimate: not timed fully
  std::int64_t build_us = 0;  // building its plan (Result::build_ms)
};

// Scratch copies of a graph's tensors on its device, and the events that time its plans.
class Bench {
 public:

  Bench(fe::graph::Graph& g, const std::vector<TensorAttr>& tensors, int device)
      : g_(g), device_(device), stream_(current_stream()), handle_(handles(device).cudnn) {
    for (const auto& t : tensors) {
      if (t->get_is_pass_by_value()) {  // a host scalar: a zeroed host value
        host_.push_back(std::make_unique<std::int64_t[]>(4));
        uids_[t->get_uid()] = host_.back().get();
        continue;
      }
      const std::size_t bytes = tensor_bytes(*t);
      buffers_.emplace_back(std::max<std::size_t>(bytes, 16), Device::cuda(device));
      // A finite pattern (0x3c3c: about 1.06 in f16, 0.0115 in bf16 and f32), zero for integers.
      check(cudaMemsetAsync(buffers_.back().data(), is_float(t->get_data_type()) ? 0x3c : 0, bytes, stream_),
            "autotune", "cudaMemsetAsync of a scratch tensor");
      uids_[t->get_uid()] = buffers_.back().data();
    }
  }

  // The plan's median time in ms per execution, or nullopt (with why) when it does not run.
  // Past the deadline it stops after min_rounds, unless told to finish.
  // A screen (see time_rounds) runs it only for an estimate.
  std::optional<double> time(std::int64_t index, std::int64_t workspace_bytes,
                             std::chrono::steady_clock::time_point deadline, bool finish, std::string& why,
                             bool screen = false) {
    void* ws = workspace(workspace_bytes);
    const auto run = [&] { return ok(g_.execute_plan_at_index(handle_, uids_, ws, index), why); };
    if (!run() || !synced(why)) return std::nullopt;
    return time_rounds(run, stream_, start_, stop_, deadline, finish, screen);
  }

  // A screen queued without waiting (see tune()): the warm-up run, then two rounds of `reps` runs
  // between three events. Its estimate (the faster round) is read once the stream has finished:
  // estimate() after synchronize().
  struct Queued {
    Event e0, e1, e2;
    int reps = 1;
    double estimate() const { return std::min(e1.elapsed_ms(e0), e2.elapsed_ms(e1)) / reps; }
  };
  // False (with why) when a run fails to launch; runs queued before it still execute.
  bool queue_screen(std::int64_t index, std::int64_t workspace_bytes, int reps, Queued& q, std::string& why) {
    // A larger workspace replaces the old one, which goes back to the device cache for this
    // stream: the queued runs still using it finish before the stream can hand it out again.
    void* ws = workspace(workspace_bytes);
    const auto run = [&] { return ok(g_.execute_plan_at_index(handle_, uids_, ws, index), why); };
    if (!run()) return false;  // the warm-up: its first launch loads the plan's kernels
    q.reps = reps;
    q.e0.record(stream_);
    for (int k = 0; k < reps; ++k)
      if (!run()) return false;
    q.e1.record(stream_);
    for (int k = 0; k < reps; ++k)
      if (!run()) return false;
    q.e2.record(stream_);
    return true;
  }
  // Waits for everything queued on the stream; false (with why) when a run failed on the GPU.
  bool synced(std::string& why) {
    if (const cudaError_t e = cudaStreamSynchronize(stream_); e != cudaSuccess) {
      (void)cudaGetLastError();
      why = cat("the warm-up run failed: ", cudaGetErrorString(e));
      return false;
    }
    return true;
  }

  // The finals: plans timed in turns, one round each per turn, so that a slow spell of the GPU
  // (clocks still settling, say) falls on all of them alike, not on whichever was timed during it.
  // Each plan's screen estimate (its median_ms) sets its executions per round; the rounds repeat
  // until every plan's median is settled (at least min_rounds, at most max_rounds; past the
  // deadline, after min_rounds). A plan that ran gets its median and is no longer `screened`; one
  // that fails leaves the turns and keeps its estimate.
  void time_in_turns(const std::vector<Timed*>& finals, std::chrono::steady_clock::time_point deadline) {
    const std::size_t n = finals.size();
    std::int64_t ws_bytes = 0;
    std::vector<int> reps(n);
    for (std::size_t i = 0; i < n; ++i) {
      ws_bytes = std::max(ws_bytes, finals[i]->workspace);
      reps[i] = Rounds::reps(finals[i]->median_ms);
    }
    void* ws = workspace(ws_bytes);
    std::vector<bool> alive(n, true);
    std::vector<std::vector<double>> rounds(n), medians(n);
    std::string why;
    for (int round = 0; round < Rounds::max_rounds; ++round) {
      bool all_settled = true;
      for (std::size_t i = 0; i < n; ++i) {
        if (!alive[i]) continue;
        start_.record(stream_);
        for (int k = 0; k < reps[i] && alive[i]; ++k)
          alive[i] = ok(g_.execute_plan_at_index(handle_, uids_, ws, finals[i]->index), why);
        if (!alive[i]) continue;
        stop_.record(stream_);
        stop_.synchronize();
        rounds[i].push_back(stop_.elapsed_ms(start_) / reps[i]);
        if (round + 1 < Rounds::min_rounds) continue;
        medians[i].push_back(median(rounds[i]));
        all_settled = all_settled && Rounds::settled(medians[i]);
      }
      if (round + 1 >= Rounds::min_rounds && (all_settled || std::chrono::steady_clock::now() > deadline)) break;
    }
    for (std::size_t i = 0; i < n; ++i) {
      if (!alive[i] || rounds[i].empty()) continue;
      finals[i]->median_ms = median(rounds[i]);
      finals[i]->screened = false;
    }
  }

  // Runs a plan for about ms of GPU time, so that the clocks are up before the baseline is timed.
  void spin_up(std::int64_t index, std::int64_t workspace_bytes, double ms) {
    void* ws = workspace(workspace_bytes);
    std::string why;
    double spent = 0;
    for (int batch = 0; batch < 20 && spent < ms; ++batch) {
      start_.record(stream_);
      for (int k = 0; k < Rounds::max_reps; ++k)
        if (!ok(g_.execute_plan_at_index(handle_, uids_, ws, index), why)) return;
      stop_.record(stream_);
      stop_.synchronize();
      spent += stop_.elapsed_ms(start_);
    }
  }

 private:
  static bool is_float(fe::DataType_t t) {
    using D = fe::DataType_t;
    return t == D::FLOAT || t == D::HALF || t == D::BFLOAT16 || t == D::DOUBLE || t == D::FP8_E4M3 ||
           t == D::FP8_E5M2;
  }
  static bool ok(fe::error_t st, std::string& why) {
    if (st.is_good()) return true;
    why = st.get_message();
    return false;
  }
  void* workspace(std::int64_t bytes) {
    if (bytes <= 0) return nullptr;
    if (static_cast<std::int64_t>(ws_.bytes()) < bytes) ws_ = Storage(static_cast<std::size_t>(bytes), Device::cuda(device_));
    return ws_.data();
  }

  fe::graph::Graph& g_;
  int device_;
  cudaStream_t stream_;
  cudnnHandle_t handle_;
  std::vector<Storage> buffers_;
  std::vector<std::unique_ptr<std::int64_t[]>> host_;
  std::unordered_map<std::int64_t, void*> uids_;
  Storage ws_;
  Event start_, stop_;
};

// The baseline is timed after Bench::spin_up (about 3 ms of its runs) so that the GPU's clocks
// are up, unless this thread finished tuning a graph on the same device less than
// clocks_stay_up_ms ago: the GPU ran that graph's candidates then, and a model's first step tunes
// its graphs one after the other.
inline constexpr int clocks_stay_up_ms = 100;
struct LastTuned {
  int device = -1;
  std::chrono::steady_clock::time_point when{};
};
inline LastTuned& last_tuned() {
  thread_local LastTuned t;
  return t;
}

// Times the candidates of r (see plan()), picks the fastest, records it in the cache. Returns
// the chosen plan index and its workspace, or nothing when no candidate could be timed (the
// caller keeps the heuristics' choice).
inline std::optional<std::pair<std::int64_t, std::int64_t>> tune(fe::graph::Graph& g, const std::vector<TensorAttr>& tensors,
                                                                 Request& r) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  const auto deadline = t0 + std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double, std::milli>(r.options.max_tuning_ms));
  cutrain::detail::DeviceGuard on(r.device);

  // Distinct engine configs, in this order: the baseline (the first that builds, normally A's
  // first), the rest of mode A's list, the fallback list; mode B's configs are added when it is
  // asked (below), or follow when plan() had to ask it. A config's name is its
  // engine id and every knob: equal names, same plan.
  // Read from cuDNN once per config: the order, the origins and mode B's merge all ask.
  std::vector<std::optional<std::string>> names;
  const auto name_of = [&](std::int64_t i) {
    const auto k = static_cast<std::size_t>(i);
    if (k >= names.size()) names.resize(k + 1);
    if (!names[k]) {
      std::string name;
      names[k] = g.get_plan_name_at_index(i, name).is_good() ? name : cat("#", i);
    }
    return *names[k];
  };
  std::vector<std::int64_t> order{r.baseline};
  std::unordered_set<std::string> seen{name_of(r.baseline)};
  const auto distinct = [&](std::int64_t from, std::int64_t to) {
    std::vector<std::int64_t> out;
    for (std::int64_t i = from; i < to; ++i)
      if (i != r.baseline && seen.insert(name_of(i)).second) out.push_back(i);
    return out;
  };
  {
    const auto listed = distinct(r.first, g.get_execution_plan_count());
    order.insert(order.end(), listed.begin(), listed.end());
  }
  // Each config's places in cuDNN's lists, by name (Result::origins).
  std::unordered_map<std::string, std::string> origin;
  const auto note_places = [&](std::int64_t from, std::int64_t to, char list) {
    for (std::int64_t i = from; i < to; ++i) {
      auto& o = origin[name_of(i)];
      if (o.find(list) == std::string::npos) o += cat(o.empty() ? "" : " ", list, i - from + 1);
    }
  };
  note_places(r.first, r.end_a, 'A');
  note_places(r.end_a, r.end_f, 'F');
  if (r.end_b >= 0) note_places(r.end_f, r.end_b, 'B');

  Bench bench(g, tensors, r.device);
  std::vector<Timed> timed;
  int tried = 0, failed = 0;
  std::string first_failure;
  const auto fail = [&](const std::string& why) {  // a candidate that did not build or run
    ++failed;
    if (first_failure.empty()) first_failure = why;
  };
  // With the screen on, the baseline is screened and waited for; the candidates after it are
  // queued (Bench::queue_screen) with executions per round set by the baseline's, and the stream is
  // synchronized only when their estimates are needed (collect(): before deciding on mode B, and
  // after the last): while the GPU runs one candidate's rounds, the host builds the next and loads
  // its kernels, instead of each waiting for the other.
  struct Pending {
    Timed t;
    Bench::Queued q;
  };
  std::deque<Pending> pending;  // Events do not move: a deque keeps them in place
  int screen_reps = 0;          // set from the baseline's screen
  std::int64_t build_us = 0;    // the candidates' plan builds (Stats::build_micros)
  std::int64_t b_us = 0;        // asking mode B (counted in Stats::query_micros)
  std::size_t next = 0;         // order[next] is the next candidate to try
  // Tries the candidates in order until `limit` were tried (deselected configs do not count).
  const auto try_until = [&](int limit) {
    for (; next < order.size(); ++next) {
      const std::int64_t i = order[next];
      const bool is_baseline = i == r.baseline;
      if (!is_baseline && (tried >= limit || Clock::now() > deadline)) break;
      std::string why;
      std::int64_t this_build_us = 0;
      if (!is_baseline) {
        const auto t_build = Clock::now();
        auto st = g.build_plan_at_index(i);
        this_build_us = micros_since(t_build);
        build_us += this_build_us;
        if (st.is_bad()) {
          // Configs the strict-f32 or determinism filter deselected are not candidates at all.
          if (st.get_message().find("Deselecting execution plan") != std::string::npos) continue;
          ++tried;
          fail(st.get_message());
          continue;
        }
      }
      ++tried;
      Timed t;
      t.index = i;
      t.build_us = this_build_us;
      t.replayable = engine_config_of(g, i, t.engine_id, t.knobs);
      if (g.get_workspace_size_plan_at_index(i, t.workspace).is_bad() || t.workspace > r.options.max_workspace_bytes) {
        ++failed;
        continue;
      }
      if (is_baseline) {
        const bool clocks_up = last_tuned().device == r.device &&
                               Clock::now() - last_tuned().when < std::chrono::milliseconds(clocks_stay_up_ms);
        if (clocks_up) stats().spin_ups_skipped.fetch_add(1);
        else bench.spin_up(i, t.workspace, 3.0);
      }
      t.screened = r.options.screen_ratio > 0;
      if (t.screened && !is_baseline && screen_reps > 0) {
        Pending& p = pending.emplace_back();
        p.t = std::move(t);
        if (!bench.queue_screen(i, p.t.workspace, screen_reps, p.q, why)) {
          pending.pop_back();
          fail(why);
        }
        continue;
      }
      const auto ms = bench.time(i, t.workspace, deadline, is_baseline, why, t.screened);
      if (!ms) {
        fail(why);
        continue;
      }
      stats().candidates_timed.fetch_add(1);
      t.median_ms = *ms;
      // Rounds of about half a round_ms at the baseline's speed: a candidate's own speed is not known
      // when its screen is queued, and one far slower than the baseline should not cost much more.
      if (is_baseline && t.screened) screen_reps = std::max(1, Rounds::reps(*ms) / 2);
      timed.push_back(std::move(t));
    }
  };
  // Waits for the queued screens and reads their estimates.
  const auto collect = [&] {
    if (pending.empty()) return;
    std::string why;
    const bool ran = bench.synced(why);  // an error on the GPU: none of the queued estimates can be trusted
    for (Pending& p : pending) {
      if (!ran) {
        fail(why);
        continue;
      }
      p.t.median_ms = p.q.estimate();
      stats().candidates_timed.fetch_add(1);
      timed.push_back(std::move(p.t));
    }
    pending.clear();
  };

  // Mode B's guesses. The two heuristics often disagree, B's first choice far faster than A's on
  // some shapes and far slower on others, and A's good configs can sit as deep as its 14th
  // (docs/autotune.md, "Candidates"). But B's query costs 17-28 ms per graph, and on most graphs
  // A's first choice is its best or close to it. So A's list (and the fallback list) goes first,
  // with room left for B's first mode_b_first; once their screens are in, B is asked only when
  // one of them came out faster than mode_b_below times the baseline (A ranked this graph
  // poorly), and its untried guesses go next. With max_candidates - mode_b_first = 1 only the
  // baseline is timed before the decision, so B is asked only with mode_b_below above 1.
  const int b_room = r.end_b < 0 && r.options.mode_b_below > 0
                         ? std::clamp(r.options.mode_b_first, 0, std::max(0, r.options.max_candidates - 1))
                         : 0;
  // Moves `up` (untried, in order) to order[next]: they are tried next.
  const auto move_up = [&](const std::vector<std::int64_t>& up) {
    std::unordered_set<std::string> up_names;
    for (const std::int64_t i : up) up_names.insert(name_of(i));
    order.erase(std::remove_if(order.begin() + static_cast<std::ptrdiff_t>(next), order.end(),
                               [&](std::int64_t i) { return up_names.contains(name_of(i)); }),
                order.end());
    order.insert(order.begin() + static_cast<std::ptrdiff_t>(next), up.begin(), up.end());
  };
  // The fallback list's runtime-compiled configs mode A does not list (Options::fallback_compiled)
  // are tried after A's first ones, in the fallback list's order.
  const int compiled_room = std::clamp(r.options.fallback_compiled, 0, std::max(0, r.options.max_candidates - 1 - b_room));
  try_until(r.options.max_candidates - b_room - compiled_room);
  if (compiled_room > 0) {
    const auto& notes = GraphInternals::plans_of(g).behavior_notes;
    std::vector<std::int64_t> up;
    for (std::size_t k = next; k < order.size() && static_cast<int>(up.size()) < compiled_room; ++k) {
      const auto i = static_cast<std::size_t>(order[k]);
      if (order[k] >= r.end_a && order[k] < r.end_f && i < notes.size() &&
          std::find(notes[i].begin(), notes[i].end(), fe::BehaviorNote_t::RUNTIME_COMPILATION) != notes[i].end())
        up.push_back(order[k]);
    }
    move_up(up);
  }
  try_until(r.options.max_candidates - b_room);
  collect();
  if (b_room > 0 && Clock::now() <= deadline) {
    double base_ms = -1, fastest = std::numeric_limits<double>::infinity();
    for (const auto& t : timed) {
      fastest = std::min(fastest, t.median_ms);
      if (t.index == r.baseline) base_ms = t.median_ms;
    }
    if (base_ms > 0 && fastest < r.options.mode_b_below * base_ms) {
      const auto t_b = Clock::now();
      fe::error_t none;
      const std::int64_t from = g.get_execution_plan_count();
      r.end_b = add_heuristics(g, fe::HeurMode_t::B, r.op, r.graph_key, none);
      base_filters(g, r.strict_f32, r.options.deterministic_only);
      if (r.speed_filtered) speed_filters(g, r.strict_f32);
      note_places(from, r.end_b, 'B');
      // B's first b_room configs not tried yet go next; those A or the fallback list also hold
      // move up from their places there. B's configs no other list holds go last.
      std::unordered_set<std::string> taken;  // tried, or already moved up
      for (std::size_t k = 0; k < next; ++k) taken.insert(name_of(order[k]));
      std::vector<std::int64_t> up;
      for (std::int64_t i = from; i < r.end_b && static_cast<int>(up.size()) < b_room; ++i) {
        if (!taken.insert(name_of(i)).second) continue;
        seen.insert(name_of(i));
        up.push_back(i);
      }
      move_up(up);
      const auto rest = distinct(from, r.end_b);
      order.insert(order.end(), rest.begin(), rest.end());
      stats().mode_b_queries.fetch_add(1);
      b_us = micros_since(t_b);
      stats().query_micros.fetch_add(b_us);
    }
  }
  try_until(r.options.max_candidates);
  collect();
  // The candidates whose screen came within screen_ratio of the fastest screen are timed fully,
  // in turns, with the baseline; the others drop out. Most candidates are far slower than the
  // best, and two short rounds show it: full timing goes to the few that could win. The baseline
  // is always among them, so that Choice::heuristic_ms is a full median taken in the same turns
  // as the winner's (a screen's estimate, the faster of two rounds, is no match for a median). In
  // turns, because a slow spell early in an op's tuning (in one run of the whole benchmark suite,
  // the first few candidates of some ops timed up to 1.4x slower than in a second run) would
  // otherwise cost a candidate timed during it its place.
  if (r.options.screen_ratio > 0 && !timed.empty()) {
    double fastest = timed.front().median_ms;
    for (const auto& t : timed) fastest = std::min(fastest, t.median_ms);
    std::vector<Timed*> finals;
    for (auto& t : timed)
      if (t.index == r.baseline || t.median_ms <= fastest * r.options.screen_ratio) finals.push_back(&t);
    bench.time_in_turns(finals, deadline);
  }

  std::vector<const Timed*> ranked;
  for (const auto& t : timed)
    if (t.replayable && !t.screened) ranked.push_back(&t);
  std::stable_sort(ranked.begin(), ranked.end(), [](const Timed* a, const Timed* b) { return a->median_ms < b->median_ms; });
  // The heuristics' choice may carry knobs this frontend cannot name, so that no engine id and
  // knobs rebuild it; when it is the fastest it is still the plan to run, and the cache records it
  // as engine heuristic_engine ("cuDNN's heuristic choice", which the key's versions pin down).
  const Timed* base = nullptr;
  for (const auto& t : timed)
    if (t.index == r.baseline) base = &t;
  const bool take_base = base && !base->replayable && (ranked.empty() || base->median_ms < ranked.front()->median_ms);
  const auto account = [&] {  // Stats: where this graph's tuning went
    stats().build_micros.fetch_add(build_us);
    stats().timing_micros.fetch_add(micros_since(t0) - build_us - b_us);
  };
  if (ranked.empty() && !take_base) {
    account();
    warn(cat(r.op, ": no candidate plan could be timed", first_failure.empty() ? "" : " (" + first_failure + ")",
             "; keeping cuDNN's heuristic choice"));
    return std::nullopt;
  }
  const Timed& best = take_base ? *base : *ranked.front();
  (void)g.build_plan_at_index(best.index);  // built already: makes it the graph's default plan too

  last_tuned() = LastTuned{r.device, Clock::now()};
  Choice c;
  c.engine_id = take_base ? heuristic_engine : best.engine_id;
  if (!take_base) c.knobs = best.knobs;
  c.median_ms = best.median_ms;
  c.workspace_bytes = best.workspace;
  c.heuristic_ms = base ? base->median_ms : -1;  // its full median (its estimate if the finals could not run it)
  c.candidates_tried = tried;
  c.candidates_failed = failed;
  c.tuning_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  if (const std::size_t second = take_base ? 0 : 1; ranked.size() > second)
    c.runner_up = RunnerUp{ranked[second]->engine_id, ranked[second]->knobs, ranked[second]->median_ms};

  stats().ops_tuned.fetch_add(1);
  account();
  store_choice(r.key, c, cat(r.op, ": the choice"));
  std::vector<RunnerUp> all;
  std::vector<std::string> origins, notes;
  std::vector<double> build_ms;
  for (const auto& t : timed) {
    all.push_back(RunnerUp{t.engine_id, t.knobs, t.median_ms});
    origins.push_back(origin[name_of(t.index)]);
    notes.push_back(notes_of(g, t.index));
    build_ms.push_back(static_cast<double>(t.build_us) / 1e3);
  }
  last() = Result{r.key, std::move(c), false, std::move(all), std::move(origins), std::move(notes), std::move(build_ms)};
  return std::pair{best.index, best.workspace};
}

}  // namespace detail

// Opened by cudnn::cached_graph() around the first build of a graph: in a tuning mode, build()
// plans through plan(), and finish() then times the candidates (or takes the cached engine) and
// sets the plan the graph executes. In heuristic mode it does nothing.
class PlanScope {
 public:
  PlanScope(int device, const std::string& graph_key) : prev_(detail::current_request()) {
    const Mode m = mode();
    if (m == Mode::heuristic) {
      detail::current_request() = nullptr;
      return;
    }
    req_.device = device;
    req_.graph_key = graph_key;
    req_.mode = m;
    req_.options = options();
    detail::current_request() = &req_;
  }
  ~PlanScope() { detail::current_request() = prev_; }
  PlanScope(const PlanScope&) = delete;
  PlanScope& operator=(const PlanScope&) = delete;

  // plan_index and workspace_bytes are the built graph's (BuiltGraph::plan_index, ::workspace).
  // Tuning never fails the op: a tuner that cannot time anything keeps the heuristics' plan.
  void finish(cudnn_frontend::graph::Graph& g, const std::vector<detail::TensorAttr>& tensors,
              std::int64_t& plan_index, std::int64_t& workspace_bytes) {
    if (detail::current_request() != &req_ || !req_.planned) return;
    if (req_.hit) {
      std::int64_t ws = 0;
      if (g.get_workspace_size_plan_at_index(req_.plan_index, ws).is_good()) {
        plan_index = req_.plan_index;
        workspace_bytes = ws;
      }
      stats().cache_hits.fetch_add(1);
      detail::last() = result_ = Result{req_.key, *req_.hit, true};
      return;
    }
    std::optional<std::pair<std::int64_t, std::int64_t>> chosen;
    try {
      chosen = detail::tune(g, tensors, req_);
      if (chosen) result_ = detail::last();  // tune() sets it with its choice
    } catch (const cutrain::Error& e) {  // out of memory for the scratch tensors, say
      detail::warn(cutrain::detail::cat(req_.op, ": tuning failed (", e.what(), "); keeping cuDNN's heuristic choice"));
    }
    if (!chosen) {
      // Pin the baseline: building other candidates moved the graph's default plan.
      std::int64_t ws = 0;
      if (g.get_workspace_size_plan_at_index(req_.baseline, ws).is_good()) chosen = std::pair{req_.baseline, ws};
    }
    if (chosen) std::tie(plan_index, workspace_bytes) = *chosen;
  }

  // The tuned or cached choice finish() set, with its key; nothing when the heuristics planned.
  const std::optional<Result>& result() const { return result_; }

 private:
  detail::Request req_;
  detail::Request* prev_;
  std::optional<Result> result_;
};

}  // namespace cutrain::cuda::autotune
