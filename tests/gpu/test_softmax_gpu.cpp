// Softmax and log-softmax (forward and backward) and flatten / flatten_backward on the GPU
// against the CPU backend in f64, in f32, bf16 and f16: the kernels into NaN-poisoned outputs and
// the ops:: entry points (device and layout of the results, determinism), over row lengths from
// 1 to 200000, strided (column-slice) inputs whose margins hold NaN, and large logits (+-1000)
// that must give no NaN. Flatten: NCHW, NHWC, strided, 2-d and 3-d cuda tensors in every dtype,
// bit for bit against the CPU.
#include "parity.hpp"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "cutrain/cuda/kernels/softmax.hpp"
#include "cutrain/cuda/runtime.hpp"
#include "cutrain/ops/flatten.hpp"
#include "cutrain/ops/softmax.hpp"

namespace cutrain_test_softmax_gpu {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;
namespace kernels = cutrain::cuda::kernels;

namespace {

std::uint64_t seed_of(const std::string& tag) { return std::hash<std::string>{}(tag); }

// A device tensor of T with random values in [lo, hi), and the same (rounded) values in f64 on the host.
template <class T>
std::pair<Tensor<T>, Tensor<double>> random_range(const Shape& s, Rng& rng, double lo, double hi) {
  auto host = Tensor<float>::uniform(s, rng, lo, hi);
  auto t = cast<T>(host);
  auto ref = cast<double>(t);
  return {t.to(Device::cuda(0)), std::move(ref)};
}

// The same elements, bit for bit (any element type: compares the bytes).
template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// The values of a 2-d cuda tensor t as a column slice [:, 2 : 2 + C) of a wider cuda tensor whose
// other columns hold NaN: a strided input, and a kernel that reads outside the slice sees NaN.
template <class T>
Tensor<T> strided_copy(const Tensor<T>& t) {
  const std::int64_t N = t.dim(0), C = t.dim(1);
  auto host = Tensor<T>::full({N, C + 5}, T(std::nanf("")));
  const auto v = t.to_vector();
  for (std::int64_t i = 0; i < N; ++i)
    for (std::int64_t c = 0; c < C; ++c) host(i, 2 + c) = v[static_cast<std::size_t>(i * C + c)];
  auto s = host.to(Device::cuda(0)).slice(1, 2, 2 + C);
  if (N > 1) REQUIRE(s.layout() == Layout::strided);
  return s;
}

// ---------------------------------------------------------------------------------------------
// softmax / log-softmax

// One direction pair (forward, then backward from the GPU's own forward output) of softmax
// (log == false) or log-softmax (log == true), through the kernels and through ops::.
template <class T>
void check_softmax(const std::string& tag, bool log, const Tensor<T>& x, const Tensor<double>& xr, const Tensor<T>& dy,
                   const Tensor<double>& dyr, bool strided) {
  const std::string name = tag + (log ? " log_softmax" : " softmax");
  const Shape s = xr.shape();
  const auto y_ref = log ? ops::log_softmax_forward(xr) : ops::softmax_forward(xr);

  auto y = poisoned<T>(s, Layout::row_major);
  if (log) kernels::log_softmax_forward(x, y);
  else kernels::softmax_forward(x, y);
  check_close(name + " forward", y, y_ref);

  auto y2 = log ? ops::log_softmax_forward(x) : ops::softmax_forward(x);
  CHECK(y2.device() == Device::cuda(0));
  CHECK(y2.shape() == s);
  CHECK(y2.layout() == Layout::row_major);
  CHECK(same_bits(y2.to_vector(), y.to_vector()));  // deterministic

  // The backward reads y as the GPU wrote it: the f64 reference starts from those values.
  const auto yr = cast<double>(y2).to(Device::cpu());
  const auto dx_ref = log ? ops::log_softmax_backward(yr, dyr) : ops::softmax_backward(yr, dyr);
  const Tensor<T> y_in = strided ? strided_copy(y2) : y2.view();

  auto dx = poisoned<T>(s, Layout::row_major);
  if (log) kernels::log_softmax_backward(y_in, dy, dx);
  else kernels::softmax_backward(y_in, dy, dx);
  check_close(name + " backward", dx, dx_ref);

  auto dx2 = log ? ops::log_softmax_backward(y_in, dy) : ops::softmax_backward(y_in, dy);
  CHECK(dx2.device() == Device::cuda(0));
  CHECK(dx2.shape() == s);
  CHECK(dx2.layout() == Layout::row_major);
  CHECK(same_bits(dx2.to_vector(), dx.to_vector()));
}

// x [N, C] in [lo, hi), dy in [-1, 1); strided: both (and y in the backward) as column slices.
template <class T>
void run_softmax(std::int64_t N, std::int64_t C, double lo, double hi, bool strided = false) {
  const std::string tag = cutrain::detail::cat("softmax ", dtype_of<T>, " [", N, ", ", C, "] x in [", lo, ", ", hi, ")",
                                               strided ? " strided" : "");
  Rng rng(seed_of(tag));
  auto [x0, xr] = random_range<T>({N, C}, rng, lo, hi);
  auto [dy0, dyr] = random_range<T>({N, C}, rng, -1.0, 1.0);
  const Tensor<T> x = strided ? strided_copy(x0) : x0.view();
  const Tensor<T> dy = strided ? strided_copy(dy0) : dy0.view();
  check_softmax<T>(tag, false, x, xr, dy, dyr, strided);
  check_softmax<T>(tag, true, x, xr, dy, dyr, strided);
  cuda::synchronize();
  std::printf("%-72s ok\n", tag.c_str());
}

// Rows that overflow or underflow exp() without the max shift, ties at the maximum, and C == 1.
template <class T>
void run_softmax_extremes() {
  const std::string tag = cutrain::detail::cat("softmax ", dtype_of<T>, " extreme rows (+-1000, 100, ties)");
  const std::vector<float> v = {1000,  1000,  1000,  1000,   // uniform, huge
                                -1000, -1000, -1000, -1000,  // uniform, hugely negative
                                1000,  -1000, 0,     1000,   // two tied maxima, the rest exp() == 0
                                100,   0,     0,     0,      // exp(100) overflows f32 unshifted
                                -1000, -999,  -998,  -997,   // exp() underflows to 0 unshifted
                                0,     0,     0,     0};
  const auto host = cast<T>(Tensor<float>::from_vector(v, {6, 4}));
  const auto xr = cast<double>(host);
  const auto x = host.to(Device::cuda(0));
  Rng rng(seed_of(tag));
  auto [dy, dyr] = random_range<T>({6, 4}, rng, -1.0, 1.0);
  check_softmax<T>(tag, false, x, xr, dy, dyr, false);
  check_softmax<T>(tag, true, x, xr, dy, dyr, false);
  // The exact answers for a few of them.
  const auto y = cast<double>(ops::softmax_forward(x)).to_vector();
  CHECK(y[0] == 0.25);
  CHECK(y[4] == 0.25);
  CHECK(y[8] == 0.5);
  CHECK(y[9] == 0.0);
  CHECK(y[11] == 0.5);
  CHECK(y[20] == 0.25);
  cuda::synchronize();
  std::printf("%-72s ok\n", tag.c_str());
}

template <class T>
void run_softmax_all() {
  run_softmax<T>(1, 10, -1.0, 1.0);
  run_softmax<T>(7, 13, -1.0, 1.0);
  run_softmax<T>(128, 10, -1.0, 1.0);
  run_softmax<T>(33, 1000, -1.0, 1.0);
  run_softmax<T>(4, 50000, -1.0, 1.0);
  run_softmax<T>(5, 1, -1.0, 1.0);        // one class: softmax 1, log-softmax 0, gradients 0
  run_softmax<T>(3, 8193, -4.0, 4.0);     // just past a block-size step
  run_softmax<T>(2, 200000, -4.0, 4.0);   // longer rows than any vocabulary here
  run_softmax<T>(300, 33, -8.0, 8.0);
  run_softmax<T>(7, 13, -1000.0, 1000.0);  // large logits: no NaN, no inf
  run_softmax<T>(33, 1000, -1000.0, 1000.0);
  run_softmax<T>(4, 50000, -1000.0, 1000.0);
  run_softmax<T>(7, 13, -1.0, 1.0, true);  // strided x, dy and y
  run_softmax<T>(128, 10, -3.0, 3.0, true);
  run_softmax<T>(33, 1000, -1000.0, 1000.0, true);
  run_softmax_extremes<T>();
}

}  // namespace

TEST_CASE("gpu softmax and log-softmax, forward and backward, match the CPU backend") {
  run_softmax_all<float>();
  run_softmax_all<cutrain::bfloat16>();
  run_softmax_all<cutrain::half>();
}

TEST_CASE("gpu softmax: empty batch, bad input, f64 refused") {
  const auto cuda0 = Device::cuda(0);
  // An empty batch gives an empty result on the device.
  Tensor<float> e({0, 5}, {.device = cuda0});
  auto ye = ops::softmax_forward(e);
  CHECK(ye.shape() == Shape{0, 5});
  CHECK(ye.device() == cuda0);
  CHECK(ops::log_softmax_forward(e).shape() == Shape{0, 5});
  CHECK(ops::softmax_backward(e, e).shape() == Shape{0, 5});
  CHECK(ops::log_softmax_backward(e, e).device() == cuda0);

  // ops:: validation (as on the CPU), and device mismatches.
  Tensor<float> x({3, 4}, {.device = cuda0}), y({3, 4}, {.device = cuda0});
  CHECK_THROWS_AS(ops::softmax_forward(Tensor<float>({3, 0}, {.device = cuda0})), InvalidArgument);
  CHECK_THROWS_AS(ops::log_softmax_forward(Tensor<float>({2, 3, 4}, {.device = cuda0}), 3), InvalidArgument);
  CHECK_THROWS_AS(ops::softmax_backward(x, Tensor<float>({4, 3}, {.device = cuda0})), InvalidArgument);
  CHECK_THROWS_AS(ops::log_softmax_backward(x, Tensor<float>({3, 4})), DeviceError);
  CHECK_THROWS_AS(ops::softmax_forward(Tensor<double>({3, 4}, {.device = cuda0})), NotImplemented);
  CHECK_THROWS_AS(ops::log_softmax_backward(Tensor<double>({3, 4}, {.device = cuda0}),
                                            Tensor<double>({3, 4}, {.device = cuda0})),
                  NotImplemented);

  // The kernels check their own arguments.
  Tensor<float> host({3, 4});
  CHECK_THROWS_AS(kernels::softmax_forward(host, y), DeviceError);               // input on the host
  CHECK_THROWS_AS(kernels::softmax_forward(x, host), DeviceError);               // output on the host
  Tensor<float> wrong({4, 3}, {.device = cuda0});
  CHECK_THROWS_AS(kernels::log_softmax_forward(x, wrong), InvalidArgument);       // output shape
  Tensor<float> wide({3, 6}, {.device = cuda0});
  auto slice = wide.slice(1, 1, 5);
  CHECK_THROWS_AS(kernels::softmax_forward(x, slice), InvalidArgument);           // strided output
  CHECK_THROWS_AS(kernels::softmax_backward(x, wrong, y), InvalidArgument);       // dy shape
  CHECK_THROWS_AS(kernels::log_softmax_backward(x, host, y), DeviceError);        // dy on the host
  CHECK_THROWS_AS(kernels::softmax_forward(Tensor<float>({3, 0}, {.device = cuda0}), y), InvalidArgument);
  CHECK_THROWS_AS(kernels::softmax_forward(Tensor<float>({12}, {.device = cuda0}), y), InvalidArgument);
  std::printf("%-72s ok\n", "softmax empty batch and bad input");
}

// ---------------------------------------------------------------------------------------------
// flatten / flatten_backward

namespace {

// Host values of T that differ from one element to the next: random for floating types, the
// logical index for integers (so a misplaced element is always seen).
template <class T>
Tensor<T> host_values(const Shape& s, Layout l, Rng& rng) {
  const Layout hl = s.rank() == 4 ? l : Layout::row_major;
  if constexpr (std::is_integral_v<T>) {
    std::vector<T> v(static_cast<std::size_t>(s.numel()));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<T>(i) * 3 - 7;
    return Tensor<T>::from_vector(v, s, {.layout = hl});
  } else {
    return cast<T>(Tensor<double>::uniform(s, rng, -4.0, 4.0, {.layout = hl}));
  }
}

// flatten of x (layout l, or a slice of the last dim of a wider tensor when strided), its
// backward into every layout, and the round trip; all against the CPU, bit for bit.
template <class T>
void run_flatten(const Shape& s, Layout l, bool strided = false) {
  const std::string tag = cutrain::detail::cat("flatten ", dtype_of<T>, " ", s, " ", strided ? "strided" : to_string(l));
  Rng rng(seed_of(tag));
  const int last = s.rank() - 1;
  Tensor<T> hx, x;
  if (strided) {
    Shape wide = s;
    wide[last] += 3;
    auto hw = host_values<T>(wide, l, rng);
    hx = hw.slice(last, 1, 1 + s[last]);
    x = hw.to(Device::cuda(0)).slice(last, 1, 1 + s[last]);
    REQUIRE(x.layout() == Layout::strided);
  } else {
    hx = host_values<T>(s, l, rng);
    x = hx.to(Device::cuda(0));
    REQUIRE(x.layout() == hx.layout());
  }
  std::int64_t rest = 1;
  for (int d = 1; d < s.rank(); ++d) rest *= s[d];
  const Shape flat_shape{s[0], rest};

  const auto ref = ops::flatten(hx);
  auto flat = ops::flatten(x);
  CHECK(flat.device() == Device::cuda(0));
  CHECK(flat.shape() == flat_shape);
  CHECK(flat.layout() == Layout::row_major);
  CHECK(same_bits(flat.to_vector(), ref.to_vector()));
  CHECK(same_bits(flat.to_vector(), hx.to_vector()));  // logical (c, h, w) order, whatever the layout
  const bool row_major_x = x.layout() == Layout::row_major || x.layout() == Layout::nchw;
  if (row_major_x) CHECK(flat.data() == x.data());  // a view, no copy
  else CHECK(flat.data() != x.data());

  // Back into each layout from a row-major dy, and from a strided one.
  auto hdy = host_values<T>(flat_shape, Layout::row_major, rng);
  const auto dy = hdy.to(Device::cuda(0));
  auto hdy_wide = host_values<T>({flat_shape[0], flat_shape[1] + 4}, Layout::row_major, rng);
  const auto hdy_s = hdy_wide.slice(1, 2, 2 + rest);
  const auto dy_s = hdy_wide.to(Device::cuda(0)).slice(1, 2, 2 + rest);
  if (flat_shape[0] > 1) REQUIRE(dy_s.layout() == Layout::strided);
  std::vector<Layout> layouts = {Layout::row_major};
  if (s.rank() == 4) layouts = {Layout::row_major, Layout::nchw, Layout::nhwc};
  for (Layout out_l : layouts) {
    INFO(tag << " flatten_backward to " << out_l);
    const auto dx_ref = ops::flatten_backward(hdy, s, out_l);
    auto dx = ops::flatten_backward(dy, s, out_l);
    CHECK(dx.device() == Device::cuda(0));
    CHECK(dx.shape() == s);
    CHECK(dx.layout() == dx_ref.layout());
    CHECK(same_bits(dx.to_vector(), dx_ref.to_vector()));
    CHECK(same_bits(dx.to_vector(), hdy.to_vector()));
    if (out_l != Layout::nhwc) CHECK(dx.data() == dy.data());  // a view of dy

    const auto dxs_ref = ops::flatten_backward(hdy_s, s, out_l);
    auto dxs = ops::flatten_backward(dy_s, s, out_l);
    CHECK(dxs.device() == Device::cuda(0));
    CHECK(dxs.layout() == dxs_ref.layout());
    CHECK(same_bits(dxs.to_vector(), dxs_ref.to_vector()));
  }

  // flatten then flatten_backward gives x back, in x's layout.
  if (!strided) {
    auto back = ops::flatten_backward(flat, s, x.layout());
    CHECK(back.device() == Device::cuda(0));
    CHECK(back.layout() == x.layout());
    CHECK(same_bits(back.to_vector(), x.to_vector()));
  }
  cuda::synchronize();
  std::printf("%-72s ok\n", tag.c_str());
}

template <class T>
void run_flatten_all() {
  const Shape s4{3, 5, 7, 9}, s2{7, 13}, s3{4, 5, 6};
  run_flatten<T>(s4, Layout::nchw);
  run_flatten<T>(s4, Layout::nhwc);
  run_flatten<T>(s4, Layout::nchw, true);
  run_flatten<T>(Shape{2, 64, 4, 4}, Layout::nhwc);
  run_flatten<T>(s2, Layout::row_major);
  run_flatten<T>(s2, Layout::row_major, true);
  run_flatten<T>(s3, Layout::row_major);
}

}  // namespace

TEST_CASE("gpu flatten and flatten_backward match the CPU backend in every dtype and layout") {
  run_flatten_all<float>();
  run_flatten_all<cutrain::bfloat16>();
  run_flatten_all<cutrain::half>();
  run_flatten_all<double>();
  run_flatten_all<std::int32_t>();

  // The CPU's validation holds on the GPU.
  const auto cuda0 = Device::cuda(0);
  Tensor<float> v({12}, {.device = cuda0}), dy({2, 12}, {.device = cuda0});
  CHECK_THROWS_AS(ops::flatten(v), InvalidArgument);
  CHECK_THROWS_AS(ops::flatten(Tensor<float>{}), InvalidArgument);
  CHECK_THROWS_AS(ops::flatten_backward(dy, Shape{2, 3, 5}, Layout::row_major), InvalidArgument);   // 15 != 12
  CHECK_THROWS_AS(ops::flatten_backward(dy, Shape{2, 3, 4}, Layout::nhwc), InvalidArgument);        // nhwc needs 4-d
  CHECK_THROWS_AS(ops::flatten_backward(dy, Shape{2, 3, 2, 2}, Layout::strided), InvalidArgument);
  CHECK_THROWS_AS(ops::flatten_backward(v, Shape{12}, Layout::row_major), InvalidArgument);
  // An empty batch.
  Tensor<float> e({0, 3, 4, 5}, {.device = cuda0});
  auto fe = ops::flatten(e);
  CHECK(fe.shape() == Shape{0, 60});
  CHECK(fe.device() == cuda0);
  std::printf("%-72s ok\n", "flatten bad input and empty batch");
}

}  // namespace cutrain_test_softmax_gpu
