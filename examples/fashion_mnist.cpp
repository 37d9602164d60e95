// Trains the reference CNN on Fashion-MNIST (conv3x3 1->32, BN, ReLU, maxpool, conv3x3 32->64, BN,
// ReLU, maxpool, linear 3136->256, ReLU, linear 256->10; nn::fashion_mnist_cnn) with AdamW and a
// one-cycle schedule. On cuda:0 when cutrain was built with CUDA and a GPU is present, else on
// the CPU.
//
//   fashion_mnist [--recipe default|fast] [--device cpu|cuda] [--epochs N] [--batch N] [--lr X]
//                 [--seed N] [--data DIR] [--limit N] [--width N] [--augment] [--label-smoothing X]
//                 [--ema DECAY] [--tta] [--target PERCENT] [--stop-at-target] [--cuda-graphs] [--channels-last]
//                 [--autotune heuristic|benchmark|cached] [--csv FILE] [--checkpoint FILE] [--resume]
//                 [--stop-after N] [--deterministic] [--precision f32|bf16|f16]
//
// The flags and the two recipes are in fashion_mnist_args.hpp. Prints per-epoch train loss, test
// loss and accuracy; a progress bar (loss, images/s, ETA) on a terminal, plain lines every 100
// steps otherwise; with --target, "time to X% test accuracy: S s from process start" once an
// epoch's test accuracy reaches it; and as the last line: "final test accuracy XX.XX%, YYYY
// images/s". CUTRAIN_PROFILE=1 prints the op-by-op profile of steps 50-99. --ema DECAY
// evaluates (and checkpoints) the moving average of the weights (optim::EMA); --tta sums the
// logits of each test image and its mirror. --checkpoint writes model, optimizer, schedule
// position and loader epoch after every epoch (atomically); --resume continues from it; --stop-after N ends the run
// after epoch N as an interruption would (the schedule still spans --epochs). --deterministic
// (GPU) has the autotuner pick only plans cuDNN marks deterministic (implies --autotune cached
// unless benchmark is given: the first run tunes, ~20 s, later runs take the plans from the
// cache), so that a run repeats exactly and a resumed run repeats an uninterrupted one. --autotune picks how cuDNN
// plans are chosen (default heuristic here: tuning the ~20 graphs of this small network costs
// seconds on a cold cache and gains little; CUTRAIN_AUTOTUNE sets the library's default otherwise).
// --precision bf16|f16 (GPU) runs the model in that type with f32 master weights, f32 batch-norm
// parameters and statistics, and an f32 loss (nn::autocast); f16 scales the loss dynamically
// (optim::GradScaler, which needs the host each step and so cannot be combined with
// --cuda-graphs; bf16 can). On the GPU the run starts a warm start named after its precision and
// autotune mode (cuda::warm_start): the cuDNN plans an earlier run used load on background threads
// while the data set is read.
// Data-parallel: scripts/launch -n N fashion_mnist ... trains on N ranks, each on its shard of
// every epoch with --batch images a step (dist::DataParallel on Gloo; batch-norm statistics stay
// local and rank 0's are copied to all before each evaluation); rank 0 prints and checkpoints.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <unistd.h>

#include "cutrain/cutrain.hpp"
#include "cutrain/data/idx.hpp"
#include "cutrain/data/loader.hpp"
#include "cutrain/dist/data_parallel.hpp"
#ifdef CUTRAIN_GLOO
#include "cutrain/dist/gloo.hpp"
#endif
#include "cutrain/nn.hpp"
#include "cutrain/optim/ema.hpp"
#include "fashion_mnist_args.hpp"
#ifdef CUTRAIN_WITH_CUDA
#include "cutrain/cuda/kernels/prebuild.hpp"
#include "cutrain/cuda/cudnn/plan_store.hpp"  // build_stats
#include "cutrain/cuda/warm_start.hpp"
#endif

using namespace cutrain;
using fashion_mnist_example::Args;
using fashion_mnist_example::parse;
using fashion_mnist_example::usage;
using Clock = std::chrono::steady_clock;

