// RMS norm over the last 1, 2 or 3 dims (gamma's shape) of rank-2 to rank-4 tensors on the GPU
// against the CPU backend in f64, in f32, bf16 and f16, forward and backward, with row-major,
// transposed (strided) and NHWC inputs: the path ops/rms_norm.hpp takes (cuDNN's rmsnorm graph,
// or the composed fallback where cuDNN has no engine), and the composed fallback on its own.
#include "parity.hpp"

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "cutrain/core/view.hpp"
#include "cutrain/cuda/runtime.hpp"
#include "cutrain/ops/rms_norm.hpp"

namespace cutrain_test_rms_norm_gpu {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;

namespace {

constexpr double stats_tol = 1e-4;

// variant 0: row-major; 1: transpose(., 0, rank - 1) of a row-major tensor (strided); 2: NHWC.
template <class T>
void run_rms(const Shape& shape, int k, int variant, double eps = 1e-5) {
  const std::string tag = cutrain::detail::cat("rms_norm ", dtype_of<T>, " ", shape, " last ", k, " eps ", eps,
                                               variant == 1 ? " strided" : variant == 2 ? " nhwc" : "");
  Rng rng(std::hash<std::string>{}(tag));
  const int r = shape.rank();
  Shape stored = shape;
  if (variant == 1) std::swap(stored[0], stored[r - 1]);
  const Layout l = variant == 2 ? Layout::nhwc : Layout::row_major;
  auto [x0, xr0] = random_pair<T>(stored, rng, l);
  auto [dy0, dyr0] = random_pair<T>(stored, rng, l);
  auto view = [&](const auto& t) { return variant == 1 ? transpose(t, 0, r - 1) : t.view(); };
  const Tensor<T> x = view(x0), dy = view(dy0);
  const Tensor<double> xr = view(xr0), dyr = view(dyr0);
  if (variant == 2) REQUIRE(x.layout() == Layout::nhwc);
  const Shape ns(std::vector<std::int64_t>(shape.dims().end() - k, shape.dims().end()));
  auto [gamma, gr] = random_pair<float>(ns, rng, Layout::row_major);
  using S = float;  // parameters and statistics in f32 under every x dtype on the GPU
  const std::int64_t fallbacks0 = cuda::cudnn::kernel_fallbacks().load();
  const auto ref = ops::rms_norm_forward(xr, gr, eps);
  auto got = ops::rms_norm_forward<T, S>(x, gamma, eps);
  CHECK(got.y.device() == Device::cuda(0));
  CHECK(got.y.shape() == shape);
  if (variant == 2) CHECK(got.y.layout() == Layout::nhwc);
  CHECK(got.inv_rms.shape() == ref.inv_rms.shape());
  check_close(tag + " y", got.y, ref.y);
  check_close(tag + " inv_rms", got.inv_rms, ref.inv_rms, stats_tol);
  const auto gb = ops::rms_norm_backward<T, S>(x, dy, gamma, got.inv_rms);
  const auto rb = ops::rms_norm_backward(xr, dyr, gr, ref.inv_rms);
  CHECK(gb.dx.shape() == shape);
  CHECK(gb.dgamma.shape() == ns);
  if (variant == 2) CHECK(gb.dx.layout() == Layout::nhwc);
  const double ptol = stats_tol * (std::is_same_v<T, float> ? 1 : 10);
  check_close(tag + " dx", gb.dx, rb.dx);
  check_close(tag + " dgamma", gb.dgamma, rb.dgamma, ptol);
  cuda::synchronize();
  const std::int64_t fell_back = cuda::cudnn::kernel_fallbacks().load() - fallbacks0;
  std::printf("%-72s ok%s\n", tag.c_str(), fell_back ? " (composed: no cuDNN engine)" : "");
}

// The fallback ops/rms_norm.hpp composes from GPU ops, called directly on x as [rows, d].
template <class T>
void run_composed(std::int64_t rows, std::int64_t d, double eps = 1e-5) {
  const std::string tag = cutrain::detail::cat("rms_norm composed ", dtype_of<T>, " [", rows, ",", d, "]");
  Rng rng(std::hash<std::string>{}(tag));
  auto [x, xr] = random_pair<T>({rows, d}, rng, Layout::row_major);
  auto [dy, dyr] = random_pair<T>({rows, d}, rng, Layout::row_major);
  auto [gamma, gr] = random_pair<float>({d}, rng, Layout::row_major);
  const auto ref = ops::rms_norm_forward(xr, gr, eps);
  const auto got = ops::detail::rms_norm_composed_forward(x, gamma, eps);
  CHECK((got.y.shape() == Shape{rows, d}));
  check_close(tag + " y", got.y, ref.y);
  check_close(tag + " inv_rms", got.inv_rms, ref.inv_rms, stats_tol);
  const auto gb = ops::detail::rms_norm_composed_backward(x, dy, gamma, got.inv_rms);
  const auto rb = ops::rms_norm_backward(xr, dyr, gr, ref.inv_rms);
  check_close(tag + " dx", gb.dx, rb.dx);
  check_close(tag + " dgamma", gb.dgamma, rb.dgamma, stats_tol * (std::is_same_v<T, float> ? 1 : 10));
  cuda::synchronize();
  std::printf("%-72s ok\n", tag.c_str());
}

template <class T>
void run_rms_all() {
  for (int variant : {0, 1}) {
    run_rms<T>({4, 6, 32}, 1, variant);     // [B, T, C] over C
    run_rms<T>({4, 6, 32}, 2, variant);
    run_rms<T>({3, 5, 7, 9}, 1, variant);   // odd sizes
    run_rms<T>({3, 5, 7, 9}, 2, variant);
    run_rms<T>({3, 5, 7, 9}, 3, variant);   // the [N, ...] case
    run_rms<T>({5, 300}, 1, variant);
    run_rms<T>({5, 300}, 2, variant);       // everything: one row
    run_rms<T>({7, 13, 1}, 1, variant);     // one element per row
  }
  run_rms<T>({3, 5, 7, 9}, 1, 2);
  run_rms<T>({3, 5, 7, 9}, 2, 2);
  run_rms<T>({2, 8, 4, 4}, 3, 2);
  run_rms<T>({8, 128, 384}, 1, 0);          // [B, T, C] with C = 384
  run_rms<T>({3, 17, 385}, 1, 0);           // odd C
  run_rms<T>({8, 128, 384}, 1, 0, 0.1);     // a large eps
  run_composed<T>(6, 7);
  run_composed<T>(1024, 384);
  run_composed<T>(33, 1);
}

}  // namespace

TEST_CASE("gpu rms norm over the trailing 1, 2, 3 dims matches the CPU backend") {
  run_rms_all<float>();
  run_rms_all<cutrain::bfloat16>();
  run_rms_all<cutrain::half>();
  const auto cuda0 = Device::cuda(0);
  Tensor<float> x({2, 3, 4}, {.device = cuda0}), g43({4, 3}, {.device = cuda0}), g4({4}, {.device = cuda0});
  CHECK_THROWS_AS(ops::rms_norm_forward(x, g43), InvalidArgument);             // not x's trailing dims
  CHECK_THROWS_AS(ops::rms_norm_forward(x, g4, 0.0), InvalidArgument);         // eps
  Tensor<float> inv({2}, {.device = cuda0});
  CHECK_THROWS_AS(ops::rms_norm_backward(x, x, g4, inv), InvalidArgument);     // inv_rms must be [2, 3]
  Tensor<cutrain::bfloat16> xb({2, 3, 4}, {.device = cuda0}), gb({4}, {.device = cuda0});
  CHECK_THROWS_AS(ops::rms_norm_forward(xb, gb), NotImplemented);              // parameters must be f32 on the GPU
}

}  // namespace cutrain_test_rms_norm_gpu
