// The autotuner's planner: picks the execution plan of a cuDNN graph when the graph is first
// built. cuDNN's heuristics plan it (Planner::heuristic, or a graph the tuner leaves to them), or
// the tuner does: in cached mode it replays the cache's engine for the signature; otherwise it
// times the candidates (candidates.hpp gives their order, timing.hpp times them) and keeps the
// fastest in the persistent cache (cache.hpp), so that a signature is tuned once per machine.
//
// The op passes the planner to its build explicitly (cudnn/plan_store.hpp):
//   Planner planner = Planner::for_graph(device, family);
//   ... cudnn::build(graph, handle, op, text, strict_f32, planner) ... planner.finish(...)
// Executing a built graph afterwards costs what it did before: one launch.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cudnn_frontend.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "cutrain/cuda/autotune/cache.hpp"
#include "cutrain/cuda/autotune/candidates.hpp"
#include "cutrain/cuda/autotune/fe_compat.hpp"
#include "cutrain/cuda/autotune/options.hpp"
#include "cutrain/cuda/autotune/plan.hpp"
#include "cutrain/cuda/autotune/timing.hpp"

namespace cutrain::inline CUTRAIN_ABI::cuda::autotune {

namespace detail {

using cutrain::cuda::detail::micros_since;

// The names of plans [0, count) of g, as CandidateOrder takes them: a config's name is its
// engine id and every knob (equal names, same plan). Plans before `first` are not candidates.
inline std::vector<std::string> plan_names(fe::graph::Graph& g, std::int64_t first, std::int64_t count) {
  std::vector<std::string> names(static_cast<std::size_t>(count));
  for (std::int64_t i = first; i < count; ++i) {
    std::string name;
    names[static_cast<std::size_t>(i)] = g.get_plan_name_at_index(i, name).is_good() ? name : cat("#", i);
  }
  return names;
}

// Times the candidates of a planned Request, picks the fastest and records it in the cache.
//
// The walk (CandidateOrder) tries mode A's list and the fallback list first, with room left for
// mode B's first mode_b_first guesses: the two heuristics often disagree, B's first choice far
// faster than A's on some shapes and far slower on others, but B's query costs 17-28 ms per
// graph and on most graphs A's first choice is its best or close to it. Once the first screens
// are in, B is asked only when one of them came out faster than mode_b_below times the baseline.
//
// With the screen on, the baseline is screened and waited for; the candidates after it are queued
// (Bench::queue_screen) with executions per round set by the baseline's, and the stream is
// synchronized only when their estimates are needed (collect()): while the GPU runs one
// candidate's rounds, the host builds the next. The candidates whose screen came within
// screen_ratio of the fastest are then timed fully, in turns, with the baseline (so that
// Choice::heuristic_ms is a full median taken in the same turns as the winner's).
class Tuning {
 public:
  using Clock = std::chrono::steady_clock;

  Tuning(fe::graph::Graph& g, const std::vector<TensorAttr>& tensors, Request& r)
      : g_(g),
        r_(r),
        o_(r.options),
        t0_(Clock::now()),
        deadline_(t0_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(o_.max_tuning_ms))),
        on_(r.device),
        order_(plan_names(g, r.first, g.get_execution_plan_count()), r.baseline, r.first),
        bench_(g, tensors, r.device) {
    order_.note_places(r.first, r.end_a, 'A');
    order_.note_places(r.end_a, r.end_f, 'F');
    if (r.end_b >= 0) order_.note_places(r.end_f, r.end_b, 'B');
  }

