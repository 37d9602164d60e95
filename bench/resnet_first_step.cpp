// The counterpart of bench/torch_resnet_first_step.py: what tuning costs on a whole model, and
// what a warm autotune cache leaves of it. ResNet-18 for CIFAR-sized input (nn::resnet18_cifar),
// batch 256, bf16 compute with f32 master weights (nn::autocast), channels-last, SGD momentum.
// Prints the wall time of the first training step (graphs built, plans chosen or tuned, kernels
// loaded), of the tenth, and the median of steps 10-29, each step synchronized.
//
//   resnet_first_step [--mode heuristic|benchmark|cached] [--cache FILE] [--warm-start on|off]
//                     [--warm-threads N] [--max-candidates N] [--mode-b-first N] [--mode-b-below F]
//                     [--fallback-compiled N]
//
// Run it with --mode heuristic (no tuning), then twice with --mode cached on a fresh --cache
// file: the first of those tunes every graph of the step (its first step minus the heuristic
// one is the tuning time, against PyTorch's benchmark-mode first step), the second finds every
// plan in the file (its first step against the tenth: the warm start). With --warm-start on (the
// default) the program calls cuda::warm_start first, so that a run loads the plans the previous
// run of the same mode used on background threads while it builds the model; "setup" is then
// partly that. --max-candidates, --mode-b-first, --mode-b-below and --fallback-compiled set the
// autotune::Options of those names. With CUTRAIN_PROFILE=1 steps 10-29 are profiled op by op
// (docs/profiling.md), against bench/torch_profile_resnet.py's table of PyTorch's same step.
// Exits 77 without a GPU.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "cutrain/cutrain.hpp"
#include "cutrain/cuda/autotune/tuner.hpp"
#include "cutrain/cuda/cudnn/plan_store.hpp"  // build_stats
#include "cutrain/cuda/warm_start.hpp"
#include "cutrain/nn.hpp"