namespace {

Device pick_device(const std::string& want) {
#ifdef CUTRAIN_WITH_CUDA
  const bool gpu = cuda::available();
#else
  const bool gpu = false;
#endif
  if (want == "cuda") {
    if (!gpu) {
      std::cerr << "fashion_mnist: --device cuda, but "
                << (built_with_cuda ? "no GPU is present" : "cutrain was built without CUDA") << "\n";
      std::exit(2);
    }
    return Device::cuda(0);
  }
  if (want == "cpu") return Device::cpu();
  return gpu ? Device::cuda(0) : Device::cpu();
}

// The first n samples of a dataset (views, no copy).
data::ImageDataset<float> first(const data::ImageDataset<float>& ds, std::int64_t n) {
  if (n <= 0 || n >= ds.size()) return {ds.images.view(), ds.labels.view()};
  return {ds.images.slice(0, 0, n), ds.labels.slice(0, 0, n)};
}

struct Eval {
  double loss = 0, accuracy = 0;
};

// The test loss (of the images as they are) and accuracy; with mirrored, a loader of the same
// images flipped left-right, each prediction is from the two logits summed.
Eval evaluate(nn::Sequential<float>& net, nn::Precision precision, data::Loader<float>& test,
              data::Loader<float>* mirrored) {
  net.eval();
  autograd::NoGradGuard no_grad;
  double loss_sum = 0;
  std::vector<float> logits_sum;
  std::vector<std::int32_t> labels;
  for (auto [x, y] : test) {
    auto logits = nn::autocast(precision, net, x);
    loss_sum += static_cast<double>(nn::cross_entropy(logits, y).item()) * static_cast<double>(y.numel());
    const auto l = logits.value().to_vector();
    const auto t = y.to_vector();
    logits_sum.insert(logits_sum.end(), l.begin(), l.end());
    labels.insert(labels.end(), t.begin(), t.end());
  }
  if (mirrored != nullptr) {
    std::size_t at = 0;
    for (auto [x, y] : *mirrored)
      for (float v : nn::autocast(precision, net, x).value().to_vector()) logits_sum.at(at++) += v;
  }
  const std::int64_t n = static_cast<std::int64_t>(labels.size());
  std::int64_t correct = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    int best = 0;
    for (int c = 1; c < 10; ++c)
      if (logits_sum[static_cast<std::size_t>(i * 10 + c)] > logits_sum[static_cast<std::size_t>(i * 10 + best)])
        best = c;
    correct += best == labels[static_cast<std::size_t>(i)];
  }
  net.train();
  return {loss_sum / static_cast<double>(n), 100.0 * static_cast<double>(correct) / static_cast<double>(n)};
}

// The images flipped left-right (for test-time augmentation), in their own host storage.
data::ImageDataset<float> mirrored(const data::ImageDataset<float>& ds) {
  data::ImageDataset<float> out{ds.images.to(Device::cpu()), ds.labels.to(Device::cpu())};
  const std::int64_t w = out.images.shape()[3], rows = out.images.numel() / w;
  float* p = out.images.data();
  for (std::int64_t r = 0; r < rows; ++r) std::reverse(p + r * w, p + (r + 1) * w);
  return out;
}

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// Progress of one epoch: a bar redrawn in place on a terminal, a plain line every 100 steps
// (and at the end) otherwise, so that logs stay readable.
class Progress {
 public:
  Progress(int epoch, std::int64_t steps) : epoch_(epoch), steps_(steps), tty_(isatty(STDOUT_FILENO) != 0) {}
  bool wants(std::int64_t k) const { return k == steps_ || (tty_ ? k % 10 == 0 : k % 100 == 0); }
  void show(std::int64_t k, double loss, double images_per_s, double eta_s) const {
    if (tty_) {
      constexpr int width = 30;
      const int fill = static_cast<int>(width * k / steps_);
      std::printf("\repoch %d [%s%s] %lld/%lld loss %.4f %7.0f images/s ETA %3.0f s ", epoch_,
                  std::string(static_cast<std::size_t>(fill), '=').c_str(),
                  std::string(static_cast<std::size_t>(width - fill), ' ').c_str(), static_cast<long long>(k),
                  static_cast<long long>(steps_), loss, images_per_s, eta_s);
      if (k == steps_) std::printf("\n");
    } else {
      std::printf("epoch %d step %lld/%lld loss %.4f %.0f images/s ETA %.0f s\n", epoch_, static_cast<long long>(k),
                  static_cast<long long>(steps_), loss, images_per_s, eta_s);
    }
    std::fflush(stdout);
  }

