// The optimizers' many-tensor GPU steps (foreach: one launch per 40 parameters) against their
// one-launch-per-parameter steps: 53 parameters of sizes around the kernel's chunk (8192), so two
// lists and chunks that end inside a tensor; fresh random gradients each step; a parameter that
// skips steps (its own step count, its own first momentum step); eagerly and replayed from a CUDA
// graph. The parameters' kept 16-bit casts written by the step. And the many-tensor kernels'
// refusals.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cutrain/cutrain.hpp"
#include "cutrain/nn.hpp"

namespace cutrain_test_optim_foreach_gpu {  // one per file: the unity build compiles files together

using namespace cutrain;

namespace {

std::vector<Shape> shapes() {
  std::vector<Shape> s;
  const std::int64_t sizes[] = {1, 7, 64, 8191, 8192, 8193, 3 * 8192 + 5, 100};
  for (int i = 0; i < 53; ++i) s.push_back(Shape{sizes[i % 8]});
  s[10] = Shape{16, 3, 3, 3};
  s[20] = Shape{40, 500};
  return s;
}

std::vector<autograd::Var<float>> params_on_gpu(std::uint64_t seed) {
  Rng rng(seed);
  std::vector<autograd::Var<float>> ps;
  for (const auto& sh : shapes())
    ps.emplace_back(Tensor<float>::uniform(sh, rng, -1, 1).to(Device::cuda(0)), true);
  return ps;
}

// Step s's gradients: fresh random values; parameter 5 has none before step 2 (it skips those
// steps, so its step count and first momentum step come later than the others').
void load_grads(std::vector<autograd::Var<float>>& ps, int s) {
  Rng rng(100 + static_cast<std::uint64_t>(s));
  for (std::size_t k = 0; k < ps.size(); ++k) {
    auto g = Tensor<float>::uniform(ps[k].shape(), rng, -1, 1);
    if (k == 5 && s < 2) {
      ps[k].zero_grad();
      continue;
    }
    if (!ps[k].grad().defined()) ps[k].grad() = Tensor<float>(ps[k].shape(), {.device = Device::cuda(0)});
    ps[k].grad().copy_from(g);
  }
}

void compare(const std::vector<autograd::Var<float>>& a, const std::vector<autograd::Var<float>>& b,
             const std::string& what) {
  const auto initial = params_on_gpu(3);
  for (std::size_t k = 0; k < a.size(); ++k) {
    const auto va = a[k].value().to_vector(), vb = b[k].value().to_vector();
    double max_err = 0, max_moved = 0;
    for (std::size_t i = 0; i < va.size(); ++i) max_err = std::max(max_err, static_cast<double>(std::abs(va[i] - vb[i])));
    const auto v0 = initial[k].value().to_vector();
    for (std::size_t i = 0; i < va.size(); ++i) max_moved = std::max(max_moved, static_cast<double>(std::abs(va[i] - v0[i])));
    INFO(what << " parameter " << k << " " << a[k].shape().str() << ": max abs err " << max_err << ", moved "
              << max_moved);
    CHECK(max_err <= 1e-6);
    CHECK(max_moved > 1e-4);  // the step did run
  }
}

// Six steps with foreach (eager, or replayed from a graph after one eager step) against six
// per-parameter steps.
template <class MakeOpt>
void foreach_against_per_tensor(const std::string& what, MakeOpt make_opt, bool graph) {
  cuda::Stream stream;  // capture needs a stream other than the default one
  cuda::StreamGuard on(stream.get());
  auto pa = params_on_gpu(3), pb = params_on_gpu(3);
  auto a = make_opt(pa, false), b = make_opt(pb, true);
  for (int s = 0; s < 6; ++s) {
    load_grads(pa, s);
    a.set_lr(0.01 * (s + 1));
    a.step();
  }
  if (!graph) {
    for (int s = 0; s < 6; ++s) {
      load_grads(pb, s);
      b.set_lr(0.01 * (s + 1));
      b.step();
    }
  } else {
    // Capture needs every parameter's state: parameter 5 gets gradients from step 2 on, so
    // steps 0-2 run eagerly and 3-5 replay.
    for (int s = 0; s < 3; ++s) {
      load_grads(pb, s);
      b.set_lr(0.01 * (s + 1));
      b.step();
    }
    cuda::CudaGraph g;
    g.capture([&] { b.step(); });
    for (int s = 3; s < 6; ++s) {
      load_grads(pb, s);
      b.set_lr(0.01 * (s + 1));
      g.replay();
    }
  }
  compare(pa, pb, what);
}

}  // namespace

TEST_CASE("optimizers: the many-tensor GPU step equals one launch per parameter", "[gpu][optim]") {
  const auto sgd = [](std::vector<autograd::Var<float>> p, bool foreach) {
    return optim::SGD<float>(std::move(p), {.lr = 0.01, .momentum = 0.9, .weight_decay = 1e-2, .nesterov = true,
                                            .foreach = foreach});
  };
  const auto sgd_plain = [](std::vector<autograd::Var<float>> p, bool foreach) {
    return optim::SGD<float>(std::move(p), {.lr = 0.01, .dampening = 0.0, .weight_decay = 1e-3, .foreach = foreach});
  };
  // Two groups with their own weight decay, as transformers use.
  const auto adamw = [](std::vector<autograd::Var<float>> p, bool foreach) {
    std::vector<optim::ParamGroup<float>> groups(2);
    for (std::size_t k = 0; k < p.size(); ++k) groups[k % 3 == 0].params.push_back(p[k]);
    groups[0].weight_decay = 0.1;
    return optim::AdamW<float>(groups, {.lr = 0.01, .foreach = foreach});
  };
  for (const bool graph : {false, true}) {
    const std::string how = graph ? " replayed" : " eager";
    foreach_against_per_tensor("SGD, Nesterov" + how, sgd, graph);
    foreach_against_per_tensor("SGD, no momentum" + how, sgd_plain, graph);
    foreach_against_per_tensor("AdamW, two groups" + how, adamw, graph);
  }
}

namespace {
template <class U>
bool same_bits(const Tensor<U>& a, const Tensor<U>& b) {
  const auto va = a.to_vector(), vb = b.to_vector();
  if (va.size() != vb.size()) return false;
  for (std::size_t i = 0; i < va.size(); ++i)
    if (va[i].bits != vb[i].bits) return false;
  return true;
}

// One step of opt on ps whose parameters have kept bf16 (k % 3 == 0) or f16 (k % 3 == 1) casts:
// afterwards each cast equals the new value's conversion bit for bit; with foreach it is the
// same copy, written by the step (no conversion ran).
template <class Opt>
void step_writes_copies(const std::string& what, std::vector<autograd::Var<float>>& ps, Opt& opt, bool foreach) {
  std::vector<const void*> kept(ps.size(), nullptr);
  for (std::size_t k = 0; k < ps.size(); ++k) {
    if (k % 3 == 0) kept[k] = autograd::cast<bfloat16>(ps[k]).value().data();
    if (k % 3 == 1) kept[k] = autograd::cast<cutrain::half>(ps[k]).value().data();
  }
  load_grads(ps, 2);
  opt.step();
  for (std::size_t k = 0; k < ps.size(); ++k) {
    INFO(what << " parameter " << k << " " << ps[k].shape().str());
    if (k % 3 == 0) {
      const auto c = autograd::cast<bfloat16>(ps[k]);
      CHECK(same_bits(c.value(), ops::cast<bfloat16>(ps[k].value())));
      if (foreach) CHECK(c.value().data() == kept[k]);
    } else if (k % 3 == 1) {
      const auto c = autograd::cast<cutrain::half>(ps[k]);
      CHECK(same_bits(c.value(), ops::cast<cutrain::half>(ps[k].value())));
      if (foreach) CHECK(c.value().data() == kept[k]);
    }
  }
}
}  // namespace

TEST_CASE("the many-tensor GPU step writes the parameters' kept bf16 and f16 casts", "[gpu][optim][mixed]") {
  for (const bool foreach : {true, false}) {
    const std::string how = foreach ? " (foreach)" : " (per parameter)";
    auto ps = params_on_gpu(4);
    optim::SGD<float> sgd(ps, {.lr = 0.1, .momentum = 0.9, .foreach = foreach});
    step_writes_copies("SGD" + how, ps, sgd, foreach);
    step_writes_copies("SGD, second step" + how, ps, sgd, foreach);
    auto qs = params_on_gpu(5);
    optim::AdamW<float> adamw(qs, {.lr = 0.01, .foreach = foreach});
    step_writes_copies("AdamW" + how, qs, adamw, foreach);
  }
}

TEST_CASE("the many-tensor GPU optimizer kernels refuse bad lists", "[gpu][optim]") {
  using cuda::kernels::SgdItem;
  auto w0 = Tensor<float>::zeros(Shape{8}, {.device = Device::cuda(0)});
  auto w1 = Tensor<float>::zeros(Shape{8});  // on the CPU
  auto buf = Tensor<float>::zeros(Shape{8}, {.device = Device::cuda(0)});
  const auto g = Tensor<float>::zeros(Shape{8}, {.device = Device::cuda(0)});
  const auto g_wrong = Tensor<float>::zeros(Shape{9}, {.device = Device::cuda(0)});
  const cuda::kernels::SgdParams p{.lr = 0.1, .momentum = 0.9};
  const auto sgd_many = [&](Tensor<float>* w, const Tensor<float>& grad, Tensor<float>* b, Tensor<float>* w2 = nullptr) {
    std::vector<SgdItem<float>> items;
    items.push_back({.w = w, .grad = grad.view(), .momentum_buffer = b});
    if (w2) items.push_back({.w = w2, .grad = grad.view(), .momentum_buffer = b});
    cuda::kernels::sgd_step(std::span<const SgdItem<float>>(items), p);
  };
  CHECK_THROWS_WITH(sgd_many(&w0, g, &buf, &w1),
                    Catch::Contains("sgd_step (many tensors)") && Catch::Contains("must be on a CUDA device"));
  CHECK_THROWS_WITH(sgd_many(&w0, g, nullptr), Catch::Contains("needs a momentum buffer"));
  CHECK_THROWS_WITH(sgd_many(&w0, g_wrong, &buf), Catch::Contains("[9]"));
  // Nothing ran: w0 is still zero.
  for (float v : w0.to_vector()) CHECK(v == 0.0f);
  using cuda::kernels::AdamWItem;
  auto m = Tensor<float>::zeros(Shape{8}, {.device = Device::cuda(0)});
  std::vector<AdamWItem<float>> items;
  items.push_back({.w = &w0, .grad = g.view(), .m = &m, .v = nullptr});
  CHECK_THROWS_WITH(cuda::kernels::adamw_step(std::span<const AdamWItem<float>>(items), {}),
                    Catch::Contains("m and v are needed"));
}

}  // namespace cutrain_test_optim_foreach_gpu
