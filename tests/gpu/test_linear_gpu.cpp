// Linear on cuBLASLt against the CPU backend in f64, in f32, bf16 and f16: forward with and
// without a bias, the relu and gelu_tanh epilogues (with and without a bias), backward dx, dw and
// db (BGRADB epilogue) with and without a bias; odd sizes (leading dimensions that are not
// multiples of 8), batch 1, the Fashion-MNIST classifier layers and a large layer; views with
// padded rows and misaligned start pointers; empty dimensions; TF32; the ops:: dispatch; a
// residual as the matmul's C operand; and the errors for what cuBLASLt does not fuse.
#include "parity.hpp"

#include <cstdio>

#include "cutrain/cuda/cublas/linear.hpp"
#include "cutrain/ops/elementwise.hpp"
#include "cutrain/ops/linear.hpp"

namespace cutrain_test_linear_gpu {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;

namespace {

struct Case {
  const char* name;
  std::int64_t n, in, out;
};

const Case cases[] = {
    {"odd_7x13_to_5", 7, 13, 5},
    {"batch1_13_to_5", 1, 13, 5},
    {"batch1_256_to_10", 1, 256, 10},
    {"aligned_16x32_to_8", 16, 32, 8},
    {"tall_300x7_to_3", 300, 7, 3},
    {"odd_33x100_to_17", 33, 100, 17},
    {"fmnist_fc1_128x3136_to_256", 128, 3136, 256},
    {"fmnist_fc2_128x256_to_10", 128, 256, 10},
    {"large_512x1024_to_1024", 512, 1024, 1024},
};

// cuBLASLt's GELU epilogue may evaluate tanh with the hardware approximation (relative error
// about 2^-11), so in f32 it is held to 1e-3 rather than 1e-5; bf16/f16 keep their 1e-2.
template <class T>
double act_tolerance(Activation a) {
  if constexpr (std::same_as<T, float>) return a == Activation::gelu_tanh ? 1e-3 : tolerance<T>;
  else return tolerance<T>;
}

template <class T>
std::string tag_of(const char* what, const std::string& name) {
  return cutrain::detail::cat("linear ", what, " ", name, " ", dtype_of<T>);
}

// Runs one combination; an exception fails it, with its message, without stopping the others, so
// that one GPU run reports every combination that does not work.
template <class Fn>
bool attempt(const std::string& what, Fn&& fn) {
  try {
    fn();
    return true;
  } catch (const std::exception& e) {
    FAIL_CHECK(what << " threw: " << e.what());
    std::printf("linear %s FAILED: %s\n", what.c_str(), e.what());
    return false;
  }
}

// Forward (all epilogues) and backward (with and without bias) of one case through
// cuda::cublas directly, every output poisoned with NaN first.
template <class T>
void run_case(const Case& c, double tol = tolerance<T>) {
  const std::string tag = cutrain::detail::cat(c.name, " ", dtype_of<T>,
                                               std::same_as<T, float> && cuda::math_options().allow_tf32 ? " tf32" : "");
  Rng rng(std::hash<std::string>{}(tag));
  auto [x, xr] = random_pair<T>({c.n, c.in}, rng, Layout::row_major);
  auto [w, wr] = random_pair<T>({c.out, c.in}, rng, Layout::row_major);
  auto [b, br] = random_pair<T>({c.out}, rng, Layout::row_major);
  auto [dy, dyr] = random_pair<T>({c.n, c.out}, rng, Layout::row_major);
  const Shape ys{c.n, c.out};
  bool all = true;

  const Tensor<double> ref_nb = ops::linear_forward(xr, wr);
  const Tensor<double> ref_b = ops::linear_forward(xr, wr, br);
  for (Activation a : {Activation::identity, Activation::relu, Activation::gelu_tanh}) {
    const ActivationParams ap{.kind = a};
    const double t = std::max(tol, act_tolerance<T>(a));
    const std::string what = cutrain::detail::cat(tag, " fwd ", a);
    all &= attempt(what + " no bias", [&] {
      auto y = poisoned<T>(ys, Layout::row_major);
      cuda::cublas::linear_forward(x, w, Tensor<T>{}, a, y);
      check_close(what + " no bias", y, cpu::activation_forward(ref_nb, ap), t);
    });
    all &= attempt(what + " + bias", [&] {
      auto y = poisoned<T>(ys, Layout::row_major);
      cuda::cublas::linear_forward(x, w, b, a, y);
      check_close(what + " + bias", y, cpu::activation_forward(ref_b, ap), t);
    });
  }

  const auto g = ops::linear_backward(xr, wr, dyr);
  all &= attempt(tag + " bwd + bias", [&] {
    auto dx = poisoned<T>({c.n, c.in}, Layout::row_major);
    auto dw = poisoned<T>({c.out, c.in}, Layout::row_major);
    auto db = poisoned<T>({c.out}, Layout::row_major);
    cuda::cublas::linear_backward(x, w, dy, true, dx, dw, db);
    check_close(tag + " bwd dx", dx, g.dx, tol);
    check_close(tag + " bwd dw (BGRADB)", dw, g.dw, tol);
    check_close(tag + " bwd db (BGRADB)", db, g.db, tol);
  });
  all &= attempt(tag + " bwd no bias", [&] {
    auto dx = poisoned<T>({c.n, c.in}, Layout::row_major);
    auto dw = poisoned<T>({c.out, c.in}, Layout::row_major);
    Tensor<T> no_db;
    cuda::cublas::linear_backward(x, w, dy, false, dx, dw, no_db);
    CHECK_FALSE(no_db.defined());
    check_close(tag + " bwd dx (no bias)", dx, g.dx, tol);
    check_close(tag + " bwd dw (no bias)", dw, g.dw, tol);
  });

  cuda::synchronize();
  if (all) std::printf("linear %-44s fwd x6 + bwd x2 ok\n", tag.c_str());
}

// The same through ops::, which allocates the outputs on the inputs' device.
template <class T>
void run_ops(const Case& c) {
  const std::string tag = tag_of<T>("ops", c.name);
  Rng rng(std::hash<std::string>{}(tag));
  auto [x, xr] = random_pair<T>({c.n, c.in}, rng, Layout::row_major);
  auto [w, wr] = random_pair<T>({c.out, c.in}, rng, Layout::row_major);
  auto [b, br] = random_pair<T>({c.out}, rng, Layout::row_major);
  auto [dy, dyr] = random_pair<T>({c.n, c.out}, rng, Layout::row_major);

  auto y = ops::linear_forward(x, w, b);
  CHECK(y.device() == Device::cuda(0));
  check_close(tag + " linear_forward", y, ops::linear_forward(xr, wr, br));
  auto y_nb = ops::linear_forward(x, w);
  check_close(tag + " linear_forward (no bias)", y_nb, ops::linear_forward(xr, wr));
  for (Activation a : {Activation::identity, Activation::relu, Activation::gelu_tanh}) {
    const ActivationParams ap{.kind = a};
    auto ya = ops::linear_activation_forward(x, w, b, ap);
    CHECK(ya.device() == Device::cuda(0));
    check_close(cutrain::detail::cat(tag, " linear_activation_forward ", a), ya,
                ops::linear_activation_forward(xr, wr, br, ap), act_tolerance<T>(a));
  }
  auto g = ops::linear_backward(x, w, dy);
  auto gr = ops::linear_backward(xr, wr, dyr);
  CHECK(g.dx.device() == Device::cuda(0));
  check_close(tag + " linear_backward dx", g.dx, gr.dx);
  check_close(tag + " linear_backward dw", g.dw, gr.dw);
  REQUIRE(g.db.defined());
  check_close(tag + " linear_backward db", g.db, gr.db);
  auto g_nb = ops::linear_backward(x, w, dy, false);
  CHECK_FALSE(g_nb.db.defined());
  check_close(tag + " linear_backward dx (no bias)", g_nb.dx, gr.dx);
  cuda::synchronize();
  std::printf("%-52s ok\n", tag.c_str());
}

// Views: x a column slice (rows padded, start pointer one element in), w a row slice, the bias a
// slice (start pointer one element in), y and dy column slices of wider buffers. The heuristic is
// told each pointer's real alignment; a combination it has no algorithm for must say so.
template <class T>
void run_views(const Case& c) {
  const std::string tag = tag_of<T>("views", c.name);
  Rng rng(std::hash<std::string>{}(tag));
  auto [xw, xwr] = random_pair<T>({c.n, c.in + 3}, rng, Layout::row_major);
  auto [ww, wwr] = random_pair<T>({c.out + 1, c.in}, rng, Layout::row_major);
  auto [bw, bwr] = random_pair<T>({c.out + 1}, rng, Layout::row_major);
  auto [dyw, dywr] = random_pair<T>({c.n, c.out + 2}, rng, Layout::row_major);
  auto x = xw.slice(1, 1, c.in + 1);
  auto xr = xwr.slice(1, 1, c.in + 1);
  auto w = ww.slice(0, 1, c.out + 1);
  auto wr = wwr.slice(0, 1, c.out + 1);
  auto b = bw.slice(0, 1, c.out + 1);
  auto br = bwr.slice(0, 1, c.out + 1);
  auto dy = dyw.slice(1, 2, c.out + 2);
  auto dyr = dywr.slice(1, 2, c.out + 2);
  try {
    for (Activation a : {Activation::identity, Activation::relu, Activation::gelu_tanh}) {
      const ActivationParams ap{.kind = a};
      auto yw = poisoned<T>({c.n, c.out + 2}, Layout::row_major);
      auto y = yw.slice(1, 1, c.out + 1);
      cuda::cublas::linear_forward(x, w, b, a, y);
      check_close(cutrain::detail::cat(tag, " fwd ", a, " + bias"), y, ops::linear_activation_forward(xr, wr, br, ap),
                  act_tolerance<T>(a));
    }
    auto dxw = poisoned<T>({c.n, c.in + 5}, Layout::row_major);
    auto dx = dxw.slice(1, 3, c.in + 3);
    auto dw = poisoned<T>({c.out, c.in}, Layout::row_major);
    auto db = poisoned<T>({c.out}, Layout::row_major);
    cuda::cublas::linear_backward(x, w, dy, true, dx, dw, db);
    const auto g = ops::linear_backward(xr, wr, dyr);
    check_close(tag + " bwd dx", dx, g.dx);
    check_close(tag + " bwd dw", dw, g.dw);
    check_close(tag + " bwd db", db, g.db);
    cuda::synchronize();
    std::printf("%-52s ok\n", tag.c_str());
  } catch (const NotImplemented& e) {
    std::printf("%-52s UNSUPPORTED by cuBLASLt: %s\n", tag.c_str(), e.what());
    CHECK(std::string(e.what()).find("cuBLASLt has no algorithm") != std::string::npos);
  }
}

// Empty dimensions never reach cuBLASLt (it wants m, n, k >= 1): N = 0, in = 0, out = 0.
template <class T>
void run_empty() {
  const std::string tag = cutrain::detail::cat("linear empty dims ", dtype_of<T>);
  Rng rng(std::hash<std::string>{}(tag));
  // in = 0: y = act(bias) in every row; db = sum_n dy.
  {
    auto [x, xr] = random_pair<T>({3, 0}, rng, Layout::row_major);
    auto [w, wr] = random_pair<T>({4, 0}, rng, Layout::row_major);
    auto [b, br] = random_pair<T>({4}, rng, Layout::row_major);
    auto [dy, dyr] = random_pair<T>({3, 4}, rng, Layout::row_major);
    for (Activation a : {Activation::identity, Activation::relu, Activation::gelu_tanh}) {
      auto y = poisoned<T>({3, 4}, Layout::row_major);
      cuda::cublas::linear_forward(x, w, b, a, y);
      check_close(cutrain::detail::cat(tag, " in=0 fwd ", a), y,
                  ops::linear_activation_forward(xr, wr, br, {.kind = a}), act_tolerance<T>(a));
      auto y0 = poisoned<T>({3, 4}, Layout::row_major);
      cuda::cublas::linear_forward(x, w, Tensor<T>{}, a, y0);
      check_close(cutrain::detail::cat(tag, " in=0 fwd no bias ", a), y0,
                  ops::linear_activation_forward(xr, wr, Tensor<double>{}, {.kind = a}));
    }
    Tensor<T> dx({3, 0}, {.device = Device::cuda(0)}), dw({4, 0}, {.device = Device::cuda(0)});
    auto db = poisoned<T>({4}, Layout::row_major);
    cuda::cublas::linear_backward(x, w, dy, true, dx, dw, db);
    check_close(tag + " in=0 bwd db", db, ops::linear_backward(xr, wr, dyr).db);
  }
  // N = 0: y is empty; dw = 0 and db = 0.
  {
    auto [x, xr] = random_pair<T>({0, 5}, rng, Layout::row_major);
    auto [w, wr] = random_pair<T>({4, 5}, rng, Layout::row_major);
    auto [b, br] = random_pair<T>({4}, rng, Layout::row_major);
    Tensor<T> y({0, 4}, {.device = Device::cuda(0)});
    cuda::cublas::linear_forward(x, w, b, Activation::relu, y);
    Tensor<T> dy({0, 4}, {.device = Device::cuda(0)}), dx({0, 5}, {.device = Device::cuda(0)});
    auto dw = poisoned<T>({4, 5}, Layout::row_major);
    auto db = poisoned<T>({4}, Layout::row_major);
    cuda::cublas::linear_backward(x, w, dy, true, dx, dw, db);
    const auto g = ops::linear_backward(xr, wr, Tensor<double>::zeros({0, 4}));
    check_close(tag + " N=0 bwd dw", dw, g.dw);
    check_close(tag + " N=0 bwd db", db, g.db);
  }
  // out = 0: y and dy are empty; dx = 0.
  {
    auto [x, xr] = random_pair<T>({3, 5}, rng, Layout::row_major);
    auto [w, wr] = random_pair<T>({0, 5}, rng, Layout::row_major);
    Tensor<T> y({3, 0}, {.device = Device::cuda(0)}), dy({3, 0}, {.device = Device::cuda(0)});
    cuda::cublas::linear_forward(x, w, Tensor<T>{}, Activation::identity, y);
    auto dx = poisoned<T>({3, 5}, Layout::row_major);
    Tensor<T> dw({0, 5}, {.device = Device::cuda(0)}), db({0}, {.device = Device::cuda(0)});
    cuda::cublas::linear_backward(x, w, dy, true, dx, dw, db);
    check_close(tag + " out=0 bwd dx", dx, ops::linear_backward(xr, wr, Tensor<double>::zeros({3, 0})).dx);
  }
  cuda::synchronize();
  std::printf("%-52s ok\n", tag.c_str());
}

struct Tf32Scope {
  Tf32Scope() { cuda::math_options().allow_tf32 = true; }
  ~Tf32Scope() { cuda::math_options().allow_tf32 = false; }
};

}  // namespace

TEST_CASE("gpu linear f32 (TF32 off) on cuBLASLt matches the CPU backend") {
  REQUIRE_FALSE(cuda::math_options().allow_tf32);
  for (const auto& c : cases) run_case<float>(c);
  std::printf("linear f32: BGRADB fallbacks so far: %lld\n",
              static_cast<long long>(cuda::cublas::detail::bgrad_fallbacks()));
}

TEST_CASE("gpu linear bf16 on cuBLASLt matches the CPU backend") {
  for (const auto& c : cases) run_case<cutrain::bfloat16>(c);
  std::printf("linear bf16: BGRADB fallbacks so far: %lld\n",
              static_cast<long long>(cuda::cublas::detail::bgrad_fallbacks()));
}

TEST_CASE("gpu linear f16 on cuBLASLt matches the CPU backend") {
  for (const auto& c : cases) run_case<cutrain::half>(c);
  std::printf("linear f16: BGRADB fallbacks so far: %lld\n",
              static_cast<long long>(cuda::cublas::detail::bgrad_fallbacks()));
}

TEST_CASE("gpu linear f32 with TF32 allowed matches the CPU backend within TF32 tolerance") {
  Tf32Scope tf32;
  // TF32 keeps 10 mantissa bits of each operand: 5e-3 of the output's scale (DESIGN.md: ~1e-3).
  for (const auto& c : {cases[0], cases[6], cases[8]}) run_case<float>(c, 5e-3);
}

TEST_CASE("gpu linear through ops:: dispatches on the device") {
  for (const auto& c : {cases[0], cases[2], cases[7]}) {
    run_ops<float>(c);
    run_ops<cutrain::bfloat16>(c);
    run_ops<cutrain::half>(c);
  }
}

TEST_CASE("gpu linear on views: padded rows and misaligned pointers") {
  for (const auto& c : {cases[0], cases[3], cases[7]}) {
    run_views<float>(c);
    run_views<cutrain::bfloat16>(c);
    run_views<cutrain::half>(c);
  }
  std::printf("linear views: BGRADB fallbacks so far: %lld\n",
              static_cast<long long>(cuda::cublas::detail::bgrad_fallbacks()));
}

// ops::linear_residual_forward: the residual as cuBLASLt's C operand (beta 1), against the CPU
// backend in f64; with and without a bias, a residual in another layout (a transposed view).
template <class T>
void run_residual(const Case& c, bool bias) {
  INFO(c.name << " " << dtype_of<T> << (bias ? " +bias" : ""));
  Rng rng(std::hash<std::string>{}(c.name) + (bias ? 1 : 0));
  auto [x, xr] = random_pair<T>({c.n, c.in}, rng, Layout::row_major);
  auto [w, wr] = random_pair<T>({c.out, c.in}, rng, Layout::row_major);
  auto [b, br] = random_pair<T>({c.out}, rng, Layout::row_major);
  auto [r, rr] = random_pair<T>({c.n, c.out}, rng, Layout::row_major);
  const Tensor<T> no;
  const Tensor<double> nor;
  const auto want = ops::add(ops::linear_forward(xr, wr, bias ? br : nor), rr);
  check_close("linear + residual", ops::linear_residual_forward(x, w, bias ? b : no, r), want, tolerance<T>);
  // The residual as a transposed view of [out, N] memory: copied to rows first.
  auto [rt, rtr] = random_pair<T>({c.out, c.n}, rng, Layout::row_major);
  const auto want_t = ops::add(ops::linear_forward(xr, wr, bias ? br : nor), transpose(rtr, 0, 1));
  check_close("linear + transposed residual", ops::linear_residual_forward(x, w, bias ? b : no, transpose(rt, 0, 1)),
              want_t, tolerance<T>);
}

TEST_CASE("gpu linear + residual (cuBLASLt's C operand) matches the CPU backend") {
  for (const auto& c : {cases[0], cases[3], cases[6]})
    for (const bool bias : {true, false}) {
      run_residual<float>(c, bias);
      run_residual<cutrain::bfloat16>(c, bias);
      run_residual<cutrain::half>(c, bias);
    }
}

TEST_CASE("gpu linear with empty dimensions") {
  run_empty<float>();
  run_empty<cutrain::bfloat16>();
  run_empty<cutrain::half>();
}

TEST_CASE("gpu linear: what cuBLASLt does not fuse, and bad input, throw errors that name it") {
  Rng rng(11);
  auto [x, xr] = random_pair<float>({4, 6}, rng, Layout::row_major);
  auto [w, wr] = random_pair<float>({3, 6}, rng, Layout::row_major);
  auto [b, br] = random_pair<float>({3}, rng, Layout::row_major);
  auto expect = [](auto&& fn, const char* what, std::initializer_list<const char*> words) {
    bool thrown = false;
    try {
      fn();
    } catch (const Error& e) {
      thrown = true;
      INFO(what << ": " << e.what());
      for (const char* word : words) CHECK(std::string(e.what()).find(word) != std::string::npos);
    }
    INFO(what);
    CHECK(thrown);
  };
  expect([&] { (void)ops::linear_activation_forward(x, w, b, {.kind = Activation::silu}); }, "silu epilogue",
         {"linear_activation_forward", "silu", "bias"});
  expect([&] { (void)ops::linear_activation_forward(x, w, Tensor<float>{}, {.kind = Activation::gelu_erf}); },
         "gelu_erf epilogue", {"linear_activation_forward", "gelu_erf"});
  CHECK_THROWS_AS(ops::linear_activation_forward(x, w, b, {.kind = Activation::leaky_relu}), NotImplemented);
  auto xd = Tensor<double>::zeros({4, 6}, {.device = Device::cuda(0)});
  auto wd = Tensor<double>::zeros({3, 6}, {.device = Device::cuda(0)});
  expect([&] { (void)ops::linear_forward(xd, wd); }, "f64 on the GPU", {"linear_forward", "f64"});
  CHECK_THROWS_AS(ops::linear_forward(xd, wd), NotImplemented);
  expect([&] { (void)ops::linear_forward(x, Tensor<float>::zeros({3, 6})); }, "mixed devices",
         {"linear_forward", "different devices"});
  CHECK_THROWS_AS(ops::linear_forward(x, Tensor<float>::zeros({3, 6})), DeviceError);
  auto y_bad = poisoned<float>({4, 4}, Layout::row_major);
  expect([&] { cuda::cublas::linear_forward(x, w, b, Activation::relu, y_bad); }, "wrong y shape", {"linear_forward", "y"});
  CHECK_THROWS_AS(cuda::cublas::linear_forward(x, w, b, Activation::relu, y_bad), InvalidArgument);
  auto xb = poisoned<float>({4, 7}, Layout::row_major);
  CHECK_THROWS_AS(ops::linear_forward(xb, w, b), InvalidArgument);  // in differs
  auto dy = poisoned<float>({4, 3}, Layout::row_major);
  auto dx = poisoned<float>({4, 6}, Layout::row_major), dw = poisoned<float>({3, 6}, Layout::row_major);
  Tensor<float> db_missing;
  CHECK_THROWS_AS(cuda::cublas::linear_backward(x, w, dy, true, dx, dw, db_missing), InvalidArgument);
  std::printf("linear errors ok\n");
}

}  // namespace cutrain_test_linear_gpu
