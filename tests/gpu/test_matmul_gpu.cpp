// matmul, gemm and matmul_backward on cuBLASLt against the CPU backend in f64 on the same
// (rounded) random data, in f32 (true f32 and TF32), bf16 and f16: 2-d, batched, broadcast batch
// dims ([2,1,3,4] x [5,4,2] runs as one call per outer index), rank-1 operands; operands as
// transposed views (op T, no copy), with inner stride 2 (staged) and starting one element into
// their rows (misaligned); gemm's alpha, beta, transposes and C (packed, transposed: staged,
// broadcast from [n]); k == 0; outputs NaN-poisoned through cuda::cublas::matmul_into; autograd
// on the device. Tolerances grow with the contraction length (sqrt(k / 16) times the dtype's).
#include "parity.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "cutrain/autograd/functions/matmul.hpp"
#include "cutrain/core/view.hpp"
#include "cutrain/cuda/cublas/matmul.hpp"
#include "cutrain/cuda/math_options.hpp"
#include "cutrain/ops/matmul.hpp"

namespace cutrain_test_matmul_gpu {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;

namespace {

enum class Variant { plain, transposed, strided, misaligned };

const char* name_of(Variant v) {
  switch (v) {
    case Variant::plain: return "plain";
    case Variant::transposed: return "transposed";
    case Variant::strided: return "strided";
    case Variant::misaligned: return "misaligned";
  }
  return "?";
}

// An operand of shape s on cuda:0 and the same values in f64 on the host, laid out as v says:
// transposed: a transpose(x, -1, -2) view of a fresh [..., c, r] tensor; strided: every other
// element of a tensor twice as wide; misaligned: a slice starting one element into rows one
// element wider. 1-d operands: plain, strided or misaligned only.
template <class T>
std::pair<Tensor<T>, Tensor<double>> operand(const Shape& s, Variant v, Rng& rng) {
  std::vector<std::int64_t> d = s.dims();
  const int last = s.rank() - 1;
  if (v == Variant::transposed && s.rank() >= 2) {
    std::swap(d[d.size() - 1], d[d.size() - 2]);
    auto [t, r] = random_pair<T>(Shape(d), rng, Layout::row_major);
    return {cutrain::transpose(t, -1, -2), cutrain::transpose(r, -1, -2)};
  }
  if (v == Variant::strided) {
    d.back() *= 2;
    auto [t, r] = random_pair<T>(Shape(d), rng, Layout::row_major);
    return {cutrain::slice(t, last, 0, slice_end, 2), cutrain::slice(r, last, 0, slice_end, 2)};
  }
  if (v == Variant::misaligned) {
    d.back() += 1;
    auto [t, r] = random_pair<T>(Shape(d), rng, Layout::row_major);
    return {cutrain::slice(t, last, 1), cutrain::slice(r, last, 1)};
  }
  return random_pair<T>(s, rng, Layout::row_major);
}

double scaled(double tol, std::int64_t k) { return tol * std::max(1.0, std::sqrt(static_cast<double>(k) / 16.0)); }

template <class T>
double base_tolerance() {
  if constexpr (std::same_as<T, float>) return cuda::math_options().allow_tf32 ? 1e-3 : tolerance<T>;
  else return tolerance<T>;
}

template <class T>
std::string tag(const std::string& what) {
  return cutrain::detail::cat(what, " ", dtype_of<T>,
                              std::same_as<T, float> && cuda::math_options().allow_tf32 ? " tf32" : "");
}

template <class Fn>
void attempt(const std::string& what, Fn&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    FAIL_CHECK(what << " threw: " << e.what());
    std::printf("matmul %s FAILED: %s\n", what.c_str(), e.what());
  }
}

struct Pair {
  Shape a, b;
};

const Pair pairs[] = {
    {{3, 4}, {4, 2}},           {{7, 13}, {13, 5}},         {{2, 3, 4}, {2, 4, 5}},      {{2, 1, 3, 4}, {5, 4, 2}},
    {{3, 4}, {2, 4, 5}},        {{2, 5, 16}, {16, 9}},      {{4}, {4, 2}},               {{2, 3, 4}, {4}},
    {{33}, {33}},               {{4, 64, 96}, {96, 48}},    {{1, 3, 1, 17, 9}, {4, 9, 11}}, {{1, 1}, {1, 1}},
    {{8, 128, 256}, {8, 256, 64}},
};

// Forward and backward of one pair in one variant of a and of b.
template <class T>
void run_pair(const Pair& p, Variant va, Variant vb) {
  const std::string what = tag<T>(cutrain::detail::cat("a ", p.a, " ", name_of(va), " x b ", p.b, " ", name_of(vb)));
  attempt(what, [&] {
    Rng rng(std::hash<std::string>{}(what));
    auto [a, ar] = operand<T>(p.a, va, rng);
    auto [b, br] = operand<T>(p.b, vb, rng);
    const std::int64_t k = p.a[p.a.rank() - 1];
    const Tensor<double> ref = ops::matmul(ar, br);
    const Tensor<T> y = ops::matmul(a, b);
    INFO(what);
    check_close(what + " forward", y, ref, scaled(base_tolerance<T>(), k));

    auto [dy, dyr] = random_pair<T>(ref.shape(), rng, Layout::row_major);
    const auto g = ops::matmul_backward(a, b, dy);
    const auto gr = ops::matmul_backward(ar, br, dyr);
    // Each element of da sums n products per batch it was broadcast over, db's m per batch: the
    // terms per element are numel(y) * k / numel(operand).
    check_close(what + " da", g.da, gr.da, scaled(base_tolerance<T>(), ref.numel() * k / std::max<std::int64_t>(ar.numel(), 1)));
    check_close(what + " db", g.db, gr.db, scaled(base_tolerance<T>(), ref.numel() * k / std::max<std::int64_t>(br.numel(), 1)));
  });
}

template <class T>
void check_all() {
  for (const Pair& p : pairs)
    for (Variant va : {Variant::plain, Variant::transposed, Variant::strided, Variant::misaligned})
      for (Variant vb : {Variant::plain, Variant::transposed, Variant::strided, Variant::misaligned}) {
        if ((p.a.rank() == 1 && va == Variant::transposed) || (p.b.rank() == 1 && vb == Variant::transposed)) continue;
        run_pair<T>(p, va, vb);
      }
}

template <class T>
void check_gemm() {
  Rng rng(std::hash<std::string>{}(tag<T>("gemm")));
  const std::int64_t m = 9, k = 20, n = 7;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (int cv = 0; cv < 3; ++cv) {  // c packed, c transposed (staged), c broadcast from [n]
        const std::string what = tag<T>(cutrain::detail::cat("gemm ta ", ta, " tb ", tb, " c ", cv));
        attempt(what, [&] {
          auto [a, ar] = random_pair<T>(ta ? Shape{k, m} : Shape{m, k}, rng, Layout::row_major);
          auto [b, br] = random_pair<T>(tb ? Shape{n, k} : Shape{k, n}, rng, Layout::row_major);
          auto [c, cr] = cv == 0 ? random_pair<T>({m, n}, rng, Layout::row_major)
                         : cv == 1 ? operand<T>({m, n}, Variant::transposed, rng)
                                   : random_pair<T>({n}, rng, Layout::row_major);
          const Tensor<double> ref = ops::gemm(ar, br, cr, 1.5, -0.75, ta, tb);
          check_close(what, ops::gemm(a, b, c, 1.5, -0.75, ta, tb), ref, scaled(base_tolerance<T>(), k));
        });
      }
  attempt(tag<T>("gemm batched, beta 0 with NaN c, k 0"), [&] {
    auto [a, ar] = random_pair<T>({3, 5, 8}, rng, Layout::row_major);
    auto [b, br] = random_pair<T>({8, 6}, rng, Layout::row_major);
    auto [c, cr] = random_pair<T>({3, 1, 6}, rng, Layout::row_major);
    check_close(tag<T>("gemm batched, c broadcast"), ops::gemm(a, b, c, 1.0, 1.0), ops::gemm(ar, br, cr, 1.0, 1.0),
                base_tolerance<T>());
    const Tensor<T> nan_c = poisoned<T>({3, 5, 6}, Layout::row_major);
    check_close(tag<T>("gemm beta 0 ignores c"), ops::gemm(a, b, nan_c, 2.0, 0.0), ops::gemm(ar, br, Tensor<double>{}, 2.0, 0.0),
                base_tolerance<T>());
    // k == 0: beta c, or zeros
    auto [c2, c2r] = random_pair<T>({4, 3}, rng, Layout::row_major);
    const auto z = [](Shape s) { return Tensor<T>::zeros(s, {.device = Device::cuda(0)}); };
    check_close(tag<T>("gemm k 0"), ops::gemm(z({4, 0}), z({0, 3}), c2, 1.0, 0.5),
                ops::gemm(Tensor<double>::zeros({4, 0}), Tensor<double>::zeros({0, 3}), c2r, 1.0, 0.5), base_tolerance<T>());
    check_close(tag<T>("matmul k 0"), ops::matmul(z({2, 4, 0}), z({0, 3})), Tensor<double>::zeros({2, 4, 3}));
  });
}

// matmul_into writes every element of a NaN-poisoned y, for one call and for an outer loop.
template <class T>
void check_poisoned() {
  Rng rng(7);
  for (const Pair& p : {Pair{{2, 1, 3, 4}, {5, 4, 2}}, Pair{{6, 10, 12}, {6, 12, 3}}}) {
    const std::string what = tag<T>(cutrain::detail::cat("matmul_into ", p.a, " x ", p.b));
    attempt(what, [&] {
      auto [a, ar] = random_pair<T>(p.a, rng, Layout::row_major);
      auto [b, br] = random_pair<T>(p.b, rng, Layout::row_major);
      const Tensor<double> ref = ops::matmul(ar, br);
      std::vector<std::int64_t> sa = ref.shape().dims(), sb = ref.shape().dims();
      sa.back() = p.a[p.a.rank() - 1];
      sb[sb.size() - 2] = p.a[p.a.rank() - 1];
      Tensor<T> y = poisoned<T>(ref.shape(), Layout::row_major);
      const Tensor<T> ae = cutrain::expand(a, Shape(sa)), be = cutrain::expand(b, Shape(sb));
      cuda::cublas::matmul_into(ae, be, Tensor<T>{}, 1.0f, 0.0f, y);
      check_close(what, y, ref, scaled(base_tolerance<T>(), p.a[p.a.rank() - 1]));
    });
  }
}

// fn throws E whose message names op.
template <class E, class Fn>
void require_throws(Fn&& fn, const std::string& op) {
  bool thrown = false;
  try {
    fn();
  } catch (const E& e) {
    thrown = true;
    INFO("message: " << e.what());
    CHECK(std::string(e.what()).find(op) != std::string::npos);
  }
  CHECK(thrown);
}

struct Tf32Scope {
  Tf32Scope() { cuda::math_options().allow_tf32 = true; }
  ~Tf32Scope() { cuda::math_options().allow_tf32 = false; }
};

}  // namespace

