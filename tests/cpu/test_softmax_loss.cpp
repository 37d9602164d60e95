// Softmax, log-softmax and cross-entropy: hand-computed rows, large logits, gradient checks,
// float against double, and bad input.
#include "gradcheck.hpp"

#include <cmath>

#include "cutrain/ops/cross_entropy.hpp"
#include "cutrain/ops/softmax.hpp"

namespace cutrain_test_softmax_loss {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;

namespace {
Tensor<std::int32_t> labels_of(const std::vector<std::int32_t>& v) {
  return Tensor<std::int32_t>::from_vector(v, {static_cast<std::int64_t>(v.size())});
}

Tensor<float> to_float(const Tensor<double>& t) {
  const auto v = t.to_vector();
  return Tensor<float>::from_vector(std::vector<float>(v.begin(), v.end()), t.shape());
}
}  // namespace

TEST_CASE("softmax: hand-computed rows") {
  const double l2 = std::log(2.0), l3 = std::log(3.0), l6 = std::log(6.0);
  // row 0: exp = 1, 2, 3, sum 6. row 1: shifted by 100, exp proportional to 1, 3, 1, sum 5.
  auto x = Tensor<double>::from_vector({0, l2, l3, 100, 100 + l3, 100}, {2, 3});
  require_close(ops::softmax_forward(x), {1.0 / 6, 1.0 / 3, 0.5, 0.2, 0.6, 0.2}, 1e-12);
  // log(1/6) = -ln6, log(2/6) = -ln3, log(3/6) = -ln2; row 1: -ln5, ln3 - ln5, -ln5
  const double l5 = std::log(5.0);
  require_close(ops::log_softmax_forward(x), {-l6, -l3, -l2, -l5, l3 - l5, -l5}, 1e-12);

  // Backward by hand on row [1/6, 1/3, 1/2] with dy = [1, 0, 0]: sum dy*y = 1/6,
  // dx = y * (dy - 1/6) = [1/6 * 5/6, 1/3 * -1/6, 1/2 * -1/6] = [5/36, -1/18, -1/12].
  auto y = ops::softmax_forward(x.slice(0, 0, 1));
  auto dy = Tensor<double>::from_vector({1, 0, 0}, {1, 3});
  require_close(ops::softmax_backward(y, dy), {5.0 / 36, -1.0 / 18, -1.0 / 12}, 1e-12);
  // log-softmax: dx = dy - softmax * sum(dy) = [1 - 1/6, -1/3, -1/2].
  auto ly = ops::log_softmax_forward(x.slice(0, 0, 1));
  require_close(ops::log_softmax_backward(ly, dy), {5.0 / 6, -1.0 / 3, -0.5}, 1e-12);
}

TEST_CASE("softmax: large logits stay finite, strided input, one class") {
  // exp(1000) overflows a double; the row maximum is subtracted first.
  auto x = Tensor<double>::from_vector({1000, 1000, -1000, 1000, 999, 1001}, {2, 3});
  auto y = ops::softmax_forward(x);
  require_close(y.slice(0, 0, 1), {0.5, 0.5, 0}, 1e-12);
  auto ly = ops::log_softmax_forward(x);
  // row 0: -ln2, -ln2, -2000 - ln2
  require_close(ly.slice(0, 0, 1), {-std::log(2.0), -std::log(2.0), -2000 - std::log(2.0)}, 1e-12);
  for (double v : y.to_vector()) CHECK(std::isfinite(v));
  for (double v : ly.to_vector()) CHECK(std::isfinite(v));
  double row1 = 0;
  for (int c = 0; c < 3; ++c) row1 += y(1, c);
  CHECK(row1 == Approx(1.0).epsilon(1e-14));

  auto xf = to_float(x);
  auto loss = ops::cross_entropy_forward(xf, labels_of({0, 1}), {});
  CHECK(std::isfinite(loss.flat(0)));
  // row 0 label 0: ln2. row 1 label 1 (999 among 1000, 999, 1001): 2 + ln(e^-1 + e^-2 + 1).
  const double want = (std::log(2.0) + 2 + std::log(std::exp(-1.0) + std::exp(-2.0) + 1)) / 2;
  CHECK(loss.flat(0) == Approx(want).epsilon(1e-6));
  for (float v : ops::cross_entropy_backward(xf, labels_of({0, 1}), 1.0, {}).to_vector()) CHECK(std::isfinite(v));
  for (float v : ops::softmax_forward(xf).to_vector()) CHECK(std::isfinite(v));

  // A column slice is strided; the result is the same as for a contiguous copy.
  auto wide = Tensor<double>::from_vector({7, 0, std::log(2.0), std::log(3.0)}, {1, 4});
  require_close(ops::softmax_forward(wide.slice(1, 1, 4)), {1.0 / 6, 1.0 / 3, 0.5}, 1e-12);
  // One class: softmax is 1, log-softmax is 0.
  auto one = Tensor<double>::from_vector({-3, 42}, {2, 1});
  require_close(ops::softmax_forward(one), {1, 1});
  require_close(ops::log_softmax_forward(one), {0, 0});
}

TEST_CASE("cross_entropy: hand-computed 2x3 case, with and without label smoothing") {
  const double l2 = std::log(2.0), l3 = std::log(3.0);
  // row 0 [0, ln2, ln3]: -log_softmax = [ln6, ln3, ln2]; row 1 [ln2, ln2, 0]: exp 2, 2, 1, sum 5,
  // -log_softmax = [ln2.5, ln2.5, ln5].
  auto logits = Tensor<double>::from_vector({0, l2, l3, l2, l2, 0}, {2, 3});
  auto labels = labels_of({2, 0});
  // no smoothing: ln2 + ln2.5 = ln5
  auto sum = ops::cross_entropy_forward(logits, labels, {.reduction = Reduction::sum});
  CHECK(sum.rank() == 0);
  CHECK(sum.numel() == 1);
  require_close(sum, {std::log(5.0)}, 1e-12);
  require_close(ops::cross_entropy_forward(logits, labels, {}), {std::log(5.0) / 2}, 1e-12);
  // eps = 0.3, C = 3: q = 0.7 onehot + 0.1. row 0: 0.7 ln2 + 0.1 (ln6 + ln3 + ln2) = 0.7 ln2 + 0.1 ln36;
  // row 1: 0.7 ln2.5 + 0.1 (2 ln2.5 + ln5) = 0.7 ln2.5 + 0.1 ln31.25; total 0.7 ln5 + 0.1 ln1125.
  const double smooth = 0.7 * std::log(5.0) + 0.1 * std::log(1125.0);
  require_close(ops::cross_entropy_forward(logits, labels, {.reduction = Reduction::sum, .label_smoothing = 0.3}),
                {smooth}, 1e-12);
  require_close(ops::cross_entropy_forward(logits, labels, {.label_smoothing = 0.3}), {smooth / 2}, 1e-12);

  // Gradient, mean, dloss 1: (softmax - onehot) / 2. softmax row 0 [1/6, 1/3, 1/2], row 1 [0.4, 0.4, 0.2].
  require_close(ops::cross_entropy_backward(logits, labels, 1.0, {}),
                {1.0 / 12, 1.0 / 6, -0.25, -0.3, 0.2, 0.1}, 1e-12);
  // Sum, eps 0.3, dloss 2: 2 (softmax - q), q row 0 [0.1, 0.1, 0.8], row 1 [0.8, 0.1, 0.1].
  require_close(ops::cross_entropy_backward(logits, labels, 2.0, {.reduction = Reduction::sum, .label_smoothing = 0.3}),
                {2 * (1.0 / 6 - 0.1), 2 * (1.0 / 3 - 0.1), 2 * (0.5 - 0.8), 2 * (0.4 - 0.8), 2 * 0.3, 2 * 0.1}, 1e-12);

  // Summed over an empty batch the loss is 0 (the mean is refused, see bad input).
  auto empty = Tensor<double>::zeros({0, 3});
  require_close(ops::cross_entropy_forward(empty, labels_of({}), {.reduction = Reduction::sum}), {0});
  CHECK(ops::cross_entropy_backward(empty, labels_of({}), 1.0, {.reduction = Reduction::sum}).shape() == Shape{0, 3});
}

TEST_CASE("gradcheck: softmax_backward") {
  struct Case { std::int64_t n, c; bool strided; };
  for (Case k : {Case{1, 7, false}, Case{5, 3, false}, Case{4, 1, false}, Case{3, 5, true}}) {
    Rng rng(200 + static_cast<std::uint64_t>(k.n * 10 + k.c));
    // a strided x is a column slice of a wider tensor
    auto full = random({k.n, k.c + (k.strided ? 2 : 0)}, rng);
    auto x = k.strided ? full.slice(1, 1, 1 + k.c) : full.view();
    auto r = random({k.n, k.c}, rng);
    auto dx = ops::softmax_backward(ops::softmax_forward(x), r);
    gradcheck(detail::cat("softmax N", k.n, " C", k.c, k.strided ? " strided" : ""), x,
              [&] { return ops::softmax_forward(x); }, dx, r);
  }
}

TEST_CASE("gradcheck: log_softmax_backward") {
  struct Case { std::int64_t n, c; bool strided; };
  for (Case k : {Case{1, 7, false}, Case{5, 3, false}, Case{4, 1, false}, Case{3, 5, true}}) {
    Rng rng(300 + static_cast<std::uint64_t>(k.n * 10 + k.c));
    auto full = random({k.n, k.c + (k.strided ? 2 : 0)}, rng);
    auto x = k.strided ? full.slice(1, 1, 1 + k.c) : full.view();
    auto r = random({k.n, k.c}, rng);
    auto dx = ops::log_softmax_backward(ops::log_softmax_forward(x), r);
    gradcheck(detail::cat("log_softmax N", k.n, " C", k.c, k.strided ? " strided" : ""), x,
              [&] { return ops::log_softmax_forward(x); }, dx, r);
  }
}

TEST_CASE("gradcheck: cross_entropy_backward, mean and sum, with and without label smoothing") {
  struct Case { std::int64_t n, c; };
  for (Case k : {Case{1, 5}, Case{6, 3}, Case{3, 10}}) {
    for (Reduction red : {Reduction::mean, Reduction::sum}) {
      for (double eps : {0.0, 0.1, 0.45}) {
        Rng rng(400 + static_cast<std::uint64_t>(k.n * 100 + k.c) + (red == Reduction::sum ? 7 : 0));
        auto x = Tensor<double>::uniform({k.n, k.c}, rng, -3.0, 3.0);
        std::vector<std::int32_t> lab(static_cast<std::size_t>(k.n));
        for (auto& l : lab) l = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(k.c)));
        auto labels = labels_of(lab);
        auto r = Tensor<double>::from_vector({rng.uniform(-2.0, 2.0)}, Shape{});
        const CrossEntropyParams p{.reduction = red, .label_smoothing = eps};
        auto dx = ops::cross_entropy_backward(x, labels, r.flat(0), p);
        gradcheck(detail::cat("cross_entropy N", k.n, " C", k.c, " ", red, " eps ", eps), x,
                  [&] { return ops::cross_entropy_forward(x, labels, p); }, dx, r);
      }
    }
  }
}

