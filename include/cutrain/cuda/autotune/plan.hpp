// The first step of tuning a cuDNN graph: the Request a Planner carries, and plan(), which
// replays the cache's engine for the signature (cached mode) or queries cuDNN's candidates and
// builds the baseline, the heuristics' first choice that the tuning times the others against.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cudnn_frontend.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "cutrain/cuda/autotune/cache.hpp"
#include "cutrain/cuda/autotune/fe_compat.hpp"
#include "cutrain/cuda/autotune/options.hpp"

namespace cutrain::inline CUTRAIN_ABI::cuda::autotune::detail {

using cutrain::cuda::detail::micros_since;

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

// What the planner asked for and what plan() found.
struct Request {
  int device = 0;
  std::string graph_key;            // the graph's signature text (the text PlanStore::build is given)
  Mode mode = Mode::heuristic;
  Options options;
  bool planned = false;             // plan() ran for this graph
  std::string op;                   // build()'s op name: the cache key's op
  Key key;                          // where the choice is stored
  std::optional<Choice> hit;        // the cache entry replayed
  std::int64_t plan_index = -1;     // the replayed engine's plan, when hit
  std::int64_t first = 0;           // the heuristics' candidates are [first, plan count):
  std::int64_t end_a = 0, end_f = 0;  // mode A's [first, end_a), the fallback list's [end_a, end_f),
  std::int64_t end_b = -1;          // mode B's [end_f, end_b) once asked (-1: not asked; see Tuning)
  bool speed_filtered = false;      // speed_filters() is on (plan(); off when nothing else was left)
  bool strict_f32 = false;          // TF32 off: no tensor-core engines (plan())
  std::int64_t baseline = -1;       // the heuristics' first choice that builds
};

// Replays the cache's entry for r.key in g (cached mode): true when its engine builds here. An
// entry that says "cuDNN's heuristic choice" goes to `heuristic_hit`, for plan() to take the
// baseline.
inline bool replay_cached(fe::graph::Graph& g, Request& r, std::optional<Choice>& heuristic_hit) {
  const auto c = cache();
  use_environment(*c, r.key.environment());
  auto hit = c->find(r.key);
  if (hit && hit->engine_id == heuristic_engine) {
    heuristic_hit = std::move(hit);
    return false;
  }
  if (!hit || hit->workspace_bytes > r.options.max_workspace_bytes) return false;
  const std::int64_t index = g.get_execution_plan_count();
  if (!create_plan(g, hit->engine_id, hit->knobs, r.op, r.graph_key)) return false;
  base_filters(g, r.strict_f32, r.options.deterministic_only);
  if (g.check_support().is_bad() || g.build_plan_at_index(index).is_bad()) return false;
  r.hit = std::move(hit);
  r.plan_index = index;
  return true;
}

// Queries the candidates: one query per mode, so that the tuning knows which list a candidate
// came from. Mode A and the fallback list here; mode B (about 17-28 ms per graph on the H200, A's
// 1-2 ms) only when the other two have nothing and mode_b_first allows it (Tuning may ask it
// later). A mode with no engine for the graph is not an error; all of them without one is.
inline void query_candidates(fe::graph::Graph& g, Request& r) {
  r.first = g.get_execution_plan_count();
  fe::error_t last;
  r.end_a = add_heuristics(g, fe::HeurMode_t::A, r.op, r.graph_key, last);
  r.end_f = add_heuristics(g, fe::HeurMode_t::FALLBACK, r.op, r.graph_key, last);
  r.end_b = -1;
  if (g.get_execution_plan_count() == r.first && r.options.mode_b_first > 0) {
    r.end_b = add_heuristics(g, fe::HeurMode_t::B, r.op, r.graph_key, last);
    stats().mode_b_queries.fetch_add(1);
  }
  if (g.get_execution_plan_count() == r.first)
    fe_check(last, r.op, r.graph_key + ": no cuDNN engine supports this combination (create_execution_plans)");
  base_filters(g, r.strict_f32, r.options.deterministic_only);
}

// Builds the first candidate that builds: what build_plans(HEURISTICS_CHOICE) would take, at an
// index we know. It is the baseline. Failures are appended to `failures`.
inline bool build_baseline(fe::graph::Graph& g, Request& r, std::string& failures) {
  const std::int64_t count = g.get_execution_plan_count();
  for (std::int64_t i = r.first; i < count && r.baseline < 0; ++i) {
    if (auto st = g.build_plan_at_index(i); st.is_good()) r.baseline = i;
    else failures += cat("\nplan ", i, ": ", st.get_message());
  }
  return r.baseline >= 0;
}

// Plans g, validated and lowered, for the tuner: replays the cached engine (cached mode, hit), or
// queries the candidates and builds the baseline that Tuning times the others against. Strict f32
// excludes tensor-core engines, as the heuristics' build does; plans needing more workspace than
// the options allow are excluded too.
inline void plan(fe::graph::Graph& g, Request& r, std::string_view op, bool strict_f32) {
  r.planned = true;
  r.op = std::string(op);
  r.strict_f32 = strict_f32;
  const Options& o = r.options;
  r.key = Key::make(r.op, r.graph_key + (o.deterministic_only ? " deterministic" : ""), "cudnn", environment(r.device));
  g.deselect_workspace_greater_than(o.max_workspace_bytes);

  std::optional<Choice> heuristic_hit;  // a cache entry that says "cuDNN's heuristic choice"
  // A stored engine that no longer builds here (another cuDNN, say) is tuned again and replaced.
  if (r.mode == Mode::cached && replay_cached(g, r, heuristic_hit)) return;

  // Timing favours the fastest plan, so engines that trade accuracy for speed are left out where
  // others exist: reductions in less than f32, and (strict f32) inputs converted down. If nothing
  // is left, the candidates are queried again with the usual filters only.
  std::string failures;
  const auto t_query = std::chrono::steady_clock::now();
  query_candidates(g, r);
  speed_filters(g, strict_f32);
  r.speed_filtered = true;
  if (!build_baseline(g, r, failures)) {
    r.speed_filtered = false;
    query_candidates(g, r);
    // Nothing of A's or the fallback list's builds: mode B's configs are candidates too.
    if (!build_baseline(g, r, failures) && r.end_b < 0 && o.mode_b_first > 0) {
      fe::error_t none;
      r.end_b = add_heuristics(g, fe::HeurMode_t::B, r.op, r.graph_key, none);
      stats().mode_b_queries.fetch_add(1);
      base_filters(g, strict_f32, o.deterministic_only);
    }
    if (r.baseline < 0 && !build_baseline(g, r, failures)) {
      fe_check(g.check_support(), op, r.graph_key + ": no cuDNN engine supports this combination");
      throw CudnnError(op, r.graph_key + ": build_plans: no plan built", failures);
    }
  }
  stats().query_micros.fetch_add(micros_since(t_query));
  if (heuristic_hit) {  // the baseline is the stored choice: nothing to time
    r.hit = std::move(heuristic_hit);
    r.plan_index = r.baseline;
  }
}

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::autotune::detail
