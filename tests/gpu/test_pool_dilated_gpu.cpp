// Dilated pooling on the GPU (the pool2d_dilated kernels) against the CPU backend in f64, in f32,
// bf16 and f16: max and average, dilation 2, 3 and 2x3, kernels 2 and 3 (and 3x2), padding 0 to
// kernel - 1, stride 1 and 2, ceil mode on and off, count_include_pad on and off, forward and
// backward, x in NCHW, NHWC and strided, dy and outputs in the same or the other layout. Every
// configuration the CPU accepts is run (those it refuses, windows whose taps all fall in the
// padding, are skipped, and the GPU must refuse them too). Max pooling on values full of ties and
// with NaN is compared exactly, forward and backward: the gradient must reach the same element as
// on the CPU. Outputs are poisoned with NaN, so an unwritten element fails.
#include "parity.hpp"
#include "cpu/bad_input.hpp"

#include <bit>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cutrain/cuda/kernels/pool2d.hpp"
#include "cutrain/ops/pool2d.hpp"

namespace cutrain_test_pool_dilated_gpu {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;
namespace kernels = cutrain::cuda::kernels;

namespace {

using PM = PoolMode;

std::uint64_t seed_of(const std::string& tag) { return std::hash<std::string>{}(tag); }

// Uniform in [-1, 1); with ties, rounded to {-1, -0.5, 0, 0.5, 1} (exact in every dtype, and
// sums of a few of them are exact in f32).
std::vector<float> draw(std::int64_t n, Rng& rng, bool ties) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& e : v) {
    e = static_cast<float>(rng.uniform(-1.0, 1.0));
    if (ties) e = std::round(e * 2.0f) / 2.0f;
  }
  return v;
}

// A device tensor of T holding the values in layout l, and the same values after rounding to T
// as a host f64 tensor.
template <class T>
std::pair<Tensor<T>, Tensor<double>> device_pair(const std::vector<float>& values, const Shape& s, Layout l) {
  auto t = cast<T>(Tensor<float>::from_vector(values, s, {.layout = l}));
  auto ref = cast<double>(t);
  return {t.to(Device::cuda(0)), std::move(ref)};
}

// x of shape s: contiguous in l, or (strided) the middle of a tensor 3 wider in W and 2 in C.
template <class T>
std::pair<Tensor<T>, Tensor<double>> input(const Shape& s, Rng& rng, Layout l, bool strided, bool ties) {
  if (!strided) return device_pair<T>(draw(s.numel(), rng, ties), s, l);
  const Shape wide{s[0], s[1] + 2, s[2], s[3] + 3};
  auto [w, wr] = device_pair<T>(draw(wide.numel(), rng, ties), wide, l);
  return {w.slice(3, 1, 1 + s[3]).slice(1, 2, 2 + s[1]), wr.slice(3, 1, 1 + s[3]).slice(1, 2, 2 + s[1])};
}

Layout other(Layout l) { return l == Layout::nhwc ? Layout::nchw : Layout::nhwc; }

// gpu == ref element for element (NaN matching NaN).
template <class T>
void check_exact(const std::string& what, const Tensor<T>& gpu, const Tensor<double>& ref) {
  REQUIRE(gpu.shape() == ref.shape());
  const auto g = cast<double>(gpu).to_vector();
  const auto r = ref.to_vector();
  std::size_t bad = 0;
  for (std::size_t i = 0; i < g.size(); ++i) bad += (g[i] == r[i] || (std::isnan(g[i]) && std::isnan(r[i]))) ? 0 : 1;
  INFO(what << ": " << bad << " of " << g.size() << " elements differ");
  CHECK(bad == 0);
}

struct Layouts {
  Layout x, dy, out;
  bool strided_x;
};