TEST_CASE("softmax: float matches double") {
  Rng rng(11);
  auto x = Tensor<double>::uniform({6, 9}, rng, -4.0, 4.0);
  auto dy = random({6, 9}, rng);
  auto xf = to_float(x), dyf = to_float(dy);
  require_close(ops::softmax_forward(xf), ops::softmax_forward(x).to_vector(), 1e-5);
  require_close(ops::log_softmax_forward(xf), ops::log_softmax_forward(x).to_vector(), 1e-5);
  require_close(ops::softmax_backward(ops::softmax_forward(xf), dyf),
                ops::softmax_backward(ops::softmax_forward(x), dy).to_vector(), 1e-5);
  auto labels = labels_of({0, 8, 3, 3, 1, 7});
  const CrossEntropyParams p{.label_smoothing = 0.1};
  require_close(ops::cross_entropy_forward(xf, labels, p), ops::cross_entropy_forward(x, labels, p).to_vector(), 1e-5);
  require_close(ops::cross_entropy_backward(xf, labels, 1.5f, p),
                ops::cross_entropy_backward(x, labels, 1.5, p).to_vector(), 1e-5);
}

TEST_CASE("softmax: bad input") {
  Rng rng(12);
  auto x = random({3, 4}, rng);
  CUTRAIN_REQUIRE_THROWS_OP(ops::softmax_forward(Tensor<double>{}), InvalidArgument, "softmax_forward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::softmax_forward(random({4}, rng), 1), InvalidArgument, "softmax_forward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::softmax_forward(random({2, 3, 4}, rng), -4), InvalidArgument, "softmax_forward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::softmax_forward(Tensor<double>::zeros(Shape{})), InvalidArgument, "softmax_forward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::softmax_forward(Tensor<double>::zeros({2, 0, 3}), 1), InvalidArgument,
                            "softmax_forward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::softmax_forward(Tensor<double>::zeros({3, 0})), InvalidArgument, "softmax_forward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::log_softmax_forward(Tensor<double>::zeros({3, 0})), InvalidArgument,
                            "log_softmax_forward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::log_softmax_forward(random({1, 3, 4, 4}, rng), 4), InvalidArgument,
                            "log_softmax_forward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::softmax_backward(x, random({4, 3}, rng)), InvalidArgument, "softmax_backward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::softmax_backward(x, Tensor<double>{}), InvalidArgument, "softmax_backward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::softmax_backward(random({12}, rng), random({12}, rng), 1), InvalidArgument,
                            "softmax_backward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::log_softmax_backward(x, random({3, 5}, rng)), InvalidArgument, "log_softmax_backward");
  auto h = Tensor<half>::zeros({2, 3});
  CUTRAIN_REQUIRE_THROWS_OP(ops::softmax_forward(h), NotImplemented, "softmax_forward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::log_softmax_forward(h), NotImplemented, "log_softmax_forward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::softmax_backward(h, h), NotImplemented, "softmax_backward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::log_softmax_backward(h, h), NotImplemented, "log_softmax_backward");
}

TEST_CASE("cross_entropy: bad input") {
  Rng rng(13);
  auto x = random({3, 4}, rng);
  auto labels = labels_of({0, 3, 1});
  const char* fwd = "cross_entropy_forward";
  const char* bwd = "cross_entropy_backward";
  CUTRAIN_REQUIRE_THROWS_OP(ops::cross_entropy_forward(Tensor<double>{}, labels, {}), InvalidArgument, fwd);
  CUTRAIN_REQUIRE_THROWS_OP(ops::cross_entropy_forward(random({3}, rng), labels, {}), InvalidArgument, fwd);
  CUTRAIN_REQUIRE_THROWS_OP(ops::cross_entropy_forward(random({3, 4, 1}, rng), labels, {}), InvalidArgument, fwd);
  CUTRAIN_REQUIRE_THROWS_OP(ops::cross_entropy_forward(Tensor<double>::zeros({3, 0}), labels, {}), InvalidArgument,
                            fwd);
  CUTRAIN_REQUIRE_THROWS_OP(ops::cross_entropy_forward(x, Tensor<std::int32_t>{}, {}), InvalidArgument, fwd);
  CUTRAIN_REQUIRE_THROWS_OP(ops::cross_entropy_forward(x, labels_of({0, 1}), {}), InvalidArgument, fwd);
  CUTRAIN_REQUIRE_THROWS_OP(ops::cross_entropy_forward(x, Tensor<std::int32_t>::zeros({3, 1}), {}), InvalidArgument,
                            fwd);
  // Out-of-range labels: the message names the value and its index.
  try {
    (void)ops::cross_entropy_forward(x, labels_of({0, 4, 1}), {});
    FAIL("label 4 with C = 4 was accepted");
  } catch (const InvalidArgument& e) {
    INFO(e.what());
    CHECK(std::string(e.what()).find("label 4 at index 1") != std::string::npos);
  }
  CUTRAIN_REQUIRE_THROWS_OP(ops::cross_entropy_forward(x, labels_of({0, 1, -1}), {}), InvalidArgument, fwd);
  CUTRAIN_REQUIRE_THROWS_OP(ops::cross_entropy_backward(x, labels_of({4, 1, 1}), 1.0, {}), InvalidArgument, bwd);
  CUTRAIN_REQUIRE_THROWS_OP(ops::cross_entropy_forward(x, labels, {.label_smoothing = 1.0}), InvalidArgument, fwd);
  CUTRAIN_REQUIRE_THROWS_OP(ops::cross_entropy_forward(x, labels, {.label_smoothing = -0.1}), InvalidArgument, fwd);
  CUTRAIN_REQUIRE_THROWS_OP(ops::cross_entropy_backward(x, labels, 1.0, {.label_smoothing = std::nan("")}),
                            InvalidArgument, bwd);
  CUTRAIN_REQUIRE_THROWS_OP(ops::cross_entropy_forward(x, labels, {.reduction = static_cast<Reduction>(7)}),
                            InvalidArgument, fwd);
  // The mean over no samples is 0 / 0.
  CUTRAIN_REQUIRE_THROWS_OP(ops::cross_entropy_forward(Tensor<double>::zeros({0, 4}), labels_of({}), {}),
                            InvalidArgument, fwd);
  CUTRAIN_REQUIRE_THROWS_OP(ops::cross_entropy_backward(Tensor<double>::zeros({0, 4}), labels_of({}), 1.0, {}),
                            InvalidArgument, bwd);
  auto h = Tensor<half>::zeros({3, 4});
  CUTRAIN_REQUIRE_THROWS_OP(ops::cross_entropy_forward(h, labels, {}), NotImplemented, fwd);
  CUTRAIN_REQUIRE_THROWS_OP(ops::cross_entropy_backward(h, labels, half(1.0f), {}), NotImplemented, bwd);
}

}  // namespace cutrain_test_softmax_loss
