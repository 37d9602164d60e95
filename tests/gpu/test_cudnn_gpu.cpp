// The ops on cuDNN's graph API against the CPU backend in f64, in f32, bf16 and f16, NCHW and
// NHWC: conv2d forward with and without bias, backward data, backward filter (and the bias
// gradient, an NVRTC kernel, through ops::); conv + bias + activation fused; activations forward and
// backward; batch norm (training, inference, backward) and layer norm (forward, backward) with
// f32 parameters and statistics. One translation unit, since each one that includes cudnn-frontend costs a minute.
#include "bn_switch.hpp"
#include "parity.hpp"
#include "scoped_config.hpp"

#include "cutrain/cuda/cudnn/activation.hpp"
#include "cutrain/cuda/cudnn/conv.hpp"
#include "cutrain/ops/activation.hpp"
#include "cutrain/ops/batch_norm.hpp"
#include "cutrain/ops/conv2d.hpp"
#include "cutrain/ops/layer_norm.hpp"

namespace cutrain_test_cudnn_gpu {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;

namespace {
// Combinations cuDNN had no engine for, collected so that one run on the GPU machine lists
// every gap; each TEST_CASE fails at its end if any were found.
std::vector<std::string> unsupported;

template <class F>
void attempt(const std::string& tag, F&& f) {
  try {
    f();
  } catch (const CudnnError& e) {
    std::printf("%-48s UNSUPPORTED by cuDNN: %.300s\n", tag.c_str(), e.what());
    unsupported.push_back(tag);
  }
}

void require_all_supported() {
  for (const auto& u : unsupported) INFO("no cuDNN engine: " << u);
  CHECK(unsupported.empty());
  unsupported.clear();
}
}  // namespace

namespace {

struct Case {
  const char* name;
  Shape x, w;
  Conv2dParams p;
};

// ResNet-style layers, odd sizes, stride 2, asymmetric padding, dilation, groups, depthwise,
// 1x1, batch 1.
const Case cases[] = {
    {"resnet_3x3_64", {8, 64, 16, 16}, {64, 64, 3, 3}, Conv2dParams::make(1, 1)},
    {"resnet_3x3_s2", {4, 32, 15, 15}, {64, 32, 3, 3}, Conv2dParams::make(2, 1)},
    {"resnet_1x1_s2", {4, 64, 16, 16}, {128, 64, 1, 1}, Conv2dParams::make(2, 0)},
    {"odd_asym_pad", {3, 6, 7, 9}, {10, 6, 3, 3},
     {.pad_top = 1, .pad_bottom = 0, .pad_left = 2, .pad_right = 1}},
    {"dilation_2", {2, 8, 12, 12}, {8, 8, 3, 3}, Conv2dParams::make(1, 2, 2)},
    {"groups_2", {2, 8, 10, 10}, {16, 4, 3, 3}, Conv2dParams::make(1, 1, 1, 2)},
    {"depthwise", {2, 16, 9, 9}, {16, 1, 3, 3}, Conv2dParams::make(1, 1, 1, 16)},
    {"batch_1_5x5", {1, 4, 11, 13}, {8, 4, 5, 5}, Conv2dParams::make(1, 2)},
    {"fmnist_conv1", {16, 1, 28, 28}, {32, 1, 3, 3}, Conv2dParams::make(1, 1)},
};

template <class T>
void run_case(const Case& c, Layout layout) {
  const std::string tag = cutrain::detail::cat(c.name, " ", dtype_of<T>, " ", layout);
  Rng rng(std::hash<std::string>{}(tag));
  auto [x, xr] = random_pair<T>(c.x, rng, layout);
  auto [w, wr] = random_pair<T>(c.w, rng, layout);
  auto [b, br] = random_pair<T>({c.w[0]}, rng, layout);
  const Shape ys = conv2d_output_shape(c.x, c.w, c.p);
  auto [dy, dyr] = random_pair<T>(ys, rng, layout);

  try {
    auto y = poisoned<T>(ys, layout);
    cuda::cudnn::conv2d_forward(x, w, Tensor<T>{}, c.p, y);
    check_close(tag + " fprop", y, ops::conv2d_forward(xr, wr, c.p));

    auto yb = poisoned<T>(ys, layout);
    cuda::cudnn::conv2d_forward(x, w, b, c.p, yb);
    check_close(tag + " fprop+bias", yb, ops::conv2d_forward(xr, wr, br, c.p));

    auto dx = poisoned<T>(c.x, layout);
    cuda::cudnn::conv2d_backward_data(dy, w, c.p, dx);
    check_close(tag + " dgrad", dx, ops::conv2d_backward_data(dyr, wr, c.x, c.p));

    auto dw = poisoned<T>(c.w, layout);
    cuda::cudnn::conv2d_backward_filter(dy, x, c.p, dw);
    check_close(tag + " wgrad", dw, ops::conv2d_backward_filter(dyr, xr, c.w, c.p));

    // the bias gradient: an NVRTC reduction kernel, through ops::
    check_close(tag + " bias grad", ops::conv2d_backward_bias(dy), ops::conv2d_backward_bias(dyr));

    cuda::synchronize();
    std::printf("conv2d %-32s ok\n", tag.c_str());
  } catch (const CudnnError& e) {
    // cuDNN offers no engine for some combinations; the message must say which.
    std::printf("conv2d %-32s UNSUPPORTED by cuDNN: %s\n", tag.c_str(), e.what());
    CHECK(std::string(e.what()).find("no cuDNN engine") != std::string::npos);
    const bool exotic = c.p.groups > 1 || c.p.dilation_h > 1 || std::string(c.name) == "odd_asym_pad";
    CHECK(exotic);  // plain convolutions must always run
  }
}

}  // namespace

TEST_CASE("gpu conv2d f32 (TF32 off) matches the CPU backend") {
  for (const auto& c : cases)
    for (Layout l : {Layout::nchw, Layout::nhwc}) run_case<float>(c, l);
}

TEST_CASE("gpu conv2d bf16 matches the CPU backend") {
  for (const auto& c : cases)
    for (Layout l : {Layout::nchw, Layout::nhwc}) run_case<cutrain::bfloat16>(c, l);
}

TEST_CASE("gpu conv2d f16 matches the CPU backend") {
  for (const auto& c : cases)
    for (Layout l : {Layout::nchw, Layout::nhwc}) run_case<cutrain::half>(c, l);
}

TEST_CASE("gpu conv2d through ops:: dispatches on the device") {
  Rng rng(5);
  auto [x, xr] = random_pair<float>({2, 3, 8, 8}, rng, Layout::nhwc);
  auto [w, wr] = random_pair<float>({4, 3, 3, 3}, rng, Layout::nhwc);
  const auto p = Conv2dParams::make(1, 1);
  auto y = ops::conv2d_forward(x, w, p);
  CHECK(y.device() == Device::cuda(0));
  CHECK(y.layout() == Layout::nhwc);
  check_close("ops::conv2d_forward", y, ops::conv2d_forward(xr, wr, p));
}

namespace {

const Activation all_kinds[] = {Activation::identity, Activation::relu,     Activation::leaky_relu,
                                Activation::elu,      Activation::sigmoid,  Activation::tanh,
                                Activation::gelu_erf, Activation::gelu_tanh, Activation::silu};

template <class T>
void run_activations(Layout layout) {
  for (Activation k : all_kinds) {
    const ActivationParams a{.kind = k, .alpha = k == Activation::elu ? 1.0 : 0.1};
    const std::string tag = cutrain::detail::cat("activation ", k, " ", dtype_of<T>, " ", layout);
    Rng rng(std::hash<std::string>{}(tag));
    auto [x, xr] = random_pair<T>({4, 24, 9, 11}, rng, layout);
    auto [dy, dyr] = random_pair<T>({4, 24, 9, 11}, rng, layout);
    auto y = poisoned<T>(x.shape(), layout);
    // cuDNN itself (false: no engine): these shapes must not need the fallback kernel.
    if (!cuda::cudnn::activation_forward(x, a, y)) {
      std::printf("%-48s UNSUPPORTED by cuDNN (no engine)\n", tag.c_str());
      unsupported.push_back(tag);
      continue;
    }
    check_close(tag + " fwd", y, ops::activation_forward(xr, a));
    auto dx = poisoned<T>(x.shape(), layout);
    REQUIRE(cuda::cudnn::activation_backward(x, dy, a, dx));
    check_close(tag + " bwd", dx, ops::activation_backward(xr, dyr, a));
    // through ops:: on a strided view (staged to a contiguous layout first)
    auto xv = x.slice(3, 1, 10);
    check_close(tag + " strided", ops::activation_forward(xv, a), ops::activation_forward(xr.slice(3, 1, 10), a));
    std::printf("%-40s ok\n", tag.c_str());
  }
}

template <class T>
void run_fused(Layout layout) {
  for (Activation k : {Activation::relu, Activation::gelu_erf, Activation::silu}) {
    for (int ci : {0, 8}) {  // resnet_3x3_64 and fmnist_conv1
      const Case& c = cases[ci];
      const std::string tag = cutrain::detail::cat("conv+bias+", k, " ", c.name, " ", dtype_of<T>, " ", layout);
      Rng rng(std::hash<std::string>{}(tag));
      auto [x, xr] = random_pair<T>(c.x, rng, layout);
      auto [w, wr] = random_pair<T>(c.w, rng, layout);
      auto [b, br] = random_pair<T>({c.w[0]}, rng, layout);
      auto y = poisoned<T>(conv2d_output_shape(c.x, c.w, c.p), layout);
      bool fused = true;
      try {
        cuda::cudnn::conv2d_forward(x, w, b, c.p, y, {.kind = k});
      } catch (const CudnnError&) {
        fused = false;  // ops:: falls back to conv graph + activation graph
      }
      if (fused) check_close(tag, y, ops::conv2d_bias_activation_forward(xr, wr, br, {.kind = k}, c.p));
      attempt(tag + " via ops", [&] {
        check_close(tag + " via ops", ops::conv2d_bias_activation_forward(x, w, b, {.kind = k}, c.p),
                    ops::conv2d_bias_activation_forward(xr, wr, br, {.kind = k}, c.p));
      });
      std::printf("%-40s ok (%s)\n", tag.c_str(), fused ? "fused" : "not fused: conv graph + activation graph");

      // backward: dgrad with the activation's backward fused behind it
      const std::string btag = cutrain::detail::cat("dgrad+", k, "_bwd ", c.name, " ", dtype_of<T>, " ", layout);
      auto [dy, dyr] = random_pair<T>(conv2d_output_shape(c.x, c.w, c.p), rng, layout);
      auto dx = poisoned<T>(c.x, layout);
      bool bfused = true;
      try {
        cuda::cudnn::conv2d_backward_data(dy, w, c.p, dx, {.kind = k}, x);
      } catch (const CudnnError&) {
        bfused = false;
      }
      const auto ref = ops::conv2d_backward_data_activation(dyr, wr, xr, {.kind = k}, c.p);
      if (bfused) check_close(btag, dx, ref);
      attempt(btag + " via ops", [&] {
        check_close(btag + " via ops", ops::conv2d_backward_data_activation(dy, w, x, {.kind = k}, c.p), ref);
      });
      std::printf("%-40s ok (%s)\n", btag.c_str(), bfused ? "fused" : "not fused: dgrad graph + activation graph");
    }
  }
}

}  // namespace

TEST_CASE("gpu activations forward and backward match the CPU backend") {
  for (Layout l : {Layout::nchw, Layout::nhwc}) {
    run_activations<float>(l);
    run_activations<cutrain::bfloat16>(l);
    run_activations<cutrain::half>(l);
  }
  require_all_supported();
}

// execute keeps a graph's variant packs of recent pointer sets (cuda/cudnn/variant_packs.hpp):
// a repeated set runs through its kept pack, which must read whatever the buffers hold now. Six
// sets in turn (more than a graph keeps), then one set over and over with fresh contents; every
// output is checked. A conv with bias and ReLU and a SiLU graph, bf16 NHWC (the combination the
// fused graph has engines for).
TEST_CASE("gpu ops run through kept variant packs with repeated and new pointer sets") {
  Rng rng(41);
  const Case& c = cases[0];  // resnet_3x3_64
  const ActivationParams relu{.kind = Activation::relu}, silu{.kind = Activation::silu};
  struct Set {
    Tensor<bfloat16> x, y, z;
    Tensor<double> xr;
  };
  std::vector<Set> sets;
  for (int i = 0; i < 6; ++i) {
    auto [x, xr] = random_pair<bfloat16>(c.x, rng, Layout::nhwc);
    sets.push_back({std::move(x), poisoned<bfloat16>(conv2d_output_shape(c.x, c.w, c.p), Layout::nhwc),
                    poisoned<bfloat16>(c.x, Layout::nhwc), std::move(xr)});
  }
  auto [w, wr] = random_pair<bfloat16>(c.w, rng, Layout::nhwc);
  auto [b, br] = random_pair<bfloat16>({c.w[0]}, rng, Layout::nhwc);
  // No plan files: a graph read from one would reach the kept packs a call earlier.
  ScopedConfig no_plan_files("CUTRAIN_PLAN_CACHE", "0");
  cuda::cudnn::clear_graph_cache();  // the graphs' first two calls go through the frontend
  const auto before = cuda::cudnn::variant_pack_stats();
  int calls = 0;
  const auto run = [&](Set& s, const std::string& tag) {
    s.y.fill(bfloat16(std::nanf("")));
    s.z.fill(bfloat16(std::nanf("")));
    cuda::cudnn::conv2d_forward(s.x, w, b, c.p, s.y, relu);
    REQUIRE(cuda::cudnn::activation_forward(s.x, silu, s.z));
    ++calls;
    check_close(tag + " conv+bias+relu", s.y, ops::conv2d_bias_activation_forward(s.xr, wr, br, relu, c.p));
    check_close(tag + " silu", s.z, ops::activation_forward(s.xr, silu));
  };
  for (int round = 0; round < 3; ++round)
    for (int i = 0; i < 6; ++i) run(sets[static_cast<std::size_t>(i)], cutrain::detail::cat("round ", round, " set ", i));
  for (int r = 0; r < 5; ++r) {
    auto [x, xr] = random_pair<bfloat16>(c.x, rng, Layout::nhwc);
    sets[0].x.copy_from(x);
    sets[0].xr = std::move(xr);
    run(sets[0], cutrain::detail::cat("repeat ", r));
  }
  const auto after = cuda::cudnn::variant_pack_stats();
  const std::int64_t runs = after.runs - before.runs, made = after.made - before.made;
  INFO(runs << " runs through kept packs, " << made << " packs made, over " << calls << " calls of 2 graphs");
  CHECK(runs == 2 * (calls - 2));  // every call of each graph but its first two
  CHECK(runs - made >= 2 * 4);     // the repeated set ran from its kept pack
}

TEST_CASE("gpu conv + bias + activation fused in one graph matches the CPU backend") {
  for (Layout l : {Layout::nchw, Layout::nhwc}) {
    run_fused<float>(l);
    run_fused<cutrain::bfloat16>(l);
    run_fused<cutrain::half>(l);
  }
  Rng rng(9);  // through ops::, on the device
  auto [x, xr] = random_pair<float>({2, 3, 8, 8}, rng, Layout::nhwc);
  auto [w, wr] = random_pair<float>({4, 3, 3, 3}, rng, Layout::nhwc);
  auto [b, br] = random_pair<float>({4}, rng, Layout::nhwc);
  const auto p = Conv2dParams::make(1, 1);
  auto y = ops::conv2d_bias_activation_forward(x, w, b, {.kind = Activation::relu}, p);
  CHECK(y.device() == Device::cuda(0));
  check_close("ops::conv2d_bias_activation_forward", y,
              ops::conv2d_bias_activation_forward(xr, wr, br, {.kind = Activation::relu}, p));
  require_all_supported();
}

namespace {

// f32 statistics accumulate over up to N*H*W elements: allow a little more than f32 rounding.
constexpr double stats_tol = 1e-4;

template <class T>
void run_batch_norm(const Shape& shape, Layout layout) {
  const FastBatchNorm cudnn_graphs(false, false);  // cuDNN's graphs (the fast kernels: test_bn_*_fast_gpu.cpp)
  const std::string tag = cutrain::detail::cat("batch_norm ", shape, " ", dtype_of<T>, " ", layout);
  Rng rng(std::hash<std::string>{}(tag));
  const Shape c{shape[1]};
  auto [x, xr] = random_pair<T>(shape, rng, layout);
  auto [dy, dyr] = random_pair<T>(shape, rng, layout);
  auto [gamma, gr] = random_pair<float>(c, rng, layout);
  auto [beta, br] = random_pair<float>(c, rng, layout);
  auto [rm, rmr] = random_pair<float>(c, rng, layout);
  auto var_host = Tensor<float>::uniform(c, rng, 0.5, 2.0);
  auto rv = var_host.to(Device::cuda(0));
  auto rvr = cast<double>(var_host);
  const BatchNormParams p{.momentum = 0.2, .eps = 1e-3};

  auto ref = ops::batch_norm_forward_training(xr, gr, br, rmr, rvr, p);
  // cuDNN 9.19 had no batch-norm engine for an odd channel count on the H200: those shapes run
  // cutrain's kernels (cuda/kernels/batch_norm_train.hpp), checked here like cuDNN's.
  const std::int64_t fallbacks_before = cuda::cudnn::kernel_fallbacks();
  attempt(tag + " training", [&] {
    auto got = ops::batch_norm_forward_training(x, gamma, beta, rm, rv, p);
    check_close(tag + " y", got.y, ref.y);
    check_close(tag + " save_mean", got.save_mean, ref.save_mean, stats_tol);
    check_close(tag + " save_inv_std", got.save_inv_std, ref.save_inv_std, stats_tol);
    check_close(tag + " running_mean", rm, rmr, stats_tol);
    check_close(tag + " running_var", rv, rvr, stats_tol);
  });
  attempt(tag + " inference", [&] {
    auto yi = ops::batch_norm_forward_inference(x, gamma, beta, rm, rv, p.eps);
    check_close(tag + " inference", yi, ops::batch_norm_forward_inference(xr, gr, br, rmr, rvr, p.eps));
  });
  attempt(tag + " backward", [&] {
    // the saved statistics of the reference, on the device, so that backward is checked alone
    auto sm = cast<float>(ref.save_mean).to(Device::cuda(0));
    auto si = cast<float>(ref.save_inv_std).to(Device::cuda(0));
    auto gb = ops::batch_norm_backward(x, dy, gamma, sm, si);
    auto rb = ops::batch_norm_backward(xr, dyr, gr, ref.save_mean, ref.save_inv_std);
    check_close(tag + " dx", gb.dx, rb.dx);
    check_close(tag + " dgamma", gb.dgamma, rb.dgamma, stats_tol * (std::is_same_v<T, float> ? 1 : 10));
    check_close(tag + " dbeta", gb.dbeta, rb.dbeta, stats_tol * (std::is_same_v<T, float> ? 1 : 10));
  });
  std::printf("%-48s done (%s)\n", tag.c_str(),
              cuda::cudnn::kernel_fallbacks() > fallbacks_before ? "cutrain's kernel: no cuDNN engine" : "cuDNN");
}

template <class T>
void run_layer_norm(const Shape& shape, Layout layout) {
  const std::string tag = cutrain::detail::cat("layer_norm ", shape, " ", dtype_of<T>, " ", layout);
  Rng rng(std::hash<std::string>{}(tag));
  const Shape rest(std::vector<std::int64_t>(shape.dims().begin() + 1, shape.dims().end()));
  auto [x, xr] = random_pair<T>(shape, rng, layout);
  auto [dy, dyr] = random_pair<T>(shape, rng, layout);
  auto [gamma, gr] = random_pair<float>(rest, rng, Layout::row_major);
  auto [beta, br] = random_pair<float>(rest, rng, Layout::row_major);
  auto ref = ops::layer_norm_forward(xr, gr, br, 1e-5);
  attempt(tag + " forward", [&] {
    auto got = ops::layer_norm_forward(x, gamma, beta, 1e-5);
    check_close(tag + " y", got.y, ref.y);
    check_close(tag + " mean", got.mean, ref.mean, stats_tol);
    check_close(tag + " inv_std", got.inv_std, ref.inv_std, stats_tol);
  });
  attempt(tag + " backward", [&] {
    auto mean = cast<float>(ref.mean).to(Device::cuda(0));
    auto inv = cast<float>(ref.inv_std).to(Device::cuda(0));
    auto gb = ops::layer_norm_backward(x, dy, gamma, mean, inv);
    auto rb = ops::layer_norm_backward(xr, dyr, gr, ref.mean, ref.inv_std);
    check_close(tag + " dx", gb.dx, rb.dx);
    check_close(tag + " dgamma", gb.dgamma, rb.dgamma, stats_tol * (std::is_same_v<T, float> ? 1 : 10));
    check_close(tag + " dbeta", gb.dbeta, rb.dbeta, stats_tol * (std::is_same_v<T, float> ? 1 : 10));
  });
  std::printf("%-48s done\n", tag.c_str());
}

template <class T>
void run_norms(Layout layout) {
  for (const Shape& s : {Shape{8, 32, 16, 16}, Shape{3, 5, 7, 9}, Shape{16, 64, 8, 8}, Shape{1, 8, 5, 5}}) {
    run_batch_norm<T>(s, layout);
    run_layer_norm<T>(s, layout);
  }
  if (layout == Layout::nchw) {
    run_batch_norm<T>({64, 40}, Layout::row_major);
    run_layer_norm<T>({32, 100}, Layout::row_major);
  }
}

}  // namespace

TEST_CASE("gpu batch norm and layer norm match the CPU backend") {
  for (Layout l : {Layout::nchw, Layout::nhwc}) {
    run_norms<float>(l);
    run_norms<cutrain::bfloat16>(l);
    run_norms<cutrain::half>(l);
  }
  require_all_supported();
}

}  // namespace cutrain_test_cudnn_gpu