  // The chosen plan index and its workspace, or nothing when no candidate could be timed (the
  // caller keeps the heuristics' choice).
  std::optional<std::pair<std::int64_t, std::int64_t>> run() {
    const int b_room = r_.end_b < 0 && o_.mode_b_below > 0
                           ? std::clamp(o_.mode_b_first, 0, std::max(0, o_.max_candidates - 1))
                           : 0;
    // The fallback list's runtime-compiled configs mode A does not list (Options::fallback_compiled)
    // are tried after A's first ones, in the fallback list's order.
    const int compiled_room = std::clamp(o_.fallback_compiled, 0, std::max(0, o_.max_candidates - 1 - b_room));
    try_until(o_.max_candidates - b_room - compiled_room);
    if (compiled_room > 0)
      order_.move_up_within(r_.end_a, r_.end_f, compiled_room, [&](std::int64_t i) { return runtime_compiled(g_, i); });
    try_until(o_.max_candidates - b_room);
    collect();
    if (b_room > 0 && Clock::now() <= deadline_ && baseline_beaten()) ask_mode_b(b_room);
    try_until(o_.max_candidates);
    collect();
    if (o_.screen_ratio > 0 && !timed_.empty()) time_finals();
    return choose();
  }

 private:
  struct Pending {
    Timed t;
    Bench::Queued q;
  };

  void fail(const std::string& why) {  // a candidate that did not build or run
    ++failed_;
    if (first_failure_.empty()) first_failure_ = why;
  }

  // Tries the candidates in order until `limit` were tried (deselected configs do not count).
  void try_until(int limit) {
    for (; !order_.done(); order_.advance()) {
      const std::int64_t i = order_.current();
      if (i != r_.baseline && (tried_ >= limit || Clock::now() > deadline_)) break;
      try_one(i);
    }
  }

  void try_one(std::int64_t i) {
    const bool is_baseline = i == r_.baseline;
    Timed t;
    t.index = i;
    if (!is_baseline) {
      const auto t_build = Clock::now();
      auto st = g_.build_plan_at_index(i);
      t.build_us = micros_since(t_build);
      build_us_ += t.build_us;
      if (st.is_bad()) {
        if (deselected(st)) return;  // the strict-f32 or determinism filter's: not a candidate at all
        ++tried_;
        fail(st.get_message());
        return;
      }
    }
    ++tried_;
    t.replayable = engine_config_of(g_, i, t.engine_id, t.knobs);
    if (g_.get_workspace_size_plan_at_index(i, t.workspace).is_bad() || t.workspace > o_.max_workspace_bytes) {
      ++failed_;
      return;
    }
    if (is_baseline) spin_up(t);
    t.screened = o_.screen_ratio > 0;
    std::string why;
    if (t.screened && !is_baseline && screen_reps_ > 0) {
      Pending& p = pending_.emplace_back();
      p.t = std::move(t);
      if (!bench_.queue_screen(i, p.t.workspace, screen_reps_, p.q, why)) {
        pending_.pop_back();
        fail(why);
      }
      return;
    }
    const auto ms = bench_.time(i, t.workspace, deadline_, is_baseline, why, t.screened);
    if (!ms) {
      fail(why);
      return;
    }
    stats().candidates_timed.fetch_add(1);
    t.median_ms = *ms;
    // Rounds of about half a round_ms at the baseline's speed: a candidate's own speed is not known
    // when its screen is queued, and one far slower than the baseline should not cost much more.
    if (is_baseline && t.screened) screen_reps_ = std::max(1, Rounds::reps(*ms) / 2);
    timed_.push_back(std::move(t));
  }

  // The baseline is timed after Bench::spin_up (about 3 ms of its runs) so that the GPU's clocks
  // are up, unless this thread tuned a graph on the same device less than clocks_stay_up_ms ago.
  void spin_up(const Timed& t) {
    const bool clocks_up = last_tuned().device == r_.device &&
                           Clock::now() - last_tuned().when < std::chrono::milliseconds(clocks_stay_up_ms);
    if (clocks_up) stats().spin_ups_skipped.fetch_add(1);
    else bench_.spin_up(t.index, t.workspace, 3.0);
  }

  // Waits for the queued screens and reads their estimates.
  void collect() {
    if (pending_.empty()) return;
    std::string why;
    const bool ran = bench_.synced(why);  // an error on the GPU: none of the queued estimates can be trusted
    for (Pending& p : pending_) {
      if (!ran) {
        fail(why);
        continue;
      }
      p.t.median_ms = p.q.estimate();
      stats().candidates_timed.fetch_add(1);
      timed_.push_back(std::move(p.t));
    }
    pending_.clear();
  }

