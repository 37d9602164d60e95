// Shape ops on the GPU against the CPU backend in f64 on the same (rounded) random data, in f32,
// bf16 and f16: concat, stack and split (exact: they copy), index_select and gather (forward
// exact, backward within the dtype's tolerance: sums in f32, rounded once), contiguous and
// strided (transposed, step-sliced) inputs and indices, repeated indices; index values checked
// on the device; autograd on the device.
#include "parity.hpp"

#include <cstdint>
#include <string>
#include <vector>

#include "cutrain/autograd.hpp"
#include "cutrain/core/view.hpp"
#include "cutrain/cuda/kernels/index.hpp"
#include "cutrain/ops/elementwise.hpp"
#include "cutrain/ops/index.hpp"
#include "cutrain/ops/shape_ops.hpp"

namespace cutrain_test_shape_ops_gpu {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;

namespace {
const Device gpu = Device::cuda(0);

// A device tensor of shape s and its f64 host copy; strided: a transposed view (dims 0 and
// last swapped) of a tensor laid out the other way, or a step-2 slice for 1-d.
template <class T>
struct Pair {
  Tensor<T> d;
  Tensor<double> r;
};

template <class T>
Pair<T> make(const Shape& s, Rng& rng, bool strided) {
  if (!strided) {
    auto [t, r] = random_pair<T>(s, rng, Layout::row_major);
    return {std::move(t), std::move(r)};
  }
  if (s.rank() == 1) {
    auto [t, r] = random_pair<T>({2 * s[0]}, rng, Layout::row_major);
    return {slice(t, 0, 0, slice_end, 2), slice(r, 0, 0, slice_end, 2)};
  }
  std::vector<std::int64_t> dims = s.dims();
  std::swap(dims.front(), dims.back());
  auto [t, r] = random_pair<T>(Shape(dims), rng, Layout::row_major);
  const int last = s.rank() - 1;
  return {transpose(t, 0, last), transpose(r, 0, last)};
}

Tensor<std::int32_t> random_index(const Shape& s, std::int64_t n, Rng& rng) {
  std::vector<std::int32_t> v(static_cast<std::size_t>(s.numel()));
  for (auto& e : v) e = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(n)));
  return Tensor<std::int32_t>::from_vector(v, s);
}

template <class T>
void check_join(const std::string& tag, Rng& rng) {
  const std::vector<Shape> shapes{{5}, {3, 4}, {2, 3, 5}, {2, 1, 3, 4}};
  for (const Shape& s : shapes) {
    for (int dim = 0; dim < s.rank(); ++dim) {
      const std::string name = tag + " " + s.str() + " dim " + std::to_string(dim);
      INFO(name);
      Shape s2 = s;
      s2[dim] += 2;
      const Pair<T> a = make<T>(s, rng, false), b = make<T>(s2, rng, true), c = make<T>(s, rng, true);
      const Tensor<T> y = ops::concat({&a.d, &b.d, &c.d}, dim);
      CHECK(y.device() == gpu);
      check_close(name + " concat", y, ops::concat({&a.r, &b.r, &c.r}, dim), 0.0);
      check_close(name + " stack", ops::stack({&a.d, &c.d, &a.d}, dim), ops::stack({&a.r, &c.r, &a.r}, dim), 0.0);
      check_close(name + " stack last", ops::stack({&a.d, &c.d}, -1), ops::stack({&a.r, &c.r}, -1), 0.0);
      const auto pieces = ops::split(y, {s[dim], s2[dim], s[dim]}, dim);
      REQUIRE(pieces.size() == 3);
      check_close(name + " split 1", pieces[1], b.r, 0.0);
      check_close(name + " split 2", pieces[2].contiguous(), c.r, 0.0);
      check_close(name + " concat of chunks", ops::concat(ops::chunk(b.d, 2, dim), dim), b.r, 0.0);
    }
  }
}

