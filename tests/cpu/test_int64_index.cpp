// int64 indices and labels (PyTorch's and NumPy's): the i64 dtype, index_select and gather with
// int64 indices and with wrap_negative, Embedding, cross_entropy and linear_cross_entropy with
// int64 labels. int64 results must equal int32 results on the same random data, bit for bit.
#include <catch2/catch.hpp>

#include "gradcheck.hpp"

#include <cstdint>
#include <string>
#include <vector>

#include "cutrain/autograd.hpp"
#include "cutrain/core/any_tensor.hpp"
#include "cutrain/core/view.hpp"
#include "cutrain/nn/embedding.hpp"
#include "cutrain/nn/loss.hpp"
#include "cutrain/nn/transformer.hpp"
#include "cutrain/ops/cross_entropy.hpp"
#include "cutrain/ops/index.hpp"
#include "cutrain/ops/linear_cross_entropy.hpp"

using namespace cutrain;
using cutrain::autograd::Var;
using cutrain::test::gradcheck;

namespace {

template <class I>
Tensor<I> index_tensor(const std::vector<std::int64_t>& v, const Shape& s) {
  std::vector<I> out(v.begin(), v.end());
  return Tensor<I>::from_vector(out, s);
}

// Random values in [lo, hi), as int64.
std::vector<std::int64_t> random_values(std::int64_t n, std::int64_t lo, std::int64_t hi, Rng& rng) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(n));
  for (auto& e : v) e = lo + static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(hi - lo)));
  return v;
}

template <class T>
bool same(const Tensor<T>& a, const Tensor<T>& b) {
  return a.shape() == b.shape() && a.to_vector() == b.to_vector();
}

// The message of the InvalidArgument that f throws ("" when none).
template <class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& msg, std::initializer_list<const char*> parts) {
  for (const char* p : parts)
    if (msg.find(p) == std::string::npos) return false;
  return true;
}

}  // namespace

TEST_CASE("i64: a dtype like the others", "[dtype][int64]") {
  CHECK(to_string(DType::i64) == "i64");
  CHECK(dtype_size(DType::i64) == 8);
  CHECK(dtype_of<std::int64_t> == DType::i64);
  const std::int64_t big = std::int64_t{1} << 40;
  const auto t = Tensor<std::int64_t>::from_vector({big, -3, 7}, Shape{3});
  CHECK(t.dtype() == DType::i64);
  CHECK(t.describe().find("i64") != std::string::npos);
  CHECK(t.to_vector() == std::vector<std::int64_t>{big, -3, 7});
  const Tensor<std::int64_t> c = t.contiguous();
  CHECK(same(c, t));
  const AnyTensor any(t.view());
  CHECK(any.dtype() == DType::i64);
  CHECK(any.holds<std::int64_t>());
  CHECK(any.as<std::int32_t>().to_vector() == std::vector<std::int32_t>{static_cast<std::int32_t>(big), -3, 7});
  CHECK(visit_dtype(DType::i64, []<class U>(std::type_identity<U>) { return sizeof(U); }) == 8);
}

TEST_CASE("index_select and gather: int64 indices equal int32 ones, forward and backward", "[index][int64]") {
  Rng rng(501);
  const auto full = Tensor<double>::uniform({5, 4, 6}, rng, -1, 1);
  const auto x = transpose(full, 0, 2);  // [6, 4, 5], strided
  for (int d = 0; d < 3; ++d) {
    INFO("dim " << d);
    const auto v = random_values(9, 0, x.dim(d), rng);
    const auto i32 = index_tensor<std::int32_t>(v, Shape{9});
    const auto i64 = index_tensor<std::int64_t>(v, Shape{9});
    const Tensor<double> y = ops::index_select(x, d, i32);
    CHECK(same(ops::index_select(x, d, i64), y));
    const auto dy = Tensor<double>::uniform(y.shape(), rng, -1, 1);
    CHECK(same(ops::index_select_backward(dy, x.shape(), d, i64), ops::index_select_backward(dy, x.shape(), d, i32)));

    Shape is = x.shape();
    is[d] = 3;
    const auto gv = random_values(is.numel(), 0, x.dim(d), rng);
    const auto g32 = index_tensor<std::int32_t>(gv, is);
    const auto g64 = index_tensor<std::int64_t>(gv, is);
    const Tensor<double> g = ops::gather(x, d, g32);
    CHECK(same(ops::gather(x, d, g64), g));
    const auto dg = Tensor<double>::uniform(g.shape(), rng, -1, 1);
    CHECK(same(ops::gather_backward(dg, x.shape(), d, g64), ops::gather_backward(dg, x.shape(), d, g32)));
  }
  // A strided int64 index (every other element) and f32 data.
  const auto xf = Tensor<float>::uniform({7, 3}, rng, -1, 1);
  const auto v = random_values(10, 0, 7, rng);
  const auto wide = index_tensor<std::int64_t>(v, Shape{10});
  const auto every_other = wide.as_strided(Shape{5}, Strides{2}, 0);
  std::vector<std::int64_t> picked;
  for (std::size_t k = 0; k < 10; k += 2) picked.push_back(v[k]);
  CHECK(same(ops::index_select(xf, 0, every_other), ops::index_select(xf, 0, index_tensor<std::int32_t>(picked, Shape{5}))));
  // Empty.
  CHECK(ops::index_select(xf, 0, Tensor<std::int64_t>(Shape{0})).shape() == Shape{0, 3});
}

