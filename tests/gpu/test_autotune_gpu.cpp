// The autotuner on the GPU: in benchmark mode conv plans (fprop, dgrad, wgrad; f32 and bf16) are
// timed, the winner is no slower than cuDNN's heuristic choice (which is among the timed ones)
// and still matches the CPU backend; the cache file written then replays the same engines in
// cached mode, timing nothing; a cache entry whose engine no longer builds is tuned again;
// heuristic mode never times. The same for cuBLASLt's matmul algorithms (linear forward with
// bias + relu, backward with the bias-gradient epilogue). And the plans cuDNN compiles at build
// (relu and batch norm here), kept on disk and read back by a fresh graph cache. A warm start
// that loads a run's plans, tuned ones included, on background threads for the next run. The
// candidate order: heuristics mode B's first two configs are timed right after the baseline when B
// is asked, and B is not asked when the options say never. Engine
// configs whose knob types only the backend names are stored and replayed.
#include "bn_switch.hpp"
#include "parity.hpp"
#include "scoped_config.hpp"
#include "temp_dir.hpp"

#include <link.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cutrain/cuda/autotune/tuner.hpp"
#include "cutrain/cuda/cublas/linear.hpp"
#include "cutrain/cuda/cudnn/activation.hpp"
#include "cutrain/cuda/cudnn/conv.hpp"
#include "cutrain/cuda/warm_start.hpp"
#include "cutrain/ops/activation.hpp"
#include "cutrain/ops/batch_norm.hpp"
#include "cutrain/ops/conv2d.hpp"
#include "cutrain/ops/linear.hpp"

