// matmul and gemm on the CPU: values against a naive triple loop (batched, broadcast, rank-1,
// transposed and strided views, empty dims), gemm's alpha, beta, transposes and broadcast C,
// f64 gradient checks of matmul through autograd (both operands, broadcast batch dims,
// transposed views), float against double, and bad input.
#include "bad_input.hpp"
#include "gradcheck.hpp"

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "cutrain/autograd/functions/matmul.hpp"
#include "cutrain/core/cast.hpp"
#include "cutrain/core/view.hpp"
#include "cutrain/ops/matmul.hpp"

namespace cutrain_test_matmul {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;
using autograd::Var;

namespace {

// torch.matmul by hand: promote, broadcast the batch dims, then a triple loop per batch.
std::vector<double> naive_matmul(const Tensor<double>& a_in, const Tensor<double>& b_in, Shape& out_shape) {
  const bool av = a_in.rank() == 1, bv = b_in.rank() == 1;
  std::vector<std::int64_t> as = a_in.shape().dims(), bs = b_in.shape().dims();
  if (av) as.insert(as.begin(), 1);
  if (bv) bs.push_back(1);
  const auto av_ = a_in.to_vector(), bv_ = b_in.to_vector();  // logical row-major order
  const std::size_t ra = as.size(), rb = bs.size(), r = std::max(ra, rb);
  const std::int64_t m = as[ra - 2], k = as[ra - 1], n = bs[rb - 1];
  std::vector<std::int64_t> batch(r - 2);
  for (std::size_t i = 0; i < r - 2; ++i) {
    const std::int64_t x = i + ra >= r ? as[i + ra - r] : 1, y = i + rb >= r ? bs[i + rb - r] : 1;
    batch[i] = std::max(x, y);
  }
  std::int64_t nb = 1;
  for (auto d : batch) nb *= d;
  std::vector<double> out(static_cast<std::size_t>(nb * m * n), 0.0);
  for (std::int64_t bi = 0; bi < nb; ++bi) {
    // Offsets (in matrices) of this batch index in a and b, broadcast dims pinned to 0.
    std::int64_t rem = bi, oa = 0, ob = 0, ma = 1, mb = 1;
    for (std::size_t i = r - 2; i-- > 0;) {
      const std::int64_t idx = rem % batch[i];
      rem /= batch[i];
      if (i + ra >= r) {
        const std::int64_t d = as[i + ra - r];
        oa += (d == 1 ? 0 : idx) * ma;
        ma *= d;
      }
      if (i + rb >= r) {
        const std::int64_t d = bs[i + rb - r];
        ob += (d == 1 ? 0 : idx) * mb;
        mb *= d;
      }
    }
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (std::int64_t p = 0; p < k; ++p)
          s += av_[static_cast<std::size_t>(oa * m * k + i * k + p)] * bv_[static_cast<std::size_t>(ob * k * n + p * n + j)];
        out[static_cast<std::size_t>(bi * m * n + i * n + j)] = s;
      }
  }
  std::vector<std::int64_t> os = batch;
  if (!av) os.push_back(m);
  if (!bv) os.push_back(n);
  out_shape = Shape(os);
  return out;
}

void check_matmul(const Tensor<double>& a, const Tensor<double>& b) {
  INFO("a " << a.describe() << " b " << b.describe());
  Shape want;
  const auto ref = naive_matmul(a, b, want);
  const Tensor<double> y = ops::matmul(a, b);
  CHECK(y.shape() == want);
  require_close(y, ref, 1e-12);
}

// The last two dims of a fresh [..., c, r] tensor swapped: a transposed view [..., r, c].
Tensor<double> transposed(const Shape& s, Rng& rng) {
  std::vector<std::int64_t> d = s.dims();
  std::swap(d[d.size() - 1], d[d.size() - 2]);
  return cutrain::transpose(random(Shape(d), rng), -1, -2);
}

// Every other element of the last dim of a tensor twice as wide: inner stride 2.
Tensor<double> strided(const Shape& s, Rng& rng) {
  std::vector<std::int64_t> d = s.dims();
  d.back() *= 2;
  return cutrain::slice(random(Shape(d), rng), -1, 0, slice_end, 2);
}

}  // namespace