// One configuration in one layout combination; exact: ties (and NaN) data, compared exactly.
template <class T>
void run_dilated(const Shape& s, const Pool2dParams& p, const Layouts& ls, bool exact, int nans = 0) {
  const std::string tag = cutrain::detail::cat("pool2d dilated ", s, " ", dtype_of<T>, " x ",
                                               ls.strided_x ? std::string("strided") : std::string(to_string(ls.x)),
                                               " dy ", ls.dy, " out ", ls.out, exact ? " ties" : "", nans ? " NaN" : "");
  INFO(tag << " " << p);
  Rng rng(seed_of(tag + cutrain::detail::cat(p)));
  auto [x, xr] = input<T>(s, rng, ls.x, ls.strided_x, exact);
  if (nans > 0) {  // a few NaN in x (contiguous only: values are set through a fresh vector)
    auto v = cast<float>(xr).to_vector();
    for (int k = 0; k < nans; ++k) v[rng.below(v.size())] = std::numeric_limits<float>::quiet_NaN();
    std::tie(x, xr) = device_pair<T>(v, s, ls.x);
  }
  const Shape ys = pool2d_output_shape(s, p);
  auto [dy, dyr] = input<T>(ys, rng, ls.dy, false, exact);
  const Tensor<double> y_ref = ops::pool2d_forward(xr, p);
  const Tensor<double> dx_ref = ops::pool2d_backward(xr, y_ref, dyr, p);
  const bool is_max = p.mode == PM::max;

  // Through ops::, which allocates outputs in x's layout.
  auto y = ops::pool2d_forward(x, p);
  CHECK(y.device() == Device::cuda(0));
  if (nans == 0) check_close(tag + " ops forward", y, y_ref);
  if (is_max) check_exact(tag + " ops forward (exact)", y, y_ref);
  auto dx = ops::pool2d_backward(x, y, dy, p);
  check_close(tag + " ops backward", dx, dx_ref);
  if (exact) check_exact(tag + " ops backward (exact)", dx, dx_ref);

  // The kernels directly, writing poisoned outputs in out_layout.
  auto y2 = poisoned<T>(ys, ls.out);
  kernels::pool2d_forward(x, p, y2);
  if (nans == 0) check_close(tag + " kernel forward", y2, y_ref);
  if (is_max) check_exact(tag + " kernel forward (exact)", y2, y_ref);
  auto dx2 = poisoned<T>(s, ls.out);
  kernels::pool2d_backward(x, dy, p, dx2);
  check_close(tag + " kernel backward", dx2, dx_ref);
  if (exact) check_exact(tag + " kernel backward (exact)", dx2, dx_ref);

  // Deterministic: no atomics.
  auto dx3 = poisoned<T>(s, ls.out);
  kernels::pool2d_backward(x, dy, p, dx3);
  const auto a = cast<float>(dx2).to_vector(), b = cast<float>(dx3).to_vector();
  std::size_t differ = 0;
  for (std::size_t i = 0; i < a.size(); ++i) differ += std::bit_cast<std::uint32_t>(a[i]) == std::bit_cast<std::uint32_t>(b[i]) ? 0 : 1;
  INFO(tag << ": two backward runs differ in " << differ << " elements");
  CHECK(differ == 0);
}

// Whether the CPU accepts p for x of shape s; when it does not, the GPU must refuse it alike.
template <class T>
bool accepted(const Shape& s, const Pool2dParams& p) {
  try {
    (void)pool2d_output_shape(s, p);
    return true;
  } catch (const InvalidArgument&) {
    Rng rng(1);
    auto [x, xr] = input<T>(s, rng, Layout::nchw, false, false);
    CHECK_THROWS_AS(ops::pool2d_forward(x, p), InvalidArgument);
    return false;
  }
}

// Every configuration of the grid; returns how many the CPU accepted (and were run).
template <class T>
int run_dilated_grid() {
  const Shape s{2, 5, 11, 10};
  struct Dil {
    int h, w;
  };
  struct Kern {
    int h, w;
  };
  int ran = 0, combo = 0;
  for (PM mode : {PM::max, PM::average})
    for (Dil d : {Dil{2, 2}, Dil{3, 3}, Dil{2, 3}})
      for (Kern k : {Kern{2, 2}, Kern{3, 3}, Kern{3, 2}})
        for (int pad = 0; pad < std::min(k.h, k.w); ++pad)
          for (int stride : {1, 2})
            for (bool ceil : {false, true})
              for (bool cip : {true, false}) {
                if (mode == PM::max && !cip) continue;  // count_include_pad is average-only
                Pool2dParams p{.mode = mode, .kernel_h = k.h, .kernel_w = k.w, .stride_h = stride,
                               .stride_w = stride, .pad_top = pad, .pad_bottom = pad, .pad_left = pad,
                               .pad_right = pad, .count_include_pad = cip, .ceil_mode = ceil,
                               .dilation_h = d.h, .dilation_w = d.w};
                // and asymmetric padding, up to kernel - 1 on one side
                if (pad == 1) {
                  p.pad_bottom = k.h - 1;
                  p.pad_left = 0;
                }
                if (!accepted<T>(s, p)) continue;
                ++ran;
                // Each configuration in NCHW and NHWC, and in turn strided x or mixed layouts.
                for (Layout l : {Layout::nchw, Layout::nhwc}) {
                  run_dilated<T>(s, p, {l, l, l, false}, false);
                  if (++combo % 2 == 0)
                    run_dilated<T>(s, p, {l, l, other(l), true}, false);
                  else
                    run_dilated<T>(s, p, {l, other(l), other(l), false}, false);
                }
              }
  std::printf("%-60s %d configurations ok\n", cutrain::detail::cat("pool2d dilated grid ", dtype_of<T>).c_str(), ran);
  return ran;
}