namespace cutrain_test_autotune_gpu {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;
namespace autotune = cutrain::cuda::autotune;

namespace {

// Puts the tuner back as the other tests expect it: the global cache, the default options, and
// no graph built under this test's modes.
struct Restore {
  ~Restore() {
    autotune::set_cache(nullptr);
    autotune::set_options({});
    cuda::cudnn::clear_graph_cache();
    cuda::cublas::clear_plan_cache();
  }
};

struct TuneCase {
  const char* name;
  Shape x, w;
  Conv2dParams p;
};

// Shapes no other GPU test uses, so that no graph of theirs is involved.
const TuneCase tune_cases[] = {
    {"3x3_64", {8, 64, 14, 14}, {64, 64, 3, 3}, Conv2dParams::make(1, 1)},
    {"3x3_s2", {4, 32, 15, 15}, {48, 32, 3, 3}, Conv2dParams::make(2, 1)},
    {"1x1", {4, 64, 8, 8}, {32, 64, 1, 1}, Conv2dParams::make(1, 0)},
};

// Runs fprop, dgrad and wgrad on the GPU, checks each against the CPU backend (f64), and returns
// what the tuner reported for each (empty where it neither tuned nor looked anything up).
template <class T>
std::vector<std::optional<autotune::Result>> run_convs(const TuneCase& c, Layout layout) {
  const std::string tag = cutrain::detail::cat("autotune ", c.name, " ", dtype_of<T>, " ", layout);
  Rng rng(std::hash<std::string>{}(tag));
  auto [x, xr] = random_pair<T>(c.x, rng, layout);
  auto [w, wr] = random_pair<T>(c.w, rng, layout);
  const Shape ys = conv2d_output_shape(c.x, c.w, c.p);
  auto [dy, dyr] = random_pair<T>(ys, rng, layout);
  std::vector<std::optional<autotune::Result>> results;

  autotune::clear_last_result();
  auto y = poisoned<T>(ys, layout);
  cuda::cudnn::conv2d_forward(x, w, Tensor<T>{}, c.p, y);
  check_close(tag + " fprop", y, ops::conv2d_forward(xr, wr, c.p));
  results.push_back(autotune::last_result());

  autotune::clear_last_result();
  auto dx = poisoned<T>(c.x, layout);
  cuda::cudnn::conv2d_backward_data(dy, w, c.p, dx);
  check_close(tag + " dgrad", dx, ops::conv2d_backward_data(dyr, wr, c.x, c.p));
  results.push_back(autotune::last_result());

  autotune::clear_last_result();
  auto dw = poisoned<T>(c.w, layout);
  cuda::cudnn::conv2d_backward_filter(dy, x, c.p, dw);
  check_close(tag + " wgrad", dw, ops::conv2d_backward_filter(dyr, xr, c.w, c.p));
  results.push_back(autotune::last_result());

  cuda::synchronize();
  return results;
}

// Every case in f32 NCHW (TF32 off) and bf16 NHWC.
std::vector<std::optional<autotune::Result>> run_all() {
  std::vector<std::optional<autotune::Result>> all;
  for (const auto& c : tune_cases) {
    for (auto& r : run_convs<float>(c, Layout::nchw)) all.push_back(std::move(r));
    for (auto& r : run_convs<cutrain::bfloat16>(c, Layout::nhwc)) all.push_back(std::move(r));
  }
  return all;
}

std::int64_t timed_count() { return autotune::stats().candidates_timed.load(); }

}  // namespace

TEST_CASE("gpu autotune: modes and guards") {
  CHECK(autotune::parse_mode("heuristic") == autotune::Mode::heuristic);
  CHECK(autotune::parse_mode("benchmark") == autotune::Mode::benchmark);
  CHECK(autotune::parse_mode("cached") == autotune::Mode::cached);
  CHECK(!autotune::parse_mode("fastest"));
  const auto outer = autotune::mode();
  {
    autotune::ModeGuard a(autotune::Mode::heuristic);
    CHECK(autotune::mode() == autotune::Mode::heuristic);
    {
      autotune::ModeGuard b(autotune::Mode::benchmark);
      CHECK(autotune::mode() == autotune::Mode::benchmark);
    }
    CHECK(autotune::mode() == autotune::Mode::heuristic);
  }
  CHECK(autotune::mode() == outer);
  CHECK_THROWS_AS(autotune::set_options({.max_candidates = 0}), InvalidArgument);
  CHECK_THROWS_AS(autotune::set_options({.max_tuning_ms = -1}), InvalidArgument);
  CHECK_THROWS_AS(autotune::set_options({.screen_ratio = 0.5}), InvalidArgument);
  CHECK_THROWS_AS(autotune::set_options({.mode_b_below = -1}), InvalidArgument);
  CHECK_THROWS_AS(autotune::set_options({.mode_b_first = -1}), InvalidArgument);
  CHECK_THROWS_AS(autotune::set_options({.fallback_compiled = -1}), InvalidArgument);
}

TEST_CASE("gpu autotune: benchmark tunes conv plans that match the CPU backend; the cache file replays them") {
  Restore restore;
  TempDir dir("autotune_gpu");
  const auto path = dir / "autotune.json";
  auto first = std::make_shared<autotune::Cache>(path);
  autotune::set_cache(first);
  autotune::set_options({});
  cuda::cudnn::clear_graph_cache();

  // 1. benchmark: every op is timed and stored.
  std::vector<autotune::Result> tuned;
  {
    autotune::ModeGuard mode(autotune::Mode::benchmark);
    const auto timed0 = timed_count();
    const auto ops0 = autotune::stats().ops_tuned.load();
    for (const auto& r : run_all()) {
      REQUIRE(r);
      const auto& c = r->choice;
      INFO(r->key.op << " " << r->key.signature);
      CHECK(!r->from_cache);
      CHECK(c.heuristic_ms > 0);  // the baseline was timed
      CHECK(c.median_ms <= c.heuristic_ms * 1.05);
      CHECK(c.candidates_tried >= 1);
      CHECK(c.candidates_tried <= autotune::options().max_candidates);
      CHECK(c.candidates_failed <= c.candidates_tried);
      CHECK(c.tuning_ms > 0);
      if (c.runner_up) CHECK(c.runner_up->median_ms >= c.median_ms);
      std::printf("%-24s eng%-4lld %8.4f ms (heuristic %8.4f ms, %5.3fx) tried %2d failed %2d, %6.1f ms tuning: %s\n",
                  r->key.op.c_str(), static_cast<long long>(c.engine_id), c.median_ms, c.heuristic_ms,
                  c.heuristic_ms / c.median_ms, c.candidates_tried, c.candidates_failed, c.tuning_ms,
                  r->key.signature.c_str());
      tuned.push_back(*r);
    }
    CHECK(autotune::stats().ops_tuned.load() - ops0 == static_cast<std::int64_t>(tuned.size()));
    CHECK(timed_count() - timed0 >= static_cast<std::int64_t>(tuned.size()));
  }
  REQUIRE(std::filesystem::exists(path));
  CHECK(first->size() == tuned.size());

  // 2. cached, from the file: a fresh cache object and fresh graphs; nothing is timed.
  cuda::cudnn::clear_graph_cache();
  auto second = std::make_shared<autotune::Cache>(path);
  CHECK(second->size() == tuned.size());
  autotune::set_cache(second);
  {
    autotune::ModeGuard mode(autotune::Mode::cached);
    const auto timed0 = timed_count();
    const auto ops0 = autotune::stats().ops_tuned.load();
    const auto hits0 = autotune::stats().cache_hits.load();
    const auto replayed = run_all();
    REQUIRE(replayed.size() == tuned.size());
    for (std::size_t i = 0; i < replayed.size(); ++i) {
      REQUIRE(replayed[i]);
      INFO(tuned[i].key.op << " " << tuned[i].key.signature);
      CHECK(replayed[i]->from_cache);
      CHECK(replayed[i]->key == tuned[i].key);
      CHECK(replayed[i]->choice.engine_id == tuned[i].choice.engine_id);
      CHECK(replayed[i]->choice.knobs == tuned[i].choice.knobs);
    }
    CHECK(timed_count() == timed0);
    CHECK(autotune::stats().ops_tuned.load() == ops0);
    CHECK(autotune::stats().cache_hits.load() - hits0 == static_cast<std::int64_t>(tuned.size()));
  }

  // 3. heuristic: nothing timed, nothing looked up.
  cuda::cudnn::clear_graph_cache();
  {
    autotune::ModeGuard mode(autotune::Mode::heuristic);
    const auto timed0 = timed_count();
    const auto hits0 = autotune::stats().cache_hits.load();
    for (const auto& r : run_all()) CHECK(!r);
    CHECK(timed_count() == timed0);
    CHECK(autotune::stats().cache_hits.load() == hits0);
  }
}

TEST_CASE("gpu autotune: a cache entry whose engine no longer builds is tuned again and replaced") {
  Restore restore;
  TempDir dir("autotune_gpu");
  auto cache = std::make_shared<autotune::Cache>(dir / "autotune.json");
  autotune::set_cache(cache);
  cuda::cudnn::clear_graph_cache();
  const TuneCase& c = tune_cases[0];

  std::optional<autotune::Result> first;
  {
    autotune::ModeGuard mode(autotune::Mode::benchmark);
    first = run_convs<float>(c, Layout::nhwc)[0];
  }
  REQUIRE(first);
  autotune::Choice stale = first->choice;
  stale.engine_id = 1 << 20;  // no such engine
  stale.knobs = {{1, 12345}};
  stale.runner_up.reset();
  cache->insert(first->key, stale);

  cuda::cudnn::clear_graph_cache();
  {
    autotune::ModeGuard mode(autotune::Mode::cached);
    const auto ops0 = autotune::stats().ops_tuned.load();
    const auto again = run_convs<float>(c, Layout::nhwc)[0];  // checks parity too
    REQUIRE(again);
    CHECK(!again->from_cache);
    CHECK(autotune::stats().ops_tuned.load() == ops0 + 1);  // fprop re-tuned; dgrad and wgrad replayed
    const auto stored = cache->find(first->key);
    REQUIRE(stored);
    CHECK(stored->engine_id == again->choice.engine_id);
    CHECK(stored->engine_id != stale.engine_id);
  }
}

TEST_CASE("gpu autotune: options bound the search and key deterministic choices apart") {
  Restore restore;
  TempDir dir("autotune_gpu");
  autotune::set_cache(std::make_shared<autotune::Cache>(dir / "autotune.json"));
  cuda::cudnn::clear_graph_cache();
  autotune::set_options({.max_candidates = 3, .deterministic_only = true});
  autotune::ModeGuard mode(autotune::Mode::benchmark);
  for (const auto& r : run_convs<float>(tune_cases[1], Layout::nchw)) {
    REQUIRE(r);
    CHECK(r->choice.candidates_tried <= 3);
    CHECK(r->key.signature.ends_with(" deterministic"));
    CHECK(r->choice.median_ms <= r->choice.heuristic_ms * 1.05);
  }
}

namespace {

// The engine configs (engine id, sorted knobs) at the first `n` places of one heuristics mode's
// list for a bf16 NHWC conv fprop, built the way conv2d_forward builds it, with the tuner's
// filters: a config the filters deselect, or that does not build, is left out (the tuner skips it).
std::vector<autotune::RunnerUp> first_of_mode(cudnn_frontend::HeurMode_t mode, const Tensor<cutrain::bfloat16>& x,
                                              const Tensor<cutrain::bfloat16>& w, const Tensor<cutrain::bfloat16>& y,
                                              const Conv2dParams& p, std::int64_t n) {
  namespace fe = cudnn_frontend;
  namespace cd = cuda::cudnn;
  auto g = cd::detail::new_graph<cutrain::bfloat16>();
  auto X = cd::tensor(*g, "x", x);
  auto W = cd::tensor(*g, "w", w);
  auto Y = g->conv_fprop(X, W, cd::detail::conv_attributes<fe::graph::Conv_fprop_attributes>(p));
  Y->set_output(true).set_dim(y.shape().dims()).set_stride(y.strides()).set_data_type(fe::DataType_t::BFLOAT16);
  cudnnHandle_t h = cuda::handles(0).cudnn;
  REQUIRE(g->validate().is_good());
  REQUIRE(g->build_operation_graph(h).is_good());
  if (g->create_execution_plans({mode}).is_bad()) return {};  // no engine in this mode: nothing to expect
  g->deselect_workspace_greater_than(autotune::options().max_workspace_bytes);
  g->deselect_numeric_notes({fe::NumericalNote_t::REDUCED_PRECISION_REDUCTION});
  std::vector<autotune::RunnerUp> out;
  for (std::int64_t i = 0; i < std::min<std::int64_t>(n, g->get_execution_plan_count()); ++i) {
    if (g->build_plan_at_index(i).is_bad()) continue;
    autotune::RunnerUp r;  // engine id and knobs as the tuner records them
    REQUIRE(autotune::detail::engine_config_of(*g, i, r.engine_id, r.knobs));
    out.push_back(r);
  }
  return out;
}

}  // namespace

TEST_CASE("gpu autotune: heuristics mode B's first two configs are timed right after the baseline") {
  Restore restore;
  TempDir dir("autotune_gpu");
  autotune::set_cache(std::make_shared<autotune::Cache>(dir / "autotune.json"));
  cuda::cudnn::clear_graph_cache();
  // Three candidates: the baseline (mode A's first) and mode B's first two, B asked for every
  // graph (mode_b_below above 1); every one timed fully, with no time budget to cut the list short.
  autotune::set_options({.max_candidates = 3, .max_tuning_ms = 1e9, .screen_ratio = 0, .mode_b_below = 2});
  autotune::ModeGuard mode(autotune::Mode::benchmark);
  const auto same = [](const autotune::RunnerUp& u, const autotune::RunnerUp& v) {
    return u.engine_id == v.engine_id && u.knobs == v.knobs;
  };
  // bf16 NHWC fprops; only those where a B config lies outside A's first three tell the orders
  // apart (taking A's list first, the tuner would not time it). Which do depends on cuDNN's
  // heuristics, hence several shapes.
  const TuneCase cases[] = {tune_cases[0], tune_cases[1], tune_cases[2],
                            {"3x3_s2_wide", {16, 64, 32, 32}, {128, 64, 3, 3}, Conv2dParams::make(2, 1)},
                            {"5x5_1ch", {32, 1, 28, 28}, {32, 1, 5, 5}, Conv2dParams::make(1, 2)}};
  int separating = 0;
  for (const auto& c : cases) {
    Rng rng(std::hash<std::string>{}(c.name) + 77);
    auto [x, xr] = random_pair<cutrain::bfloat16>(c.x, rng, Layout::nhwc);
    auto [w, wr] = random_pair<cutrain::bfloat16>(c.w, rng, Layout::nhwc);
    auto y = poisoned<cutrain::bfloat16>(conv2d_output_shape(c.x, c.w, c.p), Layout::nhwc);
    const auto a = first_of_mode(cudnn_frontend::HeurMode_t::A, x, w, y, c.p, 3);
    const auto b = first_of_mode(cudnn_frontend::HeurMode_t::B, x, w, y, c.p, 2);
    bool separates = false;
    for (const auto& want : b) {
      bool in_a = false;
      for (const auto& have : a) in_a = in_a || same(have, want);
      separates = separates || !in_a;
    }
    if (!separates) continue;
    ++separating;
    INFO("case " << c.name);
    autotune::clear_last_result();
    const auto asked = autotune::stats().mode_b_queries.load();
    cuda::cudnn::conv2d_forward(x, w, Tensor<cutrain::bfloat16>{}, c.p, y);
    check_close(cutrain::detail::cat("tuned fprop ", c.name), y, ops::conv2d_forward(xr, wr, c.p));
    CHECK(autotune::stats().mode_b_queries.load() == asked + 1);
    const auto r = autotune::last_result();
    REQUIRE(r);
    REQUIRE(!r->from_cache);
    REQUIRE(r->timed.size() <= 3);
    REQUIRE(r->origins.size() == r->timed.size());
    CHECK(r->origins.front().find("A1") != std::string::npos);
    // The baseline is A's first that builds; each of B's first two is timed too.
    if (!a.empty()) CHECK(same(r->timed.front(), a.front()));
    for (const auto& want : b) {
      bool found = false;
      for (const auto& t : r->timed) found = found || same(t, want);
      INFO("mode B config: engine " << want.engine_id << ", " << want.knobs.size() << " knobs");
      CHECK(found);
    }
  }
  if (separating == 0) WARN("on no case here do mode B's first two lie outside mode A's first three: the order is untested");
  cuda::synchronize();
}

namespace {

// Tunes a bf16 NHWC fprop of c afresh (this thread's built graphs forgotten) under the options in
// force, checks it against the CPU backend, and returns what the tuner reported: a new tuning,
// with cuDNN's places for each candidate timed.
autotune::Result tune_fprop_afresh(const TuneCase& c, const Tensor<cutrain::bfloat16>& x,
                                   const Tensor<cutrain::bfloat16>& w, const Tensor<double>& xr,
                                   const Tensor<double>& wr) {
  cuda::cudnn::clear_graph_cache();
  autotune::clear_last_result();
  auto y = poisoned<cutrain::bfloat16>(conv2d_output_shape(c.x, c.w, c.p), Layout::nhwc);
  cuda::cudnn::conv2d_forward(x, w, Tensor<cutrain::bfloat16>{}, c.p, y);
  check_close(cutrain::detail::cat("tuned fprop ", c.name), y, ops::conv2d_forward(xr, wr, c.p));
  const auto r = autotune::last_result();
  REQUIRE(r);
  REQUIRE(!r->from_cache);
  REQUIRE(r->origins.size() == r->timed.size());
  return *r;
}

}  // namespace

TEST_CASE("gpu autotune: heuristics mode B is not asked when mode_b_first or mode_b_below is 0") {
  Restore restore;
  TempDir dir("autotune_gpu");
  autotune::set_cache(std::make_shared<autotune::Cache>(dir / "autotune.json"));
  autotune::ModeGuard mode(autotune::Mode::benchmark);
  const TuneCase& c = tune_cases[0];
  Rng rng(4242);
  auto [x, xr] = random_pair<cutrain::bfloat16>(c.x, rng, Layout::nhwc);
  auto [w, wr] = random_pair<cutrain::bfloat16>(c.w, rng, Layout::nhwc);
  for (const autotune::Options o : {autotune::Options{.mode_b_below = 2, .mode_b_first = 0},
                                    autotune::Options{.mode_b_below = 0}}) {
    INFO("mode_b_first " << o.mode_b_first << ", mode_b_below " << o.mode_b_below);
    autotune::set_options(o);
    const auto asked = autotune::stats().mode_b_queries.load();
    const auto r = tune_fprop_afresh(c, x, w, xr, wr);
    CHECK(autotune::stats().mode_b_queries.load() == asked);
    for (const auto& where : r.origins) CHECK(where.find('B') == std::string::npos);
  }
  cuda::synchronize();
}

TEST_CASE("gpu autotune: fallback_compiled tries the fallback list's runtime-compiled configs after A's first") {
  Restore restore;
  TempDir dir("autotune_gpu");
  autotune::set_cache(std::make_shared<autotune::Cache>(dir / "autotune.json"));
  autotune::ModeGuard mode(autotune::Mode::benchmark);
  // bf16 NHWC 3x3 convolutions like ResNet-18's, where cuDNN 9.19's fallback list on the H200 holds
  // a runtime-compiled tensor-core config (eng70, eng71) that mode A does not list.
  const TuneCase cases[] = {{"3x3_64_32x32", {16, 64, 32, 32}, {64, 64, 3, 3}, Conv2dParams::make(1, 1)},
                            {"1x1_s2", {16, 64, 32, 32}, {128, 64, 1, 1}, Conv2dParams::make(2, 0)}};
  int seen = 0;
  for (const auto& c : cases) {
    Rng rng(std::hash<std::string>{}(c.name) + 5);
    auto [x, xr] = random_pair<cutrain::bfloat16>(c.x, rng, Layout::nhwc);
    auto [w, wr] = random_pair<cutrain::bfloat16>(c.w, rng, Layout::nhwc);
    for (const int compiled : {0, 1}) {
      INFO("case " << c.name << ", fallback_compiled " << compiled);
      // Two candidates, B never asked: the baseline and either A's second or the compiled config.
      autotune::set_options({.max_candidates = 2, .max_tuning_ms = 1e9, .mode_b_first = 0, .fallback_compiled = compiled});
      const auto r = tune_fprop_afresh(c, x, w, xr, wr);
      REQUIRE(r.notes.size() == r.timed.size());
      REQUIRE(r.build_ms.size() == r.timed.size());
      REQUIRE(r.timed.size() == 2);
      CHECK(r.origins[0].find("A1") != std::string::npos);
      const bool compiled_fallback = r.origins[1].find('A') == std::string::npos &&
                                     r.origins[1].find('F') != std::string::npos &&
                                     r.notes[1].find("RUNTIME_COMPILATION") != std::string::npos;
      if (compiled == 0) {
        CHECK(r.origins[1].find('A') != std::string::npos);
      } else if (compiled_fallback) {
        ++seen;
        CHECK(r.build_ms[1] > 0);
      } else {
        // No such config for this shape: A's next is tried, as without the option.
        CHECK(r.origins[1].find('A') != std::string::npos);
      }
    }
  }
  if (seen == 0) WARN("no case here has a runtime-compiled config only the fallback list holds: the option is untested");
  cuda::synchronize();
}

namespace {

// Linear forward (bias + relu epilogue) and backward (dx, and dw with the BGRADB epilogue) on
// shapes no other GPU test uses, each checked against the CPU backend; returns what the tuner
// reported for each matmul (the forward, dgrad and wgrad).
std::vector<std::optional<autotune::Result>> run_linears() {
  std::vector<std::optional<autotune::Result>> results;
  Rng rng(91);
  const std::int64_t N = 96, in = 200, out = 136;
  auto [x, xr] = random_pair<float>(Shape{N, in}, rng, Layout::row_major);
  auto [w, wr] = random_pair<float>(Shape{out, in}, rng, Layout::row_major);
  auto [b, br] = random_pair<float>(Shape{out}, rng, Layout::row_major);
  auto [dy, dyr] = random_pair<float>(Shape{N, out}, rng, Layout::row_major);
  autotune::clear_last_result();
  auto y = poisoned<float>(Shape{N, out}, Layout::row_major);
  cuda::cublas::linear_forward(x, w, b, Activation::relu, y);
  check_close("tuned linear fprop", y, ops::activation_forward(ops::linear_forward(xr, wr, br), {.kind = Activation::relu}));
  results.push_back(autotune::last_result());
  auto dx = poisoned<float>(Shape{N, in}, Layout::row_major);
  auto dw = poisoned<float>(Shape{out, in}, Layout::row_major);
  auto db = poisoned<float>(Shape{out}, Layout::row_major);
  cuda::cublas::linear_backward(x, w, dy, true, dx, dw, db);
  const auto g = ops::linear_backward(xr, wr, dyr);
  check_close("tuned linear dgrad", dx, g.dx);
  check_close("tuned linear wgrad", dw, g.dw);
  check_close("tuned linear bgrad", db, g.db);
  results.push_back(autotune::last_result());  // the last matmul of backward
  cuda::synchronize();
  return results;
}

}  // namespace

TEST_CASE("gpu autotune: benchmark tunes cuBLASLt matmul algorithms that match the CPU; the cache replays them") {
  Restore restore;
  TempDir dir("autotune_gpu");
  const auto path = dir / "autotune.json";
  autotune::set_cache(std::make_shared<autotune::Cache>(path));
  autotune::set_options({});
  cuda::cublas::clear_plan_cache();

  std::vector<autotune::Result> tuned;
  {
    autotune::ModeGuard mode(autotune::Mode::benchmark);
    const auto ops0 = autotune::stats().ops_tuned.load();
    for (const auto& r : run_linears()) {
      REQUIRE(r);
      const auto& c = r->choice;
      INFO(r->key.op << " " << r->key.signature);
      CHECK(r->key.library == "cublaslt");
      CHECK(!r->from_cache);
      CHECK(!c.algo.empty());
      CHECK(c.engine_id >= 0);  // the algorithm's config id, read back from its bytes
      CHECK(!c.knobs.empty());
      CHECK(c.heuristic_ms > 0);  // the heuristic's first choice is always timed
      CHECK(c.median_ms <= c.heuristic_ms);
      CHECK(c.candidates_tried >= 1);
      CHECK(c.candidates_tried <= autotune::options().max_candidates);
      std::printf("%-14s algo %-4lld %8.4f ms (heuristic %8.4f ms, %5.3fx) tried %2d failed %2d, %6.1f ms tuning: %s\n",
                  r->key.op.c_str(), static_cast<long long>(c.engine_id), c.median_ms, c.heuristic_ms,
                  c.heuristic_ms / c.median_ms, c.candidates_tried, c.candidates_failed, c.tuning_ms,
                  r->key.signature.c_str());
      tuned.push_back(*r);
    }
    CHECK(autotune::stats().ops_tuned.load() - ops0 >= 3);  // forward, dgrad, wgrad
  }

  // Cached, from a fresh cache object on the file and fresh plans: nothing is timed.
  cuda::cublas::clear_plan_cache();
  autotune::set_cache(std::make_shared<autotune::Cache>(path));
  {
    autotune::ModeGuard mode(autotune::Mode::cached);
    const auto ops0 = autotune::stats().ops_tuned.load();
    const auto timed0 = timed_count();
    const auto hits0 = autotune::stats().cache_hits.load();
    const auto replayed = run_linears();
    REQUIRE(replayed.size() == tuned.size());
    for (std::size_t i = 0; i < replayed.size(); ++i) {
      REQUIRE(replayed[i]);
      CHECK(replayed[i]->from_cache);
      CHECK(replayed[i]->key == tuned[i].key);
      CHECK(replayed[i]->choice.algo == tuned[i].choice.algo);
    }
    CHECK(autotune::stats().ops_tuned.load() == ops0);
    CHECK(timed_count() == timed0);
    CHECK(autotune::stats().cache_hits.load() - hits0 >= 3);
  }
}

TEST_CASE("gpu: plans cuDNN compiles at build are kept on disk, and a fresh graph cache reads them back") {
  Restore restore;
  TempDir dir("plan_files");
  ScopedConfig cache_dir("CUTRAIN_KERNEL_CACHE", dir.path().string());
  autotune::ModeGuard mode(autotune::Mode::heuristic);

  // relu forward and backward and batch norm training forward and backward, bf16 NHWC, on a
  // shape no other test uses, as cuDNN's graphs (ops:: prefers cutrain's kernels for these); every
  // output checked against the CPU backend.
  const FastBatchNorm cudnn_graphs(false, false);
  Rng rng(57);
  const Shape s{3, 24, 7, 9};
  auto [x, xr] = random_pair<cutrain::bfloat16>(s, rng, Layout::nhwc);
  auto [dy, dyr] = random_pair<cutrain::bfloat16>(s, rng, Layout::nhwc);
  auto [gamma, gr] = random_pair<float>(Shape{24}, rng, Layout::row_major);
  auto [beta, br] = random_pair<float>(Shape{24}, rng, Layout::row_major);
  const ActivationParams relu{.kind = Activation::relu};
  auto run = [&] {
    const TensorOptions o{.layout = Layout::nhwc, .device = Device::cuda(0)};
    Tensor<cutrain::bfloat16> z(s, o), dz(s, o);
    REQUIRE(cuda::cudnn::activation_forward(x, relu, z));
    REQUIRE(cuda::cudnn::activation_backward(x, dy, relu, dz));
    check_close("plan file relu fwd", z, ops::activation_forward(xr, relu));
    check_close("plan file relu bwd", dz, ops::activation_backward(xr, dyr, relu));
    Tensor<float> rm = Tensor<float>::zeros(Shape{24}, {.device = Device::cuda(0)});
    Tensor<float> rv = Tensor<float>::full(Shape{24}, 1.0f, {.device = Device::cuda(0)});
    Tensor<double> rmr = Tensor<double>::zeros(Shape{24}), rvr = Tensor<double>::full(Shape{24}, 1.0);
    const auto f = ops::batch_norm_forward_training(x, gamma, beta, rm, rv, {});
    const auto fr = ops::batch_norm_forward_training(xr, gr, br, rmr, rvr, {});
    check_close("plan file bn fwd", f.y, fr.y);
    const auto b = ops::batch_norm_backward(x, dy, gamma, f.save_mean, f.save_inv_std);
    const auto brf = ops::batch_norm_backward(xr, dyr, gr, fr.save_mean, fr.save_inv_std);
    check_close("plan file bn bwd dx", b.dx, brf.dx);
    cuda::synchronize();
  };
  const auto plan_files = [&] {
    std::vector<std::filesystem::path> out;
    for (const auto& name : dir.entries())
      if (name.starts_with("cudnn-plan-") && name.ends_with(".bin")) out.push_back(dir / name);
    return out;
  };

  cuda::cudnn::clear_graph_cache();
  const auto loaded0 = cuda::cudnn::build_stats().from_files.load();
  run();  // builds the four graphs and writes the plans cuDNN can serialize
  CHECK(cuda::cudnn::build_stats().from_files.load() == loaded0);
  const auto files = plan_files();
  std::printf("plan files written: %zu of 4 graphs\n", files.size());
  REQUIRE(!files.empty());

  // A fresh graph cache: each plan with a file is read back, not built, and computes the same.
  cuda::cudnn::clear_graph_cache();
  run();
  CHECK(cuda::cudnn::build_stats().from_files.load() - loaded0 == static_cast<std::int64_t>(files.size()));

  // A damaged file is ignored: that graph is built again, and still right.
  {
    std::ofstream damage(files.front(), std::ios::binary | std::ios::trunc);
    damage << "not a plan";
  }
  cuda::cudnn::clear_graph_cache();
  const auto loaded1 = cuda::cudnn::build_stats().from_files.load();
  run();
  CHECK(cuda::cudnn::build_stats().from_files.load() - loaded1 == static_cast<std::int64_t>(files.size()) - 1);
}

TEST_CASE("gpu: a warm start loads the plans of an earlier run in the background, tuned plans included") {
  Restore restore;
  TempDir dir("warm_start");
  ScopedConfig cache_dir("CUTRAIN_KERNEL_CACHE", dir.path().string());
  struct Forget {
    ~Forget() { cuda::cudnn::detail::reset_warm_start(); }
  } forget;
  autotune::set_cache(std::make_shared<autotune::Cache>(dir / "autotune.json"));
  autotune::ModeGuard mode(autotune::Mode::cached);
  cuda::cudnn::detail::reset_warm_start();  // none is active in this binary; be sure

  CHECK_THROWS_AS(cuda::warm_start("bad name"), InvalidArgument);
  CHECK_THROWS_AS(cuda::warm_start("ok", 99), InvalidArgument);

  // A bf16 NHWC conv (tuned: its plan goes to a file only under a warm start), relu and batch
  // norm (the heuristics' plans: cuDNN's graphs, not the kernels ops:: prefers), on shapes no
  // other test uses; every output against the CPU.
  const FastBatchNorm cudnn_graphs(false, false);
  Rng rng(91);
  const Shape xs{2, 16, 9, 11}, ws{24, 16, 3, 3};
  const auto p = Conv2dParams::make(1, 1);
  const Shape ys = conv2d_output_shape(xs, ws, p);
  auto [x, xr] = random_pair<cutrain::bfloat16>(xs, rng, Layout::nhwc);
  auto [w, wr] = random_pair<cutrain::bfloat16>(ws, rng, Layout::nhwc);
  auto [gamma, gr] = random_pair<float>(Shape{24}, rng, Layout::row_major);
  auto [beta, br] = random_pair<float>(Shape{24}, rng, Layout::row_major);
  const ActivationParams relu{.kind = Activation::relu};
  auto run = [&] {
    const auto y = ops::conv2d_forward(x, w, p);
    const auto yr = ops::conv2d_forward(xr, wr, p);
    check_close("warm start conv", y, yr);
    Tensor<cutrain::bfloat16> z(y.shape(), {.layout = y.layout(), .device = y.device()});
    REQUIRE(cuda::cudnn::activation_forward(y, relu, z));  // cuDNN's pointwise graph (ops:: runs a kernel)
    check_close("warm start relu", z, ops::activation_forward(yr, relu));
    Tensor<float> rm = Tensor<float>::zeros(Shape{24}, {.device = Device::cuda(0)});
    Tensor<float> rv = Tensor<float>::full(Shape{24}, 1.0f, {.device = Device::cuda(0)});
    Tensor<double> rmr = Tensor<double>::zeros(Shape{24}), rvr = Tensor<double>::full(Shape{24}, 1.0);
    check_close("warm start bn", ops::batch_norm_forward_training(y, gamma, beta, rm, rv, {}).y,
                ops::batch_norm_forward_training(yr, gr, br, rmr, rvr, {}).y);
    cuda::synchronize();
  };

  // The first run: nothing listed yet; the three graphs go to files and to the list.
  cuda::cudnn::clear_graph_cache();
  CHECK(cuda::warm_start("gpu-test") == 0);
  CHECK(cuda::warm_start("gpu-test") == 0);  // again, same name: nothing more
  CHECK_THROWS_AS(cuda::warm_start("other"), InvalidArgument);
  run();
  REQUIRE(std::filesystem::exists(dir / "warm-gpu-test.list"));

  // A later run (the warm start forgotten, as in a new process): the threads load and run all
  // three; the ops take them instead of building, and still compute the same.
  cuda::cudnn::detail::reset_warm_start();
  cuda::cudnn::clear_graph_cache();
  const std::size_t queued = cuda::warm_start("gpu-test");
  std::printf("warm start: %zu plans listed\n", queued);
  CHECK(queued == 3);
  for (int i = 0; i < 200 && cuda::warm_start_stats().loaded < static_cast<std::int64_t>(queued); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const auto st = cuda::warm_start_stats();
  CHECK(st.loaded == 3);
  CHECK(st.warmed == 3);
  // The first thread warmed cuBLASLt up before its plans (the busy count covers it: reset waits).
  CHECK(st.cublas_ready_ms >= 0);
  CHECK(st.cublas_ready_ms <= st.last_ready_ms);
  const auto warm0 = cuda::cudnn::build_stats().warm.load();
  const auto tuned0 = autotune::stats().ops_tuned.load();
  run();
  CHECK(cuda::cudnn::build_stats().warm.load() - warm0 == 3);
  CHECK(autotune::stats().ops_tuned.load() == tuned0);

  // In heuristic mode the tuned conv plan does not fit: that graph is built; the others are taken.
  cuda::cudnn::detail::reset_warm_start();
  cuda::cudnn::clear_graph_cache();
  CHECK(cuda::warm_start("gpu-test") == 3);
  {
    autotune::ModeGuard heuristic(autotune::Mode::heuristic);
    const auto warm1 = cuda::cudnn::build_stats().warm.load();
    run();
    CHECK(cuda::cudnn::build_stats().warm.load() - warm1 == 2);
  }
  cuda::cudnn::clear_graph_cache();
}

TEST_CASE("gpu: the warm start opens cuDNN's engine libraries from the directory of the libcudnn loaded") {
  cuda::detail::open_cudnn_libraries();
  std::vector<std::string> parts;  // every libcudnn* object in the process
  dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* out) {
        const std::string_view name = info->dlpi_name ? info->dlpi_name : "";
        if (name.find("libcudnn") != std::string_view::npos) static_cast<std::vector<std::string>*>(out)->emplace_back(name);
        return 0;
      },
      &parts);
  std::string core;
  for (const auto& p : parts)
    if (p.find("/libcudnn.so") != std::string::npos) core = p;
  REQUIRE_FALSE(core.empty());
  const auto dir = std::filesystem::path(core).parent_path();
  int engines = 0;
  for (const auto& p : parts) {
    INFO(p << " against " << core);
    std::error_code ec;
    CHECK(std::filesystem::equivalent(std::filesystem::path(p).parent_path(), dir, ec));  // one copy of cuDNN
    const auto file = std::filesystem::path(p).filename().string();
    engines += file.starts_with("libcudnn_engines_precompiled.so") || file.starts_with("libcudnn_engines_runtime_compiled.so");
  }
  CHECK(engines == 2);
}