template <class T>
void check_index(const std::string& tag, Rng& rng) {
  const std::vector<Shape> shapes{{7}, {6, 5}, {4, 3, 5}, {2, 3, 4, 5}};
  for (const Shape& s : shapes) {
    for (int dim = 0; dim < s.rank(); ++dim) {
      for (bool strided : {false, true}) {
        const std::string name = tag + " " + s.str() + " dim " + std::to_string(dim) + (strided ? " strided" : "");
        INFO(name);
        const Pair<T> x = make<T>(s, rng, strided);
        // index_select: 9 positions (repeats), index strided as a step-2 slice when strided.
        const auto idx_host = random_index({18}, s[dim], rng);
        const auto idx_r = strided ? slice(idx_host, 0, 0, slice_end, 2) : slice(idx_host, 0, 0, 9);
        const auto idx_dev = idx_host.to(gpu);
        const auto idx_d = strided ? slice(idx_dev, 0, 0, slice_end, 2) : slice(idx_dev, 0, 0, 9);
        const Tensor<T> y = ops::index_select(x.d, dim, idx_d);
        const Tensor<double> yr = ops::index_select(x.r, dim, idx_r);
        check_close(name + " index_select", y, yr, 0.0);
        const Pair<T> dy = make<T>(yr.shape(), rng, strided);
        check_close(name + " index_select_backward", ops::index_select_backward(dy.d, s, dim, idx_d),
                    ops::index_select_backward(dy.r, s, dim, idx_r));
        // gather: 6 along dim, one smaller in another dim (when it has more than 1).
        Shape gs = s;
        gs[dim] = 6;
        const int other = (dim + 1) % s.rank();
        if (other != dim && gs[other] > 1) gs[other] -= 1;
        const auto gi_r = random_index(gs, s[dim], rng);
        Tensor<std::int32_t> gi_host = gi_r.view();
        Tensor<std::int32_t> gi_dev;
        if (strided && gs.rank() >= 2) {
          // The same values through a transposed device tensor.
          const int last = gs.rank() - 1;
          gi_dev = transpose(transpose(gi_r, 0, last).contiguous().to(gpu), 0, last);
        } else {
          gi_dev = gi_r.to(gpu);
        }
        const Tensor<T> g = ops::gather(x.d, dim, gi_dev);
        const Tensor<double> gr = ops::gather(x.r, dim, gi_host);
        check_close(name + " gather", g, gr, 0.0);
        const Pair<T> dg = make<T>(gs, rng, strided);
        check_close(name + " gather_backward", ops::gather_backward(dg.d, s, dim, gi_dev),
                    ops::gather_backward(dg.r, s, dim, gi_host));
      }
    }
  }
}
}  // namespace

TEST_CASE("gpu shape ops: concat, stack, split, chunk against the CPU, f32", "[gpu][shape_ops]") {
  Rng rng(41);
  check_join<float>("f32", rng);
}
TEST_CASE("gpu shape ops: concat, stack, split, chunk against the CPU, bf16", "[gpu][shape_ops]") {
  Rng rng(42);
  check_join<bfloat16>("bf16", rng);
}
TEST_CASE("gpu shape ops: concat, stack, split, chunk against the CPU, f16", "[gpu][shape_ops]") {
  Rng rng(43);
  check_join<cutrain::half>("f16", rng);
}

TEST_CASE("gpu shape ops: index_select and gather against the CPU, f32", "[gpu][shape_ops][index]") {
  Rng rng(44);
  check_index<float>("f32", rng);
}
TEST_CASE("gpu shape ops: index_select and gather against the CPU, bf16", "[gpu][shape_ops][index]") {
  Rng rng(45);
  check_index<bfloat16>("bf16", rng);
}
TEST_CASE("gpu shape ops: index_select and gather against the CPU, f16", "[gpu][shape_ops][index]") {
  Rng rng(46);
  check_index<cutrain::half>("f16", rng);
}

TEST_CASE("gpu shape ops: an embedding-sized lookup and its backward", "[gpu][shape_ops][index]") {
  Rng rng(47);
  auto [w, wr] = random_pair<float>({1000, 64}, rng, Layout::row_major);
  const auto tokens = random_index({4096}, 1000, rng);
  const auto tokens_d = tokens.to(gpu);
  check_close("embedding forward", ops::index_select(w, 0, tokens_d), ops::index_select(wr, 0, tokens), 0.0);
  auto [dy, dyr] = random_pair<float>({4096, 64}, rng, Layout::row_major);
  const Tensor<float> dw = ops::index_select_backward(dy, w.shape(), 0, tokens_d);
  check_close("embedding backward", dw, ops::index_select_backward(dyr, wr.shape(), 0, tokens));
  // Deterministic: a second run gives the same bits.
  CHECK(ops::index_select_backward(dy, w.shape(), 0, tokens_d).to_vector() == dw.to_vector());
  // Rows longer than one tile of the block-per-row backward (512, then 1024 elements), a
  // character vocabulary with many repeats, and a middle dim indexed (outer 3 x inner 700).
  for (const Shape& table : {Shape{37, 1300}, Shape{114, 384}, Shape{3, 9, 700}}) {
    const int dim = table.rank() - 2;
    INFO("table " << table);
    const auto idx = random_index({2500}, table[dim], rng);
    Shape ys = table;
    ys[dim] = 2500;
    auto [g, gr] = random_pair<bfloat16>(ys, rng, Layout::row_major);
    check_close("embedding backward", ops::index_select_backward(g, table, dim, idx.to(gpu)),
                ops::index_select_backward(gr, table, dim, idx));
  }
  // char_gpt's lookup: 16384 tokens over 114 rows, a fifth of them one index (a space): the index
  // is cut into chunks whose sums a second pass adds in order; the bits repeat run to run.
  std::vector<std::int32_t> text(16384);
  for (auto& t : text) t = rng.below(5) == 0 ? 3 : static_cast<std::int32_t>(rng.below(114));
  const auto chars = Tensor<std::int32_t>::from_vector(text, {16384});
  const auto chars_d = chars.to(gpu);
  auto [g, gr] = random_pair<bfloat16>({16384, 384}, rng, Layout::row_major);
  const Tensor<bfloat16> dw2 = ops::index_select_backward(g, Shape{114, 384}, 0, chars_d);
  check_close("char embedding backward", dw2, ops::index_select_backward(gr, Shape{114, 384}, 0, chars));
  CHECK(ops::index_select_backward(g, Shape{114, 384}, 0, chars_d).to_vector() == dw2.to_vector());
}

