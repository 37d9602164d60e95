// The NVRTC kernels against the CPU backend in f64, in f32, bf16 and f16, NCHW, NHWC and 2-d:
// add / multiply / scale and their backwards, casts (bit for bit), dropout (the CPU's exact mask),
// softmax cross-entropy (loss and gradient), the conv bias gradient, and the SGD and AdamW steps
// (against updates computed by hand in f64); then the module cache in memory and on disk; and
// Tensor::copy_from between layouts on one GPU (the strided-copy kernel), eager and captured.
#include "parity.hpp"
#include "scoped_config.hpp"

#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "cutrain/cpu/conv2d.hpp"
#include "cutrain/cuda/cuda_graph.hpp"
#include "cutrain/cuda/kernels/bias_grad.hpp"
#include "cutrain/cuda/kernels/cast.hpp"
#include "cutrain/cuda/kernels/cross_entropy.hpp"
#include "cutrain/cuda/kernels/dropout.hpp"
#include "cutrain/cuda/kernels/elementwise.hpp"
#include "cutrain/cuda/kernels/optim.hpp"
#include "cutrain/ops/cross_entropy.hpp"
#include "cutrain/ops/dropout.hpp"
#include "cutrain/ops/elementwise.hpp"

namespace cutrain_test_kernels_gpu {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;
namespace kernels = cutrain::cuda::kernels;

namespace {

std::uint64_t seed_of(const std::string& tag) { return std::hash<std::string>{}(tag); }

// A device tensor of T with random values in [lo, hi), and the same (rounded) values in f64 on the host.
template <class T>
std::pair<Tensor<T>, Tensor<double>> random_range(const Shape& s, Rng& rng, double lo, double hi, Layout l = Layout::row_major) {
  auto host = Tensor<float>::uniform(s, rng, lo, hi, {.layout = s.rank() == 4 ? l : Layout::row_major});
  auto t = cast<T>(host);
  auto ref = cast<double>(t);
  return {t.to(Device::cuda(0)), std::move(ref)};
}

// The elements' bits, and whether they are NaN.
template <class T>
std::uint32_t bits_of(T v) {
  if constexpr (std::is_same_v<T, float>) return std::bit_cast<std::uint32_t>(v);
  else return v.bits;
}
template <class T>
bool is_nan(T v) {
  return std::isnan(static_cast<float>(v));
}

// Equal element by element, bit for bit (any NaN equals any NaN).
template <class T>
std::size_t bit_mismatches(const std::vector<T>& a, const std::vector<T>& b) {
  REQUIRE(a.size() == b.size());
  std::size_t bad = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const bool same = is_nan(a[i]) ? is_nan(b[i]) : bits_of(a[i]) == bits_of(b[i]);
    bad += same ? 0 : 1;
  }
  return bad;
}

// The layout an op's output takes from `like` (as the CPU backend's empty_like_layout).
template <class T>
Layout expected_layout(const Tensor<T>& like) {
  return like.rank() == 4 ? (like.layout() == Layout::nhwc ? Layout::nhwc : Layout::nchw) : Layout::row_major;
}

// ---------------------------------------------------------------------------------------------
// add, multiply, scale

template <class T>
void run_elementwise(const Shape& s, Layout la, Layout lb, bool strided_a = false) {
  const std::string tag = cutrain::detail::cat("elementwise ", dtype_of<T>, " ", s, " a ", strided_a ? "strided" : to_string(la),
                                               " b ", lb);
  Rng rng(seed_of(tag));
  std::optional<std::pair<Tensor<T>, Tensor<double>>> a_pair;
  if (strided_a) {  // a slice of a wider tensor: not contiguous
    Shape wide = s;
    wide[s.rank() - 1] += 3;
    auto [aw, awr] = random_pair<T>(wide, rng, la);
    a_pair.emplace(aw.slice(s.rank() - 1, 1, 1 + s[s.rank() - 1]), awr.slice(s.rank() - 1, 1, 1 + s[s.rank() - 1]));
    REQUIRE(a_pair->first.layout() == Layout::strided);
  } else {
    a_pair.emplace(random_pair<T>(s, rng, la));
  }
  const Tensor<T>& a = a_pair->first;
  const Tensor<double>& ar = a_pair->second;
  auto [b, br] = random_pair<T>(s, rng, lb);
  auto [dy, dyr] = random_pair<T>(s, rng, lb);
  const Layout out_l = strided_a ? Layout::nchw : la;
  const double alpha = -1.75;

  auto y = poisoned<T>(s, out_l);
  kernels::add(a, b, y);
  check_close(tag + " add", y, ops::add(ar, br));
  y = poisoned<T>(s, out_l);
  kernels::multiply(a, b, y);
  check_close(tag + " multiply", y, ops::multiply(ar, br));
  y = poisoned<T>(s, out_l);
  kernels::scale(a, alpha, y);
  check_close(tag + " scale", y, ops::scale(ar, alpha));

  // Through ops::, which allocates the outputs in the CPU backend's layouts.
  auto ya = ops::add(a, b);
  CHECK(ya.device() == Device::cuda(0));
  CHECK(ya.layout() == expected_layout(a));
  check_close(tag + " ops::add", ya, ops::add(ar, br));
  check_close(tag + " ops::multiply", ops::multiply(a, b), ops::multiply(ar, br));
  check_close(tag + " ops::scale", ops::scale(a, alpha), ops::scale(ar, alpha));

  auto gm = ops::multiply_backward(a, b, dy);
  auto gm_ref = ops::multiply_backward(ar, br, dyr);
  CHECK(gm.da.layout() == expected_layout(a));
  CHECK(gm.db.layout() == expected_layout(b));
  check_close(tag + " multiply_backward da", gm.da, gm_ref.da);
  check_close(tag + " multiply_backward db", gm.db, gm_ref.db);

  auto ga = ops::add_backward(dy);  // two exact copies, in dy's layout
  CHECK(ga.da.layout() == expected_layout(dy));
  CHECK(bit_mismatches(ga.da.to_vector(), dy.to_vector()) == 0);
  CHECK(bit_mismatches(ga.db.to_vector(), dy.to_vector()) == 0);
  CHECK(ga.da.data() != ga.db.data());

  auto gs = ops::scale_backward(dy, alpha);
  CHECK(gs.layout() == expected_layout(dy));
  check_close(tag + " scale_backward", gs, ops::scale_backward(dyr, alpha));
  cuda::synchronize();
  std::printf("%-60s ok\n", tag.c_str());
}

template <class T>
void run_elementwise_all() {
  const Shape s4{3, 5, 7, 9}, s2{33, 17};
  run_elementwise<T>(s4, Layout::nchw, Layout::nchw);
  run_elementwise<T>(s4, Layout::nhwc, Layout::nhwc);
  run_elementwise<T>(s4, Layout::nchw, Layout::nhwc);  // b staged into a's layout
  run_elementwise<T>(s4, Layout::nhwc, Layout::nchw);
  run_elementwise<T>(s2, Layout::row_major, Layout::row_major);
  run_elementwise<T>(Shape{100003}, Layout::row_major, Layout::row_major);  // odd, several blocks
  // Element counts that are multiples of 16 bytes' worth: add takes its 16-byte (_vec) kernel.
  run_elementwise<T>(Shape{4, 16, 6, 10}, Layout::nhwc, Layout::nhwc);
  run_elementwise<T>(Shape{4, 16, 6, 10}, Layout::nchw, Layout::nhwc);
  run_elementwise<T>(Shape{262144}, Layout::row_major, Layout::row_major);
  run_elementwise<T>(s4, Layout::nchw, Layout::nchw, true);                 // strided a
}

}  // namespace