TEST_CASE("gpu autotune: engine configs with knob types only cuDNN's backend names are chosen and replayed") {
  Restore restore;
  TempDir dir("autotune_gpu");
  autotune::set_cache(std::make_shared<autotune::Cache>(dir / "autotune.json"));
  cuda::cudnn::clear_graph_cache();
  const auto raw_knob = [](const autotune::Knob& k) { return k.type >= autotune::raw_knob_type_base; };
  // Every candidate of the f32 convolutions (TF32 off) is timed, mode B's too. Among them are engines that still
  // report knob types cudnn-frontend no longer names (on the H200 with cuDNN 9.19, several per
  // graph): cutrain keeps those types as the backend's numbers.
  autotune::set_options({.max_candidates = 100, .max_tuning_ms = 1e9, .mode_b_below = 2});
  std::optional<autotune::Result> tuned;
  autotune::RunnerUp raw;
  {
    autotune::ModeGuard mode(autotune::Mode::benchmark);
    for (const auto& c : tune_cases)
      for (auto& r : run_convs<float>(c, Layout::nchw)) {
        if (!r || tuned) continue;
        for (const auto& t : r->timed)
          if (std::any_of(t.knobs.begin(), t.knobs.end(), raw_knob)) {
            tuned = r;
            raw = t;
            break;
          }
      }
  }
  REQUIRE(tuned);  // else no candidate had such a knob: the test no longer covers the case
  INFO("engine " << raw.engine_id << " with " << raw.knobs.size() << " knobs, for " << tuned->key.signature);
  // That config becomes the op's stored choice; a fresh graph cache in cached mode must build it
  // from the entry (no tuning), and the op must still match the CPU (run_convs checks).
  auto choice = tuned->choice;
  choice.engine_id = raw.engine_id;
  choice.knobs = raw.knobs;
  autotune::cache()->insert(tuned->key, choice);
  cuda::cudnn::clear_graph_cache();
  const auto tuned_before = autotune::stats().ops_tuned.load();
  autotune::ModeGuard mode(autotune::Mode::cached);
  bool replayed = false;
  for (const auto& c : tune_cases)
    for (auto& r : run_convs<float>(c, Layout::nchw)) {
      REQUIRE(r);
      CHECK(r->from_cache);
      if (r->key != tuned->key) continue;
      replayed = true;
      CHECK(r->choice.engine_id == raw.engine_id);
      CHECK(r->choice.knobs == raw.knobs);
    }
  CHECK(replayed);
  CHECK(autotune::stats().ops_tuned.load() == tuned_before);
}

}  // namespace cutrain_test_autotune_gpu
