// A max pool's indices on the GPU (the cutrain_pool2d_dilated_indices kernel) against the CPU's,
// exactly, in f32, bf16 and f16: values full of ties and with NaN, x in NCHW, NHWC and strided,
// windows with padding, ceil mode, overlap and dilation; and max_unpool2d on the GPU against the
// CPU. The indices are poisoned first, so an unwritten one fails.
#include "parity.hpp"

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "cutrain/cuda/kernels/pool2d.hpp"
#include "cutrain/ops/pool2d.hpp"

namespace cutrain_test_pool_indices_gpu {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;

namespace {

std::vector<Pool2dParams> params() {
  Pool2dParams ceil3 = Pool2dParams::max(3, 2, 1);
  ceil3.ceil_mode = true;
  Pool2dParams rect = {.kernel_h = 2, .kernel_w = 3, .stride_h = 1, .stride_w = 2, .pad_top = 1, .pad_bottom = 0,
                       .pad_left = 1, .pad_right = 1};
  return {Pool2dParams::max(2), Pool2dParams::max(3, 2, 1), ceil3, Pool2dParams::max(3, 1), rect,
          Pool2dParams::max(3, 1, 2, 2)};
}

// Values in {-1, -0.5, 0, 0.5, 1} (ties in every window; exact in every dtype), a few NaN.
template <class T>
std::pair<Tensor<T>, Tensor<double>> tied_input(const Shape& s, Rng& rng, Layout l, bool strided) {
  const Shape big = strided ? Shape{s[0], s[1] + 2, s[2], s[3] + 3} : s;
  std::vector<float> v(static_cast<std::size_t>(big.numel()));
  for (auto& e : v) e = rng.uniform(0.0, 1.0) < 0.02 ? std::nanf("") : std::round(static_cast<float>(rng.uniform(-1.0, 1.0)) * 2) / 2;
  Tensor<T> host = cast<T>(Tensor<float>::from_vector(v, big, {.layout = l}));
  if (strided) host = host.slice(1, 1, 1 + s[1]).slice(3, 2, 2 + s[3]);
  Tensor<double> ref = cast<double>(host.contiguous(Layout::nchw));
  return {host.to(Device::cuda(0)), std::move(ref)};
}

template <class T>
void run_indices() {
  Rng rng(21);
  int runs = 0;
  for (const Pool2dParams& p : params())
    for (Layout l : {Layout::nchw, Layout::nhwc})
      for (bool strided : {false, true}) {
        const Shape s{2, 5, 9, 11};
        auto [x, ref] = tied_input<T>(s, rng, l, strided);
        const Shape ys = pool2d_output_shape(s, p);
        Tensor<std::int32_t> idx(ys, {.device = Device::cuda(0)});
        idx.fill(-7);
        cuda::kernels::max_pool2d_indices(x, p, idx);
        const auto want = ops::max_pool2d_indices(ref, p).to_vector();
        INFO(dtype_of<T> << " " << p << (l == Layout::nhwc ? " nhwc" : " nchw") << (strided ? " strided" : ""));
        REQUIRE(idx.to(Device::cpu()).to_vector() == want);
        // Through ops:: and back again: max_unpool2d of a random dy equals the CPU's.
        const Tensor<std::int32_t> via_ops = ops::max_pool2d_indices(x, p);
        REQUIRE(via_ops.to(Device::cpu()).to_vector() == want);
        auto [dy, dy_ref] = random_pair<T>(ys, rng, Layout::nchw);
        const Tensor<T> un = ops::max_unpool2d(dy, via_ops, s);
        const Tensor<double> un_ref = ops::max_unpool2d(dy_ref, ops::max_pool2d_indices(ref, p), s);
        check_close("max_unpool2d", un.to(Device::cpu()), un_ref);
        ++runs;
      }
  CHECK(runs == 24);
  std::printf("%-60s ok\n", cutrain::detail::cat("max_pool2d_indices and max_unpool2d ", dtype_of<T>).c_str());
}

}  // namespace

TEST_CASE("gpu max_pool2d_indices picks the CPU's element, and max_unpool2d matches the CPU", "[pool][indices]") {
  run_indices<float>();
  run_indices<cutrain::bfloat16>();
  run_indices<cutrain::half>();
}

TEST_CASE("gpu max_pool2d_indices refuses an average pool and a wrong idx", "[pool][indices]") {
  Rng rng(22);
  auto [x, ref] = random_pair<float>({1, 2, 4, 4}, rng, Layout::nchw);
  Tensor<std::int32_t> idx(Shape{1, 2, 2, 2}, {.device = Device::cuda(0)});
  CHECK_THROWS_WITH(cuda::kernels::max_pool2d_indices(x, Pool2dParams::average(2), idx),
                    Catch::Contains("max_pool2d_indices") && Catch::Contains("max pool"));
  Tensor<std::int32_t> wrong(Shape{1, 2, 3, 2}, {.device = Device::cuda(0)});
  CHECK_THROWS_WITH(cuda::kernels::max_pool2d_indices(x, Pool2dParams::max(2), wrong),
                    Catch::Contains("idx must be a contiguous NCHW [1,2,2,2]"));
}

}  // namespace cutrain_test_pool_indices_gpu
