// Tunes the convolutions of two reference models on this GPU and prints what the autotuner found:
// per op the chosen cuDNN engine (id and knobs), its time, the time of cuDNN's heuristic choice,
// the speed-up, how many candidates were tried and failed, and how long tuning took.
//
//   (a) ResNet-18 on CIFAR-sized input: batch 256, 32x32, bf16 NHWC
//   (b) the Fashion-MNIST CNN: batch 128, 28x28, f32 NCHW (TF32 off)
// each in fprop, dgrad and wgrad, run through ops:: under autotune::Mode::benchmark.
//
//   (c) with --suite FILE, the benchmark suite's convolutions (bench/conv_shapes.txt, as
//       bench_ops_gpu runs them): f32 NCHW, TF32 NCHW and bf16 NHWC, and in bf16 the fused
//       conv + bias + relu forward; a graph that an earlier row built is not listed again
//
//   autotune_report [--json FILE] [--cache FILE] [--mode benchmark|cached|heuristic] [--exhaustive] [--suite FILE]
//                   [--max-candidates N] [--mode-b-first N] [--mode-b-below F] [--fallback-compiled N]
//                   [--candidates-json FILE]
//
// --cache uses that cache file instead of the default ($CUTRAIN_AUTOTUNE_CACHE, else
// ~/.cache/cutrain/autotune.json); benchmark mode writes what it finds there. --mode cached shows
// the cache's entries being replayed (nothing timed on a hit). --exhaustive then tunes every op
// again with no limit on candidates (and a memory-only cache), and prints, per op, how the chosen
// engine compares with the fastest of all candidates, both timed in that second pass.
// --max-candidates, --mode-b-first, --mode-b-below and --fallback-compiled set the first pass's
// autotune::Options of those names (defaults 18, 2, 0.9 and 0), to weigh tuning time against the
// choices; --candidates-json writes every op's candidates of the second pass (engine, places in
// cuDNN's lists, time, cuDNN's notes, build time). Exits 77 without a GPU.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cutrain/core/json.hpp"
#include "cutrain/core/tensor.hpp"
#include "cutrain/cuda/autotune/tuner.hpp"
#include "cutrain/cuda/cudnn/graph.hpp"
#include "cutrain/cuda/cudnn/plan_store.hpp"  // clear_graph_cache
#include "cutrain/cuda/runtime.hpp"
#include "cutrain/ops/conv2d.hpp"

#include "../bench/conv_shapes.hpp"

using namespace cutrain;
namespace autotune = cutrain::cuda::autotune;
using Clock = std::chrono::steady_clock;