TEST_CASE("gpu add, multiply, scale and their backwards match the CPU backend") {
  run_elementwise_all<float>();
  run_elementwise_all<cutrain::bfloat16>();
  run_elementwise_all<cutrain::half>();
}

TEST_CASE("gpu elementwise ops: empty tensors, f64 refused, shape mismatch refused") {
  Tensor<float> e({0, 3}, {.device = Device::cuda(0)});
  CHECK(ops::add(e, e).numel() == 0);
  Tensor<double> d({4}, {.device = Device::cuda(0)});
  CHECK_THROWS_AS(ops::add(d, d), NotImplemented);
  Tensor<float> a({4}, {.device = Device::cuda(0)}), b({5}, {.device = Device::cuda(0)});
  CHECK_THROWS_AS(ops::add(a, b), InvalidArgument);
  Tensor<float> y({4}, {.device = Device::cuda(0)});
  CHECK_THROWS_AS(kernels::add(a, b, y), InvalidArgument);
  Tensor<float> host({4});
  CHECK_THROWS_AS(kernels::scale(host, 2.0, y), DeviceError);
}

// ---------------------------------------------------------------------------------------------
// casts

namespace {

// Values that probe rounding: ties, overflow to inf, subnormals, signed zero, NaN.
std::vector<float> special_values() {
  return {0.0f, -0.0f, 1.0f, -1.0f, 0.1f, -2.5f, std::numeric_limits<float>::infinity(),
          -std::numeric_limits<float>::infinity(), std::nanf(""), 65504.0f, 65520.0f, 65519.0f, 1e-8f, 6e-8f,
          3e-5f, 3.0e38f, 1e-40f, -1e-45f, 1.0f + 0x1.0p-8f, 1.0f + 3 * 0x1.0p-8f, 1.0f + 0x1.0p-11f,
          1.0f + 3 * 0x1.0p-11f, 0x1.fffffep127f, 2049.0f, 2051.0f};
}

template <class T, class U>
void run_cast(Layout l, Layout out_l) {
  const std::string tag = cutrain::detail::cat("cast ", dtype_of<T>, " -> ", dtype_of<U>, " ", l, " -> ", out_l);
  Rng rng(seed_of(tag));
  const Shape s{2, 3, 5, 7};
  std::vector<float> v(static_cast<std::size_t>(s.numel()));
  for (auto& x : v) x = static_cast<float>(rng.uniform(-4.0, 4.0));
  const auto sp = special_values();
  std::copy(sp.begin(), sp.end(), v.begin());
  const auto host_t = cast<T>(Tensor<float>::from_vector(v, s, {.layout = l}));
  const auto expected = cast<U>(host_t).to_vector();  // the host's conversion is the reference
  const auto x = host_t.to(Device::cuda(0));

  auto y = poisoned<U>(s, out_l);
  kernels::cast_into(x, y);
  INFO(tag);
  CHECK(bit_mismatches(y.to_vector(), expected) == 0);

  auto y2 = kernels::cast<U>(x);
  CHECK(y2.layout() == expected_layout(x));
  CHECK(y2.device() == Device::cuda(0));
  CHECK(bit_mismatches(y2.to_vector(), expected) == 0);

  // 2-d and a size that needs several blocks.
  Rng rng2(seed_of(tag + " 2d"));
  auto [x2, x2r] = random_range<T>({513, 77}, rng2, -100.0, 100.0);
  const auto expected2 = cast<U>(cast<T>(x2r)).to_vector();
  auto y3 = poisoned<U>({513, 77}, Layout::row_major);
  kernels::cast_into(x2, y3);
  CHECK(bit_mismatches(y3.to_vector(), expected2) == 0);
  cuda::synchronize();
  std::printf("%-60s ok\n", tag.c_str());
}

template <class T>
void run_casts_from() {
  for (auto [l, out_l] : {std::pair{Layout::nchw, Layout::nchw}, std::pair{Layout::nhwc, Layout::nhwc},
                          std::pair{Layout::nchw, Layout::nhwc}}) {
    run_cast<T, float>(l, out_l);
    run_cast<T, cutrain::bfloat16>(l, out_l);
    run_cast<T, cutrain::half>(l, out_l);
  }
}

}  // namespace