TEST_CASE("matmul: values against a naive triple loop", "[matmul]") {
  Rng rng(20);
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{3, 4}, {4, 2}},       {{1, 1}, {1, 1}},          {{2, 3, 4}, {2, 4, 5}},    {{2, 1, 3, 4}, {5, 4, 2}},
      {{3, 4}, {2, 4, 5}},    {{2, 3, 4}, {4, 5}},       {{4}, {4, 2}},             {{2, 3, 4}, {4}},
      {{4}, {4}},             {{4}, {2, 4, 3}},          {{1, 3, 1, 2, 3}, {4, 3, 2}}, {{7, 13}, {13, 5}},
  };
  for (const auto& [sa, sb] : shapes) {
    check_matmul(random(sa, rng), random(sb, rng));
    if (sa.rank() >= 2) check_matmul(transposed(sa, rng), random(sb, rng));
    if (sb.rank() >= 2) check_matmul(random(sa, rng), transposed(sb, rng));
    if (sa.rank() >= 2 && sb.rank() >= 2) check_matmul(transposed(sa, rng), transposed(sb, rng));
    check_matmul(strided(sa, rng), strided(sb, rng));
  }
  // Broadcast through expand (stride 0 in a batch dim and in a matrix dim).
  check_matmul(cutrain::expand(random({1, 3, 4}, rng), {3, 3, 4}), random({3, 4, 2}, rng));
  check_matmul(cutrain::expand(random({3, 1}, rng), {3, 4}), random({4, 2}, rng));
}

TEST_CASE("matmul: hand-computed case, 1-d dot, empty dims", "[matmul]") {
  auto a = Tensor<double>::from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  auto b = Tensor<double>::from_vector({1, 0, 0, 1, 1, 1}, {3, 2});
  require_close(ops::matmul(a, b), {4, 5, 10, 11});
  auto v = Tensor<double>::from_vector({1, 2, 3}, {3});
  const auto dot = ops::matmul(v, v);
  CHECK(dot.shape() == Shape{});
  require_close(dot, {14});
  // k == 0: zeros; m == 0 or a zero batch: empty results.
  require_close(ops::matmul(Tensor<double>::zeros({2, 0}), Tensor<double>::zeros({0, 3})), {0, 0, 0, 0, 0, 0});
  CHECK(ops::matmul(Tensor<double>::zeros({0, 3}), Tensor<double>::zeros({3, 2})).shape() == Shape{0, 2});
  CHECK(ops::matmul(Tensor<double>::zeros({0, 2, 3}), Tensor<double>::zeros({3, 2})).shape() == Shape{0, 2, 2});
  // float agrees with double
  Rng rng(3);
  auto ad = random({2, 5, 7}, rng), bd = random({7, 3}, rng);
  const auto yf = ops::matmul(cast<float>(ad), cast<float>(bd));
  require_close(yf, ops::matmul(ad, bd).to_vector(), 1e-5);
}

TEST_CASE("gemm: alpha, beta, transposes, broadcast c", "[matmul]") {
  Rng rng(21);
  auto a = random({4, 3}, rng), b = random({5, 4}, rng), c = random({3, 5}, rng);
  // alpha a^T b^T + beta c
  Shape s;
  const auto ab = naive_matmul(cutrain::transpose(a, 0, 1), cutrain::transpose(b, 0, 1), s);
  const auto cv = c.to_vector();
  std::vector<double> want(ab.size());
  for (std::size_t i = 0; i < ab.size(); ++i) want[i] = 2.5 * ab[i] - 0.5 * cv[i];
  require_close(ops::gemm(a, b, c, 2.5, -0.5, true, true), want, 1e-12);
  // c broadcast from [n]; batched a
  auto ba = random({2, 3, 4}, rng), bb = random({4, 5}, rng), bias = random({5}, rng);
  const auto y = ops::gemm(ba, bb, bias, 1.0, 1.0);
  const auto bab = naive_matmul(ba, bb, s);
  const auto bv = bias.to_vector();
  for (std::size_t i = 0; i < bab.size(); ++i) want.resize(bab.size()), want[i] = bab[i] + bv[i % 5];
  require_close(y, want, 1e-12);
  // beta == 0 ignores c (even NaN) and c may be undefined
  auto nanc = Tensor<double>::full({3, 5}, std::numeric_limits<double>::quiet_NaN());
  const auto ref = naive_matmul(cutrain::transpose(a, 0, 1), cutrain::transpose(b, 0, 1), s);
  require_close(ops::gemm(a, b, nanc, 1.0, 0.0, true, true), ref, 1e-12);
  require_close(ops::gemm(a, b, Tensor<double>{}, 1.0, 0.0, true, true), ref, 1e-12);
  // k == 0: beta c
  auto c2 = random({2, 3}, rng);
  std::vector<double> half_c;
  for (double x : c2.to_vector()) half_c.push_back(0.5 * x);
  require_close(ops::gemm(Tensor<double>::zeros({2, 0}), Tensor<double>::zeros({0, 3}), c2, 1.0, 0.5), half_c, 1e-12);
}