TEST_CASE("gpu matmul: forward and backward against the CPU, f32", "[gpu][matmul]") { check_all<float>(); }
TEST_CASE("gpu matmul: forward and backward against the CPU, tf32", "[gpu][matmul]") {
  Tf32Scope tf32;
  check_all<float>();
}
TEST_CASE("gpu matmul: forward and backward against the CPU, bf16", "[gpu][matmul]") { check_all<bfloat16>(); }
TEST_CASE("gpu matmul: forward and backward against the CPU, f16", "[gpu][matmul]") { check_all<cutrain::half>(); }

TEST_CASE("gpu gemm: alpha, beta, transposes and c, every dtype", "[gpu][matmul]") {
  check_gemm<float>();
  check_gemm<bfloat16>();
  check_gemm<cutrain::half>();
  check_poisoned<float>();
  check_poisoned<bfloat16>();
  check_poisoned<cutrain::half>();
}

TEST_CASE("gpu matmul: autograd on the device, errors", "[gpu][matmul]") {
  Rng rng(11);
  auto [a, ar] = random_pair<float>({2, 1, 3, 4}, rng, Layout::row_major);
  auto [b, br] = random_pair<float>({5, 4, 2}, rng, Layout::row_major);
  autograd::Var<float> av(a.view(), true), bv(cutrain::transpose(cutrain::transpose(b, -1, -2).contiguous(), -1, -2), true);
  autograd::Var<double> avr(ar.view(), true), bvr(br.view(), true);
  auto y = autograd::matmul(av, bv);
  auto yr = autograd::matmul(avr, bvr);
  auto [dy, dyr] = random_pair<float>(yr.shape(), rng, Layout::row_major);
  y.backward(dy);
  yr.backward(dyr);
  check_close("autograd y", y.value(), yr.value());
  check_close("autograd da", av.grad(), avr.grad(), scaled(1e-5, 10));
  check_close("autograd db", bv.grad(), bvr.grad(), scaled(1e-5, 10));
  CHECK(av.grad().device() == Device::cuda(0));

  const auto z = [](Shape s) { return Tensor<float>::zeros(s, {.device = Device::cuda(0)}); };
  require_throws<InvalidArgument>([&] { (void)ops::matmul(z({2, 3}), z({4, 5})); }, "cutrain::matmul: inner dims");
  require_throws<DeviceError>([&] { (void)ops::matmul(z({2, 3}), Tensor<float>::zeros({3, 5})); }, "cutrain::matmul");
  require_throws<NotImplemented>(
      [&] {
        (void)ops::matmul(Tensor<double>::zeros({2, 2}, {.device = Device::cuda(0)}),
                          Tensor<double>::zeros({2, 2}, {.device = Device::cuda(0)}));
      },
      "cutrain::matmul");
}

}  // namespace cutrain_test_matmul_gpu
