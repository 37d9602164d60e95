// act(batch_norm(x) + residual) as one op on the GPU (ops::batch_norm_act_*) against the CPU
// backend in f64, in f32, bf16 and f16, NHWC and NCHW, with and without a residual, C even (cuDNN's
// fused graph where it has an engine) and odd (the fallback); which path ran is printed. Then
// nn::ResidualBlock (fused) forward and backward on the GPU against the same block on the CPU.
#include "bn_switch.hpp"
#include "parity.hpp"

#include <cstdio>
#include <string>

#include "cutrain/cutrain.hpp"
#include "cutrain/nn.hpp"

namespace cutrain_test_batch_norm_act_gpu {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;

namespace {

constexpr double stats_tol = 1e-4;  // f32 statistics over up to N*H*W elements

template <class T>
void run_batch_norm_act(const Shape& shape, Layout layout, bool residual) {
  const std::string tag =
      cutrain::detail::cat("batch_norm_act ", shape, " ", dtype_of<T>, " ", layout, residual ? " +residual" : "");
  Rng rng(std::hash<std::string>{}(tag));
  const Shape c{shape[1]};
  const ActivationParams relu{.kind = Activation::relu};
  auto [x, xr] = random_pair<T>(shape, rng, layout);
  auto [r, rr] = random_pair<T>(shape, rng, layout);
  auto [dy, dyr] = random_pair<T>(shape, rng, layout);
  auto [gamma, gr] = random_pair<float>(c, rng, layout);
  auto [beta, br] = random_pair<float>(c, rng, layout);
  auto [rm, rmr] = random_pair<float>(c, rng, layout);
  auto var_host = Tensor<float>::uniform(c, rng, 0.5, 2.0);
  auto rv = var_host.to(Device::cuda(0));
  auto rvr = cast<double>(var_host);
  const BatchNormParams p{.momentum = 0.2, .eps = 1e-3};

  auto ref = ops::batch_norm_act_forward_training(xr, gr, br, rmr, rvr, p, relu, residual ? rr.view() : Tensor<double>{});
  const auto f0 = cuda::cudnn::kernel_fallbacks().load();
  auto got = ops::batch_norm_act_forward_training(x, gamma, beta, rm, rv, p, relu, residual ? r.view() : Tensor<T>{});
  const bool fwd_fused = cuda::cudnn::kernel_fallbacks().load() == f0;
  check_close(tag + " y", got.y, ref.y);
  check_close(tag + " save_mean", got.save_mean, ref.save_mean, stats_tol);
  check_close(tag + " save_inv_std", got.save_inv_std, ref.save_inv_std, stats_tol);
  check_close(tag + " running_mean", rm, rmr, stats_tol);
  check_close(tag + " running_var", rv, rvr, stats_tol);

  // backward alone: the reference's y (rounded to T) and statistics on the device
  auto y_t = cast<T>(ref.y);
  auto yr = cast<double>(y_t);
  auto y = y_t.to(Device::cuda(0)).contiguous(x.layout());
  auto sm = cast<float>(ref.save_mean).to(Device::cuda(0));
  auto si = cast<float>(ref.save_inv_std).to(Device::cuda(0));
  const auto b0 = cuda::cudnn::kernel_fallbacks().load();
  auto gb = ops::batch_norm_act_backward(x, y, dy, gamma, sm, si, relu, residual);
  const bool bwd_fused = cuda::cudnn::kernel_fallbacks().load() == b0;
  auto rb = ops::batch_norm_act_backward(xr, yr, dyr, gr, ref.save_mean, ref.save_inv_std, relu, residual);
  const double grad_tol = stats_tol * (std::is_same_v<T, float> ? 1 : 10);
  check_close(tag + " dx", gb.dx, rb.dx);
  check_close(tag + " dgamma", gb.dgamma, rb.dgamma, grad_tol);
  check_close(tag + " dbeta", gb.dbeta, rb.dbeta, grad_tol);
  REQUIRE(gb.dresidual.defined() == residual);
  if (residual) check_close(tag + " dresidual", gb.dresidual, rb.dresidual);
  std::printf("%-56s forward %s, backward %s\n", tag.c_str(), fwd_fused ? "one cuDNN graph" : "fallback",
              bwd_fused ? "one cuDNN graph" : "fallback");
}

template <class T>
void run_all() {
  const FastBatchNorm cudnn_graphs(false, false);  // cuDNN's graphs (the fast kernels: test_bn_*_fast_gpu.cpp)
  for (const Layout l : {Layout::nhwc, Layout::nchw})
    for (const bool residual : {true, false}) {
      run_batch_norm_act<T>({8, 64, 16, 16}, l, residual);
      run_batch_norm_act<T>({3, 5, 7, 9}, l, residual);  // odd C: cuDNN 9.19 had no batch-norm engine
    }
  run_batch_norm_act<T>({64, 40}, Layout::row_major, true);
}

}  // namespace

TEST_CASE("gpu batch_norm_act f32 matches the CPU backend") { run_all<float>(); }
TEST_CASE("gpu batch_norm_act bf16 matches the CPU backend") { run_all<bfloat16>(); }
TEST_CASE("gpu batch_norm_act f16 matches the CPU backend") { run_all<cutrain::half>(); }

TEST_CASE("gpu nn::ResidualBlock (fused) forward and backward match the CPU") {
  for (const bool projection : {false, true}) {
    INFO((projection ? "projection shortcut" : "identity shortcut"));
    const nn::ResidualBlockOptions o{.in = 16, .out = projection ? 32 : 16, .stride = projection ? 2 : 1, .seed = 7};
    nn::ResidualBlock<float> gpu(o), cpu(o);
    gpu.to(Device::cuda(0));
    Rng rng(projection ? 11 : 12);
    auto xt = Tensor<float>::uniform(Shape{4, 16, 8, 8}, rng, -1, 1, {.layout = Layout::nhwc});
    auto xg = autograd::parameter(xt.to(Device::cuda(0))), xc = autograd::parameter(xt.clone());
    autograd::Var<float> yg = gpu(xg), yc = cpu(xc);
    check_close("block y", yg.value(), cast<double>(yc.value()), 1e-4);
    auto seed = Tensor<float>::uniform(yc.shape(), rng, -1, 1);
    yg.backward(seed.to(Device::cuda(0)));
    yc.backward(seed.clone());
    check_close("block dx", xg.grad(), cast<double>(xc.grad()), 1e-4);
    auto pg = gpu.named_parameters(), pc = cpu.named_parameters();
    REQUIRE(pg.size() == pc.size());
    for (std::size_t i = 0; i < pg.size(); ++i)
      check_close("block d" + pg[i].first, pg[i].second.grad(), cast<double>(pc[i].second.grad()), 1e-3);
    check_close("block bn2 running_var", gpu.bn2.running_var, cast<double>(cpu.bn2.running_var), 1e-4);
  }
}

}  // namespace cutrain_test_batch_norm_act_gpu