TEST_CASE("index_select and gather: wrap_negative counts from the end, as NumPy's take", "[index][int64]") {
  Rng rng(502);
  const auto x = Tensor<double>::uniform({6, 5}, rng, -1, 1);
  const ops::IndexOptions wrap{.wrap_negative = true};
  for (int d = 0; d < 2; ++d) {
    const std::int64_t n = x.dim(d);
    const auto v = random_values(8, -n, n, rng);
    std::vector<std::int64_t> wrapped(v);
    for (auto& e : wrapped) e = e < 0 ? e + n : e;
    const auto want = ops::index_select(x, d, index_tensor<std::int32_t>(wrapped, Shape{8}));
    CHECK(same(ops::index_select(x, d, index_tensor<std::int64_t>(v, Shape{8}), wrap), want));
    CHECK(same(ops::index_select(x, d, index_tensor<std::int32_t>(v, Shape{8}), wrap), want));
    const auto dy = Tensor<double>::uniform(want.shape(), rng, -1, 1);
    CHECK(same(ops::index_select_backward(dy, x.shape(), d, index_tensor<std::int64_t>(v, Shape{8}), wrap),
               ops::index_select_backward(dy, x.shape(), d, index_tensor<std::int32_t>(wrapped, Shape{8}))));
    Shape gs = x.shape();
    gs[d] = 4;
    const auto gv = random_values(gs.numel(), -n, n, rng);
    std::vector<std::int64_t> gw(gv);
    for (auto& e : gw) e = e < 0 ? e + n : e;
    CHECK(same(ops::gather(x, d, index_tensor<std::int64_t>(gv, gs), wrap),
               ops::gather(x, d, index_tensor<std::int32_t>(gw, gs))));
    const auto dg = Tensor<double>::uniform(gs, rng, -1, 1);
    CHECK(same(ops::gather_backward(dg, x.shape(), d, index_tensor<std::int32_t>(gv, gs), wrap),
               ops::gather_backward(dg, x.shape(), d, index_tensor<std::int32_t>(gw, gs))));
  }
}

TEST_CASE("index ops: bad int64 and negative indices name the op, the value, its position and the bound",
          "[index][int64]") {
  const auto x = Tensor<float>::zeros(Shape{4, 3});
  const std::int64_t big = std::int64_t{1} << 40;
  std::string m = message_of([&] { ops::index_select(x, 0, index_tensor<std::int64_t>({0, big, 1}, Shape{3})); });
  INFO(m);
  CHECK(has(m, {"index_select", "1099511627776", "position 1", "size 4", "[0, 4)"}));
  // PyTorch refuses negative indices: so does cutrain unless asked, and says how to ask.
  m = message_of([&] { ops::gather(x, 1, index_tensor<std::int64_t>({0, 1, 2, 0, -1, 0}, Shape{2, 3})); });
  CHECK(has(m, {"gather", "-1", "position 4", "size 3", "wrap_negative"}));
  m = message_of([&] { ops::index_select(x, 1, index_tensor<std::int32_t>({-1}, Shape{1})); });
  CHECK(has(m, {"index_select", "-1", "position 0", "size 3"}));
  // With wrap_negative the range is [-size, size).
  m = message_of([&] {
    ops::index_select(x, 0, index_tensor<std::int64_t>({-4, -5}, Shape{2}), {.wrap_negative = true});
  });
  CHECK(has(m, {"index_select", "-5", "position 1", "[-4, 4)"}));
  m = message_of([&] {
    ops::gather_backward(x, Shape{4, 3}, 0, index_tensor<std::int64_t>(std::vector<std::int64_t>(12, 4), Shape{4, 3}));
  });
  CHECK(has(m, {"gather_backward", "4", "12 of the 12"}));
  m = message_of([&] {
    ops::index_select_backward(x, Shape{3, 3}, 0, index_tensor<std::int64_t>({0, 1, 2, -big}, Shape{4}));
  });
  CHECK(has(m, {"index_select_backward", "-1099511627776", "position 3"}));
  CHECK(message_of([&] { ops::index_select(x, 0, index_tensor<std::int64_t>({0, 1}, Shape{1, 2})); }).find("1-d") !=
        std::string::npos);
}