TEST_CASE("gpu shape ops: GPT-2's embedding backward (50257 rows) against the CPU, sorted by row", "[gpu][shape_ops][index]") {
  // 16384 tokens over 50257 rows: a fifth of them one token (3000+ positions: the row that walks
  // the index), one in 50 another (about 330: sorted in shared memory), the rest spread out.
  Rng rng(48);
  std::vector<std::int32_t> tok(16384);
  for (auto& t : tok) {
    const auto u = rng.below(50);
    t = u < 10 ? 50256 : u == 10 ? 17 : static_cast<std::int32_t>(rng.below(50257));
  }
  const auto tokens = Tensor<std::int32_t>::from_vector(tok, {16384});
  const auto tokens_d = tokens.to(gpu);
  auto [g, gr] = random_pair<float>({16384, 40}, rng, Layout::row_major);
  const Tensor<float> dw = ops::index_select_backward(g, Shape{50257, 40}, 0, tokens_d);
  check_close("embedding backward f32", dw, ops::index_select_backward(gr, Shape{50257, 40}, 0, tokens), 1e-4);
  CHECK(ops::index_select_backward(g, Shape{50257, 40}, 0, tokens_d).to_vector() == dw.to_vector());
  auto [h, hr] = random_pair<bfloat16>({16384, 72}, rng, Layout::row_major);
  const Tensor<bfloat16> dh = ops::index_select_backward(h, Shape{50257, 72}, 0, tokens_d);
  check_close("embedding backward bf16", dh, ops::index_select_backward(hr, Shape{50257, 72}, 0, tokens));
  CHECK(ops::index_select_backward(h, Shape{50257, 72}, 0, tokens_d).to_vector() == dh.to_vector());
}

namespace {
// cuda::kernels::embedding against index_select and the broadcast add on the CPU: C = 16 takes
// the 16-byte kernel in every dtype, C = 10 the scalar one; a token out of range gives NaNs.
template <class T>
void run_embedding(std::int64_t c, bool with_pos) {
  const std::string tag = cutrain::detail::cat("embedding ", dtype_of<T>, " C ", c, with_pos ? " + pos" : "");
  Rng rng(std::hash<std::string>{}(tag));
  auto [table, tr] = random_pair<T>(Shape{7, c}, rng, Layout::row_major);
  auto [pos, pr] = random_pair<T>(Shape{3, c}, rng, Layout::row_major);
  std::vector<std::int32_t> ids(12);
  for (auto& v : ids) v = static_cast<std::int32_t>(rng.uniform() * 7) % 7;
  const auto idx = Tensor<std::int32_t>::from_vector(ids, {12});
  Tensor<T> y(Shape{12, c}, {.device = gpu});
  cuda::kernels::embedding(table, idx.to(gpu), with_pos ? pos.view() : Tensor<T>(), y);
  auto want = ops::index_select(tr, 0, idx);
  if (with_pos) want = ops::add(want.reshape({4, 3, c}), pr).reshape({12, c});
  check_close(tag, y, cast<double>(cast<T>(want)), 0.0);  // one rounding of an f32 sum, as the CPU's
  ids[5] = 7;
  cuda::kernels::embedding(table, Tensor<std::int32_t>::from_vector(ids, {12}).to(gpu), with_pos ? pos.view() : Tensor<T>(), y);
  const auto host = cast<double>(y.to(Device::cpu()));
  for (std::int64_t k = 0; k < 12 * c; ++k) CHECK(std::isnan(host.data()[k]) == (k / c == 5));
}
}  // namespace