using namespace cutrain;
namespace autotune = cutrain::cuda::autotune;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  std::string mode = "heuristic", cache_path, warm = "on";
  int warm_threads = 0;
  autotune::Options options;  // --max-candidates, --mode-b-first, --mode-b-below, --fallback-compiled
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--mode" && i + 1 < argc) mode = argv[++i];
    else if (a == "--cache" && i + 1 < argc) cache_path = argv[++i];
    else if (a == "--warm-threads" && i + 1 < argc) warm_threads = std::atoi(argv[++i]);
    else if (a == "--max-candidates" && i + 1 < argc) options.max_candidates = std::atoi(argv[++i]);
    else if (a == "--mode-b-first" && i + 1 < argc) options.mode_b_first = std::atoi(argv[++i]);
    else if (a == "--mode-b-below" && i + 1 < argc) options.mode_b_below = std::atof(argv[++i]);
    else if (a == "--fallback-compiled" && i + 1 < argc) options.fallback_compiled = std::atoi(argv[++i]);
    else if (a == "--warm-start" && i + 1 < argc && (std::string(argv[i + 1]) == "on" || std::string(argv[i + 1]) == "off"))
      warm = argv[++i];
    else {
      std::cerr << "usage: resnet_first_step [--mode heuristic|benchmark|cached] [--cache FILE] [--warm-start on|off] "
                   "[--warm-threads N] [--max-candidates N] [--mode-b-first N] [--mode-b-below F] "
                   "[--fallback-compiled N]\n";
      return 2;
    }
  }
  const auto m = autotune::parse_mode(mode);
  if (!m) {
    std::cerr << "resnet_first_step: --mode takes heuristic, benchmark or cached\n";
    return 2;
  }
  try {
    if (!cuda::available()) {
      std::puts("resnet_first_step: SKIPPED (no CUDA device)");
      return 77;
    }
    const auto t_start = Clock::now();
    autotune::set_mode(*m);
    autotune::set_options(options);  // throws on a bad value
    if (!cache_path.empty()) autotune::set_cache(std::make_shared<autotune::Cache>(cache_path));
    // One list per mode: a heuristic run and a tuned run use different plans.
    const std::size_t queued = warm == "on" ? cuda::warm_start("resnet_first_step-" + mode, 0, warm_threads) : 0;
    const Device dev = Device::cuda(0);
    cuda::Stream stream;
    cuda::StreamGuard on(stream.get());

    Rng init(0), data(1);
    auto net = nn::resnet18_cifar<float>(init);
    net.to(dev).to(Layout::nhwc);
    optim::SGD<float> opt(net.parameters(), {.lr = 0.1, .momentum = 0.9});
    const auto x = Tensor<float>::randn(Shape{256, 3, 32, 32}, data, 1.0, {.layout = Layout::nhwc}).to(dev);
    Tensor<std::int32_t> y_host(Shape{256});
    for (std::int64_t i = 0; i < 256; ++i) y_host.data()[i] = static_cast<std::int32_t>(data.below(10));
    const auto y = y_host.to(dev);
    cuda::synchronize();
    const double setup_ms = std::chrono::duration<double, std::milli>(Clock::now() - t_start).count();

    std::vector<double> ms;
    double loss0 = 0, loss_last = 0;
    // CUTRAIN_PROFILE=1: steps 10-29 op by op (core/profile.hpp), the table on stderr at step 30;
    // their wall times then include the profiler's events.
    std::unique_ptr<profile::Session> prof;
    for (int s = 0; s < 30; ++s) {
      if (s == 10) prof = profile::Session::from_env();
      const auto t0 = Clock::now();
      auto loss = nn::cross_entropy(nn::autocast<bfloat16>(net, x), y);
      opt.zero_grad();
      loss.backward();
      opt.step();
      cuda::synchronize();
      ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      if (s == 0) loss0 = loss.item();
      if (s == 29) loss_last = loss.item();
    }
    if (prof) {
      std::fprintf(stderr, "\nprofile of steps 10-29 (20 steps):");
      prof.reset();
    }
    std::vector<double> steady(ms.begin() + 10, ms.end());
    std::nth_element(steady.begin(), steady.begin() + static_cast<std::ptrdiff_t>(steady.size() / 2), steady.end());
    const auto& st = autotune::stats();
    std::printf("cutrain ResNet-18 (CIFAR), batch 256, bf16 autocast, channels-last, SGD; autotune %s, cache %s\n",
                mode.c_str(), cache_path.empty() ? "(default)" : cache_path.c_str());
    std::printf("setup %.1f ms; first step %.1f ms, tenth step %.1f ms, steady (median of steps 10-29) %.2f ms; "
                "start to end of first step %.1f ms\n",
                setup_ms, ms[0], ms[9], steady[steady.size() / 2], setup_ms + ms[0]);
    std::printf("graphs and matmuls tuned %lld (candidates timed %lld), planned from the cache %lld; loss %.4f -> %.4f\n",
                static_cast<long long>(st.ops_tuned.load()), static_cast<long long>(st.candidates_timed.load()),
                static_cast<long long>(st.cache_hits.load()), loss0, loss_last);
    std::printf("tuning's wall time: heuristics' queries %.1f ms, candidates' builds %.1f ms, timing %.1f ms, cache "
                "saves %.1f ms; spin-ups skipped %lld; mode B asked for %lld graphs\n",
                st.query_micros.load() / 1e3, st.build_micros.load() / 1e3, st.timing_micros.load() / 1e3,
                st.save_micros.load() / 1e3, static_cast<long long>(st.spin_ups_skipped.load()),
                static_cast<long long>(st.mode_b_queries.load()));
    // Where the first step's time went: building the cuDNN graphs (plans chosen, cached, tuned)
    // and loading cutrain's NVRTC kernels (compiled, or read from their disk cache).
    const auto& bs = cuda::cudnn::build_stats();
    const auto& ks = cuda::kernels::stats();
    const auto ws = cuda::warm_start_stats();
    std::printf("warm start %s: %zu plans listed, %lld loaded by its %d threads (%lld also run once), the last ready "
                "%.1f ms after the start, cuBLASLt's warm-up done at %.1f ms; thread time: reading %.1f ms, running %.1f ms, "
                "cuBLASLt %.1f ms, cuDNN's libraries %.1f ms\n",
                warm.c_str(), queued, static_cast<long long>(ws.loaded), ws.threads, static_cast<long long>(ws.warmed),
                ws.last_ready_ms, ws.cublas_ready_ms, ws.load_ms, ws.run_ms, ws.cublas_ms, ws.libraries_ms);
    std::printf("cuDNN graphs built %lld (%lld read from plan files, %lld of those by the warm start) in %.1f ms; NVRTC "
                "modules loaded %llu (%llu compiled) in %.1f ms\n",
                static_cast<long long>(bs.graphs.load()), static_cast<long long>(bs.from_files.load()),
                static_cast<long long>(bs.warm.load()),
                static_cast<double>(bs.micros.load()) / 1e3,
                static_cast<unsigned long long>(ks.module_loads.load()), static_cast<unsigned long long>(ks.compiles.load()),
                static_cast<double>(ks.load_micros.load()) / 1e3);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "resnet_first_step: " << e.what() << "\n";
    return 1;
  }
}