TEST_CASE("gpu casts between f32, bf16 and f16 equal the host's conversion bit for bit") {
  run_casts_from<float>();
  run_casts_from<cutrain::bfloat16>();
  run_casts_from<cutrain::half>();
}

// ---------------------------------------------------------------------------------------------
// dropout

namespace {

template <class T>
void run_dropout(const Shape& s, Layout l, double p, std::uint64_t seed) {
  const std::string tag = cutrain::detail::cat("dropout ", dtype_of<T>, " ", s, " ", s.rank() == 4 ? to_string(l) : "2d",
                                               " p ", p, " seed ", seed);
  Rng rng(seed_of(tag));
  auto [x, xr] = random_pair<T>(s, rng, l);
  auto [dy, dyr] = random_pair<T>(s, rng, l);
  auto y = poisoned<T>(s, l), mask = poisoned<T>(s, l);
  kernels::dropout_forward(x, p, seed, y, mask);
  const auto ref = ops::dropout_forward(xr, p, seed);

  // The mask: dropped exactly where the CPU drops, and 1 / (1 - p) in T elsewhere.
  const auto m = cast<double>(mask).to_vector(), mr = ref.mask.to_vector();
  const double keep = static_cast<double>(static_cast<T>(1.0 / (1.0 - p)));
  std::size_t mismatches = 0, dropped = 0;
  for (std::size_t i = 0; i < m.size(); ++i) {
    dropped += mr[i] == 0 ? 1 : 0;
    mismatches += (mr[i] == 0 ? m[i] == 0 : m[i] == keep) ? 0 : 1;
  }
  INFO(tag << ": " << mismatches << " mask elements differ from the CPU's, " << dropped << " dropped of " << m.size());
  CHECK(mismatches == 0);
  if (m.size() >= 10000) CHECK(std::abs(static_cast<double>(dropped) / static_cast<double>(m.size()) - p) < 0.02);
  check_close(tag + " y", y, ref.y);

  auto dx = poisoned<T>(s, l);
  kernels::dropout_backward(dy, mask, dx);
  check_close(tag + " backward", dx, ops::dropout_backward(dyr, ref.mask));

  // Through ops::: same mask again (the generator is counter-based), outputs in x's layout.
  auto out = ops::dropout_forward(x, p, seed);
  CHECK(out.mask.layout() == expected_layout(x));
  CHECK(bit_mismatches(out.mask.to_vector(), mask.to_vector()) == 0);
  CHECK(bit_mismatches(out.y.to_vector(), y.to_vector()) == 0);
  check_close(tag + " ops::dropout_backward", ops::dropout_backward(dy, out.mask), ops::dropout_backward(dyr, ref.mask));
  cuda::synchronize();
  std::printf("%-60s ok\n", tag.c_str());
}

template <class T>
void run_dropout_all() {
  for (double p : {0.0, 0.1, 0.5, 0.9}) {
    run_dropout<T>({4, 6, 5, 7}, Layout::nchw, p, 42);
    run_dropout<T>({4, 6, 5, 7}, Layout::nhwc, p, 42);
    run_dropout<T>({33, 17}, Layout::row_major, p, 0xdeadbeefcafeull);
  }
  run_dropout<T>({8, 32, 16, 16}, Layout::nhwc, 0.3, 7);  // 65536 elements, many blocks
}

}  // namespace