namespace {

struct Layer {
  std::string model, name;
  Shape x, w;
  Conv2dParams p;
};

// ResNet-18 for 32x32 input: the stage convolutions at their spatial sizes (the stride-2 ones
// read the previous stage's size) and the first 1x1 projection shortcut.
const Layer resnet[] = {
    {"resnet18", "layer1 3x3 64->64", {256, 64, 32, 32}, {64, 64, 3, 3}, Conv2dParams::make(1, 1)},
    {"resnet18", "layer2 3x3 64->128 s2", {256, 64, 32, 32}, {128, 64, 3, 3}, Conv2dParams::make(2, 1)},
    {"resnet18", "layer2 1x1 64->128 s2", {256, 64, 32, 32}, {128, 64, 1, 1}, Conv2dParams::make(2, 0)},
    {"resnet18", "layer2 3x3 128->128", {256, 128, 16, 16}, {128, 128, 3, 3}, Conv2dParams::make(1, 1)},
    {"resnet18", "layer3 3x3 128->256 s2", {256, 128, 16, 16}, {256, 128, 3, 3}, Conv2dParams::make(2, 1)},
    {"resnet18", "layer3 3x3 256->256", {256, 256, 8, 8}, {256, 256, 3, 3}, Conv2dParams::make(1, 1)},
    {"resnet18", "layer4 3x3 256->512 s2", {256, 256, 8, 8}, {512, 256, 3, 3}, Conv2dParams::make(2, 1)},
    {"resnet18", "layer4 3x3 512->512", {256, 512, 4, 4}, {512, 512, 3, 3}, Conv2dParams::make(1, 1)},
};
const Layer fmnist[] = {
    {"fashion_mnist_cnn", "conv1 3x3 1->32", {128, 1, 28, 28}, {32, 1, 3, 3}, Conv2dParams::make(1, 1)},
    {"fashion_mnist_cnn", "conv2 3x3 32->64", {128, 32, 14, 14}, {64, 32, 3, 3}, Conv2dParams::make(1, 1)},
};

struct Row {
  std::string model, layer, direction, dtype, layout;
  std::optional<autotune::Result> result;  // empty: nothing tuned or looked up (heuristic mode)
  std::string error;                       // cuDNN had no engine
};

std::string engine_text(std::int64_t id, const std::vector<autotune::Knob>& knobs) {
  std::string s = "eng" + std::to_string(id);
  for (const auto& k : knobs) s += " k" + std::to_string(k.type) + "=" + std::to_string(k.value);
  return s;
}

template <class T>
Tensor<T> filled(const Shape& s, Layout l) {
  Tensor<T> t(s, {.layout = l, .device = Device::cuda(0)});
  t.fill(T(0.25f));
  return t;
}

// How a layer runs: its element type (bf16, else f32) and layout, TF32 for f32, and (bf16 suite
// rows) the fused conv + bias + relu forward as a fourth op.
struct Precision {
  bool bf16;
  Layout layout;
  bool tf32 = false;
  bool fused = false;
};

template <class T>
void run_layer(const Layer& c, Precision pr, std::vector<Row>& rows) {
  const Layout layout = pr.layout;
  const Shape ys = conv2d_output_shape(c.x, c.w, c.p);
  auto x = filled<T>(c.x, layout);
  auto w = filled<T>(c.w, layout);
  auto dy = filled<T>(ys, layout);
  const Tensor<T> bias = pr.fused ? filled<T>(Shape{c.w[0]}, Layout::nchw) : Tensor<T>{};
  std::vector<std::pair<const char*, std::function<void()>>> directions = {
      {"fprop", [&] { ops::conv2d_forward(x, w, c.p); }},
      {"dgrad", [&] { ops::conv2d_backward_data(dy, w, c.x, c.p); }},
      {"wgrad", [&] { ops::conv2d_backward_filter(dy, x, c.w, c.p); }},
  };
  if (pr.fused)
    directions.emplace_back("fused", [&] {
      ops::conv2d_bias_activation_forward(x, w, bias, ActivationParams{.kind = Activation::relu}, c.p);
    });
  cuda::math_options().allow_tf32 = pr.tf32;
  for (const auto& [direction, run] : directions) {
    Row row{c.model, c.name, direction, pr.tf32 ? "tf32" : cutrain::detail::cat(dtype_of<T>), cutrain::detail::cat(layout), {}, {}};
    autotune::clear_last_result();
    try {
      run();
      cuda::synchronize("autotune_report");
      row.result = autotune::last_result();
    } catch (const CudnnError& e) {
      row.error = e.what();
    }
    const auto& r = row.result;
    const char* model = c.model.c_str();
    const char* name = c.name.c_str();
    if (!row.error.empty()) {
      std::printf("%-18s %-24s %-5s  no cuDNN engine: %.120s\n", model, name, direction, row.error.c_str());
    } else if (!r && autotune::mode() != autotune::Mode::heuristic) {
      std::printf("%-18s %-24s %-5s  (the graph of a row above)\n", model, name, direction);
      continue;  // built before in this process (a suite shape that is a ResNet-18 layer): no row of its own
    } else if (!r) {
      std::printf("%-18s %-24s %-5s  (heuristic plan, nothing timed)\n", model, name, direction);
    } else {
      const auto& ch = r->choice;
      const double speedup = ch.heuristic_ms > 0 && ch.median_ms > 0 ? ch.heuristic_ms / ch.median_ms : 0;
      std::printf("%-18s %-24s %-5s  %-40s %9.4f %9.4f %7.3fx %4d/%-3d %9.1f%s\n", model, name, direction,
                  engine_text(ch.engine_id, ch.knobs).c_str(), ch.median_ms, ch.heuristic_ms, speedup,
                  ch.candidates_tried, ch.candidates_failed, ch.tuning_ms, r->from_cache ? "  (cache)" : "");
    }
    rows.push_back(std::move(row));
  }
  cuda::math_options().allow_tf32 = false;
}

// The layers to tune, in order: ResNet-18 in bf16 NHWC, the Fashion-MNIST CNN in f32 NCHW, and
// the suite's convolutions (when given) in f32 NCHW, TF32 NCHW and bf16 NHWC (with the fused op).
struct Entry {
  Layer layer;
  Precision precision;
};
std::vector<Entry> layers(const std::vector<bench::ConvShape>& suite) {
  std::vector<Entry> plan;
  for (const auto& c : resnet) plan.push_back({c, {true, Layout::nhwc}});
  for (const auto& c : fmnist) plan.push_back({c, {false, Layout::nchw}});
  for (const auto& s : suite) {
    Layer l{"bench_suite", s.name, {s.n, s.c, s.h, s.w}, {s.k, s.c, s.r, s.r}, Conv2dParams::make(s.stride, s.pad)};
    const std::string name = l.name;
    l.name = name + " f32";
    plan.push_back({l, {false, Layout::nchw}});
    l.name = name + " tf32";
    plan.push_back({l, {false, Layout::nchw, true}});
    l.name = name + " bf16";
    plan.push_back({l, {true, Layout::nhwc, false, true}});
  }
  return plan;
}
void run_layers(const std::vector<Entry>& plan, std::vector<Row>& rows) {
  for (const auto& e : plan) {
    if (e.precision.bf16) run_layer<bfloat16>(e.layer, e.precision, rows);
    else run_layer<float>(e.layer, e.precision, rows);
  }
}

json::Value knobs_json(const std::vector<autotune::Knob>& knobs) {
  json::Value a = json::Value::array();
  for (const auto& k : knobs) a.push_back(json::Value::array({k.type, k.value}));
  return a;
}

json::Value to_json(const std::vector<Row>& rows, const autotune::Environment& env, autotune::Mode mode,
                    double total_tuning_ms, double wall_s) {
  json::Value ops = json::Value::array();
  for (const auto& row : rows) {
    json::Value v = json::Value::object({{"model", row.model},
                                         {"layer", row.layer},
                                         {"direction", row.direction},
                                         {"dtype", row.dtype},
                                         {"layout", row.layout}});
    if (!row.error.empty()) {
      v["error"] = row.error;
    } else if (row.result) {
      const auto& ch = row.result->choice;
      v["signature"] = row.result->key.signature;
      v["engine_id"] = ch.engine_id;
      v["knobs"] = knobs_json(ch.knobs);
      v["median_ms"] = ch.median_ms;
      v["heuristic_ms"] = ch.heuristic_ms;
      v["speedup"] = ch.heuristic_ms > 0 && ch.median_ms > 0 ? ch.heuristic_ms / ch.median_ms : 0.0;
      v["workspace_bytes"] = ch.workspace_bytes;
      v["candidates_tried"] = ch.candidates_tried;
      v["candidates_failed"] = ch.candidates_failed;
      v["tuning_ms"] = ch.tuning_ms;
      v["from_cache"] = row.result->from_cache;
      if (ch.runner_up)
        v["runner_up"] = json::Value::object({{"engine_id", ch.runner_up->engine_id},
                                              {"knobs", knobs_json(ch.runner_up->knobs)},
                                              {"median_ms", ch.runner_up->median_ms}});
    }
    ops.push_back(std::move(v));
  }
  return json::Value::object({
      {"gpu", json::Value::object({{"name", env.gpu_name},
                                   {"sm_count", env.sm_count},
                                   {"compute_capability", env.compute_capability},
                                   {"cudnn_version", env.cudnn_version},
                                   {"frontend_version", env.frontend_version}})},
      {"mode", autotune::to_string(mode)},
      {"ops", std::move(ops)},
      {"total_tuning_ms", total_tuning_ms},
      {"wall_s", wall_s}});
}

// The second pass of --exhaustive: every op tuned again over all its candidates (no count limit, no
// screen, a 30 s budget per op, a memory-only cache, graphs built afresh). The first pass's choice is found
// among the candidates by engine id and knobs (cuDNN's heuristic choice, engine -1, is the
// baseline, timed first) and compared with the fastest, both timed in this pass.
void compare_with_all_candidates(const std::vector<Entry>& plan, const std::vector<Row>& first,
                                 const std::string& dump_path) {
  autotune::Options all;
  all.max_candidates = 1000;
  all.screen_ratio = 0;  // every candidate timed fully
  all.max_tuning_ms = 30000;
  all.mode_b_below = 2;  // mode B asked for every graph: its configs are candidates too
  autotune::set_options(all);
  autotune::set_cache(std::make_shared<autotune::Cache>(""));
  cuda::cudnn::clear_graph_cache();
  std::vector<Row> second;
  {
    autotune::ModeGuard guard(autotune::Mode::benchmark);
    std::printf("\n-- every candidate (second pass) --\n");
    run_layers(plan, second);
  }
  autotune::set_options({});  // the defaults again
  std::printf("\n%-18s %-24s %-5s %10s %10s %8s %6s %7s\n", "model", "layer", "op", "chosen ms", "best ms", "ratio",
              "timed", "best at");
  int compared = 0, within = 0;
  double worst = 0;
  for (std::size_t i = 0; i < first.size() && i < second.size(); ++i) {
    const auto& a = first[i].result;
    const auto& b = second[i].result;
    if (!a || !b || b->timed.empty()) continue;
    const autotune::RunnerUp* chosen = nullptr;
    if (a->choice.engine_id == autotune::heuristic_engine) chosen = &b->timed.front();
    for (const auto& t : b->timed)
      if (!chosen && t.engine_id == a->choice.engine_id && t.knobs == a->choice.knobs) chosen = &t;
    const auto best = std::min_element(b->timed.begin(), b->timed.end(),
                                       [](const auto& x, const auto& y) { return x.median_ms < y.median_ms; });
    if (!chosen) {
      std::printf("%-18s %-24s %-5s  chosen engine not among the second pass's candidates\n",
                  first[i].model.c_str(), first[i].layer.c_str(), first[i].direction.c_str());
      continue;
    }
    const double ratio = chosen->median_ms / best->median_ms;
    ++compared;
    within += ratio <= 1.03 ? 1 : 0;
    worst = std::max(worst, ratio);
    // "best at": the fastest's place in the candidate order (1: the heuristics' choice); the first
    // pass times the first max_candidates of that order.
    std::printf("%-18s %-24s %-5s %10.4f %10.4f %7.3fx %6zu %7td\n", first[i].model.c_str(), first[i].layer.c_str(),
                first[i].direction.c_str(), chosen->median_ms, best->median_ms, ratio, b->timed.size(),
                best - b->timed.begin() + 1);
  }
  std::printf("\nthe chosen plan within 3%% of the fastest of all candidates on %d of %d ops (worst %.3fx)\n", within,
              compared, worst);
  if (dump_path.empty()) return;
  // --candidates-json: every op's candidates in the order timed, with their places in cuDNN's
  // lists, to weigh other candidate orders and counts against the first pass's choices.
  json::Value ops = json::Value::array();
  for (std::size_t i = 0; i < first.size() && i < second.size(); ++i) {
    const auto& b = second[i].result;
    if (!b) continue;
    json::Value cands = json::Value::array();
    for (std::size_t k = 0; k < b->timed.size(); ++k)
      cands.push_back(json::Value::object({{"engine", engine_text(b->timed[k].engine_id, b->timed[k].knobs)},
                                           {"origin", k < b->origins.size() ? b->origins[k] : ""},
                                           {"ms", b->timed[k].median_ms},
                                           {"notes", k < b->notes.size() ? b->notes[k] : ""},
                                           {"build_ms", k < b->build_ms.size() ? b->build_ms[k] : 0.0}}));
    const auto& a = first[i].result;
    ops.push_back(json::Value::object({{"model", first[i].model},
                                       {"layer", first[i].layer},
                                       {"direction", first[i].direction},
                                       {"chosen", a ? engine_text(a->choice.engine_id, a->choice.knobs) : ""},
                                       {"candidates", std::move(cands)}}));
  }
  std::ofstream f(dump_path);
  f << json::dump(json::Value::object({{"ops", std::move(ops)}}), 1) << "\n";
  if (!f) std::fprintf(stderr, "autotune_report: cannot write %s\n", dump_path.c_str());
}

[[noreturn]] void usage(const std::string& msg) {
  std::cerr << "autotune_report: " << msg << "\n"
            << "usage: autotune_report [--json FILE] [--cache FILE] [--mode benchmark|cached|heuristic] [--exhaustive] [--suite FILE]\n"
               "                       [--max-candidates N] [--mode-b-first N] [--mode-b-below F] [--fallback-compiled N]\n"
               "                       [--candidates-json FILE]\n";
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) try {
  std::string json_path, cache_path, candidates_path;
  autotune::Mode mode = autotune::Mode::benchmark;
  bool exhaustive = false;
  autotune::Options options;  // the first pass's (--max-candidates, --mode-b-first, --mode-b-below, --fallback-compiled)
  std::vector<bench::ConvShape> suite;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    // The flag's value as a number in [lo, hi] (whole when asked), else the usage.
    const auto number = [&](double lo, double hi, bool whole) {
      const std::string v = value();
      char* end = nullptr;
      const double n = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !(n >= lo && n <= hi) || (whole && n != static_cast<double>(static_cast<long>(n))))
        usage(cutrain::detail::cat(a, " takes ", whole ? "a whole number" : "a number", " from ", lo, " to ", hi));
      return n;
    };
    if (a == "--json") json_path = value();
    else if (a == "--candidates-json") candidates_path = value();
    else if (a == "--cache") cache_path = value();
    else if (a == "--mode") {
      const auto m = autotune::parse_mode(value());
      if (!m) usage("--mode takes benchmark, cached or heuristic");
      mode = *m;
    } else if (a == "--mode-b-below") {
      options.mode_b_below = number(0, 100, false);
    } else if (a == "--max-candidates") {
      options.max_candidates = static_cast<int>(number(1, 1000, true));
    } else if (a == "--mode-b-first") {
      options.mode_b_first = static_cast<int>(number(0, 1000, true));
    } else if (a == "--fallback-compiled") {
      options.fallback_compiled = static_cast<int>(number(0, 1000, true));
    } else if (a == "--exhaustive") {
      exhaustive = true;
    } else if (a == "--suite") {
      const std::string path = value();
      std::vector<int> bad;
      suite = bench::read_conv_shapes(path, &bad);
      if (suite.empty()) usage("--suite " + path + ": no convolution shapes read (name N C H W K R stride pad per line)");
      for (const int line : bad) std::fprintf(stderr, "autotune_report: %s:%d: not a shape, skipped\n", path.c_str(), line);
    } else if (a == "--help" || a == "-h") usage("prints the autotuner's choices for ResNet-18, the Fashion-MNIST CNN and (--suite) bench/conv_shapes.txt");
    else usage("unknown argument " + a);
  }
  if (!cuda::available()) {
    std::printf("SKIPPED: no CUDA device\n");
    return 77;
  }
  if (!cache_path.empty()) autotune::set_cache(std::make_shared<autotune::Cache>(cache_path));
  autotune::set_options(options);
  const auto env = autotune::environment(0);
  std::printf("%s (%d SMs, sm_%s), cuDNN %lld, cudnn-frontend %lld, mode %s, cache %s\n", env.gpu_name.c_str(),
              env.sm_count, env.compute_capability.c_str(), static_cast<long long>(env.cudnn_version),
              static_cast<long long>(env.frontend_version), autotune::to_string(mode),
              autotune::cache()->path().empty() ? "(memory only)" : autotune::cache()->path().c_str());
  std::printf("%-18s %-24s %-5s  %-40s %9s %9s %8s %8s %9s\n", "model", "layer", "op", "chosen engine (id, knobs)",
              "ms", "heur. ms", "speedup", "tried/f", "tune ms");

  const std::vector<Entry> plan = layers(suite);
  const auto t0 = Clock::now();
  std::vector<Row> rows;
  {
    autotune::ModeGuard guard(mode);
    run_layers(plan, rows);
  }
  const double wall_s = std::chrono::duration<double>(Clock::now() - t0).count();

  double total_tuning_ms = 0, heuristic_sum = 0, chosen_sum = 0;
  int tuned = 0;
  for (const auto& row : rows)
    if (row.result && !row.result->from_cache) {
      total_tuning_ms += row.result->choice.tuning_ms;
      if (row.result->choice.heuristic_ms > 0) {
        heuristic_sum += row.result->choice.heuristic_ms;
        chosen_sum += row.result->choice.median_ms;
      }
      ++tuned;
    }
  std::printf("\n%d ops tuned in %.1f ms of tuning (%.1f s wall for the whole report)", tuned, total_tuning_ms, wall_s);
  if (chosen_sum > 0)
    std::printf("; sum of op times %.4f ms chosen vs %.4f ms heuristic (%.3fx)", chosen_sum, heuristic_sum,
                heuristic_sum / chosen_sum);
  std::printf("\n");

  if (exhaustive) compare_with_all_candidates(plan, rows, candidates_path);

  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << json::dump(to_json(rows, env, mode, total_tuning_ms, wall_s), 2) << "\n";
    if (!out) {
      std::cerr << "autotune_report: cannot write " << json_path << "\n";
      return 1;
    }
    std::printf("wrote %s\n", json_path.c_str());
  }
  return 0;
} catch (const std::exception& e) {
  std::cerr << "autotune_report: " << e.what() << "\n";
  return 1;
}