// Max pooling on ties (and on ties with NaN), compared exactly forward and backward.
template <class T>
void run_dilated_ties() {
  const Shape s{2, 4, 12, 11};
  for (const Pool2dParams& p :
       {Pool2dParams::max(3, 1, 2, 2), Pool2dParams::max(2, 2, 1, 3), Pool2dParams::max(3, 2, 1, 2),
        Pool2dParams{.mode = PM::max, .kernel_h = 3, .kernel_w = 2, .stride_h = 1, .stride_w = 2, .pad_top = 2,
                     .pad_bottom = 0, .pad_left = 1, .pad_right = 1, .ceil_mode = true, .dilation_h = 2,
                     .dilation_w = 3}})
    for (Layout l : {Layout::nchw, Layout::nhwc}) {
      run_dilated<T>(s, p, {l, l, l, false}, true);
      run_dilated<T>(s, p, {l, other(l), other(l), true}, true);
      run_dilated<T>(s, p, {l, l, other(l), false}, true, 10);
    }
  std::printf("%-60s ok\n", cutrain::detail::cat("pool2d dilated max ties and NaN ", dtype_of<T>).c_str());
}

}  // namespace

TEST_CASE("gpu dilated max and average pooling, forward and backward, match the CPU backend") {
  CHECK(run_dilated_grid<float>() > 100);
  CHECK(run_dilated_grid<cutrain::bfloat16>() > 100);
  CHECK(run_dilated_grid<cutrain::half>() > 100);
}

TEST_CASE("gpu dilated max pooling with ties and NaN picks the CPU's element") {
  run_dilated_ties<float>();
  run_dilated_ties<cutrain::bfloat16>();
  run_dilated_ties<cutrain::half>();
}

TEST_CASE("gpu dilated pooling: bad input is refused with the op's error") {
  Rng rng(3);
  auto [x, xr] = random_pair<float>({2, 3, 8, 8}, rng, Layout::nchw);
  const auto p = Pool2dParams::max(3, 1, 2, 3);  // span 7, pad 2: output [2,3,6,6]
  // a window whose taps (rows -1 and 8 of 8) all lie in the padding is refused on both backends
  const Pool2dParams empty{.mode = PM::average, .kernel_h = 2, .kernel_w = 2, .stride_h = 1, .stride_w = 1,
                           .pad_top = 1, .pad_bottom = 1, .pad_left = 1, .pad_right = 1, .dilation_h = 9,
                           .dilation_w = 9};
  const std::string kf = "cuda::kernels::pool2d_forward", kb = "cuda::kernels::pool2d_backward";
  run_cases({
      bad<InvalidArgument>("dilated y of the wrong shape", kf, {"y must have shape [2,3,6,6]", "[2,3,5,4]"},
                           [&] {
                             auto wrong = poisoned<float>({2, 3, 5, 4}, Layout::nchw);
                             kernels::pool2d_forward(x, p, wrong);
                           }),
      bad<InvalidArgument>("dilated dy of the wrong shape", kb, {"dy must have the output shape [2,3,6,6]", "[2,3,5,4]"},
                           [&] {
                             auto wrong = poisoned<float>({2, 3, 5, 4}, Layout::nchw);
                             auto dx = poisoned<float>({2, 3, 8, 8}, Layout::nchw);
                             kernels::pool2d_backward(x, wrong, p, dx);
                           }),
      bad<InvalidArgument>("dilated dx of the wrong shape", kb, {"dx must have shape [2,3,8,8]", "[2,3,8,7]"},
                           [&] {
                             auto dy = poisoned<float>({2, 3, 6, 6}, Layout::nchw);
                             auto dx = poisoned<float>({2, 3, 8, 7}, Layout::nchw);
                             kernels::pool2d_backward(x, dy, p, dx);
                           }),
      bad<InvalidArgument>("dilated window wholly in the padding", kf, {"all lie in the padding", "[2,3,8,8]", "dilation 9x9"},
                           [&] {
                             auto y = poisoned<float>({2, 3, 1, 1}, Layout::nchw);
                             kernels::pool2d_forward(x, empty, y);
                           }),
      bad<DeviceError>("dilated dy on the host", "pool2d_backward", {}, [&] {
        auto y = ops::pool2d_forward(x, p);
        Tensor<float> dy_host(y.shape());
        (void)ops::pool2d_backward(x, y, dy_host, p);
      }),
  });
  CHECK_THROWS_AS(ops::pool2d_forward(x, empty), InvalidArgument);
  std::printf("%-60s ok\n", "pool2d dilated bad input");
}

}  // namespace cutrain_test_pool_dilated_gpu
