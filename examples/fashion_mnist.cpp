// Trains the reference CNN on Fashion-MNIST (conv3x3 1->32, BN, ReLU, maxpool, conv3x3 32->64, BN,
// ReLU, maxpool, linear 3136->256, ReLU, linear 256->10) with AdamW and a one-cycle schedule.
// On the CPU by default; on cuda:0 when cutrain was built with CUDA and a GPU is present.
//
//   fashion_mnist [--device cpu|cuda] [--epochs N] [--batch N] [--lr X] [--seed N] [--data DIR]
//                 [--limit N] [--csv FILE] [--augment]
//
// Prints per-epoch train loss, test loss and accuracy, plain progress lines every ~50 steps, and
// as the last line: "final test accuracy XX.XX%, YYYY images/s".
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iostream>
#include <string>

#include "cutrain/cutrain.hpp"
#include "cutrain/data/idx.hpp"
#include "cutrain/data/loader.hpp"
#include "cutrain/nn.hpp"

using namespace cutrain;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  std::string device;  // "" = auto
  int epochs = 1;
  std::int64_t batch = 128;
  double lr = 2e-3;
  std::uint64_t seed = 0;
  std::string data = data::fashion_mnist_dir();
  std::int64_t limit = 0;  // 0 = all
  std::string csv;
  bool augment = false;
};

[[noreturn]] void usage(const std::string& msg) {
  std::cerr << "fashion_mnist: " << msg << "\n"
            << "usage: fashion_mnist [--device cpu|cuda] [--epochs N] [--batch N] [--lr X] [--seed N]\n"
            << "                     [--data DIR] [--limit N] [--csv FILE] [--augment]\n";
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(f + " needs a value");
      return argv[++i];
    };
    try {
      if (f == "--device") a.device = value();
      else if (f == "--epochs") a.epochs = std::stoi(value());
      else if (f == "--batch") a.batch = std::stoll(value());
      else if (f == "--lr") a.lr = std::stod(value());
      else if (f == "--seed") a.seed = std::stoull(value());
      else if (f == "--data") a.data = value();
      else if (f == "--limit") a.limit = std::stoll(value());
      else if (f == "--csv") a.csv = value();
      else if (f == "--augment") a.augment = true;
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
  return a;
}

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

Eval evaluate(nn::Sequential<float>& net, data::Loader<float>& test) {
  net.eval();
  autograd::NoGradGuard no_grad;
  double loss_sum = 0;
  std::int64_t correct = 0, n = 0;
  for (auto [x, y] : test) {
    const std::int64_t b = y.numel();
    auto logits = net(x);
    loss_sum += static_cast<double>(nn::cross_entropy(logits, y).item()) * static_cast<double>(b);
    const auto l = logits.value().to_vector();
    const auto t = y.to_vector();
    for (std::int64_t i = 0; i < b; ++i) {
      int best = 0;
      for (int c = 1; c < 10; ++c)
        if (l[static_cast<std::size_t>(i * 10 + c)] > l[static_cast<std::size_t>(i * 10 + best)]) best = c;
      correct += best == t[static_cast<std::size_t>(i)];
    }
    n += b;
  }
  net.train();
  return {loss_sum / static_cast<double>(n), 100.0 * static_cast<double>(correct) / static_cast<double>(n)};
}

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

}  // namespace

