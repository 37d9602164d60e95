// Broadcasting elementwise ops on the GPU against the CPU backend in f64 on the same (rounded)
// random data, in f32, bf16 and f16: every binary op forward and backward over broadcast shape
// pairs, with inputs contiguous, column-sliced (strided), transposed and stride-0 expand views;
// every unary op and its backward; comparisons (exactly) and where forward and backward; the
// kernels into NaN-poisoned outputs; autograd on the device.
#include "parity.hpp"

#include <cstdint>
#include <string>
#include <vector>

#include "cutrain/autograd/functions.hpp"
#include "cutrain/cuda/kernels/broadcast.hpp"
#include "cutrain/ops/broadcast.hpp"
#include "cutrain/ops/elementwise.hpp"

namespace cutrain_test_broadcast_gpu {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;
namespace kernels = cutrain::cuda::kernels;

namespace {

enum class Kind { contiguous, sliced, transposed, expanded };
const char* kind_name(Kind k) {
  switch (k) {
    case Kind::contiguous: return "contiguous";
    case Kind::sliced: return "sliced";
    case Kind::transposed: return "transposed";
    case Kind::expanded: return "expanded";
  }
  return "";
}

// The values: in [-1, 1), or with magnitude in [0.5, 1.5] (away: safe divisors), or in [0.5, 1.5]
// (positive: in the domain of log, sqrt, rsqrt, pow).
enum class Values { any, away, positive };

template <class T>
struct Input {
  Tensor<T> x;
  Tensor<double> ref;
};

Tensor<float> draw(const Shape& s, Rng& rng, Values v) {
  if (v == Values::any) return Tensor<float>::uniform(s, rng, -1.0, 1.0);
  auto t = Tensor<float>::uniform(s, rng, 0.5, 1.5);
  if (v == Values::away)
    for (std::int64_t i = 0; i < t.numel(); ++i) t.flat(i) *= (i % 3 == 1) ? -1.0f : 1.0f;
  return t;
}

// An input of shape s laid out as `kind` says: contiguous; a slice [1, 1 + n) of a last axis 3
// wider; the transpose of a stored tensor with the last two dims swapped; or a stride-0 expand
// of a tensor of size 1 along dim 0 (s[0] copies of one row). The same values on the host in f64.
template <class T>
Input<T> make_input(const Shape& s, Rng& rng, Kind kind, Values v = Values::any) {
  const int r = s.rank();
  if (kind == Kind::sliced && r >= 1) {
    std::vector<std::int64_t> d = s.dims();
    d.back() += 3;
    auto host = cast<T>(draw(Shape(d), rng, v));
    return {host.to(Device::cuda(0)).slice(r - 1, 1, 1 + s[r - 1]), cast<double>(host).slice(r - 1, 1, 1 + s[r - 1])};
  }
  if (kind == Kind::transposed && r >= 2) {
    std::vector<std::int64_t> d = s.dims();
    std::swap(d[static_cast<std::size_t>(r - 1)], d[static_cast<std::size_t>(r - 2)]);
    auto host = cast<T>(draw(Shape(d), rng, v));
    auto dev = host.to(Device::cuda(0));
    auto ref = cast<double>(host);
    return {transpose(dev, r - 1, r - 2), transpose(ref, r - 1, r - 2)};
  }
  if (kind == Kind::expanded && r >= 1) {
    std::vector<std::int64_t> d = s.dims();
    d[0] = 1;
    auto host = cast<T>(draw(Shape(d), rng, v));
    auto dev = host.to(Device::cuda(0));
    auto ref = cast<double>(host);
    return {expand(dev, s), expand(ref, s)};
  }
  auto host = cast<T>(draw(s, rng, v));
  return {host.to(Device::cuda(0)), cast<double>(host)};
}

struct Pair {
  Shape a, b;
};
const std::vector<Pair> pairs = {
    {{3, 1, 4}, {2, 1}},        {{2, 1}, {3, 1, 4}},       {{4}, {2, 3, 4}},        {{}, {2, 3}},
    {{2, 3}, {}},               {{5, 1, 1, 3}, {1, 4, 2, 1}}, {{6, 7}, {6, 7}},     {{2, 3, 4, 5}, {5}},
    {{64, 1, 33}, {17, 1}},     {{1000, 40}, {40}},        {{0, 3}, {1, 3}},
};
const BinaryOp all_binary[] = {BinaryOp::add, BinaryOp::sub, BinaryOp::mul, BinaryOp::div, BinaryOp::minimum,
                               BinaryOp::maximum};
const Kind all_kinds[] = {Kind::contiguous, Kind::sliced, Kind::transposed, Kind::expanded};

template <class T>
void check_binary(const std::string& tag) {
  Rng rng(100);
  for (const auto& p : pairs) {
    const Shape out = broadcast_shape("test", p.a, p.b);
    for (Kind ka : all_kinds) {
      for (BinaryOp op : all_binary) {
        const Kind kb = all_kinds[(static_cast<int>(ka) + static_cast<int>(op)) % 4];
        const std::string name = tag + " " + std::string(to_string(op)) + " " + p.a.str() + " " + kind_name(ka) +
                                 " vs " + p.b.str() + " " + kind_name(kb);
        INFO(name);
        const auto a = make_input<T>(p.a, rng, ka, Values::away);
        const auto b = make_input<T>(p.b, rng, kb, Values::away);
        auto y = ops::binary(op, a.x, b.x);
        CHECK(y.device() == Device::cuda(0));
        check_close(name + " forward", y, ops::binary(op, a.ref, b.ref));
        const auto dy = make_input<T>(out, rng, Kind::contiguous);
        const auto g = ops::binary_backward(op, a.x, b.x, dy.x);
        const auto gr = ops::binary_backward(op, a.ref, b.ref, dy.ref);
        // Sums of up to ~1000 rounded terms: bf16 and f16 get a wider band.
        const double tol = std::is_same_v<T, float> ? 1e-5 : 2e-2;
        check_close(name + " da", g.da, gr.da, tol);
        check_close(name + " db", g.db, gr.db, tol);
      }
    }
    // pow with a tensor exponent: positive bases (a negative one with a fractional exponent is
    // NaN on both sides), exponents of both signs.
    for (Kind ka : all_kinds) {
      const Kind kb = all_kinds[(static_cast<int>(ka) + 1) % 4];
      const std::string name = tag + " pow " + p.a.str() + " " + kind_name(ka) + " vs " + p.b.str() + " " + kind_name(kb);
      INFO(name);
      const auto a = make_input<T>(p.a, rng, ka, Values::positive);
      const auto b = make_input<T>(p.b, rng, kb, Values::away);
      check_close(name + " forward", ops::pow(a.x, b.x), ops::pow(a.ref, b.ref));
      const auto dy = make_input<T>(out, rng, Kind::contiguous);
      const auto g = ops::pow_backward(a.x, b.x, dy.x);
      const auto gr = ops::pow_backward(a.ref, b.ref, dy.ref);
      const double tol = std::is_same_v<T, float> ? 1e-5 : 2e-2;
      check_close(name + " da", g.da, gr.da, tol);
      check_close(name + " db", g.db, gr.db, tol);
    }
    // add and multiply (the long names) broadcast the same way.
    const auto a = make_input<T>(p.a, rng, Kind::contiguous), b = make_input<T>(p.b, rng, Kind::sliced);
    check_close(tag + " add " + p.a.str() + p.b.str(), ops::add(a.x, b.x), ops::add(a.ref, b.ref));
    check_close(tag + " multiply " + p.a.str() + p.b.str(), ops::multiply(a.x, b.x), ops::multiply(a.ref, b.ref));
  }
}

template <class T>
void check_unary(const std::string& tag) {
  Rng rng(200);
  const std::vector<std::pair<UnaryOp, double>> ops_p = {
      {UnaryOp::exp, 0},  {UnaryOp::log, 0},   {UnaryOp::sqrt, 0},  {UnaryOp::rsqrt, 0},  {UnaryOp::neg, 0},
      {UnaryOp::abs, 0},  {UnaryOp::pow, 3.0}, {UnaryOp::pow, 2.5}, {UnaryOp::pow, -1.5}, {UnaryOp::pow, 0.0}};
  for (auto [op, p] : ops_p) {
    const bool positive = op == UnaryOp::log || op == UnaryOp::sqrt || op == UnaryOp::rsqrt ||
                          (op == UnaryOp::pow && p != 3.0 && p != 0.0);
    for (const Shape& s : {Shape{}, Shape{7}, Shape{3, 5, 6}, Shape{2, 3, 4, 5}, Shape{300, 129}}) {
      for (Kind k : all_kinds) {
        const std::string name = tag + " " + std::string(to_string(op)) + " " + std::to_string(p) + " " + s.str() +
                                 " " + kind_name(k);
        INFO(name);
        const auto x = make_input<T>(s, rng, k, positive ? Values::positive : Values::away);
        check_close(name + " forward", ops::unary(op, x.x, p), ops::unary(op, x.ref, p));
        const auto dy = make_input<T>(s, rng, Kind::sliced);
        check_close(name + " backward", ops::unary_backward(op, x.x, dy.x, p), ops::unary_backward(op, x.ref, dy.ref, p));
      }
    }
  }
  // An nhwc input gives an nhwc output.
  auto [x, xr] = random_pair<T>(Shape{2, 3, 4, 5}, rng, Layout::nhwc);
  auto y = ops::exp(x);
  CHECK(y.layout() == Layout::nhwc);
  check_close(tag + " exp nhwc", y, ops::exp(xr));
}

template <class T>
void check_compare_where(const std::string& tag) {
  Rng rng(300);
  const CompareOp all_compare[] = {CompareOp::eq, CompareOp::ne, CompareOp::lt,
                                   CompareOp::le, CompareOp::gt, CompareOp::ge};
  for (const auto& p : pairs) {
    const Shape out = broadcast_shape("test", p.a, p.b);
    for (Kind ka : all_kinds) {
      const std::string name = tag + " " + p.a.str() + " " + kind_name(ka) + " vs " + p.b.str();
      INFO(name);
      const auto a = make_input<T>(p.a, rng, ka);
      const auto b = make_input<T>(p.b, rng, Kind::sliced);
      for (CompareOp op : all_compare) {
        auto yg = ops::compare(op, a.x, b.x);
        CHECK(yg.device() == Device::cuda(0));
        CHECK(yg.to_vector() == ops::compare(op, a.ref, b.ref).to_vector());
        // Against itself: eq everywhere, lt nowhere.
        auto self = ops::compare(op, a.x, a.x).to_vector();
        for (auto v : self) CHECK(v == ((op == CompareOp::eq || op == CompareOp::le || op == CompareOp::ge) ? 1 : 0));
      }
      // where with a cond of its own shape (the output's last dim), broadcast too.
      const Shape cs = out.rank() > 0 ? Shape{out[out.rank() - 1]} : Shape{};
      std::vector<std::uint8_t> cv(static_cast<std::size_t>(cs.numel()));
      for (auto& v : cv) v = static_cast<std::uint8_t>(rng.below(2));
      auto cond_h = Tensor<std::uint8_t>::from_vector(cv, cs);
      auto cond = cond_h.to(Device::cuda(0));
      check_close(name + " where", ops::where(cond, a.x, b.x), ops::where(cond_h, a.ref, b.ref));
      const auto cmp = ops::lt(a.x, b.x);  // a full-shape cond on the device
      check_close(name + " where lt", ops::where(cmp, a.x, b.x), ops::where(ops::lt(a.ref, b.ref), a.ref, b.ref));
      const auto dy = make_input<T>(out, rng, Kind::contiguous);
      const auto g = ops::where_backward(cond, p.a, p.b, dy.x);
      const auto gr = ops::where_backward(cond_h, p.a, p.b, dy.ref);
      const double tol = std::is_same_v<T, float> ? 1e-5 : 2e-2;
      check_close(name + " where da", g.da, gr.da, tol);
      check_close(name + " where db", g.db, gr.db, tol);
    }
  }
}

// The kernels write every output element: outputs poisoned with NaN first.
template <class T>
void check_poisoned(const std::string& tag) {
  Rng rng(400);
  const auto a = make_input<T>({5, 1, 7}, rng, Kind::sliced, Values::away);
  const auto b = make_input<T>({3, 1}, rng, Kind::transposed, Values::away);
  const Shape out{5, 3, 7};
  for (BinaryOp op : all_binary) {
    Tensor<T> y = poisoned<T>(out, Layout::row_major);
    kernels::broadcast_binary(op, a.x, b.x, y);
    check_close(tag + " poisoned " + std::string(to_string(op)), y, ops::binary(op, a.ref, b.ref));
    const auto dy = make_input<T>(out, rng, Kind::expanded);
    for (int which : {0, 1}) {
      Tensor<T> gr = poisoned<T>(out, Layout::row_major);
      kernels::broadcast_binary_grad(op, a.x, b.x, dy.x, which, gr);
      check_close(tag + " poisoned grad " + std::string(to_string(op)), gr,
                  cpu::binary_grad(op, a.ref, b.ref, dy.ref, which));
    }
  }
  Tensor<T> u = poisoned<T>(Shape{5, 1, 7}, Layout::row_major);
  kernels::unary(UnaryOp::abs, a.x, 0.0, u);
  check_close(tag + " poisoned abs", u, ops::abs(a.ref));
  // An nhwc output written through its own strides.
  auto [x4, x4r] = random_pair<T>(Shape{2, 3, 4, 5}, rng, Layout::row_major);
  Tensor<T> y4 = poisoned<T>(Shape{2, 3, 4, 5}, Layout::nhwc);
  kernels::unary(UnaryOp::neg, x4, 0.0, y4);
  check_close(tag + " poisoned neg nhwc", y4, ops::neg(x4r));
}

template <class T>
void check_all(const std::string& tag) {
  check_binary<T>(tag);
  check_unary<T>(tag);
  check_compare_where<T>(tag);
  check_poisoned<T>(tag);
}

}  // namespace

TEST_CASE("gpu broadcast: every op and backward against the CPU, f32", "[gpu][broadcast]") { check_all<float>("f32"); }
TEST_CASE("gpu broadcast: every op and backward against the CPU, bf16", "[gpu][broadcast]") { check_all<bfloat16>("bf16"); }
TEST_CASE("gpu broadcast: every op and backward against the CPU, f16", "[gpu][broadcast]") {
  check_all<cutrain::half>("f16");
}

TEST_CASE("gpu broadcast: autograd on the device matches the CPU", "[gpu][broadcast]") {
  Rng rng(500);
  auto ha = Tensor<float>::uniform({3, 1, 4}, rng, 0.5, 1.5);
  auto hb = Tensor<float>::uniform({2, 1}, rng, 0.5, 1.5);
  auto run = [](const Tensor<float>& av, const Tensor<float>& bv, Device d) {
    auto a = autograd::parameter(av.to(d)), b = autograd::parameter(bv.to(d));
    auto cond = ops::gt(a.value(), b.value());
    auto y = autograd::sum(autograd::where(cond, autograd::exp(a - b), autograd::pow(b, 2.0)) / a +
                           autograd::maximum(a, b) * -b + autograd::sqrt(a * b));
    y.backward();
    return std::make_tuple(y.value().to(Device::cpu()), a.grad().to(Device::cpu()), b.grad().to(Device::cpu()));
  };
  auto [yg, dag, dbg] = run(ha, hb, Device::cuda(0));
  auto [yc, dac, dbc] = run(ha, hb, Device::cpu());
  check_close("autograd y", yg, cast<double>(yc));
  check_close("autograd da", dag, cast<double>(dac));
  check_close("autograd db", dbg, cast<double>(dbc));
}

TEST_CASE("gpu broadcast: errors name the op", "[gpu][broadcast]") {
  auto a = Tensor<float>::zeros({2, 3}).to(Device::cuda(0));
  auto b = Tensor<float>::zeros({4}).to(Device::cuda(0));
  CHECK_THROWS_AS(ops::sub(a, b), InvalidArgument);
  CHECK_THROWS_AS(ops::sub(a, Tensor<float>::zeros({3})), DeviceError);
  CHECK_THROWS_AS(ops::where(Tensor<std::uint8_t>::zeros({3}), a, a), DeviceError);
}

}  // namespace cutrain_test_broadcast_gpu
