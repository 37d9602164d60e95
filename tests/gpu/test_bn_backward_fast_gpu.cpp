// The fast batch-norm backward (cuda/kernels/batch_norm_train.hpp: reduce, finish, apply) against
// the CPU backend in f64 and against cuDNN's graph, on fresh random data: channels-last rows (C a
// multiple of 16 bytes, more than 256 packs a row, a pack count that does not divide 256) and
// channels-first planes (packed and one element at a time), relu and identity, with and without
// the residual's gradient; its sums are deterministic; it declines what it does not take.
#include "bn_switch.hpp"
#include "parity.hpp"

#include <cstdio>
#include <string>

#include "cutrain/cutrain.hpp"

namespace cutrain_test_bn_backward_fast_gpu {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;

namespace {

template <class T>
void run_fast(const Shape& shape, Layout layout, bool relu, bool want_dz) {
  const std::string tag = cutrain::detail::cat("fast bn backward ", shape, " ", dtype_of<T>, " ", layout,
                                               relu ? " relu" : " identity", want_dz ? " +dz" : "");
  INFO(tag);
  Rng rng(std::hash<std::string>{}(tag));
  const Shape c{shape[1]};
  auto [x, xr] = random_pair<T>(shape, rng, layout);
  auto [y, yr] = random_pair<T>(shape, rng, layout);  // only its sign is read (relu's mask)
  auto [dy, dyr] = random_pair<T>(shape, rng, layout);
  auto [gamma, gr] = random_pair<float>(c, rng, layout);
  auto [mean, mr] = random_pair<float>(c, rng, layout);
  auto inv_host = Tensor<float>::uniform(c, rng, 0.5, 2.0);
  auto inv = inv_host.to(Device::cuda(0));
  auto ir = cast<double>(inv_host);
  const ActivationParams act{.kind = relu ? Activation::relu : Activation::identity};

  auto ref = ops::batch_norm_act_backward(xr, yr, dyr, gr, mr, ir, act, want_dz);
  const Layout l = shape.rank() == 4 ? layout : Layout::row_major;
  auto dx = poisoned<T>(shape, l), dz = poisoned<T>(shape, l);
  Tensor<float> dgamma = poisoned<float>(c, l), dbeta = poisoned<float>(c, l);
  REQUIRE(cuda::kernels::batch_norm_act_backward_fast(x, y, dy, gamma, mean, inv, relu, dx, dgamma, dbeta,
                                                      want_dz ? &dz : nullptr));
  const double grad_tol = std::is_same_v<T, float> ? 1e-4 : 1e-3;
  const double e = check_close(tag + " dx", dx, ref.dx);
  check_close(tag + " dgamma", dgamma, ref.dgamma, grad_tol);
  check_close(tag + " dbeta", dbeta, ref.dbeta, grad_tol);
  if (want_dz) check_close(tag + " dz", dz, ref.dresidual, 0.0);  // a copy of dy or 0: exact

  // The same again: the same bits (partial sums added in a fixed order).
  auto dx2 = poisoned<T>(shape, l);
  Tensor<float> dgamma2 = poisoned<float>(c, l), dbeta2 = poisoned<float>(c, l);
  REQUIRE(cuda::kernels::batch_norm_act_backward_fast(x, y, dy, gamma, mean, inv, relu, dx2, dgamma2, dbeta2, nullptr));
  CHECK(same_bits(dx, dx2));
  CHECK(same_bits(dgamma, dgamma2));
  CHECK(same_bits(dbeta, dbeta2));

  // ops:: takes this path by default; with it off, cuDNN's graph (or the per-channel kernel) runs.
  auto via_ops = ops::batch_norm_act_backward(x, y, dy, gamma, mean, inv, act, want_dz);
  CHECK(same_bits(via_ops.dx, dx));
  if (!relu) {  // the op without an activation takes it too
    auto plain = ops::batch_norm_backward(x, dy, gamma, mean, inv);
    CHECK(same_bits(plain.dx, dx));
    CHECK(same_bits(plain.dgamma, dgamma));
  }
  const FastBatchNorm off(true, false);  // cuDNN's graph first
  auto other = ops::batch_norm_act_backward(x, y, dy, gamma, mean, inv, act, want_dz);
  const double e_other = check_close(tag + " dx (cuDNN's graph)", other.dx, ref.dx);
  std::printf("%-66s scaled dx error: fast %.2e, cuDNN %.2e\n", tag.c_str(), e, e_other);
}

template <class T>
void run_shapes() {
  run_fast<T>({8, 64, 16, 16}, Layout::nhwc, true, true);
  run_fast<T>({4, 768, 3, 3}, Layout::nhwc, true, false);   // 96 packs a row of bf16: 2 rows a block
  run_fast<T>({3, 4096, 2, 2}, Layout::nhwc, true, true);   // more than 256 packs a row: grid y > 1
  run_fast<T>({600, 64}, Layout::row_major, false, false);   // [N, C]: rows
  run_fast<T>({6, 32, 16, 16}, Layout::nchw, true, true);   // planes of 256: packed
  run_fast<T>({5, 24, 7, 9}, Layout::nchw, true, false);    // planes of 63: one element at a time
  run_fast<T>({70, 48, 14, 14}, Layout::nchw, false, true);  // many planes per block
  run_fast<T>({64, 32, 1, 1}, Layout::nchw, false, false);    // planes of 1: taken as rows of C
}

// x = 3000 + u with u in [-1, 1) and dy correlated with u: where |mean| is thousands of times the
// standard deviation, dx must not lose f32 digits to cancellation (x is centred before the product).
void run_large_mean(const Shape& shape, Layout layout) {
  const std::string tag = cutrain::detail::cat("fast bn backward, |mean| >> std ", shape, " ", layout);
  INFO(tag);
  Rng rng(11);
  const long long C = shape[1], plane = shape[2] * shape[3], per = shape.numel() / C;
  const auto u = Tensor<float>::uniform(shape, rng, -1.0, 1.0).to_vector();
  const auto noise = Tensor<float>::uniform(shape, rng, -1.0, 1.0).to_vector();
  std::vector<float> xv(u.size()), dyv(u.size()), mean_v(static_cast<std::size_t>(C)), inv_v(mean_v.size());
  std::vector<double> sum(mean_v.size()), sq(mean_v.size());
  const auto channel = [&](std::size_t i) { return static_cast<std::size_t>((static_cast<long long>(i) / plane) % C); };
  for (std::size_t i = 0; i < u.size(); ++i) {
    xv[i] = 3000.0f + u[i];
    dyv[i] = 0.8f * u[i] + 0.2f * noise[i];
    sum[channel(i)] += xv[i];
  }
  // The batch's own statistics, as the forward saves them (in f64, then rounded to f32).
  for (std::size_t c = 0; c < mean_v.size(); ++c) mean_v[c] = static_cast<float>(sum[c] / static_cast<double>(per));
  for (std::size_t i = 0; i < u.size(); ++i) {
    const double d = static_cast<double>(xv[i]) - mean_v[channel(i)];
    sq[channel(i)] += d * d;
  }
  for (std::size_t c = 0; c < inv_v.size(); ++c)
    inv_v[c] = static_cast<float>(1.0 / std::sqrt(sq[c] / static_cast<double>(per) + 1e-5));
  const auto x_host = Tensor<float>::from_vector(xv, shape, {.layout = layout});
  const auto dy_host = Tensor<float>::from_vector(dyv, shape, {.layout = layout});
  const auto mean_host = Tensor<float>::from_vector(mean_v, Shape{C});
  const auto inv_host = Tensor<float>::from_vector(inv_v, Shape{C});
  auto gamma_host = Tensor<float>::uniform(Shape{C}, rng, 0.5, 1.5);

  const auto dev = Device::cuda(0);
  auto x = x_host.to(dev), dy = dy_host.to(dev), gamma = gamma_host.to(dev), mean = mean_host.to(dev),
       inv = inv_host.to(dev);
  // (identity: y, read only for relu's mask, is any tensor of x's shape)
  auto ref = ops::batch_norm_act_backward(cast<double>(x_host), cast<double>(x_host), cast<double>(dy_host),
                                          cast<double>(gamma_host), cast<double>(mean_host), cast<double>(inv_host),
                                          ActivationParams{}, false);
  auto dx = poisoned<float>(shape, layout);
  Tensor<float> dgamma = poisoned<float>(Shape{C}, layout), dbeta = poisoned<float>(Shape{C}, layout);
  REQUIRE(cuda::kernels::batch_norm_act_backward_fast(x, Tensor<float>{}, dy, gamma, mean, inv, false, dx, dgamma,
                                                      dbeta, nullptr));
  // Folding the mean into the constant (B x + K with K holding -B mean) would lose |mean| / std
  // times f32's rounding here: some 1e-4.
  const double e = check_close(tag + " dx", dx, ref.dx, 5e-6);
  check_close(tag + " dgamma", dgamma, ref.dgamma, 1e-4);
  std::printf("%-66s scaled dx error: %.2e\n", tag.c_str(), e);
}

}  // namespace

TEST_CASE("gpu fast batch-norm backward f32 matches the CPU and cuDNN") { run_shapes<float>(); }
TEST_CASE("gpu fast batch-norm backward bf16 matches the CPU and cuDNN") { run_shapes<bfloat16>(); }
TEST_CASE("gpu fast batch-norm backward f16 matches the CPU and cuDNN") { run_shapes<cutrain::half>(); }

TEST_CASE("gpu fast batch-norm backward keeps f32 digits where |mean| >> std") {
  run_large_mean({16, 32, 8, 8}, Layout::nhwc);
  run_large_mean({16, 32, 8, 8}, Layout::nchw);
}

TEST_CASE("gpu fast batch-norm backward declines what it does not take, and checks its inputs") {
  Rng rng(5);
  const auto on_gpu = [&](const Shape& s, Layout l) {
    return Tensor<float>::uniform(s, rng, -1, 1, {.layout = l}).to(Device::cuda(0));
  };
  const Shape s{2, 8, 4, 4}, c{8};
  auto x = on_gpu(s, Layout::nhwc), dy = on_gpu(s, Layout::nhwc), dyc = on_gpu(s, Layout::nchw);
  auto gamma = on_gpu(c, Layout::row_major), mean = on_gpu(c, Layout::row_major);
  auto inv = Tensor<float>::uniform(c, rng, 0.5, 2.0).to(Device::cuda(0));
  Tensor<float> dx(s, {.layout = Layout::nhwc, .device = Device::cuda(0)}), dg(c, {.device = Device::cuda(0)}),
      db(c, {.device = Device::cuda(0)});
  // dy in another layout than x: not taken (ops:: then runs cuDNN's graph)
  CHECK_FALSE(cuda::kernels::batch_norm_act_backward_fast(x, Tensor<float>{}, dyc, gamma, mean, inv, false, dx, dg, db,
                                                          nullptr));
  // channels-last with C not a multiple of 4 f32s
  const Shape s5{2, 5, 4, 4}, c5{5};
  auto x5 = on_gpu(s5, Layout::nhwc), dy5 = on_gpu(s5, Layout::nhwc);
  auto g5 = on_gpu(c5, Layout::row_major), m5 = on_gpu(c5, Layout::row_major), i5 = on_gpu(c5, Layout::row_major);
  Tensor<float> dx5(s5, {.layout = Layout::nhwc, .device = Device::cuda(0)}), dg5(c5, {.device = Device::cuda(0)}),
      db5(c5, {.device = Device::cuda(0)});
  CHECK_FALSE(cuda::kernels::batch_norm_act_backward_fast(x5, Tensor<float>{}, dy5, g5, m5, i5, false, dx5, dg5, db5,
                                                          nullptr));
  // a strided view
  auto wide = on_gpu(Shape{2, 16, 4, 4}, Layout::nchw);
  auto half_c = wide.slice(1, 0, 8);
  Tensor<float> dxs(s, {.device = Device::cuda(0)});
  CHECK_FALSE(cuda::kernels::batch_norm_act_backward_fast(half_c, Tensor<float>{}, half_c, gamma, mean, inv, false, dxs,
                                                          dg, db, nullptr));
  // errors name the op: relu without y, dy of another shape, a channel vector of the wrong size
  CHECK_THROWS_WITH(cuda::kernels::batch_norm_act_backward_fast(x, Tensor<float>{}, dy, gamma, mean, inv, true, dx, dg,
                                                                db, nullptr),
                    Catch::Contains("batch_norm_act_backward_fast") && Catch::Contains("needs y"));
  CHECK_THROWS_AS(cuda::kernels::batch_norm_act_backward_fast(x, Tensor<float>{}, dy5, gamma, mean, inv, false, dx, dg,
                                                              db, nullptr),
                  InvalidArgument);
  CHECK_THROWS_AS(cuda::kernels::batch_norm_act_backward_fast(x, Tensor<float>{}, dy, g5, mean, inv, false, dx, dg, db,
                                                              nullptr),
                  InvalidArgument);
}

}  // namespace cutrain_test_bn_backward_fast_gpu
