// examples/fashion_mnist's command line: its flags, their checks and the two recipes.
//   --recipe default  the reference recipe (AdamW, one-cycle, batch 128, 1 epoch unless --epochs)
//   --recipe fast     the speed run (docs/performance.md): width 2, batch 256, 30 epochs, max lr 4e-3,
//                     crop+flip, label smoothing 0.1, bf16 with CUDA graphs, channels-last, an EMA of the weights
//                     (decay 0.99) evaluated with test-time flips, timed to 94.0% test accuracy; batch norm's
//                     NHWC forward on cutrain's kernels (CUTRAIN_BN_FORWARD=fast, docs/kernels.md)
// Flags given on the command line override the recipe's values, wherever they stand.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <stdexcept>
#include <string>

#include "cutrain/data/idx.hpp"
#include "cutrain/nn.hpp"

namespace fashion_mnist_example {

struct Args {
  std::string device;  // "" = auto
  std::string recipe = "default";
  int epochs = 1;
  std::int64_t batch = 128;
  double lr = 2e-3;
  std::uint64_t seed = 0;
  std::string data = cutrain::data::fashion_mnist_dir();
  std::int64_t limit = 0;  // 0 = all
  std::int64_t width = 1;
  bool augment = false;
  double label_smoothing = 0.0;
  bool cuda_graphs = false;
  bool channels_last = false;  // the model's 4-d tensors NHWC (Module::to(Layout::nhwc))
  std::string autotune = "heuristic";
  cutrain::nn::Precision precision = cutrain::nn::Precision::f32;
  double ema = 0.0;       // decay of the weights' moving average; 0 = off
  bool tta = false;       // evaluate on each test image and its mirror (logits summed)
  double target = 0.0;    // test accuracy (%) whose time from process start is reported; 0 = none
  bool stop_at_target = false;
  std::string csv;
  std::string checkpoint;
  bool resume = false;
  int stop_after = 0;  // 0 = run every epoch
  bool deterministic = false;
};

[[noreturn]] inline void usage(const std::string& msg) {
  std::cerr << "fashion_mnist: " << msg << "\n"
            << "usage: fashion_mnist [--recipe default|fast] [--device cpu|cuda] [--epochs N] [--batch N] [--lr X]\n"
            << "                     [--seed N] [--data DIR] [--limit N] [--width N] [--augment] [--label-smoothing X]\n"
            << "                     [--ema DECAY] [--tta] [--target PERCENT] [--stop-at-target]\n"
            << "                     [--cuda-graphs] [--channels-last] [--autotune heuristic|benchmark|cached] [--csv FILE]\n"
            << "                     [--checkpoint FILE] [--resume] [--stop-after N] [--deterministic]\n"
            << "                     [--precision f32|bf16|f16]\n";
  std::exit(2);
}

inline void apply_recipe(Args& a, const std::string& recipe) {
  a.recipe = recipe;
  if (recipe == "default") return;
  if (recipe != "fast") usage("--recipe must be default or fast");
  a.width = 2;
  a.batch = 256;
  a.epochs = 30;
  a.lr = 4e-3;
  a.augment = true;
  a.label_smoothing = 0.1;
  a.precision = cutrain::nn::Precision::bf16;
  a.cuda_graphs = true;
  a.ema = 0.99;
  a.tta = true;
  a.channels_last = true;
  a.target = 94.0;
}

inline Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; ++i)  // the recipe first: the other flags override it
    if (std::string(argv[i]) == "--recipe") apply_recipe(a, argv[i + 1]);
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(f + " needs a value");
      return argv[++i];
    };
    try {
      if (f == "--recipe") apply_recipe(a, value());  // (already applied; checks the value's place)
      else if (f == "--device") a.device = value();
      else if (f == "--epochs") a.epochs = std::stoi(value());
      else if (f == "--batch") a.batch = std::stoll(value());
      else if (f == "--lr") a.lr = std::stod(value());
      else if (f == "--seed") a.seed = std::stoull(value());
      else if (f == "--data") a.data = value();
      else if (f == "--limit") a.limit = std::stoll(value());
      else if (f == "--width") a.width = std::stoll(value());
      else if (f == "--augment") a.augment = true;
      else if (f == "--label-smoothing") a.label_smoothing = std::stod(value());
      else if (f == "--ema") a.ema = std::stod(value());
      else if (f == "--tta") a.tta = true;
      else if (f == "--target") a.target = std::stod(value());
      else if (f == "--stop-at-target") a.stop_at_target = true;
      else if (f == "--cuda-graphs") a.cuda_graphs = true;
      else if (f == "--channels-last") a.channels_last = true;
      else if (f == "--autotune") a.autotune = value();
      else if (f == "--csv") a.csv = value();
      else if (f == "--checkpoint") a.checkpoint = value();
      else if (f == "--resume") a.resume = true;
      else if (f == "--stop-after") a.stop_after = std::stoi(value());
      else if (f == "--deterministic") a.deterministic = true;
      else if (f == "--precision") {
        const auto p = cutrain::nn::parse_precision(value());
        if (!p) usage("--precision must be f32, bf16 or f16");
        a.precision = *p;
      }
      else if (f == "--help" || f == "-h") usage("help");
      else usage("unknown flag " + f);
    } catch (const std::logic_error&) {  // stoi & co.
      usage("bad value for " + f);
    }
  }
  if (a.epochs < 1) usage("--epochs must be >= 1");
  if (a.batch < 1) usage("--batch must be >= 1");
  if (a.lr <= 0) usage("--lr must be positive");
  if (a.limit < 0) usage("--limit must be >= 0");
  if (!a.device.empty() && a.device != "cpu" && a.device != "cuda") usage("--device must be cpu or cuda");
  if (a.width < 1 || a.width > 16) usage("--width must be in [1, 16]");
  if (a.label_smoothing < 0 || a.label_smoothing >= 1) usage("--label-smoothing must be in [0, 1)");
  if (a.ema < 0 || a.ema >= 1) usage("--ema must be in [0, 1) (0: off)");
  if (a.target < 0 || a.target > 100) usage("--target must be a percentage");
  if (a.stop_at_target && a.target == 0) usage("--stop-at-target needs --target");
  if (a.resume && a.checkpoint.empty()) usage("--resume needs --checkpoint FILE");
  if (a.resume && a.ema > 0) usage("--ema is not saved in checkpoints: it cannot be combined with --resume");
  if (a.stop_after < 0) usage("--stop-after must be >= 0");
  if (a.deterministic && a.autotune == "heuristic") a.autotune = "cached";
  if (a.autotune != "heuristic" && a.autotune != "benchmark" && a.autotune != "cached")
    usage("--autotune must be heuristic, benchmark or cached");
  if (a.precision == cutrain::nn::Precision::f16 && a.cuda_graphs)
    usage("--precision f16 scales the loss, which reads an overflow flag on the host every step: it cannot run in "
          "a CUDA graph (use bf16 with --cuda-graphs)");
  return a;
}

}  // namespace fashion_mnist_example
