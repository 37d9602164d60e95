// A short CPU demo of the ops, forward and backward, on real data: a small CNN
//   conv3x3(1->8) + bias, batch norm, relu, max pool 2, flatten, linear(8*14*14 -> 10), cross-entropy
// trained with plain SGD by calling the ops and their backward functions by hand (the autograd
// layer will do this bookkeeping). Prints the loss as it goes, the test accuracy, and where the
// time went.
//   build/examples/ops_demo [steps=300] [batch=64]
#include <cutrain/cpu.hpp>
#include <cutrain/data/idx.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

using namespace cutrain;
using Clock = std::chrono::steady_clock;

namespace {
std::map<std::string, double> seconds;  // time per op, for the closing table

template <class F>
auto timed(const char* name, F&& f) {
  const auto t0 = Clock::now();
  auto r = f();
  seconds[name] += std::chrono::duration<double>(Clock::now() - t0).count();
  return r;
}

// In-place SGD step: p -= lr * g.
void sgd(Tensor<float>& p, const Tensor<float>& g, float lr) {
  p = ops::add(p, ops::scale(g, -lr));
}

struct Net {
  Tensor<float> conv_w, conv_b, gamma, beta, run_mean, run_var, fc_w, fc_b;
};
}  // namespace

int main(int argc, char** argv) try {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 300;
  const int batch = argc > 2 ? std::atoi(argv[2]) : 64;
  const auto t_start = Clock::now();
  const auto train = data::fashion_mnist<float>("train");
  const auto test = data::fashion_mnist<float>("test");
  std::printf("cutrain %s ops demo: Fashion-MNIST %lld train / %lld test images, %d steps of batch %d\n",
              version_string, static_cast<long long>(train.size()), static_cast<long long>(test.size()), steps, batch);

  Rng rng(1234);
  Net n{Tensor<float>::randn({8, 1, 3, 3}, rng, std::sqrt(2.0 / 9)),
        Tensor<float>::zeros({8}),
        Tensor<float>::full({8}, 1.f),
        Tensor<float>::zeros({8}),
        Tensor<float>::zeros({8}),
        Tensor<float>::full({8}, 1.f),
        Tensor<float>::randn({10, 8 * 14 * 14}, rng, std::sqrt(1.0 / (8 * 14 * 14))),
        Tensor<float>::zeros({10})};
  const auto conv = Conv2dParams::make(1, 1);
  const auto pool = Pool2dParams::max(2);
  const ActivationParams relu{.kind = Activation::relu};
  const float lr = 0.05f;

  for (int step = 0; step < steps; ++step) {
    const std::int64_t begin = (static_cast<std::int64_t>(step) * batch) % (train.size() - batch);
    auto x = train.images.slice(0, begin, begin + batch);
    auto y = train.labels.slice(0, begin, begin + batch);
    // forward
    auto c = timed("conv2d_forward", [&] { return ops::conv2d_forward(x, n.conv_w, n.conv_b, conv); });
    auto bn = timed("batch_norm_forward", [&] {
      return ops::batch_norm_forward_training(c, n.gamma, n.beta, n.run_mean, n.run_var, {});
    });
    auto a = timed("activation_forward", [&] { return ops::activation_forward(bn.y, relu); });
    auto p = timed("pool2d_forward", [&] { return ops::pool2d_forward(a, pool); });
    auto f = ops::flatten(p);
    auto logits = timed("linear_forward", [&] { return ops::linear_forward(f, n.fc_w, n.fc_b); });
    auto loss = ops::cross_entropy_forward(logits, y, {});
    // backward
    auto dlogits = timed("cross_entropy_backward", [&] { return ops::cross_entropy_backward(logits, y, 1.f, {}); });
    auto fc = timed("linear_backward", [&] { return ops::linear_backward(f, n.fc_w, dlogits); });
    auto dp = ops::flatten_backward(fc.dx, p.shape(), p.layout());
    auto da = timed("pool2d_backward", [&] { return ops::pool2d_backward(a, p, dp, pool); });
    auto dbn = timed("activation_backward", [&] { return ops::activation_backward(bn.y, da, relu); });
    auto bnb = timed("batch_norm_backward", [&] {
      return ops::batch_norm_backward(c, dbn, n.gamma, bn.save_mean, bn.save_inv_std);
    });
    auto dw = timed("conv2d_backward_filter", [&] { return ops::conv2d_backward_filter(bnb.dx, x, n.conv_w.shape(), conv); });
    auto db = timed("conv2d_backward_bias", [&] { return ops::conv2d_backward_bias(bnb.dx); });
    sgd(n.conv_w, dw, lr);
    sgd(n.conv_b, db, lr);
    sgd(n.gamma, bnb.dgamma, lr);
    sgd(n.beta, bnb.dbeta, lr);
    sgd(n.fc_w, fc.dw, lr);
    sgd(n.fc_b, fc.db, lr);
    if (step % 50 == 0 || step == steps - 1)
      std::printf("step %4d  loss %.4f\n", step, static_cast<double>(loss.to_vector()[0]));
  }

  // Test accuracy with the running batch-norm statistics.
  std::int64_t correct = 0;
  for (std::int64_t b = 0; b < test.size(); b += 500) {
    auto x = test.images.slice(0, b, b + 500);
    auto c = ops::conv2d_forward(x, n.conv_w, n.conv_b, conv);
    auto bn = ops::batch_norm_forward_inference(c, n.gamma, n.beta, n.run_mean, n.run_var);
    auto logits = ops::linear_forward(ops::flatten(ops::pool2d_forward(ops::activation_forward(bn, relu), pool)), n.fc_w, n.fc_b);
    const auto v = logits.to_vector();
    for (std::int64_t i = 0; i < 500; ++i) {
      int best = 0;
      for (int k = 1; k < 10; ++k)
        if (v[static_cast<std::size_t>(i * 10 + k)] > v[static_cast<std::size_t>(i * 10 + best)]) best = k;
      correct += best == test.labels.data()[b + i];
    }
  }
  std::printf("\ntime per op (ms per step):\n");
  for (const auto& [name, s] : seconds) std::printf("  %-24s %8.3f\n", name.c_str(), 1e3 * s / steps);
  const double total = std::chrono::duration<double>(Clock::now() - t_start).count();
  std::printf("test accuracy %.2f%% after %d steps (%.1f s in all, %.0f train images/s)\n",
              100.0 * static_cast<double>(correct) / static_cast<double>(test.size()), steps, total,
              steps * batch / total);
  return 0;
} catch (const cutrain::Error& e) {
  std::fprintf(stderr, "ops_demo: %s\n", e.what());
  return 1;
}