int main(int argc, char** argv) {
  const auto t_start = Clock::now();
  const Args args = parse(argc, argv);
  try {
    const Device dev = pick_device(args.device);

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

    // Fashion-MNIST pixel statistics (of the [0, 1] training images).
    const double mean = 0.2860, stdev = 0.3530;
    data::Loader train(train_set, {.batch = args.batch,
                                   .shuffle = true,
                                   .seed = args.seed,
                                   .normalize_mean = mean,
                                   .normalize_std = stdev,
                                   .random_crop_padding = args.augment ? 2 : 0,
                                   .hflip = args.augment,
                                   .device = dev});
    data::Loader test(test_set, {.batch = 1000, .normalize_mean = mean, .normalize_std = stdev, .device = dev});

    Rng init(args.seed + 1);
    nn::Sequential<float> net{nn::Conv2d<float>({.in = 1, .out = 32, .kernel = 3, .padding = 1}, init),
                              nn::BatchNorm2d<float>({.features = 32}),
                              nn::ReLU{},
                              nn::MaxPool2d({.kernel = 2}),
                              nn::Conv2d<float>({.in = 32, .out = 64, .kernel = 3, .padding = 1}, init),
                              nn::BatchNorm2d<float>({.features = 64}),
                              nn::ReLU{},
                              nn::MaxPool2d({.kernel = 2}),
                              nn::Flatten{},
                              nn::Linear<float>({.in = 64 * 7 * 7, .out = 256}, init),
                              nn::ReLU{},
                              nn::Linear<float>({.in = 256, .out = 10}, init)};
    net.to(dev);
    optim::AdamW opt(net.parameters(), {.lr = args.lr, .weight_decay = 5e-4});
    const std::int64_t steps_per_epoch = train.size(), total_steps = steps_per_epoch * args.epochs;
    const optim::OneCycleSchedule sched{.max_lr = args.lr, .total_steps = total_steps};

    std::cout << "fashion_mnist: device " << dev << ", " << train.samples_per_epoch() << " train / " << test_set.size()
              << " test images, batch " << args.batch << ", " << args.epochs << " epoch(s), " << steps_per_epoch
              << " steps/epoch, AdamW max lr " << args.lr << (args.augment ? ", crop+flip" : "") << std::endl;

    std::ofstream csv;
    if (!args.csv.empty()) {
      csv.open(args.csv);
      if (!csv) throw IoError("fashion_mnist", "cannot write " + args.csv);
      csv << "epoch,train_loss,test_loss,test_accuracy,epoch_seconds,images_per_s\n";
    }

    std::int64_t step = 0, images_total = 0;
    double train_seconds = 0;
    Eval last{};
    net.train();
    for (int epoch = 1; epoch <= args.epochs; ++epoch) {
      const auto t_epoch = Clock::now();
      auto t_window = t_epoch;
      double loss_sum = 0, window_loss = 0;
      std::int64_t seen = 0, window_images = 0, window_steps = 0, k = 0;
      for (auto [x, y] : train) {
        const std::int64_t b = y.numel();
        auto loss = nn::cross_entropy(net(x), y);
        opt.zero_grad();
        loss.backward();
        opt.set_lr(sched(step));
        opt.step();
        ++step;
        ++k;
        const double l = loss.item();
        loss_sum += l * static_cast<double>(b);
        seen += b;
        window_loss += l;
        window_images += b;
        ++window_steps;
        if (k == 1 || k % 50 == 0 || k == steps_per_epoch) {
          const auto now = Clock::now();
          std::printf("epoch %d step %lld/%lld loss %.4f %.0f images/s\n", epoch, static_cast<long long>(k),
                      static_cast<long long>(steps_per_epoch), window_loss / static_cast<double>(window_steps),
                      static_cast<double>(window_images) / seconds(t_window, now));
          std::fflush(stdout);
          t_window = now;
          window_loss = 0;
          window_images = window_steps = 0;
        }
      }
      const double epoch_s = seconds(t_epoch, Clock::now());
      train_seconds += epoch_s;
      images_total += seen;
      last = evaluate(net, test);
      const double train_loss = loss_sum / static_cast<double>(seen);
      std::printf("epoch %d: train loss %.4f, test loss %.4f, test accuracy %.2f%%, %.1f s, %.0f images/s\n", epoch,
                  train_loss, last.loss, last.accuracy, epoch_s, static_cast<double>(seen) / epoch_s);
      if (csv) {
        csv << epoch << ',' << train_loss << ',' << last.loss << ',' << last.accuracy << ',' << epoch_s << ','
            << static_cast<double>(seen) / epoch_s << '\n';
        csv.flush();
      }
    }
    std::printf("total wall time %.1f s from process start\n", seconds(t_start, Clock::now()));
    std::printf("final test accuracy %.2f%%, %.0f images/s\n", last.accuracy,
                static_cast<double>(images_total) / train_seconds);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "fashion_mnist: " << e.what() << "\n";
    return 1;
  }
}