TEST_CASE("gpu dropout draws exactly the CPU's mask and matches the CPU backend") {
  run_dropout_all<float>();
  run_dropout_all<cutrain::bfloat16>();
  run_dropout_all<cutrain::half>();
  // An NCHW input into NHWC outputs: the mask still follows logical indices.
  Rng rng(3);
  auto [x, xr] = random_pair<float>({2, 3, 4, 5}, rng, Layout::nchw);
  auto y = poisoned<float>(x.shape(), Layout::nhwc), mask = poisoned<float>(x.shape(), Layout::nhwc);
  kernels::dropout_forward(x, 0.5, 11, y, mask);
  const auto ref = ops::dropout_forward(xr, 0.5, 11);
  check_close("dropout nchw -> nhwc mask", mask, ref.mask, 0.0);
  check_close("dropout nchw -> nhwc y", y, ref.y);
}

// ---------------------------------------------------------------------------------------------
// softmax cross-entropy

namespace {

Tensor<std::int32_t> random_labels(std::int64_t N, std::int64_t C, Rng& rng) {
  std::vector<std::int32_t> v(static_cast<std::size_t>(N));
  for (auto& l : v) l = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(C)));
  return Tensor<std::int32_t>::from_vector(v, {N});
}

template <class T>
void run_cross_entropy(std::int64_t N, std::int64_t C, const CrossEntropyParams& p, double dloss) {
  const std::string tag = cutrain::detail::cat("cross_entropy ", dtype_of<T>, " N ", N, " C ", C, " ", p.reduction,
                                               " smoothing ", p.label_smoothing, " dloss ", dloss);
  Rng rng(seed_of(tag));
  auto [logits, lr] = random_range<T>({N, C}, rng, -8.0, 8.0);
  const auto labels_host = random_labels(N, C, rng);
  const auto labels = labels_host.to(Device::cuda(0));
  const auto loss_ref = ops::cross_entropy_forward(lr, labels_host, p);
  const auto grad_ref = ops::cross_entropy_backward(lr, labels_host, dloss, p);

  auto loss = poisoned<T>(Shape{}, Layout::row_major);
  auto grad = poisoned<T>({N, C}, Layout::row_major);
  kernels::cross_entropy(logits, labels, p, dloss, &loss, &grad);  // both in one pass
  check_close(tag + " loss", loss, loss_ref);
  check_close(tag + " dlogits", grad, grad_ref);

  auto loss2 = ops::cross_entropy_forward(logits, labels, p);
  CHECK(loss2.rank() == 0);
  CHECK(bit_mismatches(loss2.to_vector(), loss.to_vector()) == 0);  // deterministic
  auto grad2 = ops::cross_entropy_backward(logits, labels, static_cast<T>(dloss), p);
  CHECK(grad2.shape() == Shape{N, C});
  check_close(tag + " ops::cross_entropy_backward", grad2, grad_ref);
  // dloss read on the device (what autograd passes, so that backward never copies to the host).
  Tensor<T> dloss_dev(Shape{}, {.device = Device::cuda(0)});
  dloss_dev.fill(static_cast<T>(dloss));
  auto grad3 = ops::cross_entropy_backward(logits, labels, dloss_dev, p);
  check_close(tag + " ops::cross_entropy_backward, dloss on the device", grad3, grad_ref);
  cuda::synchronize();
  std::printf("%-60s ok\n", tag.c_str());
}

template <class T>
void run_cross_entropy_all() {
  const std::pair<std::int64_t, std::int64_t> shapes[] = {{1, 10}, {37, 10}, {64, 1000}, {5, 3}, {3, 5000}, {7, 1}, {300, 33}};
  for (auto [N, C] : shapes) {
    run_cross_entropy<T>(N, C, {}, 1.0);
    run_cross_entropy<T>(N, C, {.reduction = Reduction::sum, .label_smoothing = 0.1}, 0.5);
  }
  run_cross_entropy<T>(128, 10, {.reduction = Reduction::mean, .label_smoothing = 0.2}, 2.0);
}

}  // namespace