TEST_CASE("gpu shape ops: the embedding kernel matches a lookup and a position add", "[gpu][shape_ops][index]") {
  for (const std::int64_t c : {16, 10})
    for (const bool p : {false, true}) {
      run_embedding<float>(c, p);
      run_embedding<bfloat16>(c, p);
      run_embedding<cutrain::half>(c, p);
    }
  Tensor<float> y(Shape{2, 4}, {.device = gpu});
  const auto table = Tensor<float>::zeros({3, 4}, {.device = gpu});
  const auto idx = Tensor<std::int32_t>::from_vector({0, 1}, {2}).to(gpu);
  CHECK_THROWS_AS(cuda::kernels::embedding(table, idx, Tensor<float>::zeros({2, 5}, {.device = gpu}), y), InvalidArgument);
  auto narrow = y.slice(1, 0, 2);
  CHECK_THROWS_AS(cuda::kernels::embedding(table, idx, Tensor<float>(), narrow), InvalidArgument);
}

TEST_CASE("gpu shape ops: index values checked on the device, errors name the op", "[gpu][shape_ops][index]") {
  auto x = Tensor<float>::zeros({3, 4}, {.device = gpu});
  const auto bad = Tensor<std::int32_t>::from_vector({0, 2, 7, -1, 1}, {5}).to(gpu);
  const auto [count, value] = cuda::kernels::index_range_check(bad, 3);
  CHECK(count == 2);
  CHECK((value == 7 || value == -1));
  CHECK_THROWS_AS(ops::index_select(x, 0, bad), InvalidArgument);
  CHECK_THROWS_WITH(ops::index_select(x, 0, bad), Catch::Contains("cutrain::index_select") &&
                                                      Catch::Contains("dim 0 of size 3") && Catch::Contains("2 of the 5"));
  const auto bad2 = Tensor<std::int32_t>::from_vector({0, 4}, {1, 2}).to(gpu);
  CHECK_THROWS_WITH(ops::gather(x, 1, bad2), Catch::Contains("cutrain::gather") && Catch::Contains("index value 4"));
  const auto host_idx = Tensor<std::int32_t>::from_vector({0}, {1});
  CHECK_THROWS_AS(ops::index_select(x, 0, host_idx), DeviceError);
  const auto y = Tensor<float>::zeros({3, 4});
  CHECK_THROWS_AS(ops::concat({&x, &y}, 0), DeviceError);
  CHECK_THROWS_WITH(ops::concat({&x, &y}, 0), Catch::Contains("cutrain::concat") && Catch::Contains("tensor 1"));
}

TEST_CASE("gpu shape ops: autograd on the device", "[gpu][shape_ops][autograd]") {
  Rng rng(48);
  auto [ad, ar] = random_pair<float>({3, 4}, rng, Layout::row_major);
  auto [bd, br] = random_pair<float>({2, 4}, rng, Layout::row_major);
  auto a = autograd::parameter(std::move(ad));
  auto b = autograd::parameter(std::move(bd));
  const auto idx = Tensor<std::int32_t>::from_vector({4, 0, 4, 2}, {4});
  const auto idx_d = idx.to(gpu);
  auto c = autograd::concat<float>({a, b}, 0);                        // [5, 4]
  auto e = autograd::index_select(c, 0, idx_d);                       // [4, 4]
  auto parts = autograd::split(e, std::int64_t{2}, 1);                // two [4, 2]
  auto s = autograd::stack<float>({parts[1], parts[0]}, 0);           // [2, 4, 2]
  auto dy_host = Tensor<float>::uniform({2, 4, 2}, rng, -1.0, 1.0);
  s.backward(dy_host.to(gpu));
  REQUIRE(a.grad().defined());
  REQUIRE(b.grad().defined());
  CHECK(a.grad().device() == gpu);
  // The same chain on the CPU in f64.
  auto ac = autograd::parameter(ar.view());
  auto bc = autograd::parameter(br.view());
  auto cc = autograd::concat<double>({ac, bc}, 0);
  auto ec = autograd::index_select(cc, 0, idx);
  auto pc = autograd::split(ec, std::int64_t{2}, 1);
  auto sc = autograd::stack<double>({pc[1], pc[0]}, 0);
  sc.backward(cast<double>(dy_host));
  check_close("autograd a grad", a.grad(), ac.grad());
  check_close("autograd b grad", b.grad(), bc.grad());
}

}  // namespace cutrain_test_shape_ops_gpu
