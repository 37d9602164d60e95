// Pooling and batch-norm inference on the GPU (NVRTC kernels) against the CPU backend in f64, in
// f32, bf16 and f16: max and average pooling (count_include_pad on and off, ceil mode, symmetric
// and asymmetric padding, overlapping windows, stride > kernel, odd sizes, batch 1) forward and
// backward, global average pooling forward and backward, in NCHW and NHWC, mixed layouts (x NCHW
// with dy NHWC and the reverse, outputs in the other layout) and strided (sliced) inputs; max
// pooling on distinct values and on values full of ties (the first-maximum rule), and with NaN;
// one 256x128x32x32 bf16 NHWC max-pool 2x2; batch-norm inference in NCHW, NHWC, 2-d, odd C,
// strided x and mixed layouts. Outputs are poisoned with NaN, so an unwritten element fails.
//
// The CPU reference is computed from the inputs after rounding to T, so a max-pool argmax is the
// same element on both sides: both compare the same values with the same tie rule.
#include "parity.hpp"

#include <bit>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "cutrain/cpu/batch_norm.hpp"
#include "cutrain/cuda/kernels/batch_norm_inference.hpp"
#include "cutrain/cuda/kernels/pool2d.hpp"
#include "cutrain/ops/pool2d.hpp"

namespace cutrain_test_pool_gpu {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;
namespace kernels = cutrain::cuda::kernels;

namespace {

std::uint64_t seed_of(const std::string& tag) { return std::hash<std::string>{}(tag); }

// How a test input's values are drawn.
enum class Data {
  uniform,      // uniform in [-1, 1)
  permutation,  // a shuffled permutation of n evenly spaced values in (-1, 1): distinct in f32
  ties,         // uniform rounded to {-1, -0.5, 0, 0.5, 1}: windows full of equal maxima
};

std::vector<float> draw(std::int64_t n, Rng& rng, Data data) {
  std::vector<float> v(static_cast<std::size_t>(n));
  if (data == Data::permutation) {
    std::vector<std::int64_t> perm(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) perm[static_cast<std::size_t>(i)] = i;
    for (std::int64_t i = n - 1; i > 0; --i)
      std::swap(perm[static_cast<std::size_t>(i)], perm[rng.below(static_cast<std::uint64_t>(i + 1))]);
    for (std::int64_t i = 0; i < n; ++i)
      v[static_cast<std::size_t>(i)] =
          static_cast<float>(-1.0 + 2.0 * (static_cast<double>(perm[static_cast<std::size_t>(i)]) + 0.5) / static_cast<double>(n));
    return v;
  }
  for (auto& e : v) {
    e = static_cast<float>(rng.uniform(-1.0, 1.0));
    if (data == Data::ties) e = std::round(e * 2.0f) / 2.0f;
  }
  return v;
}

// A device tensor of T holding the values (logical row-major order) in layout l, and the same
// values after rounding to T as a host f64 tensor.
template <class T>
std::pair<Tensor<T>, Tensor<double>> device_pair(const std::vector<float>& values, const Shape& s, Layout l) {
  auto host = Tensor<float>::from_vector(values, s, {.layout = s.rank() == 4 ? l : Layout::row_major});
  auto t = cast<T>(host);
  auto ref = cast<double>(t);
  return {t.to(Device::cuda(0)), std::move(ref)};
}

template <class T>
std::pair<Tensor<T>, Tensor<double>> input(const Shape& s, Rng& rng, Layout l, Data data = Data::uniform) {
  return device_pair<T>(draw(s.numel(), rng, data), s, l);
}

// A strided input of shape s: the middle of a tensor 3 wider in W and 2 wider in C, laid out l
// (not contiguous, unless s is so degenerate that its strides do not matter, as [1, C, 1, 1]).
template <class T>
std::pair<Tensor<T>, Tensor<double>> strided_input(const Shape& s, Rng& rng, Layout l, Data data = Data::uniform) {
  const Shape wide{s[0], s[1] + 2, s[2], s[3] + 3};
  auto [w, wr] = input<T>(wide, rng, l, data);
  auto t = w.slice(3, 1, 1 + s[3]).slice(1, 2, 2 + s[1]);
  auto r = wr.slice(3, 1, 1 + s[3]).slice(1, 2, 2 + s[1]);
  return {std::move(t), std::move(r)};
}

Layout other(Layout l) { return l == Layout::nhwc ? Layout::nchw : Layout::nhwc; }

// The layout the CPU backend gives an op's output for input `like`: nhwc stays nhwc, all else
// becomes row-major (nchw); checked through the strides.
template <class T>
void check_output_layout(const std::string& what, const Tensor<T>& out, const Layout like) {
  const Layout want = like == Layout::nhwc ? Layout::nhwc : Layout::row_major;
  INFO(what << ": got " << out.describe() << ", want " << want);
  CHECK(out.device() == Device::cuda(0));
  CHECK(out.strides() == contiguous_strides(out.shape(), want));
}

// gpu == ref element for element (max pooling picks an input element: no rounding at all).
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

// ---------------------------------------------------------------------------------------------
// pool2d forward and backward

struct PoolCase {
  const char* name;
  Shape x;
  Pool2dParams p;
};

using PM = PoolMode;
const PoolCase pool_cases[] = {
    // tiling windows (the backward's one-thread-per-window path)
    {"max_2x2", {2, 3, 8, 8}, Pool2dParams::max(2)},
    {"avg_2x2", {2, 3, 8, 8}, Pool2dParams::average(2)},
    {"max_2x3_tiles_wide", {2, 40, 6, 9}, {.mode = PM::max, .kernel_h = 2, .kernel_w = 3}},
    // odd sizes: floor mode drops the last row and column (gather path)
    {"max_2x2_odd", {2, 3, 7, 9}, Pool2dParams::max(2)},
    // overlapping windows, ResNet's stem pool
    {"max_k3s2p1", {2, 5, 9, 11}, Pool2dParams::max(3, 2, 1)},
    {"max_k3s2p1_resnet", {4, 16, 32, 32}, Pool2dParams::max(3, 2, 1)},
    {"max_k3s1p1_batch1", {1, 7, 13, 15}, Pool2dParams::max(3, 1, 1)},
    {"avg_k3s2p1_incl", {2, 5, 9, 11}, Pool2dParams::average(3, 2, 1, true)},
    {"avg_k3s2p1_excl", {2, 5, 9, 11}, Pool2dParams::average(3, 2, 1, false)},
    // ceil mode: a last window overhanging the padding (and count_include_pad not counting it)
    {"max_ceil_2x2", {2, 3, 7, 9}, {.mode = PM::max, .kernel_h = 2, .kernel_w = 2, .ceil_mode = true}},
    {"max_ceil_k3s2p1_batch1", {1, 4, 10, 8},
     {.mode = PM::max, .kernel_h = 3, .kernel_w = 3, .stride_h = 2, .stride_w = 2, .pad_top = 1, .pad_bottom = 1,
      .pad_left = 1, .pad_right = 1, .ceil_mode = true}},
    {"avg_ceil_k3s2p1_incl", {2, 3, 8, 7},
     {.mode = PM::average, .kernel_h = 3, .kernel_w = 3, .stride_h = 2, .stride_w = 2, .pad_top = 1, .pad_bottom = 1,
      .pad_left = 1, .pad_right = 1, .count_include_pad = true, .ceil_mode = true}},
    {"avg_ceil_k3s2p1_excl", {2, 3, 8, 7},
     {.mode = PM::average, .kernel_h = 3, .kernel_w = 3, .stride_h = 2, .stride_w = 2, .pad_top = 1, .pad_bottom = 1,
      .pad_left = 1, .pad_right = 1, .count_include_pad = false, .ceil_mode = true}},
    // asymmetric padding, rectangular kernels and strides
    {"max_asym_pad", {2, 3, 7, 6},
     {.mode = PM::max, .kernel_h = 3, .kernel_w = 2, .stride_h = 2, .stride_w = 1, .pad_top = 1, .pad_bottom = 0,
      .pad_left = 0, .pad_right = 1}},
    {"max_asym_pad_ceil_rect", {3, 2, 9, 13},
     {.mode = PM::max, .kernel_h = 2, .kernel_w = 5, .stride_h = 3, .stride_w = 2, .pad_top = 0, .pad_bottom = 1,
      .pad_left = 2, .pad_right = 1, .ceil_mode = true}},
    {"avg_asym_pad_excl", {2, 3, 7, 6},
     {.mode = PM::average, .kernel_h = 3, .kernel_w = 2, .stride_h = 2, .stride_w = 1, .pad_top = 1, .pad_bottom = 0,
      .pad_left = 0, .pad_right = 1, .count_include_pad = false}},
    {"avg_asym_pad_incl_ceil", {2, 3, 10, 9},
     {.mode = PM::average, .kernel_h = 4, .kernel_w = 3, .stride_h = 3, .stride_w = 2, .pad_top = 2, .pad_bottom = 1,
      .pad_left = 0, .pad_right = 1, .count_include_pad = true, .ceil_mode = true}},
    // stride > kernel: inputs in no window get a zero gradient
    {"max_stride_gt_kernel", {2, 3, 11, 10}, {.mode = PM::max, .kernel_h = 2, .kernel_w = 2, .stride_h = 3, .stride_w = 4}},
    {"avg_stride_gt_kernel", {2, 3, 11, 10},
     {.mode = PM::average, .kernel_h = 2, .kernel_w = 3, .stride_h = 3, .stride_w = 4}},
    // C a multiple of 8: NHWC threads move 16-byte packs of channels (when the data allows)
    {"max_k3s2p1_c32", {2, 32, 9, 11}, Pool2dParams::max(3, 2, 1)},
    {"avg_k3s2p1_c8_excl", {2, 8, 9, 11}, Pool2dParams::average(3, 2, 1, false)},
    {"max_ceil_k3s2p1_c8", {1, 8, 10, 8},
     {.mode = PM::max, .kernel_h = 3, .kernel_w = 3, .stride_h = 2, .stride_w = 2, .pad_top = 1, .pad_bottom = 1,
      .pad_left = 1, .pad_right = 1, .ceil_mode = true}},
    {"avg_2x2_c16", {2, 16, 6, 10}, Pool2dParams::average(2)},
    {"max_2x2_c64_odd", {3, 64, 7, 5}, Pool2dParams::max(2)},
    // padding up to kernel - 1 (over PyTorch's kernel / 2): windows mostly in the padding
    {"max_k3s1p2", {2, 5, 7, 9}, Pool2dParams::max(3, 1, 2)},
    {"max_k2s2p1", {2, 3, 7, 6}, Pool2dParams::max(2, 2, 1)},
    {"max_k4s3p3_ceil_c8", {1, 8, 10, 11},
     {.mode = PM::max, .kernel_h = 4, .kernel_w = 4, .stride_h = 3, .stride_w = 3, .pad_top = 3, .pad_bottom = 2,
      .pad_left = 1, .pad_right = 3, .ceil_mode = true}},
    {"avg_k3s1p2_incl", {2, 5, 7, 9}, Pool2dParams::average(3, 1, 2, true)},
    {"avg_k3s2p2_excl", {2, 5, 7, 9}, Pool2dParams::average(3, 2, 2, false)},
    {"avg_k2s1p1_excl_c16", {2, 16, 6, 5}, Pool2dParams::average(2, 1, 1, false)},
    // degenerate windows: 1x1, and one window covering the whole plane
    {"max_1x1", {2, 3, 5, 4}, Pool2dParams::max(1)},
    {"max_whole_plane", {2, 3, 5, 4}, {.mode = PM::max, .kernel_h = 5, .kernel_w = 4}},
    {"avg_whole_plane_odd_c", {3, 37, 5, 5}, Pool2dParams::average(5)},
};

// The inputs' layouts for one combination: x contiguous in x_layout (or strided), dy in dy_layout;
// the kernel-level calls write outputs in out_layout.
struct Layouts {
  Layout x, dy, out;
  bool strided_x;
};

template <class T>
void run_pool(const PoolCase& c, const Layouts& ls, Data data) {
  const char* data_name = data == Data::permutation ? "distinct" : data == Data::ties ? "ties" : "uniform";
  const std::string tag = cutrain::detail::cat("pool2d ", c.name, " ", dtype_of<T>, " x ",
                                               ls.strided_x ? std::string("strided") : std::string(to_string(ls.x)),
                                               " dy ", ls.dy, " out ", ls.out, " ", data_name);
  INFO(tag << " " << c.p);
  Rng rng(seed_of(tag));
  auto [x, xr] = ls.strided_x ? strided_input<T>(c.x, rng, ls.x, data) : input<T>(c.x, rng, ls.x, data);
  const Shape ys = pool2d_output_shape(c.x, c.p);
  auto [dy, dyr] = input<T>(ys, rng, ls.dy);
  const bool is_max = c.p.mode == PM::max;

  const Tensor<double> y_ref = ops::pool2d_forward(xr, c.p);
  const Tensor<double> dx_ref = ops::pool2d_backward(xr, y_ref, dyr, c.p);

  // Through ops::, which allocates outputs in x's layout as the CPU does.
  auto y = ops::pool2d_forward(x, c.p);
  check_output_layout(tag + " y", y, x.layout());
  check_close(tag + " ops forward", y, y_ref);
  if (is_max) check_exact(tag + " ops forward (exact)", y, y_ref);
  auto dx = ops::pool2d_backward(x, y, dy, c.p);
  check_output_layout(tag + " dx", dx, x.layout());
  check_close(tag + " ops backward", dx, dx_ref);

  // The kernels directly, writing poisoned outputs in out_layout.
  auto y2 = poisoned<T>(ys, ls.out);
  kernels::pool2d_forward(x, c.p, y2);
  check_close(tag + " kernel forward", y2, y_ref);
  if (is_max) check_exact(tag + " kernel forward (exact)", y2, y_ref);
  auto dx2 = poisoned<T>(c.x, ls.out);
  kernels::pool2d_backward(x, dy, c.p, dx2);
  check_close(tag + " kernel backward", dx2, dx_ref);

  // Deterministic: the gather adds in a fixed order, no atomics.
  auto dx3 = poisoned<T>(c.x, ls.out);
  kernels::pool2d_backward(x, dy, c.p, dx3);
  const auto a = cast<float>(dx2).to_vector(), b = cast<float>(dx3).to_vector();
  std::size_t differ = 0;
  for (std::size_t i = 0; i < a.size(); ++i) differ += std::bit_cast<std::uint32_t>(a[i]) == std::bit_cast<std::uint32_t>(b[i]) ? 0 : 1;
  INFO(tag << ": two backward runs differ in " << differ << " elements");
  CHECK(differ == 0);
  std::printf("%-100s ok\n", tag.c_str());
}

template <class T>
void run_pool_cases() {
  for (const auto& c : pool_cases) {
    const bool is_max = c.p.mode == PM::max;
    const Data data = is_max ? Data::permutation : Data::uniform;
    for (Layout l : {Layout::nchw, Layout::nhwc}) {
      run_pool<T>(c, {l, l, l, false}, data);                // all alike
      run_pool<T>(c, {l, other(l), other(l), false}, data);  // mixed: dy and outputs in the other layout
      run_pool<T>(c, {l, l, l, true}, data);                 // strided x
      if (is_max) run_pool<T>(c, {l, l, other(l), false}, Data::ties);
    }
  }
}

// Max pooling with NaN in x: a window holding a NaN gives NaN, and its gradient goes to the first
// NaN (the CPU's rule); dx has no NaN, since dy has none.
template <class T>
void run_pool_nan(Layout l) {
  const std::string tag = cutrain::detail::cat("pool2d max with NaN ", dtype_of<T>, " ", l);
  Rng rng(seed_of(tag));
  const Shape s{2, 3, 9, 9};
  auto values = draw(s.numel(), rng, Data::permutation);
  for (int k = 0; k < 12; ++k) values[rng.below(values.size())] = std::numeric_limits<float>::quiet_NaN();
  auto [x, xr] = device_pair<T>(values, s, l);
  for (const Pool2dParams& p : {Pool2dParams::max(2), Pool2dParams::max(3, 2, 1)}) {
    INFO(tag << " " << p);
    const Shape ys = pool2d_output_shape(s, p);
    auto [dy, dyr] = input<T>(ys, rng, l);
    const auto y_ref = ops::pool2d_forward(xr, p);
    auto y = ops::pool2d_forward(x, p);
    check_exact(tag + " forward", y, y_ref);
    std::size_t nan_outputs = 0;
    for (double v : y_ref.to_vector()) nan_outputs += std::isnan(v) ? 1 : 0;
    CHECK(nan_outputs > 0);  // the case does test NaN
    check_close(tag + " backward", ops::pool2d_backward(x, y, dy, p), ops::pool2d_backward(xr, y_ref, dyr, p));
  }
  std::printf("%-100s ok\n", tag.c_str());
}

// ---------------------------------------------------------------------------------------------
// global average pooling

template <class T>
void run_global_avg(const Shape& s, Layout l, bool strided_x, Layout dx_layout) {
  const std::string tag =
      cutrain::detail::cat("global_avg_pool ", s, " ", dtype_of<T>, " x ",
                           strided_x ? std::string("strided") : std::string(to_string(l)), " dx ", dx_layout);
  INFO(tag);
  Rng rng(seed_of(tag));
  auto [x, xr] = strided_x ? strided_input<T>(s, rng, l) : input<T>(s, rng, l);
  const Shape ys{s[0], s[1], 1, 1};
  const auto y_ref = ops::global_avg_pool_forward(xr);

  auto y = ops::global_avg_pool_forward(x);
  CHECK(y.device() == Device::cuda(0));
  check_close(tag + " ops forward", y, y_ref);
  auto y2 = poisoned<T>(ys, other(l));
  kernels::global_avg_pool_forward(x, y2);
  check_close(tag + " kernel forward", y2, y_ref);

  // dy contiguous, and dy strided (a slice of [N, C + 2, 1, 1])
  auto [dy, dyr] = input<T>(ys, rng, l);
  const auto dx_ref = ops::global_avg_pool_backward(dyr, s, dx_layout);
  auto dx = ops::global_avg_pool_backward(dy, s, dx_layout);
  check_output_layout(tag + " dx", dx, dx_layout);
  check_close(tag + " ops backward", dx, dx_ref);

  auto [dyw, dywr] = input<T>({s[0], s[1] + 2, 1, 1}, rng, Layout::nchw);
  auto dys = dyw.slice(1, 1, 1 + s[1]);
  auto dysr = dywr.slice(1, 1, 1 + s[1]);
  auto dx2 = poisoned<T>(s, other(dx_layout));
  kernels::global_avg_pool_backward(dys, dx2);
  check_close(tag + " kernel backward (strided dy)", dx2, ops::global_avg_pool_backward(dysr, s));
  std::printf("%-100s ok\n", tag.c_str());
}

template <class T>
void run_global_avg_cases() {
  // odd sizes, a ResNet head (7x7), 1x1 planes, C over one 32-channel tile, one channel
  for (const Shape& s : {Shape{2, 3, 5, 7}, Shape{4, 64, 7, 7}, Shape{1, 5, 1, 1}, Shape{3, 40, 16, 16},
                         Shape{2, 70, 3, 2}, Shape{1, 1, 9, 9}})
    for (Layout l : {Layout::nchw, Layout::nhwc}) {
      run_global_avg<T>(s, l, false, l);
      run_global_avg<T>(s, l, false, other(l));
      run_global_avg<T>(s, l, true, l);
    }
}

// ---------------------------------------------------------------------------------------------
// batch-norm inference

template <class T>
void run_bn_inference(const Shape& s, Layout l, bool strided_x, Layout y_layout) {
  const std::string tag = cutrain::detail::cat("batch_norm_inference ", s, " ", dtype_of<T>, " x ",
                                               strided_x ? std::string("strided") : std::string(to_string(l)), " y ",
                                               s.rank() == 4 ? y_layout : Layout::row_major);
  INFO(tag);
  Rng rng(seed_of(tag));
  std::pair<Tensor<T>, Tensor<double>> xp;
  if (strided_x) {  // the middle of a tensor 3 wider in its last dimension (contiguous only for [1, C])
    Shape wide = s;
    const int last = s.rank() - 1;
    wide[last] += 3;
    auto [w, wr] = input<T>(wide, rng, l);
    xp = {w.slice(last, 2, 2 + s[last]), wr.slice(last, 2, 2 + s[last])};
  } else {
    xp = input<T>(s, rng, l);
  }
  const Tensor<T>& x = xp.first;
  const Tensor<double>& xr = xp.second;
  const Shape c{s[1]};
  auto [gamma, gr] = random_pair<float>(c, rng, Layout::row_major);
  auto [beta, br] = random_pair<float>(c, rng, Layout::row_major);
  auto [mean, mr] = random_pair<float>(c, rng, Layout::row_major);
  auto var_host = Tensor<float>::uniform(c, rng, 0.5, 2.0);
  auto var = var_host.to(Device::cuda(0));
  auto vr = cast<double>(var_host);
  const double eps = 1e-3;
  auto y = poisoned<T>(s, y_layout);
  kernels::batch_norm_inference(x, gamma, beta, mean, var, eps, y);
  check_close(tag, y, cpu::batch_norm_forward_inference(xr, gr, br, mr, vr, eps));
  std::printf("%-100s ok\n", tag.c_str());
}

template <class T>
void run_bn_inference_cases() {
  for (const Shape& s : {Shape{8, 32, 16, 16}, Shape{3, 5, 7, 9}, Shape{1, 8, 5, 5}, Shape{2, 70, 3, 2},
                         Shape{40, 33, 2, 2}, Shape{4, 3, 1, 1}, Shape{2, 16, 4, 6}, Shape{3, 24, 8, 8}})
    for (Layout l : {Layout::nchw, Layout::nhwc}) {
      run_bn_inference<T>(s, l, false, l);
      run_bn_inference<T>(s, l, false, other(l));
      run_bn_inference<T>(s, l, true, l);
    }
  for (const Shape& s : {Shape{64, 40}, Shape{5, 3}, Shape{7, 1}, Shape{1, 100}, Shape{9, 64}}) {
    run_bn_inference<T>(s, Layout::row_major, false, Layout::row_major);
    run_bn_inference<T>(s, Layout::row_major, true, Layout::row_major);
  }
}

}  // namespace

TEST_CASE("gpu max and average pooling, forward and backward, match the CPU backend") {
  run_pool_cases<float>();
  run_pool_cases<cutrain::bfloat16>();
  run_pool_cases<cutrain::half>();
}

TEST_CASE("gpu max pooling with NaN inputs follows the CPU's rule") {
  for (Layout l : {Layout::nchw, Layout::nhwc}) {
    run_pool_nan<float>(l);
    run_pool_nan<cutrain::bfloat16>(l);
    run_pool_nan<cutrain::half>(l);
  }
}

TEST_CASE("gpu max pool 2x2 on 256x128x32x32 bf16 NHWC matches the CPU backend") {
  const Shape s{256, 128, 32, 32};
  const std::string tag = "pool2d max 2x2 bf16 nhwc [256,128,32,32]";
  Rng rng(seed_of(tag));
  auto [x, xr] = random_pair<cutrain::bfloat16>(s, rng, Layout::nhwc);
  const auto p = Pool2dParams::max(2);
  auto [dy, dyr] = random_pair<cutrain::bfloat16>(pool2d_output_shape(s, p), rng, Layout::nhwc);
  const auto y_ref = ops::pool2d_forward(xr, p);
  auto y = ops::pool2d_forward(x, p);
  check_output_layout(tag + " y", y, Layout::nhwc);
  check_exact(tag + " forward", y, y_ref);
  auto dx = ops::pool2d_backward(x, y, dy, p);
  check_output_layout(tag + " dx", dx, Layout::nhwc);
  check_close(tag + " backward", dx, ops::pool2d_backward(xr, y_ref, dyr, p));
  std::printf("%-100s ok\n", tag.c_str());
}

TEST_CASE("gpu global average pooling, forward and backward, matches the CPU backend") {
  run_global_avg_cases<float>();
  run_global_avg_cases<cutrain::bfloat16>();
  run_global_avg_cases<cutrain::half>();
}

TEST_CASE("gpu batch-norm inference kernel matches the CPU backend") {
  run_bn_inference_cases<float>();
  run_bn_inference_cases<cutrain::bfloat16>();
  run_bn_inference_cases<cutrain::half>();
}

TEST_CASE("gpu pooling: bad input is refused with the op's error") {
  Rng rng(7);
  auto [x, xr] = random_pair<float>({2, 3, 8, 8}, rng, Layout::nchw);
  const auto p = Pool2dParams::max(2);
  // f64 is not a GPU dtype
  Tensor<double> xd({2, 3, 8, 8}, {.device = Device::cuda(0)});
  CHECK_THROWS_AS(ops::pool2d_forward(xd, p), NotImplemented);
  CHECK_THROWS_AS(ops::global_avg_pool_forward(xd), NotImplemented);
  // tensors on different devices
  auto y = ops::pool2d_forward(x, p);
  Tensor<float> dy_host({2, 3, 4, 4});
  CHECK_THROWS_AS(ops::pool2d_backward(x, y, dy_host, p), DeviceError);
  // wrong output or dy shapes at the kernel level
  auto wrong = poisoned<float>({2, 3, 5, 4}, Layout::nchw);
  CHECK_THROWS_AS(kernels::pool2d_forward(x, p, wrong), InvalidArgument);
  CHECK_THROWS_AS(kernels::pool2d_backward(x, wrong, p, wrong), InvalidArgument);
  // a kernel larger than the padded input, padding over half the kernel
  CHECK_THROWS_AS(ops::pool2d_forward(x, Pool2dParams::max(9)), InvalidArgument);
  CHECK_THROWS_AS(ops::pool2d_forward(x, Pool2dParams::max(2, 2, 2)), InvalidArgument);  // padding = kernel
  CHECK_THROWS_AS(ops::pool2d_forward(x, Pool2dParams{.dilation_h = 0}), InvalidArgument);
  // dilation runs on the GPU (the pool2d_dilated kernels; test_pool_dilated_gpu.cpp checks the
  // values), and a dilated backward still checks dy's shape
  CHECK(ops::pool2d_forward(x, Pool2dParams::max(2, 1, 1, 2)).shape() == Shape{2, 3, 8, 8});
  CHECK_THROWS_AS(kernels::pool2d_backward(x, wrong, Pool2dParams::max(2, 1, 1, 2), wrong), InvalidArgument);
  // batch-norm inference: [C] vectors of the wrong size
  auto [g, gr] = random_pair<float>({4}, rng, Layout::row_major);
  auto yb = poisoned<float>({2, 3, 8, 8}, Layout::nchw);
  CHECK_THROWS_AS(kernels::batch_norm_inference(x, g, g, g, g, 1e-5, yb), InvalidArgument);
  std::printf("%-100s ok\n", "pooling and batch-norm inference bad input");
}

}  // namespace cutrain_test_pool_gpu