TEST_CASE("gpu softmax cross-entropy (loss and gradient) matches the CPU backend") {
  run_cross_entropy_all<float>();
  run_cross_entropy_all<cutrain::bfloat16>();
  run_cross_entropy_all<cutrain::half>();

  // Strided logits (a column slice) are staged; an empty batch sums to 0.
  Rng rng(17);
  auto [wide, wide_r] = random_range<float>({9, 14}, rng, -3.0, 3.0);
  const auto logits = wide.slice(1, 2, 12);
  const auto logits_r = wide_r.slice(1, 2, 12);
  const auto labels_host = random_labels(9, 10, rng);
  const auto labels = labels_host.to(Device::cuda(0));
  check_close("cross_entropy strided logits", ops::cross_entropy_forward(logits, labels, {}),
              ops::cross_entropy_forward(logits_r, labels_host, {}));
  check_close("cross_entropy strided logits backward", ops::cross_entropy_backward(logits, labels, 1.0f, {}),
              ops::cross_entropy_backward(logits_r, labels_host, 1.0, {}));
  Tensor<float> empty({0, 4}, {.device = Device::cuda(0)});
  Tensor<std::int32_t> no_labels({0}, {.device = Device::cuda(0)});
  auto zero = ops::cross_entropy_forward(empty, no_labels, {.reduction = Reduction::sum});
  CHECK(zero.to_vector() == std::vector<float>{0.0f});
}

TEST_CASE("gpu cross-entropy rejects out-of-range labels on the host") {
  Rng rng(23);
  auto [logits, lr] = random_pair<float>({4, 5}, rng, Layout::row_major);
  const auto bad = Tensor<std::int32_t>::from_vector({0, 1, 5, 2}, {4}).to(Device::cuda(0));
  CHECK_THROWS_AS(ops::cross_entropy_forward(logits, bad, {}), InvalidArgument);
  CHECK_THROWS_AS(ops::cross_entropy_backward(logits, bad, 1.0f, {}), InvalidArgument);
  // The kernel itself never reads outside a row: a bad label gives NaN.
  Tensor<float> loss(Shape{}, {.device = Device::cuda(0)});
  kernels::cross_entropy_forward(logits, bad, {}, loss);
  CHECK(std::isnan(loss.to_vector()[0]));
}

// ---------------------------------------------------------------------------------------------
// conv bias gradient

namespace {

template <class T>
void run_bias_grad(const Shape& s, Layout l) {
  const std::string tag = cutrain::detail::cat("bias_grad ", dtype_of<T>, " ", s, " ", l);
  Rng rng(seed_of(tag));
  auto [dy, dyr] = random_pair<T>(s, rng, l);
  auto db = poisoned<T>({s[1]}, Layout::row_major);
  kernels::bias_grad(dy, db);
  check_close(tag, db, cpu::conv2d_backward_bias(dyr));
  cuda::synchronize();
  std::printf("%-60s ok\n", tag.c_str());
}

template <class T>
void run_bias_grad_all() {
  const Shape shapes[] = {{8, 64, 16, 16}, {3, 5, 7, 9}, {1, 1, 1, 1}, {2, 300, 3, 3},
                          {64, 16, 32, 32}, {4, 1000, 1, 1}, {1, 3, 1, 4000}, {0, 4, 3, 3}};
  for (const auto& s : shapes)
    for (Layout l : {Layout::nchw, Layout::nhwc}) run_bias_grad<T>(s, l);
}

}  // namespace

TEST_CASE("gpu conv bias gradient matches the CPU backend") {
  run_bias_grad_all<float>();
  run_bias_grad_all<cutrain::bfloat16>();
  run_bias_grad_all<cutrain::half>();
  // A strided dy (a slice along W) is staged to nchw.
  Rng rng(31);
  auto [wide, wide_r] = random_pair<float>({2, 6, 5, 9}, rng, Layout::nhwc);
  auto db = poisoned<float>({6}, Layout::row_major);
  kernels::bias_grad(wide.slice(3, 2, 7), db);
  check_close("bias_grad strided", db, cpu::conv2d_backward_bias(wide_r.slice(3, 2, 7)));
}

// ---------------------------------------------------------------------------------------------
// SGD and AdamW steps, against updates computed by hand in f64

