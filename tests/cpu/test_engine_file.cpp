// deploy::save_engine / load_engine on the CPU: a loaded engine has the saved one's plan and
// report and gives bit-identical outputs on fresh random inputs (f64 and f32, row-major and
// NHWC, a batch range, transformer blocks); a file for another element type, version or device is rejected naming
// what differs; corrupt files (not an engine, broken JSON, a missing or misshapen weight, a plan
// whose indices or shapes do not add up) are IoErrors naming the reason.
#include "bad_input.hpp"

#include <fstream>
#include <functional>
#include <string>

#include "cutrain/core/json.hpp"
#include "cutrain/core/safetensors.hpp"
#include "cutrain/deploy/engine_file.hpp"
#include "cutrain/nn.hpp"
#include "random_model.hpp"
#include "temp_dir.hpp"

namespace cutrain_test_engine_file {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;

namespace {

nn::Sequential<double> small_resnet(Rng& rng) {
  nn::Sequential<double> net{nn::Conv2d<double>({.in = 3, .out = 8, .kernel = 3, .padding = 1, .bias = false}, rng),
                             nn::BatchNorm2d<double>({.features = 8}),
                             nn::ReLU{},
                             nn::ResidualBlock<double>({.in = 8, .out = 16, .stride = 2}),
                             nn::MaxPool2d({.kernel = 2}),
                             nn::AdaptiveAvgPool2d{},
                             nn::Flatten{},
                             nn::BatchNorm2d<double>({.features = 16}),  // no conv before it: a scale_shift step
                             nn::Dropout({.p = 0.3}),
                             nn::Linear<double>({.in = 16, .out = 5}, rng),
                             nn::Activation({.kind = Activation::leaky_relu, .alpha = 0.2})};
  randomize(net, rng);
  return net;
}

template <class E>
void check_round_trip(const deploy::Engine<E>& engine, const TempDir& dir, Rng& rng) {
  const auto path = dir / "model.engine";
  deploy::save_engine(engine, path);
  const auto loaded = deploy::load_engine<E>(path);
  CHECK(loaded.report() == engine.report());
  CHECK(loaded.options().layout == engine.options().layout);
  CHECK(loaded.options().min_batch == engine.options().min_batch);
  REQUIRE(loaded.plan().steps.size() == engine.plan().steps.size());
  Shape in = engine.plan().shapes[0];
  for (const std::int64_t batch : {in[0], engine.options().min_batch}) {
    in[0] = batch;
    const auto x = Tensor<E>::uniform(in, rng, -1, 1);
    const auto a = engine(x).contiguous(Layout::row_major), b = loaded(x).contiguous(Layout::row_major);
    REQUIRE(a.shape() == b.shape());
    std::int64_t differ = 0;
    for (std::int64_t i = 0; i < a.numel(); ++i) differ += a.flat(i) != b.flat(i);
    CHECK(differ == 0);
  }
}

// The file's tensors and metadata, for editing; written back by rewrite.
Safetensors open_file(const std::filesystem::path& p) { return read_safetensors(p); }
void rewrite(const std::filesystem::path& p, const Safetensors& f) { save_safetensors(p, f.tensors, f.metadata); }

}  // namespace

TEST_CASE("engine file: a loaded engine is the saved one (f64 and f32, row-major and NHWC)", "[deploy]") {
  Rng rng(51);
  TempDir dir("engine_file");
  auto cnn = nn::fashion_mnist_cnn<double>(rng);
  randomize(cnn, rng);
  check_round_trip(deploy::compile<double>(cnn, Shape{3, 1, 28, 28}), dir, rng);
  auto net = small_resnet(rng);
  check_round_trip(deploy::compile<double>(net, Shape{4, 3, 8, 8}, {.layout = Layout::nhwc, .min_batch = 2}), dir, rng);
  check_round_trip(deploy::compile<float>(net, Shape{4, 3, 8, 8}), dir, rng);
  check_round_trip(deploy::compile<double>(net, Shape{2, 3, 8, 8}, {.fuse = false}), dir, rng);
  // Norms and softmax keep eps and axis through the file.
  nn::Sequential<double> norms{nn::Linear<double>({.in = 6, .out = 8}, rng), nn::LayerNorm<double>({.shape = {8}, .eps = 1e-3}),
                               nn::RMSNorm<double>({.shape = {8}, .eps = 1e-4}), nn::Softmax{.axis = 0}};
  randomize(norms, rng);
  const auto ne = deploy::compile<double>(norms, Shape{3, 6});
  check_round_trip(ne, dir, rng);
  const auto nl = deploy::load_engine<double>(dir / "model.engine");
  CHECK(nl.plan().steps[1].eps == 1e-3);
  CHECK(nl.plan().steps[2].eps == 1e-4);
  CHECK(nl.plan().steps[3].axis == 0);
  // Attention steps keep their heads and causal flag.
  auto tf = token_transformer(rng, 4);
  check_round_trip(deploy::compile<double>(tf, Shape{2, 4, 16}, {.min_batch = 1}), dir, rng);
  const auto tl = deploy::load_engine<double>(dir / "model.engine");
  CHECK((tl.plan().steps[2].heads == 4 && tl.plan().steps[2].causal));
  CHECK((tl.plan().steps[9].heads == 2 && !tl.plan().steps[9].causal));
  CHECK(tl.plan().steps[3].in2 == 0);  // the first block's proj takes the residual add
  {  // a head count that does not divide the width is named
    auto f = open_file(dir / "model.engine");
    auto plan = json::parse(f.metadata.at("plan"));
    plan["steps"][2]["heads"] = 5;
    f.metadata["plan"] = json::dump(plan, 0);
    rewrite(dir / "heads.engine", f);
    run_cases({bad<IoError>("heads", "load_engine", {"step 2", "attention step of 5 heads", "[2,4,48]"},
                            [&] { deploy::load_engine<double>(dir / "heads.engine"); })});
  }
  // The file holds the engine's folded weights, not the model's: loading needs no model.
  const auto f = open_file(dir / "model.engine");
  CHECK(f.metadata.at("dtype") == "f64");
  CHECK(f.metadata.count("plan") == 1);
}

TEST_CASE("engine file: other element types, versions and devices are named; corrupt files are IoErrors",
          "[deploy][bad_input]") {
  Rng rng(52);
  TempDir dir("engine_file_bad");
  auto net = small_resnet(rng);
  const auto good = dir / "good.engine";
  deploy::save_engine(deploy::compile<double>(net, Shape{2, 3, 8, 8}), good);
  // Each case: the good file edited one way, then loaded.
  const auto edited = [&](const std::string& name, const std::function<void(Safetensors&)>& edit) {
    auto f = open_file(good);
    edit(f);
    const auto p = dir / (name + ".engine");
    rewrite(p, f);
    return p;
  };
  const auto plan_edit = [&](const std::string& name, const std::function<void(json::Value&)>& edit) {
    return edited(name, [&](Safetensors& f) {
      auto plan = json::parse(f.metadata.at("plan"));
      edit(plan);
      f.metadata["plan"] = json::dump(plan, 0);
    });
  };
  const auto version = edited("version", [](Safetensors& f) {
    f.metadata["environment"] = R"({"cutrain": "0.0.9", "device": "cpu"})";
  });
  const auto gpu = edited("gpu", [](Safetensors& f) {
    f.metadata["environment"] = R"({"cutrain": "0.1.0", "device": "cuda", "gpu_name": "NVIDIA H200"})";
  });
  const auto foreign_gpu = edited("foreign_gpu", [](Safetensors& f) {
    f.metadata["environment"] = R"({"cutrain": "0.1.0", "device": "cpu", "gpu_name": "NVIDIA H100"})";
  });
  const auto no_meta = edited("no_meta", [](Safetensors& f) { f.metadata.clear(); });
  const auto format = edited("format", [](Safetensors& f) { f.metadata["format_version"] = "7"; });
  const auto broken = edited("broken", [](Safetensors& f) { f.metadata["plan"] = "{\"steps\": ["; });
  const auto no_weight = edited("no_weight", [](Safetensors& f) { f.tensors.erase("step0.w"); });
  const auto wrong_weight = edited("wrong_weight", [](Safetensors& f) {
    f.tensors["step0.w"] = Tensor<double>::zeros(Shape{8, 3, 5, 5});
  });
  const auto f32_weight = edited("f32_weight", [](Safetensors& f) {
    f.tensors["step0.w"] = f.tensors.at("step0.w").as<float>();
  });
  const auto bad_index = plan_edit("bad_index", [](json::Value& p) { p["steps"][1]["in"] = 40; });
  const auto twice = plan_edit("twice", [](json::Value& p) { p["steps"][1]["out"] = p["steps"][0]["out"]; });
  const auto unwritten = plan_edit("unwritten", [](json::Value& p) { p["steps"][0]["in"] = p["steps"][1]["out"]; });
  const auto bad_shape = plan_edit("bad_shape", [](json::Value& p) { p["shapes"][p["steps"][0]["out"].get<int>()][1] = 9; });
  const auto bad_kind = plan_edit("bad_kind", [](json::Value& p) { p["steps"][0]["kind"] = "deconv"; });
  const auto bad_act = plan_edit("bad_act", [](json::Value& p) { p["steps"][0]["act"] = 99; });
  const auto bad_model = plan_edit("bad_model", [](json::Value& p) { p["model"] = "bert"; });
  const auto bad_output = plan_edit("bad_output", [](json::Value& p) { p["output"] = 0; });
  const auto graph_on_cpu = plan_edit("graph_on_cpu", [](json::Value& p) { p["cuda_graph"] = true; });
  const auto wide_act = plan_edit("wide_act", [](json::Value& p) { p["steps"][0]["act"] = (std::int64_t{1} << 32) + 1; });
  const auto bad_layout = plan_edit("bad_layout", [](json::Value& p) { p["layout"] = "nchw"; });
  const auto huge = plan_edit("huge", [](json::Value& p) {
    p["shapes"][0] = json::Value::array({1 << 30, 1 << 30, 4, 1});
  });
  const auto stray = edited("stray", [](Safetensors& f) { f.tensors["step99.w"] = Tensor<double>::zeros(Shape{2}); });
  const auto not_st = dir / "text.engine";
  { std::ofstream(not_st) << "not an engine"; }
  using deploy::load_engine;
  run_cases({
      bad<InvalidArgument>("element type", "load_engine", {"good.engine", "holds an engine in f64, not f32"},
                           [&] { load_engine<float>(good); }),
      bad<InvalidArgument>("version", "load_engine", {"does not match here", "cutrain: the file's 0.0.9, here 0.1.0"},
                           [&] { load_engine<double>(version); }),
      bad<InvalidArgument>("a GPU engine here", "load_engine", {"an engine for cuda:0", "no CUDA"},
                           [&] { load_engine<double>(gpu); }),
      bad<InvalidArgument>("a GPU's field", "load_engine", {"gpu_name: the file's NVIDIA H100, here (none)"},
                           [&] { load_engine<double>(foreign_gpu); }),
      bad<IoError>("not safetensors", "load_engine", {"text.engine"}, [&] { load_engine<double>(not_st); }),
      bad<IoError>("no metadata", "load_engine", {"not a cutrain engine file", "\"format\""},
                   [&] { load_engine<double>(no_meta); }),
      bad<IoError>("format version", "load_engine", {"version 7 is not cutrain engine version 3"},
                   [&] { load_engine<double>(format); }),
      bad<IoError>("broken JSON", "load_engine", {"\"plan\" is not valid JSON"}, [&] { load_engine<double>(broken); }),
      bad<IoError>("missing weight", "load_engine", {"does not add up", "conv step has no weight"},
                   [&] { load_engine<double>(no_weight); }),
      bad<IoError>("misshapen weight", "load_engine", {"does not add up", "step 0 (module 0)", "the plan says"},
                   [&] { load_engine<double>(wrong_weight); }),
      bad<IoError>("weight of another dtype", "load_engine", {"tensor step0.w is", "f32"},
                   [&] { load_engine<double>(f32_weight); }),
      bad<IoError>("index out of range", "load_engine", {"step 1", "in is 40, outside 0 to"},
                   [&] { load_engine<double>(bad_index); }),
      bad<IoError>("a value written twice", "load_engine", {"step 1", "it writes value", "which an earlier step writes"},
                   [&] { load_engine<double>(twice); }),
      bad<IoError>("a value read before it is written", "load_engine", {"step 0", "it reads value", "which no earlier step writes"},
                   [&] { load_engine<double>(unwritten); }),
      bad<IoError>("a shape that does not follow", "load_engine", {"step 0", "the plan says [2,9,8,8]"},
                   [&] { load_engine<double>(bad_shape); }),
      bad<IoError>("unknown step kind", "load_engine", {"step kind \"deconv\" is unknown"},
                   [&] { load_engine<double>(bad_kind); }),
      bad<IoError>("unknown model", "load_engine", {"model \"bert\" is unknown"},
                   [&] { load_engine<double>(bad_model); }),
      bad<IoError>("unknown activation", "load_engine", {"step 0", "act is 99, outside 0 to 8"},
                   [&] { load_engine<double>(bad_act); }),
      bad<IoError>("output never written", "load_engine", {"the output value 0"},
                   [&] { load_engine<double>(bad_output); }),
      bad<IoError>("CUDA graphs in a CPU file", "load_engine", {"does not add up", "cuda_graph needs a GPU device"},
                   [&] { load_engine<double>(graph_on_cpu); }),
      bad<IoError>("an activation past int", "load_engine", {"act is 4294967297"},
                   [&] { load_engine<double>(wide_act); }),
      bad<IoError>("unknown layout", "load_engine", {"layout \"nchw\" is neither"},
                   [&] { load_engine<double>(bad_layout); }),
      bad<IoError>("a shape past memory", "load_engine", {"[1073741824,1073741824,4,1] is too large"},
                   [&] { load_engine<double>(huge); }),
      bad<IoError>("a tensor no step reads", "load_engine", {"1 tensor(s) that no step reads"},
                   [&] { load_engine<double>(stray); }),
      bad<IoError>("missing file", "load_engine", {"nothing.engine"},
                   [&] { load_engine<double>(dir / "nothing.engine"); }),
  });
  try {  // the op is named once, not once per layer of context
    load_engine<double>(unwritten);
    FAIL("a plan that reads a value before it is written loaded");
  } catch (const IoError& e) {
    const std::string w = e.what();
    CHECK(w.find("cutrain::load_engine") == w.rfind("cutrain::load_engine"));
  }
}

TEST_CASE("engine: a model with no step (only dropout) is the identity, compiled and loaded", "[deploy]") {
  Rng rng(52);
  TempDir dir("engine_identity");
  const nn::Sequential<double> net{nn::Dropout({.p = 0.5})};
  const auto engine = deploy::compile<double>(net, Shape{3, 5});
  CHECK(engine.plan().steps.empty());
  const auto x = Tensor<double>::uniform({3, 5}, rng, -1, 1);
  const auto y = engine(x);
  CHECK(y.to_vector() == x.to_vector());
  CHECK(y.data() != x.data());  // a copy, not x itself
  deploy::save_engine(engine, dir / "identity.engine");
  const auto loaded = deploy::load_engine<double>(dir / "identity.engine");
  CHECK(loaded(x).to_vector() == x.to_vector());
  CHECK_THROWS_AS(loaded(Tensor<double>::uniform({3, 6}, rng, -1, 1)), InvalidArgument);
}

}  // namespace cutrain_test_engine_file