namespace {
// d <r, matmul(a, b)> / da and / db through autograd against finite differences. make_a and
// make_b build the operands from the tensors gradcheck perturbs (a transposed view of them, say).
using Make = std::function<Tensor<double>(const Tensor<double>&)>;
void check_matmul_grad(const std::string& name, Tensor<double> a, Tensor<double> b, Rng& rng, const Make& make_a,
                       const Make& make_b) {
  Var<double> av(make_a(a), true), bv(make_b(b), true);
  Var<double> y = autograd::matmul(av, bv);
  const Tensor<double> r = random(y.shape(), rng);
  y.backward(r);
  REQUIRE(av.grad().defined());
  REQUIRE(bv.grad().defined());
  CHECK(av.grad().shape() == av.shape());
  CHECK(bv.grad().shape() == bv.shape());
  // The gradient of the base tensor is the gradient of the view, read back through the view.
  const auto base_grad = [](const Tensor<double>& base, const Make& make, const Tensor<double>& g) {
    Tensor<double> out = Tensor<double>::zeros(base.shape());
    Tensor<double> view = make(out);
    view.copy_from(g);
    return out;
  };
  const Tensor<double> ga = base_grad(a, make_a, av.grad()), gb = base_grad(b, make_b, bv.grad());
  gradcheck(name + " da", a, [&] { return ops::matmul(make_a(a), make_b(b)); }, ga, r);
  gradcheck(name + " db", b, [&] { return ops::matmul(make_a(a), make_b(b)); }, gb, r);
}
const Make same = [](const Tensor<double>& t) { return t.view(); };
const Make swap_last = [](const Tensor<double>& t) { return cutrain::transpose(t, -1, -2); };
}  // namespace

TEST_CASE("gradcheck: matmul, batched, broadcast, transposed views, rank 1", "[matmul][autograd]") {
  Rng rng(22);
  check_matmul_grad("rank-2", random({3, 4}, rng), random({4, 5}, rng), rng, same, same);
  check_matmul_grad("batched", random({2, 3, 4}, rng), random({2, 4, 5}, rng), rng, same, same);
  check_matmul_grad("broadcast [2,1,3,4]x[5,4,2]", random({2, 1, 3, 4}, rng), random({5, 4, 2}, rng), rng, same, same);
  check_matmul_grad("batched x 2-d", random({2, 3, 4}, rng), random({4, 5}, rng), rng, same, same);
  check_matmul_grad("2-d x batched", random({3, 4}, rng), random({2, 4, 5}, rng), rng, same, same);
  check_matmul_grad("transposed a", random({4, 3}, rng), random({4, 5}, rng), rng, swap_last, same);
  check_matmul_grad("transposed both, batched", random({2, 4, 3}, rng), random({2, 5, 4}, rng), rng, swap_last,
                    swap_last);
  check_matmul_grad("transposed a, batched x 2-d", random({2, 4, 3}, rng), random({4, 5}, rng), rng, swap_last, same);
  check_matmul_grad("vector x batched", random({4}, rng), random({2, 4, 3}, rng), rng, same, same);
  check_matmul_grad("batched x vector", random({2, 3, 4}, rng), random({4}, rng), rng, same, same);
  check_matmul_grad("dot", random({4}, rng), random({4}, rng), rng, same, same);
}