namespace {

Tensor<double> host_ref(const std::vector<double>& v, const Shape& s) { return Tensor<double>::from_vector(v, s); }

// Three SGD steps with fresh gradients; w and the momentum buffer compared after each.
template <class G>
void run_sgd(const kernels::SgdParams& base, const Shape& s, Layout lw, Layout lg, const char* name) {
  const std::string tag = cutrain::detail::cat("sgd ", name, " grad ", dtype_of<G>, " ", s, " w ", lw, " grad ", lg);
  Rng rng(seed_of(tag));
  auto [w, w_ref] = random_pair<float>(s, rng, lw);
  std::vector<double> wv = w_ref.to_vector(), buf(wv.size(), 0.0);
  Tensor<float> mb = base.momentum != 0 ? Tensor<float>::full(s, 123.0f, {.layout = lw, .device = Device::cuda(0)})
                                        : Tensor<float>{};  // garbage before the first step: it is overwritten
  for (int step = 0; step < 3; ++step) {
    auto [g, g_ref] = random_pair<G>(s, rng, lg);
    auto p = base;
    p.first_step = step == 0;
    kernels::sgd_step(w, g, mb, p);
    const auto gv = g_ref.to_vector();
    for (std::size_t i = 0; i < wv.size(); ++i) {
      double d = gv[i] + p.weight_decay * wv[i];
      if (p.momentum != 0) {
        buf[i] = p.first_step ? d : p.momentum * buf[i] + (1 - p.dampening) * d;
        d = p.nesterov ? d + p.momentum * buf[i] : buf[i];
      }
      wv[i] -= p.lr * d;
    }
    check_close(tag + cutrain::detail::cat(" w after step ", step + 1), w, host_ref(wv, s));
    if (p.momentum != 0) check_close(tag + cutrain::detail::cat(" buf after step ", step + 1), mb, host_ref(buf, s));
  }
  cuda::synchronize();
  std::printf("%-60s ok\n", tag.c_str());
}

template <class G>
void run_adamw(const kernels::AdamWParams& base, const Shape& s, Layout lw, Layout lg) {
  const std::string tag = cutrain::detail::cat("adamw grad ", dtype_of<G>, " ", s, " w ", lw, " grad ", lg, " lr ", base.lr,
                                               " wd ", base.weight_decay);
  Rng rng(seed_of(tag));
  auto [w, w_ref] = random_pair<float>(s, rng, lw);
  std::vector<double> wv = w_ref.to_vector(), mv(wv.size(), 0.0), vv(wv.size(), 0.0);
  // AdamW starts from zero moments (device memory is not zeroed unless asked for)
  auto m = Tensor<float>::zeros(s, {.layout = lw, .device = Device::cuda(0)});
  auto v = Tensor<float>::zeros(s, {.layout = lw, .device = Device::cuda(0)});
  for (std::int64_t t = 1; t <= 3; ++t) {
    auto [g, g_ref] = random_pair<G>(s, rng, lg);
    auto p = base;
    p.step = t;
    kernels::adamw_step(w, g, m, v, p);
    const auto gv = g_ref.to_vector();
    const double bc1 = 1 - std::pow(p.beta1, static_cast<double>(t)), bc2 = 1 - std::pow(p.beta2, static_cast<double>(t));
    for (std::size_t i = 0; i < wv.size(); ++i) {
      wv[i] *= 1 - p.lr * p.weight_decay;
      mv[i] = p.beta1 * mv[i] + (1 - p.beta1) * gv[i];
      vv[i] = p.beta2 * vv[i] + (1 - p.beta2) * gv[i] * gv[i];
      wv[i] -= p.lr / bc1 * mv[i] / (std::sqrt(vv[i]) / std::sqrt(bc2) + p.eps);
    }
    check_close(tag + cutrain::detail::cat(" w after step ", t), w, host_ref(wv, s));
    check_close(tag + cutrain::detail::cat(" m after step ", t), m, host_ref(mv, s));
    check_close(tag + cutrain::detail::cat(" v after step ", t), v, host_ref(vv, s));
  }
  cuda::synchronize();
  std::printf("%-60s ok\n", tag.c_str());
}

template <class G>
void run_optim_all() {
  const Shape flat{1000}, conv{64, 3, 3, 3};
  run_sgd<G>({.lr = 0.1}, flat, Layout::row_major, Layout::row_major, "plain");
  run_sgd<G>({.lr = 0.1, .momentum = 0.9}, flat, Layout::row_major, Layout::row_major, "momentum");
  run_sgd<G>({.lr = 0.05, .momentum = 0.9, .dampening = 0.1, .weight_decay = 1e-2}, conv, Layout::nhwc, Layout::nhwc,
             "momentum+dampening+decay");
  run_sgd<G>({.lr = 0.05, .momentum = 0.8, .weight_decay = 5e-4, .nesterov = true}, conv, Layout::nchw, Layout::nchw,
             "nesterov+decay");
  run_sgd<G>({.lr = 0.1, .momentum = 0.9, .nesterov = true}, conv, Layout::nhwc, Layout::nchw, "nesterov, grad staged");
  run_adamw<G>({.lr = 1e-2, .weight_decay = 0.1}, flat, Layout::row_major, Layout::row_major);
  run_adamw<G>({.lr = 3e-3, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.0}, conv, Layout::nhwc, Layout::nhwc);
  run_adamw<G>({.lr = 1e-3}, conv, Layout::nchw, Layout::nhwc);
}

}  // namespace

