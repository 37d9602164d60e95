// The fast batch-norm forward in training (cuda/kernels/batch_norm_train.hpp: reduce, finish,
// apply) against the CPU backend in f64 and against cuDNN's graph, on fresh random data: the
// layouts of the fast backward's test, relu, identity and silu, with and without a residual; the
// running statistics; its sums are deterministic; a mean far from zero; what it declines.
#include "bn_switch.hpp"
#include "parity.hpp"

#include <cstdio>
#include <string>

#include "cutrain/cutrain.hpp"

namespace cutrain_test_bn_forward_fast_gpu {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;

namespace {

// x = offset + u (u uniform in [-1, 1)): offset 0, or far from zero against the spread.
template <class T>
void run_fast(const Shape& shape, Layout layout, Activation kind, bool with_residual, double offset = 0.0) {
  const std::string tag = cutrain::detail::cat("fast bn forward ", shape, " ", dtype_of<T>, " ", layout, " ", kind,
                                               with_residual ? " +residual" : "", offset != 0 ? " offset" : "");
  INFO(tag);
  Rng rng(std::hash<std::string>{}(tag));
  const Shape c{shape[1]};
  const Layout l = shape.rank() == 4 ? layout : Layout::row_major;
  auto u = Tensor<float>::uniform(shape, rng, -1.0, 1.0, {.layout = l});
  auto xh = cast<T>(Tensor<float>::from_vector([&] {
                      auto v = u.to_vector();
                      for (float& e : v) e += static_cast<float>(offset);
                      return v;
                    }(),
                    shape, {.layout = l}));
  auto x = xh.to(Device::cuda(0));
  auto xr = cast<double>(xh);
  auto [res, resr] = random_pair<T>(shape, rng, layout);
  auto [gamma, gr] = random_pair<float>(c, rng, layout);
  auto [beta, br] = random_pair<float>(c, rng, layout);
  auto [rmean, rmr] = random_pair<float>(c, rng, layout);
  auto rvar_host = Tensor<float>::uniform(c, rng, 0.5, 2.0);
  auto rvar = rvar_host.to(Device::cuda(0));
  auto rvr = cast<double>(rvar_host);
  const ActivationParams act{.kind = kind};
  const BatchNormParams p{.momentum = 0.1, .eps = 1e-5};

  // The CPU in f64: batch norm, + residual, then the activation (any kind).
  auto ref = ops::batch_norm_forward_training(xr, gr, br, rmr, rvr, p);
  if (with_residual) ref.y = ops::add(ref.y, resr);
  if (kind != Activation::identity) ref.y = ops::activation_forward(ref.y, act);

  auto y = poisoned<T>(shape, l);
  Tensor<float> sm = poisoned<float>(c, l), si = poisoned<float>(c, l), nm = poisoned<float>(c, l),
                nv = poisoned<float>(c, l);
  REQUIRE(cuda::kernels::batch_norm_act_forward_fast(x, gamma, beta, rmean, rvar, p, act,
                                                     with_residual ? &res : nullptr, y, sm, si, nm, nv));
  const double e = check_close(tag + " y", y, ref.y);
  check_close(tag + " save_mean", sm, ref.save_mean, 1e-5);
  check_close(tag + " save_inv_std", si, ref.save_inv_std, 1e-4);
  check_close(tag + " running_mean", nm, rmr, 1e-5);
  check_close(tag + " running_var", nv, rvr, 1e-4);

  // The same again: the same bits; and with next = running (in place), the same statistics.
  auto y2 = poisoned<T>(shape, l);
  Tensor<float> sm2 = poisoned<float>(c, l), si2 = poisoned<float>(c, l);
  auto rm2 = rmean.clone(), rv2 = rvar.clone();
  REQUIRE(cuda::kernels::batch_norm_act_forward_fast(x, gamma, beta, rm2, rv2, p, act, with_residual ? &res : nullptr,
                                                     y2, sm2, si2, rm2, rv2));
  CHECK(same_bits(y, y2));
  CHECK(same_bits(sm, sm2));
  CHECK(same_bits(nm, rm2));
  CHECK(same_bits(nv, rv2));

  if (kind != Activation::relu && kind != Activation::identity) return;  // ops:: takes these two only
  if (offset != 0) return;  // cuDNN's graph is not asked to keep these digits
  // With the default switches (pinned here, whatever the environment set), ops:: takes this path
  // for NCHW and [N, C] (running statistics in place), cuDNN's graph first for channels-last
  // images; with the fast forward off, cuDNN's graph everywhere.
  double e_other = 0;
  {
    const FastBatchNorm defaults(true, true, false);
    auto rm3 = rmean.clone(), rv3 = rvar.clone();
    auto via_ops = ops::batch_norm_act_forward_training(x, gamma, beta, rm3, rv3, p, act,
                                                        with_residual ? res.view() : Tensor<T>{});
    CHECK(cuda::kernels::forward_prefers_fast(x) == (shape.rank() == 2 || layout == Layout::nchw));
    if (cuda::kernels::forward_prefers_fast(x)) {
      CHECK(same_bits(via_ops.y, y));
      CHECK(same_bits(rm3, nm));
      CHECK(same_bits(rv3, nv));
    } else {
      check_close(tag + " y (ops::, cuDNN's graph)", via_ops.y, ref.y);
      check_close(tag + " running_mean (ops::, cuDNN's graph)", rm3, rmr, 1e-5);
      check_close(tag + " running_var (ops::, cuDNN's graph)", rv3, rvr, 1e-4);
    }
  }
  {
    const FastBatchNorm off(false, true, false);  // cuDNN's graph first
    auto rm4 = rmean.clone(), rv4 = rvar.clone();
    auto other =
        ops::batch_norm_act_forward_training(x, gamma, beta, rm4, rv4, p, act, with_residual ? res.view() : Tensor<T>{});
    e_other = check_close(tag + " y (cuDNN's graph)", other.y, ref.y);
    check_close(tag + " running_mean (cuDNN's graph)", rm4, rmr, 1e-5);
    check_close(tag + " running_var (cuDNN's graph)", rv4, rvr, 1e-4);
  }
  std::printf("%-72s scaled y error: fast %.2e, cuDNN %.2e\n", tag.c_str(), e, e_other);
}

template <class T>
void run_shapes() {
  run_fast<T>({8, 64, 16, 16}, Layout::nhwc, Activation::relu, true);
  run_fast<T>({4, 768, 3, 3}, Layout::nhwc, Activation::relu, false);      // 96 packs a row of bf16
  run_fast<T>({3, 4096, 2, 2}, Layout::nhwc, Activation::identity, true);  // grid y > 1
  run_fast<T>({600, 64}, Layout::row_major, Activation::identity, false);  // [N, C]: rows
  run_fast<T>({6, 32, 16, 16}, Layout::nchw, Activation::relu, true);      // planes of 256: packed
  run_fast<T>({5, 24, 7, 9}, Layout::nchw, Activation::relu, false);       // planes of 63: one at a time
  run_fast<T>({70, 48, 14, 14}, Layout::nchw, Activation::identity, true);  // many planes a block
  run_fast<T>({64, 32, 1, 1}, Layout::nchw, Activation::relu, false);      // planes of 1: rows of C
  run_fast<T>({8, 64, 8, 8}, Layout::nhwc, Activation::silu, false);       // any activation
  run_fast<T>({8, 64, 8, 8}, Layout::nhwc, Activation::identity, false, 300.0);  // |mean| >> std
  run_fast<T>({8, 64, 8, 8}, Layout::nchw, Activation::identity, false, 300.0);
}

}  // namespace

TEST_CASE("gpu fast batch-norm forward f32 matches the CPU and cuDNN") { run_shapes<float>(); }
TEST_CASE("gpu fast batch-norm forward bf16 matches the CPU and cuDNN") { run_shapes<bfloat16>(); }
TEST_CASE("gpu fast batch-norm forward f16 matches the CPU and cuDNN") { run_shapes<cutrain::half>(); }

TEST_CASE("gpu fast batch-norm forward declines what it does not take, and checks its inputs") {
  Rng rng(6);
  const auto on_gpu = [&](const Shape& s, Layout l) {
    return Tensor<float>::uniform(s, rng, -1, 1, {.layout = l}).to(Device::cuda(0));
  };
  const Shape s{2, 8, 4, 4}, c{8};
  const BatchNormParams p{};
  const ActivationParams relu{.kind = Activation::relu};
  auto x = on_gpu(s, Layout::nhwc), resc = on_gpu(s, Layout::nchw);
  auto gamma = on_gpu(c, Layout::row_major), beta = on_gpu(c, Layout::row_major);
  auto rm = on_gpu(c, Layout::row_major), rv = Tensor<float>::uniform(c, rng, 0.5, 2.0).to(Device::cuda(0));
  const auto dev = [] { return TensorOptions{.device = Device::cuda(0)}; };
  Tensor<float> y(s, {.layout = Layout::nhwc, .device = Device::cuda(0)}), sm(c, dev()), si(c, dev()), nm(c, dev()),
      nv(c, dev());
  // a residual in another layout than x: not taken (ops:: then runs cuDNN's graph)
  CHECK_FALSE(cuda::kernels::batch_norm_act_forward_fast(x, gamma, beta, rm, rv, p, relu, &resc, y, sm, si, nm, nv));
  // channels-last with C not a multiple of 4 f32s
  const Shape s5{2, 5, 4, 4}, c5{5};
  auto x5 = on_gpu(s5, Layout::nhwc);
  auto g5 = on_gpu(c5, Layout::row_major), b5 = on_gpu(c5, Layout::row_major), m5 = on_gpu(c5, Layout::row_major);
  auto v5 = Tensor<float>::uniform(c5, rng, 0.5, 2.0).to(Device::cuda(0));
  Tensor<float> y5(s5, {.layout = Layout::nhwc, .device = Device::cuda(0)}), a5(c5, dev()), b5s(c5, dev()),
      c5m(c5, dev()), d5(c5, dev());
  CHECK_FALSE(cuda::kernels::batch_norm_act_forward_fast(x5, g5, b5, m5, v5, p, relu, nullptr, y5, a5, b5s, c5m, d5));
  // ops:: on that shape still runs (cuDNN's graph or the per-channel kernel) and agrees with the CPU
  auto m5c = m5.clone(), v5c = v5.clone();
  auto r5 = ops::batch_norm_act_forward_training(x5, g5, b5, m5c, v5c, p, relu);
  auto m5r = cast<double>(m5.to(Device::cpu())), v5r = cast<double>(v5.to(Device::cpu()));
  const auto host = [](const Tensor<float>& t) { return cast<double>(t.to(Device::cpu())); };
  auto ref5 = ops::batch_norm_act_forward_training(host(x5), host(g5), host(b5), m5r, v5r, p, relu);
  check_close("bn forward C=5 nhwc via ops", r5.y, ref5.y);
  // errors name the op: a residual of another shape, a channel vector of the wrong size, one value
  // per channel
  auto res5 = on_gpu(s5, Layout::nhwc);
  CHECK_THROWS_WITH(
      cuda::kernels::batch_norm_act_forward_fast(x, gamma, beta, rm, rv, p, relu, &res5, y, sm, si, nm, nv),
      Catch::Contains("batch_norm_act_forward_fast") && Catch::Contains("residual"));
  CHECK_THROWS_AS(cuda::kernels::batch_norm_act_forward_fast(x, g5, beta, rm, rv, p, relu, nullptr, y, sm, si, nm, nv),
                  InvalidArgument);
  auto one = on_gpu(Shape{1, 8, 1, 1}, Layout::nchw);
  Tensor<float> y1(Shape{1, 8, 1, 1}, dev());
  CHECK_THROWS_AS(cuda::kernels::batch_norm_act_forward_fast(one, gamma, beta, rm, rv, p, relu, nullptr, y1, sm, si, nm,
                                                             nv),
                  InvalidArgument);
}

}  // namespace cutrain_test_bn_forward_fast_gpu