  // Whether a candidate's screen beat mode_b_below times the baseline's (A ranked this graph poorly).
  bool baseline_beaten() const {
    double base_ms = -1, fastest = std::numeric_limits<double>::infinity();
    for (const auto& t : timed_) {
      fastest = std::min(fastest, t.median_ms);
      if (t.index == r_.baseline) base_ms = t.median_ms;
    }
    return base_ms > 0 && fastest < o_.mode_b_below * base_ms;
  }

  void ask_mode_b(int room) {
    const auto t_b = Clock::now();
    fe::error_t none;
    const std::int64_t from = g_.get_execution_plan_count();
    r_.end_b = add_heuristics(g_, fe::HeurMode_t::B, r_.op, r_.graph_key, none);
    base_filters(g_, r_.strict_f32, o_.deterministic_only);
    if (r_.speed_filtered) speed_filters(g_, r_.strict_f32);
    std::vector<std::string> b_names = plan_names(g_, from, r_.end_b);
    b_names.erase(b_names.begin(), b_names.begin() + static_cast<std::ptrdiff_t>(from));
    order_.add_mode_b(b_names, room);
    stats().mode_b_queries.fetch_add(1);
    b_us_ = micros_since(t_b);
    stats().query_micros.fetch_add(b_us_);
  }

  // The baseline and the candidates whose screen came within screen_ratio of the fastest screen,
  // timed fully in turns: a slow spell of the GPU falls on all of them alike.
  void time_finals() {
    double fastest = timed_.front().median_ms;
    for (const auto& t : timed_) fastest = std::min(fastest, t.median_ms);
    std::vector<Timed*> finals;
    for (auto& t : timed_)
      if (t.index == r_.baseline || t.median_ms <= fastest * o_.screen_ratio) finals.push_back(&t);
    bench_.time_in_turns(finals, deadline_);
  }

  void account() const {  // Stats: where this graph's tuning went
    stats().build_micros.fetch_add(build_us_);
    stats().timing_micros.fetch_add(micros_since(t0_) - build_us_ - b_us_);
  }

  // The fastest fully timed candidate, stored in the cache and in last_result().
  std::optional<std::pair<std::int64_t, std::int64_t>> choose() {
    std::vector<const Timed*> ranked;
    for (const auto& t : timed_)
      if (t.replayable && !t.screened) ranked.push_back(&t);
    std::stable_sort(ranked.begin(), ranked.end(), [](const Timed* a, const Timed* b) { return a->median_ms < b->median_ms; });
    // The heuristics' choice may carry knobs this frontend cannot name, so that no engine id and
    // knobs rebuild it; when it is the fastest it is still the plan to run, and the cache records
    // it as engine heuristic_engine ("cuDNN's heuristic choice", which the key's versions pin down).
    const Timed* base = nullptr;
    for (const auto& t : timed_)
      if (t.index == r_.baseline) base = &t;
    const bool take_base = base && !base->replayable && (ranked.empty() || base->median_ms < ranked.front()->median_ms);
    if (ranked.empty() && !take_base) {
      account();
      warn(cat(r_.op, ": no candidate plan could be timed", first_failure_.empty() ? "" : " (" + first_failure_ + ")",
               "; keeping cuDNN's heuristic choice"));
      return std::nullopt;
    }
    const Timed& best = take_base ? *base : *ranked.front();
    (void)g_.build_plan_at_index(best.index);  // built already: makes it the graph's default plan too

    last_tuned() = LastTuned{r_.device, Clock::now()};
    Choice c;
    c.engine_id = take_base ? heuristic_engine : best.engine_id;
    if (!take_base) c.knobs = best.knobs;
    c.median_ms = best.median_ms;
    c.workspace_bytes = best.workspace;
    c.heuristic_ms = base ? base->median_ms : -1;  // its full median (its estimate if the finals could not run it)
    c.candidates_tried = tried_;
    c.candidates_failed = failed_;
    c.tuning_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0_).count();
    if (const std::size_t second = take_base ? 0 : 1; ranked.size() > second)
      c.runner_up = RunnerUp{ranked[second]->engine_id, ranked[second]->knobs, ranked[second]->median_ms};