TEST_CASE("gpu SGD and AdamW steps match updates computed by hand in f64") {
  run_optim_all<float>();
  run_optim_all<cutrain::bfloat16>();
  run_optim_all<cutrain::half>();
  // Bad arguments are refused before anything runs.
  Tensor<float> w({4}, {.device = Device::cuda(0)}), none;
  Tensor<float> g({4}, {.device = Device::cuda(0)});
  CHECK_THROWS_AS(kernels::sgd_step(w, g, none, {.lr = 0.1, .momentum = 0.9}), InvalidArgument);  // no buffer
  CHECK_THROWS_AS(kernels::sgd_step(w, g, none, {.lr = 0.1, .nesterov = true}), InvalidArgument);
  Tensor<float> m({4}, {.device = Device::cuda(0)}), v({5}, {.device = Device::cuda(0)});
  CHECK_THROWS_AS(kernels::adamw_step(w, g, m, v, {}), InvalidArgument);  // v's shape
  CHECK_THROWS_AS(kernels::adamw_step(w, g, m, m, {.step = 0}), InvalidArgument);
}

// ---------------------------------------------------------------------------------------------
// the module cache: in memory, on disk

namespace {

// An elementwise program under a name (and text) no other test uses.
kernels::Program unique_program(const std::string& what) {
  kernels::Program p = kernels::programs::elementwise("float");
  p.name = cutrain::detail::cat("gpu_test_", what, "_", ::getpid());
  p.source += "\n// " + p.name + "\n";
  return p;
}

// Runs p's cutrain_add on a few elements and checks the sums.
void add_with(const kernels::Program& p, CUfunction f) {
  Rng rng(1);
  auto [a, ar] = random_pair<float>({1000}, rng, Layout::row_major);
  auto [b, br] = random_pair<float>({1000}, rng, Layout::row_major);
  auto y = poisoned<float>({1000}, Layout::row_major);
  const long long n = 1000;
  kernels::launch(f, kernels::grid_for(n), 256, "test", a.data(), b.data(), y.data(), n);
  check_close(p.name + " add", y, ops::add(ar, br));
}

}  // namespace

TEST_CASE("gpu NVRTC modules: compiled once, then served from memory; the disk cache is used") {
  namespace fs = std::filesystem;
  std::string tmpl = (fs::temp_directory_path() / "cutrain_gpu_kernel_cache_XXXXXX").string();
  REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
  const fs::path dir = tmpl;
  ScopedConfig env("CUTRAIN_KERNEL_CACHE", dir.string());
  auto& st = kernels::stats();
  const int arch = kernels::detail::device_arch(0);
  std::printf("NVRTC %s, GPU sm_%d, kernels compiled for %s\n", kernels::nvrtc_version().c_str(), arch,
              kernels::target_for(arch).gpu_architecture.c_str());
  kernels::DeviceScope scope(0);

  // First use compiles and writes the cache file; the second is a memory hit.
  const auto p = unique_program("memory");
  const auto compiles0 = st.compiles.load(), loads0 = st.module_loads.load(), hits0 = st.memory_hits.load();
  CUfunction f1 = kernels::function(0, p, "cutrain_add");
  CHECK(st.compiles.load() == compiles0 + 1);
  CHECK(st.module_loads.load() == loads0 + 1);
  CHECK(fs::exists(kernels::cache_file(p, kernels::target_for(arch))));
  CUfunction f2 = kernels::function(0, p, "cutrain_add");
  CHECK(f1 == f2);
  CHECK(st.memory_hits.load() == hits0 + 1);
  CHECK(st.module_loads.load() == loads0 + 1);
  CHECK(st.compiles.load() == compiles0 + 1);
  add_with(p, f1);
  CHECK(kernels::function(0, p, "cutrain_scale") != f1);  // another kernel of the same module
  CHECK(st.module_loads.load() == loads0 + 1);
  CHECK_THROWS_AS(kernels::function(0, p, "no_such_kernel"), CudaError);

  // An op's second call loads nothing.
  Tensor<float> a = Tensor<float>::full({64}, 1.5f, {.device = Device::cuda(0)});
  (void)ops::add(a, a);
  const auto loads1 = st.module_loads.load(), hits1 = st.memory_hits.load();
  auto y = ops::add(a, a);
  CHECK(st.module_loads.load() == loads1);
  CHECK(st.memory_hits.load() > hits1);
  CHECK(y.to_vector() == std::vector<float>(64, 3.0f));

  // A valid cache file is loaded without compiling.
  const auto pd = unique_program("disk");
  const auto img = kernels::image_for(pd, arch);  // compiles and writes the file
  REQUIRE(fs::exists(img.file));
  const auto compiles1 = st.compiles.load(), disk1 = st.disk_hits.load();
  add_with(pd, kernels::function(0, pd, "cutrain_add"));
  CHECK(st.compiles.load() == compiles1);
  CHECK(st.disk_hits.load() == disk1 + 1);

  // A cache file that is well formed but that the driver refuses is replaced by a fresh compile.
  const auto pr = unique_program("refused");
  const std::string junk = "this is not a CUBIN";
  REQUIRE(kernels::detail::write_cache_file(kernels::cache_file(pr, kernels::target_for(arch)),
                                            std::vector<char>(junk.c_str(), junk.c_str() + junk.size() + 1)));
  const auto rejects0 = st.disk_rejects.load(), compiles2 = st.compiles.load();
  add_with(pr, kernels::function(0, pr, "cutrain_add"));
  CHECK(st.disk_rejects.load() == rejects0 + 1);
  CHECK(st.compiles.load() == compiles2 + 1);

  // A corrupt file is ignored before it reaches the driver.
  const auto pc = unique_program("corrupt");
  fs::create_directories(dir);
  { std::ofstream(kernels::cache_file(pc, kernels::target_for(arch)), std::ios::binary) << "garbage"; }
  add_with(pc, kernels::function(0, pc, "cutrain_add"));
  CHECK(kernels::image_for(pc, arch).from_disk);  // rewritten valid
  cuda::synchronize();
  fs::remove_all(dir);
  std::printf("%-60s ok\n", "nvrtc module cache (memory, disk, refused and corrupt files)");
}

