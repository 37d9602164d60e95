// int64 indices and labels on the GPU against the CPU: index_select and gather (forward and
// backward, strided int64 indices, wrap_negative) in f32, bf16 and f16; nn::Embedding's lookup
// and gradient; cross_entropy and linear_cross_entropy with int64 labels (ignore_index); the
// errors naming a bad value; and under CUDA graph capture a bad int64 index gives NaN.
#include "parity.hpp"

#include <cmath>
#include <string>
#include <vector>

#include "cutrain/autograd.hpp"
#include "cutrain/core/view.hpp"
#include "cutrain/cuda/cuda_graph.hpp"
#include "cutrain/nn/embedding.hpp"
#include "cutrain/ops/cross_entropy.hpp"
#include "cutrain/ops/index.hpp"
#include "cutrain/ops/linear_cross_entropy.hpp"

namespace cutrain_test_int64_index_gpu {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;
using autograd::Var;

namespace {

const Device gpu = Device::cuda(0);

std::vector<std::int64_t> random_values(std::int64_t n, std::int64_t lo, std::int64_t hi, Rng& rng) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(n));
  for (auto& e : v) e = lo + static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(hi - lo)));
  return v;
}

Tensor<std::int64_t> i64(const std::vector<std::int64_t>& v, const Shape& s) {
  return Tensor<std::int64_t>::from_vector(v, s);
}

template <class T>
void check_index_ops(const std::string& tag, Rng& rng) {
  const std::vector<Shape> shapes{{9}, {5, 7}, {3, 4, 6}};
  for (const Shape& s : shapes) {
    for (int dim = 0; dim < s.rank(); ++dim) {
      for (const bool wrap : {false, true}) {
        const std::string name = tag + " " + s.str() + " dim " + std::to_string(dim) + (wrap ? " wrapped" : "");
        INFO(name);
        const ops::IndexOptions o{.wrap_negative = wrap};
        auto [x, xr] = random_pair<T>(s, rng, Layout::row_major);
        const std::int64_t n = s[dim];
        // index_select: an int64 index read through a step-2 slice (strided on the device too).
        const auto wide = i64(random_values(18, wrap ? -n : 0, n, rng), Shape{18});
        const auto idx_h = slice(wide, 0, 0, 18, 2);
        const auto idx_d = slice(wide.to(gpu), 0, 0, 18, 2);
        const Tensor<T> y = ops::index_select(x, dim, idx_d, o);
        check_close(name + " index_select", y, ops::index_select(xr, dim, idx_h, o), 0.0);
        auto [dy, dyr] = random_pair<T>(y.shape(), rng, Layout::row_major);
        check_close(name + " index_select_backward", ops::index_select_backward(dy, s, dim, idx_d, o),
                    ops::index_select_backward(dyr, s, dim, idx_h, o));
        // gather: 5 along dim.
        Shape gs = s;
        gs[dim] = 5;
        const auto gi = i64(random_values(gs.numel(), wrap ? -n : 0, n, rng), gs);
        const Tensor<T> g = ops::gather(x, dim, gi.to(gpu), o);
        check_close(name + " gather", g, ops::gather(xr, dim, gi, o), 0.0);
        auto [dg, dgr] = random_pair<T>(gs, rng, Layout::row_major);
        check_close(name + " gather_backward", ops::gather_backward(dg, s, dim, gi.to(gpu), o),
                    ops::gather_backward(dgr, s, dim, gi, o));
      }
    }
  }
}

}  // namespace

TEST_CASE("gpu index_select and gather with int64 indices and wrap_negative: against the CPU", "[gpu][index][int64]") {
  Rng rng(64);
  check_index_ops<float>("f32", rng);
  check_index_ops<bfloat16>("bf16", rng);
  check_index_ops<cutrain::half>("f16", rng);
}

TEST_CASE("gpu int64 index errors name the value and its position, as on the CPU", "[gpu][index][int64]") {
  const auto x = Tensor<float>::zeros(Shape{4, 3}, {.device = gpu});
  const std::int64_t big = std::int64_t{1} << 40;
  CHECK_THROWS_WITH(ops::index_select(x, 0, i64({0, big, 1}, Shape{3}).to(gpu)),
                    Catch::Contains("index_select") && Catch::Contains("1099511627776") && Catch::Contains("position 1"));
  CHECK_THROWS_WITH(ops::gather(x, 1, i64({0, 1, 2, 0, -1, 0}, Shape{2, 3}).to(gpu)),
                    Catch::Contains("gather") && Catch::Contains("-1") && Catch::Contains("wrap_negative"));
  CHECK_THROWS_WITH(ops::index_select(x, 0, i64({-5}, Shape{1}).to(gpu), {.wrap_negative = true}),
                    Catch::Contains("-5") && Catch::Contains("[-4, 4)"));
  const auto logits = Tensor<float>::zeros(Shape{2, 3}, {.device = gpu});
  CHECK_THROWS_WITH(ops::cross_entropy_forward(logits, i64({0, big}, Shape{2}).to(gpu)),
                    Catch::Contains("cross_entropy_forward") && Catch::Contains("does not fit int32"));
}