TEST_CASE("matmul_backward: only what is asked for", "[matmul]") {
  Rng rng(23);
  auto a = random({2, 3, 4}, rng), b = random({4, 5}, rng), dy = random({2, 3, 5}, rng);
  auto g = ops::matmul_backward(a, b, dy, true, false);
  CHECK(g.da.defined());
  CHECK_FALSE(g.db.defined());
  g = ops::matmul_backward(a, b, dy, false, true);
  CHECK_FALSE(g.da.defined());
  CHECK(g.db.shape() == Shape{4, 5});
  // db = sum over the batch of a[i]^T dy[i]
  const auto full = ops::matmul(cutrain::transpose(a, -1, -2), dy);
  const auto fv = full.to_vector();
  std::vector<double> want(20, 0.0);
  for (std::size_t i = 0; i < fv.size(); ++i) want[i % 20] += fv[i];
  require_close(g.db, want, 1e-12);
}

TEST_CASE("bad input: matmul and gemm", "[matmul][bad_input]") {
  using D = Tensor<double>;
  const auto z = [](Shape s) { return D::zeros(s); };
  run_cases({
      bad<InvalidArgument>("inner dims", "matmul", {"inner dims", "[2,3]", "[4,5]"},
                           [&] { (void)ops::matmul(z({2, 3}), z({4, 5})); }),
      bad<InvalidArgument>("inner dims, 1-d b", "matmul", {"inner dims", "[2,3]", "[4]"},
                           [&] { (void)ops::matmul(z({2, 3}), z({4})); }),
      bad<InvalidArgument>("rank 0", "matmul", {"rank >= 1", "[]"}, [&] { (void)ops::matmul(z({}), z({3})); }),
      bad<InvalidArgument>("batch dims", "matmul", {"do not broadcast", "[2,3,4]", "[3,4,5]"},
                           [&] { (void)ops::matmul(z({2, 3, 4}), z({3, 4, 5})); }),
      bad<InvalidArgument>("undefined a", "matmul", {"a is an empty"}, [&] { (void)ops::matmul(D{}, z({3})); }),
      bad<InvalidArgument>("undefined b", "matmul", {"b is an empty"}, [&] { (void)ops::matmul(z({3}), D{}); }),
      bad<InvalidArgument>("gemm 1-d", "gemm", {"rank >= 2", "[3]"},
                           [&] { (void)ops::gemm(z({3}), z({3, 2}), D{}); }),
      bad<InvalidArgument>("gemm inner dims after transpose", "gemm", {"inner dims", "[2,3]", "[3,2]"},
                           [&] { (void)ops::gemm(z({2, 3}), z({3, 2}), D{}, 1.0, 0.0, true, false); }),
      bad<InvalidArgument>("gemm beta without c", "gemm", {"beta", "undefined"},
                           [&] { (void)ops::gemm(z({2, 3}), z({3, 2}), D{}, 1.0, 1.0); }),
      bad<InvalidArgument>("gemm c shape", "gemm", {"does not broadcast", "[3,3]", "[2,2]"},
                           [&] { (void)ops::gemm(z({2, 3}), z({3, 2}), z({3, 3}), 1.0, 1.0); }),
      bad<InvalidArgument>("backward dy shape", "matmul_backward", {"dy", "[2,2]", "[2,3]"},
                           [&] { (void)ops::matmul_backward(z({2, 3}), z({3, 2}), z({2, 3})); }),
      bad<InvalidArgument>("autograd undefined", "autograd::matmul", {"b is an undefined"},
                           [&] { (void)autograd::matmul(Var<double>(z({2, 2})), Var<double>{}); }),
  });
  // Half-precision matmul is a GPU dtype: on the CPU it says so.
  CUTRAIN_REQUIRE_THROWS_OP(ops::matmul(Tensor<half>::zeros({2, 2}), Tensor<half>::zeros({2, 2})), NotImplemented,
                            "matmul");
}

}  // namespace cutrain_test_matmul