    stats().ops_tuned.fetch_add(1);
    account();
    store_choice(r_.key, c, cat(r_.op, ": the choice"));
    Result result{r_.key, std::move(c), false};
    for (const auto& t : timed_) {
      result.timed.push_back(RunnerUp{t.engine_id, t.knobs, t.median_ms});
      result.origins.push_back(order_.origin(t.index));
      result.notes.push_back(notes_of(g_, t.index));
      result.build_ms.push_back(static_cast<double>(t.build_us) / 1e3);
    }
    last() = std::move(result);
    return std::pair{best.index, best.workspace};
  }

  fe::graph::Graph& g_;
  Request& r_;
  const Options& o_;
  const Clock::time_point t0_, deadline_;
  cutrain::detail::DeviceGuard on_;
  CandidateOrder order_;
  Bench bench_;
  std::vector<Timed> timed_;
  std::deque<Pending> pending_;  // Events do not move: a deque keeps them in place
  int tried_ = 0, failed_ = 0;
  std::string first_failure_;
  int screen_reps_ = 0;        // set from the baseline's screen
  std::int64_t build_us_ = 0;  // the candidates' plan builds (Stats::build_micros)
  std::int64_t b_us_ = 0;      // asking mode B (counted in Stats::query_micros)
};

}  // namespace detail

namespace fe = cudnn_frontend;

// Whether the tuner plans graphs of `family` under options o: convolutions (with their fused
// epilogues) and attention, or every graph with tune_all_graphs.
inline bool tunes(GraphFamily family, const Options& o) {
  return o.tune_all_graphs || family == GraphFamily::convolution || family == GraphFamily::attention;
}

// How a graph's execution plan is chosen, passed to cudnn::build() and then finish()ed once the
// op has listed its tensors. Tuning never fails the op: a tuner that cannot time anything keeps
// the heuristics' plan.
class Planner {
 public:
  // cuDNN's heuristics' first choice; nothing is timed or looked up.
  static Planner heuristic() { return Planner{}; }
  // What this thread's mode (a ModeGuard's, else the process default) and options give a graph
  // of `family` on `device`: the heuristics for graphs the tuner leaves to them.
  static Planner for_graph(int device, GraphFamily family) {
    Planner p;
    const Mode m = autotune::mode();
    if (m == Mode::heuristic) return p;
    p.req_.options = autotune::options();
    if (!autotune::tunes(family, p.req_.options)) return p;
    p.tunes_ = true;
    p.req_.device = device;
    p.req_.mode = m;
    return p;
  }

  // Whether the tuner plans the graph (else cuDNN's heuristics do), in which mode, with which options.
  bool tunes() const { return tunes_; }
  Mode mode() const { return req_.mode; }
  const Options& options() const { return req_.options; }

  // Called by cudnn::build() once the graph is validated and lowered: false when the heuristics
  // are to plan it. Otherwise replays the cached engine, or queries the candidates and builds the
  // baseline (see detail::plan).
  bool plan(fe::graph::Graph& g, std::string_view op, const std::string& graph_text, bool strict_f32) {
    if (!tunes_ || req_.planned) return false;
    req_.graph_key = graph_text;
    detail::plan(g, req_, op, strict_f32);
    return true;
  }

  // plan_index and workspace_bytes are the built graph's (BuiltGraph::plan_index, ::workspace).
  void finish(fe::graph::Graph& g, const std::vector<detail::TensorAttr>& tensors, std::int64_t& plan_index,
              std::int64_t& workspace_bytes) {
    if (!req_.planned) return;
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
      chosen = detail::Tuning(g, tensors, req_).run();
      if (chosen) result_ = detail::last();  // run() sets it with its choice
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
  Planner() = default;
  detail::Request req_;
  bool tunes_ = false;
  std::optional<Result> result_;
};

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::autotune
