// Whole training steps on the GPU against the same steps on the CPU: the reference CNN of the
// Fashion-MNIST example (scaled down), the same initial weights and the same random batches,
// AdamW and SGD-momentum. Losses and final weights must agree to f32 tolerance (looser than one
// op: a few steps compound the rounding differences of cuDNN's and Eigen's summation orders).
// The conv before batch norm has no bias: its gradient would be rounding noise around zero, and
// Adam turns noise of either sign into a full step of +-lr, on the CPU and the GPU alike.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <cstdint>
#include <string>
#include <vector>

#include "cutrain/cutrain.hpp"
#include "cutrain/nn.hpp"

namespace cutrain_test_train_gpu {  // one per file: the unity build compiles files together

using namespace cutrain;

namespace {

nn::Sequential<float> small_cnn(std::uint64_t seed) {
  Rng init(seed);
  return nn::Sequential<float>{nn::Conv2d<float>({.in = 1, .out = 8, .kernel = 3, .padding = 1, .bias = false}, init),
                               nn::BatchNorm2d<float>({.features = 8}),
                               nn::ReLU{},
                               nn::MaxPool2d({.kernel = 2}),
                               nn::Conv2d<float>({.in = 8, .out = 16, .kernel = 3, .padding = 1}, init),
                               nn::ReLU{},  // conv + bias + relu: the fused op on the GPU
                               nn::MaxPool2d({.kernel = 2}),
                               nn::Flatten{},
                               nn::Linear<float>({.in = 16 * 3 * 3, .out = 32}, init),
                               nn::ReLU{},  // linear + relu: cuBLASLt's epilogue
                               nn::Linear<float>({.in = 32, .out = 10}, init)};
}

struct Run {
  std::vector<double> losses;
  nn::StateDict<float> state;
};

// steps training steps on dev, on batches drawn from a fixed seed, computed in precision p (the
// parameters stay f32); with a scaler (f16) the loss is scaled and no step may overflow.
template <class MakeOpt>
Run train(Device dev, int steps, MakeOpt make_opt, nn::Precision p = nn::Precision::f32,
          optim::GradScaler<float>* scaler = nullptr) {
  auto net = small_cnn(7);
  net.to(dev);
  auto opt = make_opt(net.parameters());
  Rng data(11);
  Run r;
  for (int s = 0; s < steps; ++s) {
    auto x = Tensor<float>::uniform(Shape{16, 1, 12, 12}, data, -1.0, 1.0, {.layout = Layout::nchw});
    Tensor<std::int32_t> y(Shape{16});
    for (std::int64_t i = 0; i < 16; ++i) y.data()[i] = static_cast<std::int32_t>(data.below(10));
    auto loss = nn::cross_entropy(nn::autocast(p, net, x.to(dev)), y.to(dev));
    opt.zero_grad();
    if (scaler) {
      scaler->backward(loss);
      CHECK(scaler->step(opt));
    } else {
      loss.backward();
      opt.step();
    }
    r.losses.push_back(loss.item());
  }
  r.state = net.state_dict();
  return r;
}

template <class MakeOpt>
void compare(const std::string& what, MakeOpt make_opt) {
  const Run cpu = train(Device::cpu(), 5, make_opt);
  const Run gpu = train(Device::cuda(0), 5, make_opt);
  for (std::size_t s = 0; s < cpu.losses.size(); ++s) {
    INFO(what << " step " << s << ": cpu loss " << cpu.losses[s] << ", gpu loss " << gpu.losses[s]);
    CHECK(std::isfinite(gpu.losses[s]));
    CHECK(std::abs(gpu.losses[s] - cpu.losses[s]) <= 1e-3 * std::max(1.0, std::abs(cpu.losses[s])));
  }
  REQUIRE(cpu.state.size() == gpu.state.size());
  for (const auto& [name, c] : cpu.state) {
    const auto g = gpu.state.at(name).contiguous(c.layout()).to_vector();
    const auto cv = c.to_vector();
    double max_err = 0, max_ref = 1;
    for (std::size_t i = 0; i < cv.size(); ++i) {
      max_err = std::max(max_err, std::abs(static_cast<double>(g[i]) - cv[i]));
      max_ref = std::max(max_ref, static_cast<double>(std::abs(cv[i])));
    }
    INFO(what << ": " << name << " max abs err " << max_err);
    CHECK(max_err / max_ref <= 2e-3);
  }
}

}  // namespace

TEST_CASE("training steps on the GPU match the CPU: AdamW", "[gpu][train]") {
  compare("adamw", [](std::vector<autograd::Var<float>> p) {
    return optim::AdamW<float>(std::move(p), {.lr = 1e-3, .weight_decay = 1e-2});
  });
}

TEST_CASE("training steps on the GPU match the CPU: SGD with Nesterov momentum", "[gpu][train]") {
  compare("sgd", [](std::vector<autograd::Var<float>> p) {
    return optim::SGD<float>(std::move(p), {.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-4, .nesterov = true});
  });
}

namespace {

struct Batches {
  std::vector<Tensor<float>> x;
  std::vector<Tensor<std::int32_t>> y;
};

Batches random_batches(int n) {
  Rng data(13);
  Batches b;
  for (int s = 0; s < n; ++s) {
    b.x.push_back(Tensor<float>::uniform(Shape{16, 1, 12, 12}, data, -1.0, 1.0, {.layout = Layout::nchw})
                      .to(Device::cuda(0)));
    Tensor<std::int32_t> y(Shape{16});
    for (std::int64_t i = 0; i < 16; ++i) y.data()[i] = static_cast<std::int32_t>(data.below(10));
    b.y.push_back(y.to(Device::cuda(0)));
  }
  return b;
}

// Learning rate of step s: changes every step, so a value frozen at capture would show.
double lr_at(int s) { return 1e-3 * (1.0 + 0.5 * std::sin(0.7 * s)); }

template <class MakeOpt>
void compare_captured(const std::string& what, MakeOpt make_opt) {
  constexpr int steps = 8;
  const Batches b = random_batches(steps);
  cuda::Stream stream;
  cuda::StreamGuard on(stream.get());

  // Eager, on the same stream.
  auto net_a = small_cnn(7);
  net_a.to(Device::cuda(0));
  auto opt_a = make_opt(net_a.parameters());
  std::vector<double> loss_a;
  for (int s = 0; s < steps; ++s) {
    opt_a.set_lr(lr_at(s));
    auto loss = nn::cross_entropy(net_a(b.x[s]), b.y[s]);
    opt_a.zero_grad();
    loss.backward();
    opt_a.step();
    loss_a.push_back(loss.item());
  }

  // Step 0 eager (the warm-up), steps 1.. replayed from one capture.
  auto net_b = small_cnn(7);
  net_b.to(Device::cuda(0));
  auto opt_b = make_opt(net_b.parameters());
  Tensor<float> x(b.x[0].shape(), {.layout = Layout::nchw, .device = Device::cuda(0)});
  Tensor<std::int32_t> y(b.y[0].shape(), {.device = Device::cuda(0)});
  auto step = [&] {
    auto loss = nn::cross_entropy(net_b(x), y);
    opt_b.zero_grad();
    loss.backward();
    opt_b.step();
    return loss;
  };
  x.copy_from(b.x[0]);
  y.copy_from(b.y[0]);
  opt_b.set_lr(lr_at(0));
  std::vector<double> loss_b{step().item()};
  cuda::CudaGraph graph;
  autograd::Var<float> captured_loss;
  graph.capture([&] { captured_loss = step(); });
  CHECK(graph.nodes() > 10);
  for (int s = 1; s < steps; ++s) {
    x.copy_from(b.x[s]);
    y.copy_from(b.y[s]);
    opt_b.set_lr(lr_at(s));
    graph.replay();
    loss_b.push_back(captured_loss.item());
  }
  for (int s = 0; s < steps; ++s) {
    INFO(what << " step " << s << ": eager " << loss_a[s] << ", captured " << loss_b[s]);
    CHECK(std::abs(loss_a[s] - loss_b[s]) <= 1e-5 * std::max(1.0, std::abs(loss_a[s])));
  }
  const auto sa = net_a.state_dict(), sb = net_b.state_dict();
  for (const auto& [name, t] : sa) {
    const auto va = t.to_vector(), vb = sb.at(name).to_vector();
    double max_err = 0;
    for (std::size_t i = 0; i < va.size(); ++i) max_err = std::max(max_err, static_cast<double>(std::abs(va[i] - vb[i])));
    INFO(what << ": " << name << " max abs err eager vs captured " << max_err);
    CHECK(max_err <= 1e-5);
  }
}

}  // namespace

TEST_CASE("a training step captured in a CUDA graph matches the eager steps: AdamW", "[gpu][train][graph]") {
  compare_captured("adamw", [](std::vector<autograd::Var<float>> p) {
    return optim::AdamW<float>(std::move(p), {.lr = 1e-3, .weight_decay = 1e-2});
  });
}

TEST_CASE("a training step captured in a CUDA graph matches the eager steps: SGD", "[gpu][train][graph]") {
  compare_captured("sgd", [](std::vector<autograd::Var<float>> p) {
    return optim::SGD<float>(std::move(p), {.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-4});
  });
}

TEST_CASE("CUDA graph capture refuses what it cannot record, with clear errors", "[gpu][graph]") {
  cuda::Stream stream;
  cuda::CudaGraph graph;
  // On the default stream.
  CHECK_THROWS_WITH(graph.capture([] {}), Catch::Contains("stream other than the default"));
  CHECK_THROWS_AS(graph.replay(), InvalidArgument);

  cuda::StreamGuard on(stream.get());
  Rng rng(21);
  // A shape never run before: its cuDNN graph would have to be built inside the capture.
  auto x = Tensor<float>::uniform(Shape{3, 5, 7, 9}, rng, -1, 1, {.layout = Layout::nchw}).to(Device::cuda(0));
  auto w = Tensor<float>::uniform(Shape{4, 5, 3, 3}, rng, -1, 1, {.layout = Layout::nchw}).to(Device::cuda(0));
  CHECK_THROWS_WITH(graph.capture([&] { (void)ops::conv2d_forward(x, w, Tensor<float>{}, Conv2dParams::make(1, 1)); }),
                    Catch::Contains("warm-up"));
  CHECK_FALSE(graph.captured());
  // After the failures the stream works: warm up, then capture and replay.
  auto y_eager = ops::conv2d_forward(x, w, Tensor<float>{}, Conv2dParams::make(1, 1));
  Tensor<float> y_graph;
  graph.capture([&] { y_graph = ops::conv2d_forward(x, w, Tensor<float>{}, Conv2dParams::make(1, 1)); });
  graph.replay();
  CHECK(y_graph.to_vector() == y_eager.to_vector());
}

namespace {

std::uint64_t seed_of_name(const std::string& s) {
  std::uint64_t h = 1469598103934665603ull;
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

template <class... Ts>
std::vector<Tensor<float>> vec(Ts&&... ts) {
  std::vector<Tensor<float>> v;
  (v.push_back(std::forward<Ts>(ts)), ...);
  return v;
}

// Runs op on inputs a (eagerly, the warm-up), captures it, copies inputs b into the captured
// inputs, replays, and compares the replay's outputs with op run eagerly on b.
template <class Op>
void check_op_replay(const std::string& what, std::vector<Shape> shapes, Op op) {
  Rng rng(seed_of_name(what));
  std::vector<Tensor<float>> a, b, in;
  for (const auto& s : shapes) {
    const TensorOptions o{.layout = s.rank() == 4 ? Layout::nchw : Layout::row_major};
    a.push_back(Tensor<float>::uniform(s, rng, -1, 1, o).to(Device::cuda(0)));
    b.push_back(Tensor<float>::uniform(s, rng, -1, 1, o).to(Device::cuda(0)));
    in.push_back(Tensor<float>::uniform(s, rng, -1, 1, o).to(Device::cuda(0)));
  }
  for (std::size_t i = 0; i < in.size(); ++i) in[i].copy_from(a[i]);
  (void)op(in);  // warm-up
  const std::vector<Tensor<float>> want = op(b);
  cuda::CudaGraph graph;
  std::vector<Tensor<float>> got;
  graph.capture([&] { got = op(in); });
  for (std::size_t i = 0; i < in.size(); ++i) in[i].copy_from(b[i]);
  graph.replay();
  REQUIRE(got.size() == want.size());
  for (std::size_t k = 0; k < got.size(); ++k) {
    const auto g = got[k].to_vector(), w = want[k].to_vector();
    double max_err = 0;
    for (std::size_t i = 0; i < g.size(); ++i) max_err = std::max(max_err, static_cast<double>(std::abs(g[i] - w[i])));
    double scale = 1;
    for (float v : w) scale = std::max(scale, static_cast<double>(std::abs(v)));
    INFO(what << " output " << k << ": max abs err replay vs eager " << max_err);
    CHECK(max_err <= 1e-6 * scale * 16);  // wgrad may sum in another order on each run
  }
}

}  // namespace

TEST_CASE("each op of a training step replayed from a CUDA graph matches the op run eagerly", "[gpu][graph]") {
  cuda::Stream stream;
  cuda::StreamGuard on(stream.get());
  using V = std::vector<Tensor<float>>;
  const auto conv = Conv2dParams::make(1, 1);
  check_op_replay("conv fprop", {{16, 8, 12, 12}, {16, 8, 3, 3}}, [&](const V& t) {
    return vec(ops::conv2d_forward(t[0], t[1], Tensor<float>{}, conv));
  });
  check_op_replay("conv dgrad", {{16, 16, 12, 12}, {16, 8, 3, 3}}, [&](const V& t) {
    return vec(ops::conv2d_backward_data(t[0], t[1], Shape{16, 8, 12, 12}, conv));
  });
  check_op_replay("conv wgrad", {{16, 16, 12, 12}, {16, 8, 12, 12}}, [&](const V& t) {
    return vec(ops::conv2d_backward_filter(t[0], t[1], Shape{16, 8, 3, 3}, conv), ops::conv2d_backward_bias(t[0]));
  });
  check_op_replay("batch norm training forward and backward", {{16, 8, 12, 12}, {8}, {8}, {16, 8, 12, 12}},
                  [&](const V& t) {
                    Tensor<float> rm = Tensor<float>::zeros(Shape{8}, {.device = Device::cuda(0)});
                    Tensor<float> rv = Tensor<float>::zeros(Shape{8}, {.device = Device::cuda(0)});
                    auto f = ops::batch_norm_forward_training(t[0], t[1], t[2], rm, rv, BatchNormParams{});
                    auto bwd = ops::batch_norm_backward(t[0], t[3], t[1], f.save_mean, f.save_inv_std);
                    return vec(std::move(f.y), std::move(f.save_mean), std::move(f.save_inv_std), std::move(bwd.dx),
                             std::move(bwd.dgamma), std::move(bwd.dbeta));
                  });
  check_op_replay("max pool forward and backward", {{16, 8, 12, 12}, {16, 8, 6, 6}}, [&](const V& t) {
    auto y = ops::pool2d_forward(t[0], Pool2dParams::max(2));
    return vec(ops::pool2d_backward(t[0], y, t[1], Pool2dParams::max(2)), std::move(y));
  });
  check_op_replay("relu forward and backward", {{16, 8, 12, 12}, {16, 8, 12, 12}}, [&](const V& t) {
    return vec(ops::activation_forward(t[0], {.kind = Activation::relu}),
             ops::activation_backward(t[0], t[1], {.kind = Activation::relu}));
  });
  // The shapes of small_cnn's first layers (one input channel).
  check_op_replay("conv fprop 1->8", {{16, 1, 12, 12}, {8, 1, 3, 3}}, [&](const V& t) {
    return vec(ops::conv2d_forward(t[0], t[1], Tensor<float>{}, conv));
  });
  check_op_replay("conv wgrad 1->8", {{16, 8, 12, 12}, {16, 1, 12, 12}}, [&](const V& t) {
    return vec(ops::conv2d_backward_filter(t[0], t[1], Shape{8, 1, 3, 3}, conv));
  });
  check_op_replay("conv + bias + relu 8->16 and its backward", {{16, 8, 6, 6}, {16, 8, 3, 3}, {16}, {16, 16, 6, 6}},
                  [&](const V& t) {
                    auto y = ops::conv2d_bias_activation_forward(t[0], t[1], t[2], {.kind = Activation::relu}, conv);
                    auto dz = ops::activation_backward(y, t[3], {.kind = Activation::relu});
                    return vec(ops::conv2d_backward_data(dz, t[1], t[0].shape(), conv),
                               ops::conv2d_backward_filter(dz, t[0], t[1].shape(), conv), ops::conv2d_backward_bias(dz),
                               std::move(y));
                  });
  check_op_replay("cross entropy forward and backward, dloss on the device", {{16, 10}, {}}, [&](const V& t) {
    Tensor<std::int32_t> labels(Shape{16});
    for (std::int32_t i = 0; i < 16; ++i) labels.data()[i] = (i * 7) % 10;
    static const Tensor<std::int32_t> lab = labels.to(Device::cuda(0));
    return vec(ops::cross_entropy_forward(t[0], lab), ops::cross_entropy_backward(t[0], lab, t[1]));
  });
  check_op_replay("linear forward and backward", {{16, 72}, {32, 72}, {32}, {16, 32}}, [&](const V& t) {
    auto r = ops::linear_backward(t[0], t[1], t[3], true);
    return vec(ops::linear_forward(t[0], t[1], t[2]), std::move(r.dx), std::move(r.dw), std::move(r.db));
  });
}

TEST_CASE("gradients of a whole backward pass replayed from a CUDA graph match the eager ones", "[gpu][graph]") {
  cuda::Stream stream;
  cuda::StreamGuard on(stream.get());
  const Batches b = random_batches(3);
  auto net = small_cnn(7);
  net.to(Device::cuda(0));
  auto params = net.parameters();
  Tensor<float> x(b.x[0].shape(), {.layout = Layout::nchw, .device = Device::cuda(0)});
  Tensor<std::int32_t> y(b.y[0].shape(), {.device = Device::cuda(0)});
  auto fwd_bwd = [&] {
    auto loss = nn::cross_entropy(net(x), y);
    for (auto& p : params) p.zero_grad();
    loss.backward();
    return loss;
  };
  auto grads = [&] {
    std::vector<std::vector<float>> g;
    for (auto& p : params) g.push_back(p.grad().to_vector());
    return g;
  };
  x.copy_from(b.x[0]);
  y.copy_from(b.y[0]);
  (void)fwd_bwd();
  x.copy_from(b.x[1]);
  y.copy_from(b.y[1]);
  const double eager_loss = fwd_bwd().item();
  const auto eager = grads();
  cuda::CudaGraph graph;
  autograd::Var<float> loss;
  x.copy_from(b.x[0]);
  graph.capture([&] { loss = fwd_bwd(); });
  x.copy_from(b.x[1]);
  graph.replay();
  CHECK(std::abs(loss.item() - eager_loss) <= 1e-6);
  const auto replayed = grads();
  for (std::size_t k = 0; k < eager.size(); ++k) {
    double max_err = 0;
    for (std::size_t i = 0; i < eager[k].size(); ++i)
      max_err = std::max(max_err, static_cast<double>(std::abs(eager[k][i] - replayed[k][i])));
    INFO("parameter " << k << " " << params[k].shape() << ": max abs err of the replayed gradient " << max_err);
    CHECK(max_err <= 1e-6);
  }
}

template <class Opt>
void optimizer_replay(const std::string& what, std::function<Opt(std::vector<autograd::Var<float>>)> make) {
  cuda::Stream stream;
  cuda::StreamGuard on(stream.get());
  Rng rng(5);
  const Shape shapes[] = {{8, 1, 3, 3}, {8}, {8}, {10, 32}};
  std::vector<autograd::Var<float>> pa, pb;
  for (const auto& sh : shapes) {
    auto w = Tensor<float>::uniform(sh, rng, -1, 1).to(Device::cuda(0));
    pa.push_back(autograd::parameter(w.clone()));
    pb.push_back(autograd::parameter(w.clone()));
    (void)Tensor<float>::uniform(sh, rng, -1, 1);  // keeps the draws of the gradients below as they were
  }
  Opt a = make(pa), b = make(pb);
  // a: eager; b: step 0 eager, then captured and replayed; both see the same gradients.
  std::vector<std::vector<Tensor<float>>> gs;
  for (int s = 0; s < 5; ++s) {
    std::vector<Tensor<float>> step_g;
    for (const auto& sh : shapes) step_g.push_back(Tensor<float>::uniform(sh, rng, -1, 1));
    gs.push_back(std::move(step_g));
  }
  auto load = [&](std::vector<autograd::Var<float>>& ps, int s) {
    for (std::size_t k = 0; k < ps.size(); ++k) {
      if (!ps[k].grad().defined()) ps[k].grad() = Tensor<float>(shapes[k], {.device = Device::cuda(0)});
      ps[k].grad().copy_from(gs[static_cast<std::size_t>(s)][k]);
    }
  };
  for (int s = 0; s < 5; ++s) {
    load(pa, s);
    a.set_lr(0.01 * (s + 1));
    a.step();
  }
  load(pb, 0);
  b.set_lr(0.01);
  b.step();
  cuda::CudaGraph graph;
  graph.capture([&] { b.step(); });
  for (int s = 1; s < 5; ++s) {
    load(pb, s);
    b.set_lr(0.01 * (s + 1));
    graph.replay();
  }
  for (std::size_t k = 0; k < pa.size(); ++k) {
    const auto va = pa[k].value().to_vector(), vb = pb[k].value().to_vector();
    double max_err = 0;
    for (std::size_t i = 0; i < va.size(); ++i) max_err = std::max(max_err, static_cast<double>(std::abs(va[i] - vb[i])));
    INFO(what << " parameter " << k << ": max abs err eager vs replayed " << max_err);
    CHECK(max_err <= 1e-6);
  }
}

TEST_CASE("optimizer steps replayed from a CUDA graph match eager steps", "[gpu][graph]") {
  optimizer_replay<optim::AdamW<float>>("adamw", [](std::vector<autograd::Var<float>> p) {
    return optim::AdamW<float>(std::move(p), {.lr = 0.01, .weight_decay = 1e-2});
  });
  optimizer_replay<optim::SGD<float>>("sgd", [](std::vector<autograd::Var<float>> p) {
    return optim::SGD<float>(std::move(p), {.lr = 0.01, .momentum = 0.9, .weight_decay = 1e-4});
  });
}

// ---- mixed precision -------------------------------------------------------------------------

namespace {

// Training steps of small_cnn with SGD-momentum on dev in precision p; f16 with a GradScaler.
Run train_mixed(Device dev, nn::Precision p, int steps) {
  // 1024, not the default 65536: the default overflows on the first steps here (and skips them,
  // as it should), which would leave nothing to compare.
  optim::GradScaler<float> scaler({.init_scale = 1024.0});
  const auto sgd = [](std::vector<autograd::Var<float>> params) {
    return optim::SGD<float>(std::move(params), {.lr = 0.01, .momentum = 0.9});
  };
  return train(dev, steps, sgd, p, p == nn::Precision::f16 ? &scaler : nullptr);
}

double rel_norm_diff(const Tensor<float>& a, const Tensor<float>& b, const Tensor<float>* minus = nullptr) {
  const auto va = a.contiguous(Layout::row_major).to_vector(), vb = b.contiguous(Layout::row_major).to_vector();
  std::vector<float> m(va.size(), 0.0f);
  if (minus) m = minus->contiguous(Layout::row_major).to_vector();
  double num = 0, den = 0;
  for (std::size_t i = 0; i < va.size(); ++i) {
    num += std::pow(static_cast<double>(va[i]) - vb[i], 2);
    den += std::pow(static_cast<double>(vb[i]) - m[i], 2);
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

void compare_mixed(nn::Precision p) {
  const std::string what(nn::to_string(p));
  const Run cpu = train_mixed(Device::cpu(), nn::Precision::f32, 5);
  const Run gpu = train_mixed(Device::cuda(0), p, 5);
  const auto init = small_cnn(7).state_dict();
  for (std::size_t s = 0; s < cpu.losses.size(); ++s) {
    INFO(what << " step " << s << ": cpu f32 loss " << cpu.losses[s] << ", gpu loss " << gpu.losses[s]);
    CHECK(std::isfinite(gpu.losses[s]));
    CHECK(std::abs(gpu.losses[s] - cpu.losses[s]) <= 2e-2 * std::max(1.0, std::abs(cpu.losses[s])));
  }
  CHECK(gpu.losses.back() < gpu.losses.front());
  for (const auto& [name, c] : cpu.state) {
    const Tensor<float>& g = gpu.state.at(name);
    // Parameters: how far the GPU's update (w - w0) is from the CPU's, within 20%: bf16 keeps 8
    // significant bits, and the gradient of the conv feeding batch norm is a small difference
    // of large terms (its update differs most: 0.148 in bf16 run alone, 0.151 after the other
    // GPU tests, whose tuned plans it then uses; every other update within 0.10, and in f16
    // within 0.032; H200, 2026-12-01). Statistics: the values, within 5%.
    const bool is_param = name.find("running") == std::string::npos;
    const double err = rel_norm_diff(g, c, is_param ? &init.at(name) : nullptr);
    INFO(what << ": " << name << (is_param ? " relative error of the update " : " relative error ") << err);
    CHECK(err <= (is_param ? 0.2 : 5e-2));
  }
}

}  // namespace

TEST_CASE("mixed-precision training steps on the GPU track f32 on the CPU: bf16", "[gpu][train][mixed]") {
  compare_mixed(nn::Precision::bf16);
}

TEST_CASE("mixed-precision training steps on the GPU track f32 on the CPU: f16 with loss scaling", "[gpu][train][mixed]") {
  compare_mixed(nn::Precision::f16);
}

TEST_CASE("GradScaler on the GPU: exact unscaling, and an overflow skips the step", "[gpu][mixed]") {
  auto net = small_cnn(7);
  net.to(Device::cuda(0));
  optim::SGD<float> opt(net.parameters(), {.lr = 0.05});
  Rng data(17);
  const auto x = Tensor<float>::uniform(Shape{16, 1, 12, 12}, data, -1.0, 1.0).to(Device::cuda(0));
  Tensor<std::int32_t> yh(Shape{16});
  for (std::int64_t i = 0; i < 16; ++i) yh.data()[i] = static_cast<std::int32_t>(data.below(10));
  const auto y = yh.to(Device::cuda(0));

  // Finite gradients: unscale divides by the scale (a power of two: exactly).
  optim::GradScaler<float> scaler({.init_scale = 256.0});
  scaler.backward(nn::cross_entropy(nn::autocast<cutrain::half>(net, x), y));
  std::vector<std::vector<float>> scaled;
  for (const auto& prm : opt.params()) scaled.push_back(prm.grad().to_vector());
  CHECK_FALSE(scaler.unscale(opt));
  for (std::size_t k = 0; k < scaled.size(); ++k) {
    const auto g = opt.params()[k].grad().to_vector();
    bool nonzero = false;
    for (std::size_t i = 0; i < g.size(); ++i) {
      REQUIRE(g[i] == scaled[k][i] / 256.0f);
      nonzero = nonzero || g[i] != 0.0f;
    }
    CHECK(nonzero);
  }

  // A scale that overflows f16: the gradients hold inf/NaN, the step is skipped, the scale halves.
  const auto before = net.state_dict();
  optim::GradScaler<float> huge({.init_scale = 1e9});
  opt.zero_grad();
  huge.backward(nn::cross_entropy(nn::autocast<cutrain::half>(net, x), y));
  CHECK_FALSE(huge.step(opt));
  CHECK(huge.scale() == 5e8);
  CHECK(huge.skipped_steps() == 1);
  const auto after = net.state_dict();
  for (const auto& [name, t] : before)
    if (name.find("running") == std::string::npos) {
      INFO(name);
      CHECK(t.to_vector() == after.at(name).to_vector());
    }

  // Under capture a scaled step refuses, saying why.
  cuda::Stream stream;
  cuda::StreamGuard on(stream.get());
  opt.zero_grad();
  scaler.backward(nn::cross_entropy(nn::autocast<cutrain::half>(net, x), y));  // warm-up on this stream
  scaler.step(opt);
  cuda::CudaGraph graph;
  bool refused = false;
  try {
    graph.capture([&] {
      auto loss = nn::cross_entropy(nn::autocast<cutrain::half>(net, x), y);
      opt.zero_grad();
      scaler.backward(loss);
    });
  } catch (const InvalidArgument& e) {
    refused = std::string(e.what()).find("cannot be captured") != std::string::npos;
  }
  CHECK(refused);
}

// Between two replays other weights are evaluated and put back: the parameters' kept bf16 casts,
// which the graph reads without converting, must be converted again before the next replay.
TEST_CASE("a bf16 mixed-precision step captured in a CUDA graph matches the eager steps", "[gpu][train][graph][mixed]") {
  constexpr int steps = 6;
  const Batches b = random_batches(steps);
  cuda::Stream stream;
  cuda::StreamGuard on(stream.get());
  auto run = [&](bool captured, bool foreach) {
    auto net = small_cnn(7);
    net.to(Device::cuda(0));
    optim::AdamW<float> opt(net.parameters(), {.lr = 1e-3, .weight_decay = 1e-2, .foreach = foreach});
    Tensor<float> x(b.x[0].shape(), {.layout = Layout::nchw, .device = Device::cuda(0)});
    Tensor<std::int32_t> y(b.y[0].shape(), {.device = Device::cuda(0)});
    auto step = [&] {
      auto loss = nn::cross_entropy(nn::autocast<bfloat16>(net, x), y);
      opt.zero_grad();
      loss.backward();
      opt.step();
      return loss;
    };
    std::vector<double> losses;
    cuda::CudaGraph graph;
    autograd::Var<float> graph_loss;
    Rng other(99);
    for (int s = 0; s < steps; ++s) {
      if (s == 3) {  // other weights evaluated in between and put back, as optim::EMA's swap does
        std::vector<Tensor<float>> kept;
        net.visit_params("", [&](const std::string&, autograd::Var<float>& p) {
          kept.push_back(p.value().clone(p.value().layout()));
          p.value().copy_from(Tensor<float>::uniform(p.shape(), other, -0.1, 0.1));
        });
        {
          autograd::NoGradGuard no_grad;
          (void)nn::autocast<bfloat16>(net, x);
        }
        std::size_t k = 0;
        net.visit_params("", [&](const std::string&, autograd::Var<float>& p) { p.value().copy_from(kept[k++]); });
      }
      x.copy_from(b.x[s]);
      y.copy_from(b.y[s]);
      opt.set_lr(lr_at(s));
      if (!captured || s == 0) {
        losses.push_back(step().item());
        if (s == 0) {  // an evaluation before the capture: the kept casts are current when it starts
          autograd::NoGradGuard no_grad;
          (void)nn::autocast<bfloat16>(net, x);
        }
        if (captured) graph.capture([&] { graph_loss = step(); });
      } else {
        graph.replay();
        losses.push_back(graph_loss.item());
      }
    }
    return std::pair(losses, net.state_dict());
  };
  // foreach: the optimizer writes the kept bf16 casts in the graph; per parameter it does not,
  // and every replay converts them first.
  for (const bool foreach : {true, false}) {
    const auto [la, sa] = run(false, foreach);
    const auto [lb, sb] = run(true, foreach);
    for (int s = 0; s < steps; ++s) {
      INFO("foreach " << foreach << ", step " << s << ": eager " << la[s] << ", captured " << lb[s]);
      CHECK(std::abs(la[s] - lb[s]) <= 1e-3 * std::max(1.0, std::abs(la[s])));
    }
    for (const auto& [name, t] : sa) {
      const double err = rel_norm_diff(sb.at(name), t);
      INFO("foreach " << foreach << ", " << name << " relative error captured vs eager " << err);
      CHECK(err <= 1e-3);
    }
  }
}

}  // namespace cutrain_test_train_gpu