TEST_CASE("autograd index_select and gather: int64 and wrapped gradients (f64 gradcheck)", "[index][int64][gradcheck]") {
  Rng rng(503);
  auto x = Tensor<double>::uniform({5, 4}, rng, -1, 1);
  const ops::IndexOptions wrap{.wrap_negative = true};
  const auto iv = random_values(7, -5, 5, rng);
  const auto idx = index_tensor<std::int64_t>(iv, Shape{7});
  const auto gv = random_values(12, -4, 4, rng);
  const auto gidx = index_tensor<std::int64_t>(gv, Shape{3, 4});

  const auto check = [&](const std::string& name, const std::function<Var<double>(const Var<double>&)>& f) {
    const auto probe = f(Var<double>(x.view()));
    const auto r = Tensor<double>::uniform(probe.shape(), rng, -1, 1);
    Var<double> xv = autograd::parameter(x.contiguous());
    autograd::sum(autograd::multiply(f(xv), Var<double>(r.view()))).backward();
    const auto res = gradcheck(name, x, [&] { return f(Var<double>(x.view())).value().contiguous(); }, xv.grad(), r);
    CHECK(res.max_abs_err < 1e-6);
  };
  check("index_select int64 wrapped", [&](const Var<double>& v) { return autograd::index_select(v, 0, idx, wrap); });
  check("gather int64 wrapped", [&](const Var<double>& v) { return autograd::gather(v, 1, gidx, wrap); });

  // int64 and int32 give the same gradient.
  std::vector<std::int64_t> pos = random_values(9, 0, 5, rng);
  const auto i64 = index_tensor<std::int64_t>(pos, Shape{9});
  const auto i32 = index_tensor<std::int32_t>(pos, Shape{9});
  Var<double> a = autograd::parameter(x.contiguous()), b = autograd::parameter(x.contiguous());
  autograd::sum(autograd::index_select(a, 0, i64)).backward();
  autograd::sum(autograd::index_select(b, 0, i32)).backward();
  CHECK(same(a.grad(), b.grad()));
}

TEST_CASE("nn::Embedding: int64 tokens equal int32 ones, forward and backward", "[embedding][int64]") {
  Rng rng(504);
  nn::Embedding<float> e({.num = 11, .dim = 6, .seed = 3});
  const auto v = random_values(15, 0, 11, rng);
  const auto t64 = index_tensor<std::int64_t>(v, Shape{3, 5});
  const auto t32 = index_tensor<std::int32_t>(v, Shape{3, 5});
  const Var<float> y64 = e(t64);
  CHECK(y64.shape() == Shape{3, 5, 6});
  const Var<float> y32 = e(t32);
  CHECK(same(y64.value(), y32.value()));
  const auto r = Tensor<float>::uniform(y64.shape(), rng, -1, 1);
  autograd::sum(autograd::multiply(y64, Var<float>(r.view()))).backward();
  const Tensor<float> g64 = e.weight.grad().contiguous();
  e.weight.zero_grad();
  autograd::sum(autograd::multiply(y32, Var<float>(r.view()))).backward();
  CHECK(same(g64, e.weight.grad().contiguous()));
  const std::string m = message_of([&] { (void)e(index_tensor<std::int64_t>({1, 11}, Shape{2})); });
  CHECK(has(m, {"nn::Embedding", "index_select", "11", "position 1", "[0, 11)"}));
}