TEST_CASE("gpu nn::Embedding with int64 tokens: lookup and gradient against the CPU", "[gpu][embedding][int64]") {
  Rng rng(65);
  // 5000 rows take the sorted embedding-gradient path of index_select's backward; 50 the other.
  for (const std::int64_t rows : {50, 5000}) {
    INFO("rows " << rows);
    nn::Embedding<float> cpu_e({.num = rows, .dim = 24, .seed = 9});
    nn::Embedding<float> gpu_e({.num = rows, .dim = 24, .seed = 9});
    gpu_e.to(gpu);
    const auto tok = i64(random_values(2 * 33, 0, rows, rng), Shape{2, 33});
    const Var<float> yc = cpu_e(tok), yg = gpu_e(tok.to(gpu));
    check_close("lookup", yg.value(), cast<double>(yc.value()), 0.0);
    const auto r = Tensor<float>::uniform(yc.shape(), rng, -1, 1);
    autograd::sum(autograd::multiply(yc, Var<float>(r.view()))).backward();
    autograd::sum(autograd::multiply(yg, Var<float>(r.to(gpu)))).backward();
    check_close("weight grad", gpu_e.weight.grad(), cast<double>(cpu_e.weight.grad()));
  }
}

TEST_CASE("gpu cross_entropy and linear_cross_entropy with int64 labels: against the CPU", "[gpu][loss][int64]") {
  Rng rng(66);
  auto [logits, lr] = random_pair<float>({37, 11}, rng, Layout::row_major);
  const auto lab = i64(random_values(37, 0, 11, rng), Shape{37});
  check_close("cross_entropy", ops::cross_entropy_forward(logits, lab.to(gpu)), ops::cross_entropy_forward(lr, lab));
  check_close("cross_entropy backward", ops::cross_entropy_backward(logits, lab.to(gpu), 1.0f),
              ops::cross_entropy_backward(lr, lab, 1.0));

  auto [x, xr] = random_pair<float>({29, 16}, rng, Layout::row_major);
  auto [w, wr] = random_pair<float>({70, 16}, rng, Layout::row_major);
  auto v = random_values(29, 0, 70, rng);
  for (std::size_t i = 2; i < v.size(); i += 5) v[i] = -100;
  const auto labels = i64(v, Shape{29});
  const auto want = ops::linear_cross_entropy(xr, wr, labels, {}, true);
  const auto got = ops::linear_cross_entropy(x, w, labels.to(gpu), {}, true);
  check_close("linear_cross_entropy loss", got.loss, want.loss, 1e-4);
  check_close("linear_cross_entropy dx", got.dx, want.dx, 1e-4);
  check_close("linear_cross_entropy dw", got.dw, want.dw, 1e-4);
}

TEST_CASE("gpu int64 index_select under CUDA graph capture: a bad index gives NaN, not a stray read",
          "[gpu][graph][int64]") {
  cuda::Stream stream;
  cuda::StreamGuard on(stream.get());
  const auto table = Tensor<float>::full(Shape{4, 3}, 2.0f, {.device = gpu});
  auto idx = i64({1, 3, -1}, Shape{3}).to(gpu);
  (void)ops::index_select(table, 0, idx, {.wrap_negative = true});  // warm-up: loads the kernels
  Tensor<float> y;
  cuda::CudaGraph graph;
  graph.capture([&] { y = ops::index_select(table, 0, idx, {.wrap_negative = true}); });
  idx.copy_from(i64({1, std::int64_t{1} << 40, -5}, Shape{3}));
  graph.replay();
  const auto v = y.to_vector();
  for (int i = 0; i < 3; ++i) {
    CHECK(v[i] == 2.0f);
    CHECK(std::isnan(v[3 + i]));
    CHECK(std::isnan(v[6 + i]));
  }
  CHECK_THROWS_WITH(ops::index_select(table, 0, idx, {.wrap_negative = true}), Catch::Contains("1099511627776"));
}

}  // namespace cutrain_test_int64_index_gpu