 private:
  int epoch_;
  std::int64_t steps_;
  bool tty_;
};

// Copies one loss value (device or host) into slot k of losses, in stream order: the host reads
// the losses only when it reports, so eager GPU steps are not serialized by a read per step.
void record_loss(Tensor<float>& losses, std::int64_t k, const Tensor<float>& loss) {
  copy_bytes(losses.data() + k, losses.device(), loss.data(), loss.device(), sizeof(float));
}

}  // namespace

int main(int argc, char** argv) {
  const auto t_start = Clock::now();
  const Args args = parse(argc, argv);
  try {
    const auto env = dist::Env::from_environment();
    if (env.rank != 0 && !std::freopen("/dev/null", "w", stdout)) return 1;  // rank 0 prints
    const Device dev = pick_device(args.device);
    ConfigOverride seed;  // the kernel seed directory beside the program, while it runs (GPU)
    if (args.cuda_graphs && env.world_size > 1) usage("--cuda-graphs with several ranks: Gloo's collectives cannot be captured");
    if (args.recipe == "fast" && dev.is_cpu())
      usage("--recipe fast trains in bf16 with CUDA graphs, which need the GPU");
    if (args.cuda_graphs && dev.is_cpu()) usage("--cuda-graphs needs the GPU");
    if (args.precision != nn::Precision::f32 && dev.is_cpu())
      usage("--precision bf16 and f16 need the GPU (the CPU backend computes in f32 and f64)");
#ifdef CUTRAIN_WITH_CUDA
    cuda::autotune::set_mode(*cuda::autotune::parse_mode(args.autotune));
    if (args.deterministic) {
      auto o = cuda::autotune::options();
      o.deterministic_only = true;
      cuda::autotune::set_options(o);
    }
    if (!dev.is_cpu()) {
      // The build's seed directory (build/kernels) where CUTRAIN_KERNEL_SEED does not name one.
      seed = cuda::kernels::use_seed_beside_program();
      cuda::warm_start(cutrain::detail::cat("fashion_mnist-", nn::to_string(args.precision), "-", args.autotune,
                                            args.deterministic ? "-deterministic" : ""));
      // The NVRTC kernels this precision can launch that neither the cache nor the seed has,
      // compiled on background threads while the data loads (CUTRAIN_KERNEL_PREFETCH=0: off).
      // The speed run counts from process start: batch norm's NHWC forward on cutrain's kernels
      // (no cuDNN runtime compile on a fresh machine: 1.9 s there, for 2% of steady throughput),
      // unless CUTRAIN_BN_FORWARD says otherwise.
      if (args.recipe == "fast" && !std::getenv("CUTRAIN_BN_FORWARD"))
        cuda::kernels::fast_batch_norm_forward_channels_last() = true;
      cuda::kernels::prefetch(cuda::kernels::programs_for(args.precision == nn::Precision::bf16  ? "cutrain_bf16"
                                                          : args.precision == nn::Precision::f16 ? "cutrain_f16"
                                                                                                 : "float"),
                              cuda::kernels::detail::device_arch(dev.index));
    }
#endif

    data::ImageDataset<float> train_full, test_set;
    try {
      train_full = data::fashion_mnist<float>("train", args.data);
      test_set = data::fashion_mnist<float>("test", args.data);
    } catch (const IoError& e) {
      std::cerr << "fashion_mnist: cannot load Fashion-MNIST from " << args.data << ":\n  " << e.what()
                << "\nInstall it with `apt install dataset-fashion-mnist` (Debian package dataset-fashion-mnist, "
                   "files in /usr/share/datasets/fashion-mnist), or pass --data DIR / set CUTRAIN_FASHION_MNIST_DIR.\n";
      return 1;
    }
    const auto train_set = first(train_full, args.limit);

#ifdef CUTRAIN_WITH_CUDA
    // On the GPU everything runs on one stream of our own: a CUDA graph cannot be captured on the
    // default stream, and eager runs use the same one so that both behave alike.
    std::optional<cuda::Stream> stream;
    std::optional<cuda::StreamGuard> on_stream;
    if (!dev.is_cpu()) {
      stream.emplace(dev.index);
      on_stream.emplace(stream->get());
    }
#endif

    // Fashion-MNIST pixel statistics (of the [0, 1] training images). The last, smaller batch is
    // dropped: every step then has one shape (one set of cuDNN plans, and a CUDA graph fits all).
    const double mean = 0.2860, stdev = 0.3530;
    data::Loader train(train_set, {.batch = args.batch,
                                   .shuffle = true,
                                   .seed = args.seed,
                                   .drop_last = train_set.size() >= args.batch,
                                   .normalize_mean = mean,
                                   .normalize_std = stdev,
                                   .random_crop_padding = args.augment ? 2 : 0,
                                   .hflip = args.augment,
                                   .device = dev,
                                   .rank = env.rank,
                                   .world_size = env.world_size});
    data::Loader test(test_set, {.batch = 1000, .normalize_mean = mean, .normalize_std = stdev, .device = dev});
    const auto test_mirrored = args.tta ? mirrored(test_set) : data::ImageDataset<float>{};
    std::optional<data::Loader<float>> test_flipped;
    if (args.tta)
      test_flipped.emplace(test_mirrored, data::LoaderOptions{.batch = 1000, .normalize_mean = mean,
                                                              .normalize_std = stdev, .device = dev});

    Rng init(args.seed + 1);
    auto net = nn::fashion_mnist_cnn<float>(init, args.width);
    net.to(dev);
    if (args.channels_last) net.to(Layout::nhwc);  // the first conv's output too (ops::conv2d_forward)
    optim::AdamW opt(net.parameters(), {.lr = args.lr, .weight_decay = 5e-4});
    std::optional<optim::EMA<float>> ema;
    if (args.ema > 0) ema.emplace(net, optim::EMAOptions{.decay = args.ema});
    const std::int64_t steps_per_epoch = train.size(), total_steps = steps_per_epoch * args.epochs;
    const optim::OneCycleSchedule sched{.max_lr = args.lr, .total_steps = total_steps};
    const CrossEntropyParams loss_params{.label_smoothing = args.label_smoothing};
    optim::GradScaler<float> scaler;  // f16 only
    const bool scaled = args.precision == nn::Precision::f16;

    int first_epoch = 1;
    std::int64_t step = 0;
    if (args.resume) {
      const auto ck = Checkpoint::load(args.checkpoint);
      CUTRAIN_REQUIRE(ck.get_int("total_steps") == total_steps && ck.get_int("width") == args.width, InvalidArgument,
                      "fashion_mnist", args.checkpoint, " was written by a run with ", ck.get_int("total_steps"),
                      " total steps and width ", ck.get_int("width"), "; this run has ", total_steps, " and ",
                      args.width, " (resume with the same --epochs, --batch, --limit and --width)");
      const std::string saved_precision = ck.contains("precision") ? ck.get_string("precision") : "f32";
      CUTRAIN_REQUIRE(saved_precision == nn::to_string(args.precision), InvalidArgument, "fashion_mnist",
                      args.checkpoint, " was written by a run in ", saved_precision, "; this run is in ",
                      nn::to_string(args.precision), " (resume with the same --precision)");
      nn::load_module(ck, "model", net);
      opt.load_state(ck, "optimizer");
      if (scaled) scaler.load_state(ck, "scaler");
      first_epoch = static_cast<int>(ck.get_int("epoch")) + 1;
      step = ck.get_int("step");
      std::cout << "fashion_mnist: resumed from " << args.checkpoint << " after epoch " << first_epoch - 1
                << " (step " << step << ")" << std::endl;
    }
    train.set_epoch(first_epoch - 1);
    // Several ranks: rank 0's model everywhere, gradients averaged.
    dist::ProcessGroup* group = nullptr;  // one rank: none
#ifdef CUTRAIN_GLOO
    std::unique_ptr<dist::GlooWorld> world;
#endif
    std::unique_ptr<dist::DataParallel<nn::Sequential<float>>> dp;  // after world: destroyed before it
    if (env.world_size > 1) {
#ifdef CUTRAIN_GLOO
      world = std::make_unique<dist::GlooWorld>(env);
      group = &world->group;
      dp = std::make_unique<dist::DataParallel<nn::Sequential<float>>>(net, *group);
#else
      usage("WORLD_SIZE > 1, but this fashion_mnist was built without Gloo (Debian's libgloo-dev)");
#endif
    }

    std::cout << "fashion_mnist: " << env.world_size << " rank(s), device " << dev << ", " << train.samples_per_epoch() << " train / " << test_set.size()
              << " test images, batch " << args.batch << ", " << args.epochs << " epoch(s), " << steps_per_epoch
              << " steps/epoch, width " << args.width << ", AdamW max lr " << args.lr
              << (args.augment ? ", crop+flip" : "")
              << (args.label_smoothing > 0 ? ", label smoothing " + std::to_string(args.label_smoothing) : "")
              << (args.ema > 0 ? ", EMA " + std::to_string(args.ema) : "") << (args.tta ? ", flip TTA" : "")
              << (args.cuda_graphs ? ", CUDA graphs" : "") << (args.channels_last ? ", channels-last" : "")
              << (dev.is_cpu() ? "" : ", autotune " + args.autotune)
              << (args.deterministic ? ", deterministic" : "") << ", " << nn::to_string(args.precision)
              << std::endl;

    std::ofstream csv;
    if (!args.csv.empty()) {
      csv.open(args.csv, args.resume ? std::ios::app : std::ios::trunc);
      if (!csv) throw IoError("fashion_mnist", "cannot write " + args.csv);
      if (!args.resume) csv << "epoch,train_loss,test_loss,test_accuracy,epoch_seconds,images_per_s\n";
    }

    // One training step as the user writes it; with --cuda-graphs it is captured once (after a
    // first, eager step that builds every plan) and replayed on inputs copied into x_in, y_in.
    auto train_step = [&](const Tensor<float>& x, const Tensor<std::int32_t>& y) {
      auto loss = nn::cross_entropy(nn::autocast(args.precision, net, x), y, loss_params);
      opt.zero_grad();
      if (scaled) {
        scaler.backward(loss);
        if (dp) dp->finish();
        scaler.step(opt);
      } else {
        loss.backward();
        if (dp) dp->finish();
        opt.step();
      }
      return loss;
    };
#ifdef CUTRAIN_WITH_CUDA
    std::optional<cuda::CudaGraph> graph;
    Tensor<float> x_in;
    Tensor<std::int32_t> y_in;
    autograd::Var<float> graph_loss;
#endif

    Tensor<float> losses(Shape{steps_per_epoch}, {.device = dev});
    std::int64_t images_total = 0;
    double train_seconds = 0;
    Eval last{};
    std::optional<double> reached;  // seconds from process start to args.target
    // CUTRAIN_PROFILE=1: the ops of steps 50 to 99 timed and tabled (core/profile.hpp; the ops of
    // a replayed CUDA graph are not dispatched one by one, so profile without --cuda-graphs).
    std::unique_ptr<profile::Session> prof;
    net.train();
    for (int epoch = first_epoch; epoch <= args.epochs; ++epoch) {
      const auto t_epoch = Clock::now();
      auto t_window = t_epoch;
      std::int64_t seen = 0, window_from = 0, k = 0;
      const Progress progress(epoch, steps_per_epoch);
      for (auto [x, y] : train) {
        if (step == 50) prof = profile::Session::from_env();
        if (step == 100 && prof) {
          std::fprintf(stderr, "\nprofile of steps 50-99:");
          prof.reset();
        }
        opt.set_lr(sched(step));
#ifdef CUTRAIN_WITH_CUDA
        if (args.cuda_graphs) {
          if (!graph) {
            x_in = Tensor<float>(x.shape(), {.layout = x.layout(), .device = dev});
            y_in = Tensor<std::int32_t>(y.shape(), {.device = dev});
          }
          x_in.copy_from(x);
          y_in.copy_from(y);
          if (!graph) {
            record_loss(losses, k, train_step(x_in, y_in).value());  // warm-up: builds plans, loads kernels
            graph.emplace();
            graph->capture([&] { graph_loss = train_step(x_in, y_in); });
          } else {
            graph->replay();
            record_loss(losses, k, graph_loss.value());
          }
        } else
#endif
        {
          record_loss(losses, k, train_step(x, y).value());
        }
        if (ema) ema->update();
        ++step;
        ++k;
        seen += y.numel();
        if (progress.wants(k)) {
          const auto lv = losses.slice(0, window_from, k).to_vector();  // waits for the GPU
          double l = 0;
          for (float v : lv) l += v;
          const auto now = Clock::now();
          const double rate = static_cast<double>((k - window_from) * args.batch * env.world_size) / seconds(t_window, now);
          const double eta = static_cast<double>(total_steps - step) * static_cast<double>(args.batch) / rate;
          progress.show(k, l / static_cast<double>(lv.size()), rate, eta);
          t_window = now;
          window_from = k;
        }
      }
      const double epoch_s = seconds(t_epoch, Clock::now());
      train_seconds += epoch_s;
      seen *= env.world_size;
      images_total += seen;
      double train_loss = 0;
      for (float v : losses.slice(0, 0, k).to_vector()) train_loss += v;
      train_loss /= static_cast<double>(k);
      // With --ema the averages are evaluated and checkpointed (swapped in for the scope).
      std::optional<optim::EMA<float>::Swapped> averaged;
      if (ema) averaged.emplace(*ema);
      if (dp) dp->sync_buffers();  // every rank evaluates rank 0's model: the same stop decisions
      last = evaluate(net, args.precision, test, test_flipped ? &*test_flipped : nullptr);
      std::printf("epoch %d: train loss %.4f, test loss %.4f, test accuracy %.2f%%, %.1f s, %.0f images/s\n", epoch,
                  train_loss, last.loss, last.accuracy, epoch_s, static_cast<double>(seen) / epoch_s);
      if (args.target > 0 && last.accuracy >= args.target && !reached) {
        reached = seconds(t_start, Clock::now());
        std::printf("time to %.1f%% test accuracy: %.2f s from process start\n", args.target, *reached);
      }
      if (csv) {
        csv << epoch << ',' << train_loss << ',' << last.loss << ',' << last.accuracy << ',' << epoch_s << ','
            << static_cast<double>(seen) / epoch_s << '\n';
        csv.flush();
      }
      if (!args.checkpoint.empty() && env.rank == 0) {
        Checkpoint ck;
        nn::save_module(ck, "model", net);
        opt.save_state(ck, "optimizer");
        if (scaled) scaler.save_state(ck, "scaler");
        ck.put_int("epoch", epoch);
        ck.put_int("step", step);
        ck.put_int("total_steps", total_steps);
        ck.put_int("width", args.width);
        ck.put_string("precision", std::string(nn::to_string(args.precision)));
        ck.save(args.checkpoint);
      }
      if (reached && args.stop_at_target) break;
      if (epoch == args.stop_after && epoch < args.epochs) {
        std::printf("stopped after epoch %d of %d (--stop-after); continue with --resume\n", epoch, args.epochs);
        if (group) group->barrier();
        return 0;
      }
    }
    if (scaled)
      std::printf("loss scale %g, %lld step(s) skipped on overflow\n", scaler.scale(),
                  static_cast<long long>(scaler.skipped_steps()));
    if (args.target > 0 && !reached) std::printf("time to %.1f%% test accuracy: not reached\n", args.target);
    std::printf("total wall time %.1f s from process start\n", seconds(t_start, Clock::now()));
#ifdef CUTRAIN_WITH_CUDA
    if (!dev.is_cpu()) {
      const auto& k = cuda::kernels::stats();
      std::printf("NVRTC kernels: %llu compiled, %llu from the disk cache, %llu from a seed directory, %llu waited for "
                  "a prefetch; %.1f s in first loads\n",
                  static_cast<unsigned long long>(k.compiles.load()), static_cast<unsigned long long>(k.disk_hits.load()),
                  static_cast<unsigned long long>(k.seed_hits.load()),
                  static_cast<unsigned long long>(k.prefetch_waits.load()), static_cast<double>(k.load_micros.load()) / 1e6);
      const auto& b = cuda::cudnn::build_stats();
      std::printf("cuDNN graphs: %lld built or loaded (%lld from plan files, %lld by the warm start), %.1f s in all\n",
                  static_cast<long long>(b.graphs.load()), static_cast<long long>(b.from_files.load()),
                  static_cast<long long>(b.warm.load()), static_cast<double>(b.micros.load()) / 1e6);
    }
#endif
    std::printf("final test accuracy %.2f%%, %.0f images/s\n", last.accuracy,
                train_seconds > 0 ? static_cast<double>(images_total) / train_seconds : 0.0);
    if (group) group->barrier();  // rank 0's store outlives the others' use of it
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "fashion_mnist: " << e.what() << "\n";
    return 1;
  }
}