TEST_CASE("cross_entropy: int64 labels equal int32 ones; a label past int32 is named", "[cross_entropy][int64]") {
  Rng rng(505);
  const auto logits = Tensor<double>::uniform({6, 4}, rng, -2, 2);
  const auto v = random_values(6, 0, 4, rng);
  const auto l64 = index_tensor<std::int64_t>(v, Shape{6});
  const auto l32 = index_tensor<std::int32_t>(v, Shape{6});
  const CrossEntropyParams p{.label_smoothing = 0.1};
  CHECK(same(ops::cross_entropy_forward(logits, l64, p), ops::cross_entropy_forward(logits, l32, p)));
  CHECK(same(ops::cross_entropy_backward(logits, l64, 0.5, p), ops::cross_entropy_backward(logits, l32, 0.5, p)));
  Var<double> a = autograd::parameter(logits.contiguous()), b = autograd::parameter(logits.contiguous());
  const Var<double> la = nn::cross_entropy(a, l64), lb = nn::cross_entropy(b, l32);
  CHECK(same(la.value(), lb.value()));
  la.backward();
  lb.backward();
  CHECK(same(a.grad(), b.grad()));

  const std::int64_t big = std::int64_t{1} << 33;
  std::string m = message_of([&] { (void)ops::cross_entropy_forward(logits, index_tensor<std::int64_t>({0, 1, 2, big, 0, 1}, Shape{6})); });
  CHECK(has(m, {"cross_entropy_forward", "8589934592", "index 3", "does not fit int32"}));
  m = message_of([&] { (void)ops::cross_entropy_forward(logits, index_tensor<std::int64_t>({0, 1, 2, 4, 0, 1}, Shape{6})); });
  CHECK(has(m, {"cross_entropy_forward", "label 4", "[0, 4)"}));
  m = message_of([&] { (void)ops::cross_entropy_forward(logits, index_tensor<std::int64_t>({0, 1, -1, 0, 0, 1}, Shape{6})); });
  CHECK(has(m, {"cross_entropy_forward", "label -1"}));
}

TEST_CASE("linear_cross_entropy and nn::GPT::loss: int64 labels with ignore_index equal int32 ones",
          "[linear_cross_entropy][int64]") {
  Rng rng(506);
  const auto x = Tensor<double>::uniform({5, 3}, rng, -1, 1);
  const auto w = Tensor<double>::uniform({7, 3}, rng, -1, 1);
  const std::vector<std::int64_t> v{3, -100, 6, 0, -100};
  const auto l64 = index_tensor<std::int64_t>(v, Shape{5});
  const auto l32 = index_tensor<std::int32_t>(v, Shape{5});
  const auto r64 = ops::linear_cross_entropy(x, w, l64, {}, true);
  const auto r32 = ops::linear_cross_entropy(x, w, l32, {}, true);
  CHECK(same(r64.loss, r32.loss));
  CHECK(same(r64.dx, r32.dx));
  CHECK(same(r64.dw, r32.dw));
  Var<double> xa = autograd::parameter(x.contiguous()), wa = autograd::parameter(w.contiguous());
  autograd::linear_cross_entropy(xa, wa, l64).backward();
  CHECK(same(xa.grad(), r32.dx));
  // A label past int32 is named; ignore_index keeps its meaning for every other value.
  const std::string m = message_of([&] {
    (void)ops::linear_cross_entropy(x, w, index_tensor<std::int64_t>({0, 1, std::int64_t{1} << 31, 0, 0}, Shape{5}));
  });
  CHECK(has(m, {"linear_cross_entropy", "2147483648", "index 2"}));

  nn::GPT<double> gpt({.vocab = 7, .context = 6, .dim = 8, .heads = 2, .layers = 1, .seed = 5});
  const auto tv = random_values(8, 0, 7, rng);
  auto yv = random_values(8, 0, 7, rng);
  yv[5] = -100;
  const Var<double> a = gpt.loss(index_tensor<std::int64_t>(tv, Shape{2, 4}), index_tensor<std::int64_t>(yv, Shape{2, 4}));
  const Var<double> b = gpt.loss(index_tensor<std::int32_t>(tv, Shape{2, 4}), index_tensor<std::int32_t>(yv, Shape{2, 4}));
  CHECK(same(a.value(), b.value()));
  CHECK(same(gpt(index_tensor<std::int64_t>(tv, Shape{2, 4})).value(), gpt(index_tensor<std::int32_t>(tv, Shape{2, 4})).value()));
}