// The same values laid out by the device copy and by the CPU (the oracle: a host loop).
template <class T>
void check_layout_copies(const std::string& tag) {
  Rng rng(seed_of(tag));
  const Shape s{3, 5, 7, 9};
  const auto host = cast<T>(Tensor<float>::uniform(s, rng, -100.0, 100.0));  // row-major
  const auto dev = host.to(Device::cuda(0));
  const auto same = [&](const std::string& what, const Tensor<T>& gpu, const Tensor<T>& cpu) {
    INFO(tag << " " << what << ": " << gpu.describe() << " against " << cpu.describe());
    REQUIRE(gpu.device().is_cuda());
    CHECK(gpu.layout() == cpu.layout());
    CHECK(gpu.to(Device::cpu()).to_vector() == cpu.to_vector());  // exact: a copy moves bits
  };
  const auto nhwc = dev.contiguous(Layout::nhwc);
  same("nchw -> nhwc", nhwc, host.contiguous(Layout::nhwc));
  same("nhwc -> nchw", nhwc.contiguous(Layout::nchw), host);
  const auto slice = dev.slice(2, 1, 6);  // strided view
  same("slice -> row-major", slice.clone(Layout::row_major), host.slice(2, 1, 6).clone(Layout::row_major));
  same("nhwc slice -> nchw", nhwc.slice(1, 2, 4).contiguous(Layout::nchw), host.slice(1, 2, 4).contiguous(Layout::nchw));
  // Into a strided destination: a column block of a wider tensor.
  auto wide = Tensor<T>::zeros(Shape{3, 5, 7, 20}, {.device = Device::cuda(0)});
  auto wide_host = Tensor<T>::zeros(Shape{3, 5, 7, 20});
  wide.slice(3, 4, 13).copy_from(nhwc);
  wide_host.slice(3, 4, 13).copy_from(host);
  same("nhwc -> strided slice", wide, wide_host);
  // Empty and rank-1 tensors.
  Tensor<T> empty(Shape{0, 4}, {.device = Device::cuda(0)});
  empty.copy_from(Tensor<T>(Shape{0, 4}, {.device = Device::cuda(0)}).slice(1, 0, 4));
  const auto line = host.reshape(Shape{s.numel()});
  same("rank 1 slice", line.to(Device::cuda(0)).slice(0, 7, 50).clone(), line.slice(0, 7, 50).clone());
}

TEST_CASE("gpu: layout changes and strided copies run on the device, bit for bit") {
  check_layout_copies<float>("copy f32");
  check_layout_copies<bfloat16>("copy bf16");
  check_layout_copies<double>("copy f64");
  check_layout_copies<std::int32_t>("copy i32");
}

TEST_CASE("gpu: a layout change can be captured in a CUDA graph (no host round trip)") {
  Rng rng(404);
  const Shape s{4, 6, 5, 3};
  auto x = Tensor<float>::uniform(s, rng, -1.0, 1.0).to(Device::cuda(0));
  Tensor<float> y(s, {.layout = Layout::nhwc, .device = Device::cuda(0)});
  cuda::Stream stream;
  cuda::StreamGuard on(stream.get());
  y.copy_from(x);  // warm-up: the kernel is loaded before capture
  cuda::CudaGraph graph;
  graph.capture([&] { y.copy_from(x); });
  CHECK(graph.nodes() == 1);
  for (int round = 0; round < 2; ++round) {
    const auto next = Tensor<float>::uniform(s, rng, -1.0, 1.0);
    x.copy_from(next.to(Device::cuda(0)));
    graph.replay();
    stream.synchronize();
    CHECK(y.to(Device::cpu()).to_vector() == next.contiguous(Layout::nhwc).to_vector());
  }
}

}  // namespace cutrain_test_kernels_gpu
