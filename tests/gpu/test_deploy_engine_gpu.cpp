// deploy::compile on the GPU: a small ResNet (residual blocks, random batch-norm statistics) and
// the reference CNN compiled in f32 (row-major) and bf16 (NHWC) against the same model's engine
// on the CPU in f64 from the same weights; the fused residual convolutions run as cuDNN graphs.
// With cuda_graph, replays per batch size give the eager engine's values for fresh inputs, from
// the default stream and from a stream of the caller's. An engine saved and loaded gives the
// saved one's outputs, and brings the autotuner's choices for its GPU into the tuner's cache.
// Layer norm, RMS norm and softmax steps (f32 parameters on the GPU) against the CPU engine;
// transformer blocks and attention (f32 and bf16, replayed, saved and loaded), and a GPT engine.
#include "parity.hpp"

#include <string>

#include "cutrain/autograd/engine.hpp"
#include "cutrain/deploy/engine.hpp"
#include "cutrain/deploy/engine_file.hpp"
#include "cutrain/deploy/engine_gpt.hpp"
#include "cutrain/nn.hpp"
#include "random_model.hpp"
#include "temp_dir.hpp"

namespace cutrain_test_deploy_engine_gpu {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;

namespace {

template <class E>
void check_engine(const std::string& what, const nn::Sequential<double>& net, const Shape& in, Layout layout, Rng& rng,
                  double tol) {
  const auto cpu = deploy::compile<double>(net, in);
  const auto gpu = deploy::compile<E>(net, in, {.device = Device::cuda(0), .layout = layout});
  INFO(gpu.report());
  auto [x, xr] = random_pair<E>(in, rng, Layout::row_major);
  const auto y = gpu(x);
  CHECK(y.device() == Device::cuda(0));
  check_close(what, y, cpu(xr), tol);
  // A second call reuses every built graph and gives the same values.
  check_close(what + " again", gpu(x), cpu(xr), tol);
}

// A stem and one strided residual block (its shortcut a 1x1 conv), random batch-norm statistics.
nn::Sequential<double> one_block_resnet(Rng& rng) { return small_resnet(rng, 1); }

}  // namespace

TEST_CASE("gpu deploy engine: compiled models match the CPU engine in f64", "[gpu][deploy]") {
  Rng rng(41);
  nn::Sequential<double> resnet = small_resnet(rng);
  check_engine<float>("resnet f32", resnet, Shape{8, 3, 16, 16}, Layout::row_major, rng, 1e-3);
  check_engine<bfloat16>("resnet bf16 nhwc", resnet, Shape{8, 3, 16, 16}, Layout::nhwc, rng, 5e-2);
  auto cnn = nn::fashion_mnist_cnn<double>(rng);
  randomize(cnn, rng);
  check_engine<float>("cnn f32", cnn, Shape{16, 1, 28, 28}, Layout::row_major, rng, 1e-3);
  check_engine<bfloat16>("cnn bf16 nhwc", cnn, Shape{16, 1, 28, 28}, Layout::nhwc, rng, 5e-2);
}

TEST_CASE("gpu deploy engine: layer norm, RMS norm and softmax steps match the CPU engine; files keep them",
          "[gpu][deploy]") {
  Rng rng(44);
  auto mlp = norm_mlp(rng);
  check_engine<float>("norm mlp f32", mlp, Shape{32, 12}, Layout::row_major, rng, 1e-4);
  check_engine<bfloat16>("norm mlp bf16", mlp, Shape{32, 12}, Layout::row_major, rng, 3e-2);
  auto cnn = norm_cnn(rng);
  check_engine<float>("norm cnn f32", cnn, Shape{8, 3, 6, 6}, Layout::row_major, rng, 1e-4);
  check_engine<bfloat16>("norm cnn bf16 nhwc", cnn, Shape{8, 3, 6, 6}, Layout::nhwc, rng, 3e-2);
  // The norms' f32 parameters travel in the file: the loaded engine gives the same bits.
  TempDir dir("engine_file_norms_gpu");
  const auto engine = deploy::compile<bfloat16>(cnn, Shape{8, 3, 6, 6}, {.device = Device::cuda(0), .layout = Layout::nhwc});
  deploy::save_engine(engine, dir / "norms.engine");
  const auto loaded = deploy::load_engine<bfloat16>(dir / "norms.engine");
  auto [x, xr] = random_pair<bfloat16>(Shape{8, 3, 6, 6}, rng, Layout::row_major);
  check_close("loaded norm engine", loaded(x), cast<double>(engine(x).to(Device::cpu())), 0.0);
}

TEST_CASE("gpu deploy engine: transformer blocks match the CPU engine; graphs and files keep them", "[gpu][deploy]") {
  Rng rng(45);
  // dim 64: heads of 16 and 32, which cuDNN's SDPA takes in bf16 (f32 runs the composed path).
  auto net = token_transformer(rng, 8, 64);
  const Shape in{4, 8, 64};
  check_engine<float>("transformer f32", net, in, Layout::row_major, rng, 1e-3);
  check_engine<bfloat16>("transformer bf16", net, in, Layout::row_major, rng, 6e-2);
  // Captured per batch size: the replay gives the eager engine's values.
  const auto eager = deploy::compile<bfloat16>(net, in, {.device = Device::cuda(0)});
  const auto graphed = deploy::compile<bfloat16>(net, in, {.device = Device::cuda(0), .cuda_graph = true});
  for (const std::int64_t batch : {4, 2, 4}) {
    auto [x, xr] = random_pair<bfloat16>(Shape{batch, 8, 64}, rng, Layout::row_major);
    check_close("transformer graph replay batch " + std::to_string(batch), graphed(x),
                cast<double>(eager(x).to(Device::cpu())), 1e-2);
  }
  CHECK(graphed.captured().size() == 2);
  TempDir dir("engine_file_transformer_gpu");
  deploy::save_engine(eager, dir / "transformer.engine");
  const auto loaded = deploy::load_engine<bfloat16>(dir / "transformer.engine");
  CHECK(loaded.report() == eager.report());
  auto [x, xr] = random_pair<bfloat16>(in, rng, Layout::row_major);
  check_close("loaded transformer engine", loaded(x), cast<double>(eager(x).to(Device::cpu())), 0.0);
}

TEST_CASE("gpu deploy engine: a GPT engine matches the CPU engine in f64", "[gpu][deploy]") {
  Rng rng(46);
  nn::GPT<double> gpt({.vocab = 37, .context = 16, .dim = 64, .heads = 4, .layers = 2, .seed = 6});
  test::randomize(gpt, rng, 0.3);
  const auto cpu = deploy::compile<double>(gpt, Shape{4, 16});
  std::vector<std::int32_t> t(4 * 16);
  for (auto& v : t) v = static_cast<std::int32_t>(rng.uniform() * 37) % 37;
  const auto tokens = Tensor<std::int32_t>::from_vector(t, Shape{4, 16});
  const auto want = cpu(tokens);
  const auto f32 = deploy::compile<float>(gpt, Shape{4, 16}, {.device = Device::cuda(0)});
  check_close("gpt f32", f32(tokens.to(Device::cuda(0))), want, 1e-3);
  const auto bf16 = deploy::compile<bfloat16>(gpt, Shape{4, 16}, {.device = Device::cuda(0), .cuda_graph = true});
  INFO(bf16.report());
  check_close("gpt bf16, captured", bf16(tokens.to(Device::cuda(0))), want, 6e-2);
  check_close("gpt bf16, replayed", bf16(tokens.to(Device::cuda(0))), want, 6e-2);
  CHECK(bf16.captured().size() == 1);  // the lookup and the body in one graph
  CHECK(bf16.body().captured().empty());
  CHECK_THAT(bf16.report(), Catch::Contains("nodes (token lookup and body)"));
  TempDir dir("engine_file_gpt_gpu");  // the file gives the same bits
  deploy::save_engine(bf16, dir / "gpt.engine");
  const auto loaded = deploy::load_gpt_engine<bfloat16>(dir / "gpt.engine");
  check_close("gpt bf16, loaded", loaded(tokens.to(Device::cuda(0))), cast<double>(bf16(tokens.to(Device::cuda(0))).to(Device::cpu())),
              0.0);
  CHECK_THROWS_AS(bf16(tokens), DeviceError);  // tokens on the CPU
  // A token out of range: the check runs on the GPU with the forward and is read at the call's end,
  // eager and replayed; the next call with good tokens gives the right logits.
  auto bad = t;
  bad[21] = 37;
  bad[40] = -2;
  const auto bad_tokens = Tensor<std::int32_t>::from_vector(bad, Shape{4, 16}).to(Device::cuda(0));
  const auto refused = [&](const auto& engine) {  // f32 is eager; loaded replays a graph captured above
    CHECK_THROWS_WITH(engine(bad_tokens), Catch::Contains("deploy::GptEngine") &&
                                              Catch::Contains("out of range [0, 37) (2 of the 64 tokens"));
  };
  refused(f32);
  refused(loaded);
  CHECK_THROWS_AS(bf16(bad_tokens.slice(0, 0, 3)), InvalidArgument);  // a new batch size: captured, then checked
  CHECK(bf16.captured().size() == 2);
  check_close("gpt f32 after a bad call", f32(tokens.to(Device::cuda(0))), want, 1e-3);
  check_close("gpt bf16 after a bad call", bf16(tokens.to(Device::cuda(0))), want, 6e-2);
}

TEST_CASE("gpu deploy engine: CUDA-graph replay per batch size matches the eager engine", "[gpu][deploy]") {
  Rng rng(42);
  auto resnet = one_block_resnet(rng);
  const Shape in{8, 3, 16, 16};
  const deploy::CompileOptions eager_o{.device = Device::cuda(0), .layout = Layout::nhwc, .min_batch = 2};
  auto graph_o = eager_o;
  graph_o.cuda_graph = true;
  const auto eager = deploy::compile<bfloat16>(resnet, in, eager_o);
  const auto graphed = deploy::compile<bfloat16>(resnet, in, graph_o);
  for (const std::int64_t batch : {8, 8, 3, 8, 3}) {  // new inputs each call: a stale output would differ
    auto [x, xr] = random_pair<bfloat16>(Shape{batch, 3, 16, 16}, rng, Layout::row_major);
    const auto y = graphed(x);
    CHECK(y.shape() == Shape{batch, 10});
    check_close("graph replay batch " + std::to_string(batch), y, cast<double>(eager(x).to(Device::cpu())), 1e-2);
  }
  {  // from a stream of the caller's: the engine's stream is ordered after it, and it after the replay
    cuda::Stream s;
    cuda::StreamGuard on(s.get());
    auto [x, xr] = random_pair<bfloat16>(in, rng, Layout::row_major);
    const auto y = graphed(x);
    check_close("graph replay on a caller's stream", y, cast<double>(eager(x).to(Device::cpu())), 1e-2);
  }
  {  // calls from two streams in turn, queued without waiting: each output is its own input's
    cuda::Stream s1, s2;
    std::vector<Tensor<bfloat16>> xs, ys;
    for (int k = 0; k < 6; ++k) {
      cuda::StreamGuard on((k % 2 ? s2 : s1).get());
      auto [x, xr] = random_pair<bfloat16>(in, rng, Layout::row_major);
      ys.push_back(graphed(x));
      xs.push_back(std::move(x));
    }
    cuda::synchronize();
    for (std::size_t k = 0; k < xs.size(); ++k)
      check_close("graph replay from two streams, call " + std::to_string(k), ys[k],
                  cast<double>(eager(xs[k]).to(Device::cpu())), 1e-2);
  }
  const auto c = graphed.captured();
  REQUIRE(c.size() == 2);
  CHECK(c[0].first == 3);
  CHECK(c[1].first == 8);
  CHECK(c[0].second > 5);
  INFO(graphed.report());
  CHECK(graphed.report().find("cuda graph: batch 8") != std::string::npos);
  CHECK(eager.captured().empty());
  auto [small, sr] = random_pair<bfloat16>(Shape{1, 3, 16, 16}, rng, Layout::row_major);
  CHECK_THROWS_AS(graphed(small), InvalidArgument);  // below min_batch, as without graphs
}

TEST_CASE("gpu deploy engine: a saved engine loads with its outputs and the tuner's choices", "[gpu][deploy]") {
  namespace autotune = cutrain::cuda::autotune;
  TempDir dir("engine_file_gpu");
  Rng rng(43);
  auto resnet = one_block_resnet(rng);
  // A cache of this test's own (memory only), holding one choice for this GPU and one for another.
  auto mine = std::make_shared<autotune::Cache>(std::filesystem::path{});
  autotune::set_cache(mine);
  const auto env = autotune::environment(0);
  auto other = env;
  other.gpu_name = "another GPU";
  const auto key = autotune::Key::make("test.engine_file", "sig", "cudnn", env);
  const auto foreign = autotune::Key::make("test.engine_file", "sig", "cudnn", other);
  autotune::Choice choice;
  choice.engine_id = 7;
  mine->insert(key, choice);
  choice.engine_id = 8;
  mine->insert(foreign, choice);
  const Shape in{8, 3, 16, 16};
  const auto engine = deploy::compile<bfloat16>(resnet, in, {.device = Device::cuda(0), .layout = Layout::nhwc});
  auto [x, xr] = random_pair<bfloat16>(in, rng, Layout::row_major);
  const auto y = engine(x);
  deploy::save_engine(engine, dir / "resnet.engine");
  mine->clear();
  const auto loaded = deploy::load_engine<bfloat16>(dir / "resnet.engine");
  CHECK(loaded.options().device == Device::cuda(0));
  CHECK(loaded.report() == engine.report());
  check_close("loaded engine", loaded(x), cast<double>(y.to(Device::cpu())), 1e-6);
  auto [x3, x3r] = random_pair<bfloat16>(Shape{3, 3, 16, 16}, rng, Layout::row_major);
  check_close("loaded engine, batch 3", loaded(x3), cast<double>(engine(x3).to(Device::cpu())), 1e-6);
  const auto found = mine->find(key);
  REQUIRE(found.has_value());
  CHECK(found->engine_id == 7);
  for (const auto& [k, c] : mine->entries()) CHECK(k.gpu_name != "another GPU");  // it stayed behind
  CHECK_THROWS_AS(deploy::load_engine<cutrain::half>(dir / "resnet.engine"), InvalidArgument);
  autotune::set_cache(nullptr);
}

}  // namespace cutrain_test_deploy_engine_gpu
