// Layer norm over the last 1, 2 or 3 dims (gamma's shape) of rank-2 to rank-4 tensors on the GPU
// (cuDNN on x viewed as [rows, d]) against the CPU backend in f64, in f32, bf16 and f16, forward
// and backward, with row-major, transposed (strided) and NHWC inputs.
#include "parity.hpp"

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "cutrain/core/view.hpp"
#include "cutrain/cuda/runtime.hpp"
#include "cutrain/ops/layer_norm.hpp"

namespace cutrain_test_layer_norm_axes_gpu {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;

namespace {

constexpr double stats_tol = 1e-4;

// variant 0: row-major; 1: transpose(., 0, rank - 1) of a row-major tensor (strided); 2: NHWC.
template <class T>
void run_ln(const Shape& shape, int k, int variant) {
  const std::string tag = cutrain::detail::cat("layer_norm ", dtype_of<T>, " ", shape, " last ", k,
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
  auto [beta, br] = random_pair<float>(ns, rng, Layout::row_major);
  using S = float;  // parameters and statistics in f32 under every x dtype on the GPU
  const auto ref = ops::layer_norm_forward(xr, gr, br, 1e-5);
  auto got = ops::layer_norm_forward<T, S>(x, gamma, beta, 1e-5);
  CHECK(got.y.device() == Device::cuda(0));
  CHECK(got.y.shape() == shape);
  if (variant == 2) CHECK(got.y.layout() == Layout::nhwc);
  CHECK(got.mean.shape() == ref.mean.shape());
  check_close(tag + " y", got.y, ref.y);
  check_close(tag + " mean", got.mean, ref.mean, stats_tol);
  check_close(tag + " inv_std", got.inv_std, ref.inv_std, stats_tol);
  const auto gb = ops::layer_norm_backward<T, S>(x, dy, gamma, got.mean, got.inv_std);
  const auto rb = ops::layer_norm_backward(xr, dyr, gr, ref.mean, ref.inv_std);
  CHECK(gb.dgamma.shape() == ns);
  const double ptol = stats_tol * (std::is_same_v<T, float> ? 1 : 10);
  check_close(tag + " dx", gb.dx, rb.dx);
  check_close(tag + " dgamma", gb.dgamma, rb.dgamma, ptol);
  check_close(tag + " dbeta", gb.dbeta, rb.dbeta, ptol);
  cuda::synchronize();
  std::printf("%-64s ok\n", tag.c_str());
}

template <class T>
void run_ln_all() {
  for (int variant : {0, 1}) {
    run_ln<T>({4, 6, 32}, 1, variant);      // [B, T, C] over C
    run_ln<T>({4, 6, 32}, 2, variant);
    run_ln<T>({3, 5, 7, 9}, 1, variant);
    run_ln<T>({3, 5, 7, 9}, 2, variant);
    run_ln<T>({3, 5, 7, 9}, 3, variant);    // the [N, ...] case
    run_ln<T>({5, 300}, 2, variant);        // everything: one row
  }
  run_ln<T>({3, 5, 7, 9}, 1, 2);
  run_ln<T>({3, 5, 7, 9}, 2, 2);
  run_ln<T>({2, 8, 4, 4}, 3, 2);
  run_ln<T>({64, 256, 768}, 1, 0);          // a transformer block's shape
}

}  // namespace

TEST_CASE("gpu layer norm over the trailing 1, 2, 3 dims matches the CPU backend") {
  run_ln_all<float>();
  run_ln_all<cutrain::bfloat16>();
  run_ln_all<cutrain::half>();
  const auto cuda0 = Device::cuda(0);
  Tensor<float> x({2, 3, 4}, {.device = cuda0}), g({3, 4}, {.device = cuda0}), b({4}, {.device = cuda0});
  CHECK_THROWS_AS(ops::layer_norm_forward(x, g, b), InvalidArgument);          // beta's shape
  CHECK_THROWS_AS(ops::layer_norm_forward(x, b, g), InvalidArgument);          // beta's shape
  Tensor<float> g43({4, 3}, {.device = cuda0});
  CHECK_THROWS_AS(ops::layer_norm_forward(x, g43, g43), InvalidArgument);      // not x's trailing dims
}

}  // namespace cutrain_test_layer_norm_axes_gpu
