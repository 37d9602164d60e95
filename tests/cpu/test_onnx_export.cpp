// deploy::export_onnx: the protobuf writer's bytes against hand-computed encodings; the reference
// CNN and resnet18_cifar exported and read back with a small protobuf reader (node op types in
// order, initializers, opset, shapes, weight bytes); bad inputs. The run in ONNX Runtime is
// examples/onnx_export.cpp with tests/onnx_check.py (CTest onnx_export_check).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "bad_input.hpp"
#include "cutrain/cpu.hpp"
#include "cutrain/deploy/onnx.hpp"
#include "cutrain/deploy/onnx_gpt.hpp"
#include "cutrain/nn.hpp"
#include "temp_dir.hpp"

namespace cutrain_test_onnx_export {  // one per file: the unity build compiles files together

using namespace cutrain;
namespace proto = cutrain::deploy::proto;
using cutrain::test::bad;
using cutrain::test::TempDir;

namespace {

std::string bytes(std::initializer_list<int> b) {
  std::string s;
  for (int x : b) s += static_cast<char>(x);
  return s;
}

// A protobuf message read back: each field number's values (varints and fixed32 as integers,
// length-delimited fields as their bytes), in the order they appear.
struct Message {
  std::multimap<std::uint32_t, std::uint64_t> ints;
  std::multimap<std::uint32_t, std::string> blobs;
  std::vector<std::string> all(std::uint32_t f) const {
    std::vector<std::string> out;
    for (auto [a, b] = blobs.equal_range(f); a != b; ++a) out.push_back(a->second);
    return out;
  }
  std::vector<std::int64_t> all_ints(std::uint32_t f) const {
    std::vector<std::int64_t> out;
    for (auto [a, b] = ints.equal_range(f); a != b; ++a) out.push_back(static_cast<std::int64_t>(a->second));
    return out;
  }
  std::string one(std::uint32_t f) const {
    const auto v = all(f);
    REQUIRE(v.size() == 1);
    return v[0];
  }
  std::int64_t one_int(std::uint32_t f) const {
    const auto v = all_ints(f);
    REQUIRE(v.size() == 1);
    return v[0];
  }
};

std::uint64_t read_varint(const std::string& s, std::size_t& pos) {
  std::uint64_t v = 0;
  for (int shift = 0;; shift += 7) {
    REQUIRE(pos < s.size());
    const auto b = static_cast<unsigned char>(s[pos++]);
    v |= std::uint64_t{b & 0x7fu} << shift;
    if (!(b & 0x80)) return v;
    REQUIRE(shift < 63);
  }
}

Message parse(const std::string& s) {
  Message m;
  std::size_t pos = 0;
  while (pos < s.size()) {
    const std::uint64_t key = read_varint(s, pos);
    const auto field = static_cast<std::uint32_t>(key >> 3);
    switch (key & 7) {
      case 0: m.ints.emplace(field, read_varint(s, pos)); break;
      case 2: {
        const std::uint64_t n = read_varint(s, pos);
        REQUIRE(pos + n <= s.size());
        m.blobs.emplace(field, s.substr(pos, n));
        pos += n;
        break;
      }
      case 5: {
        REQUIRE(pos + 4 <= s.size());
        std::uint32_t v = 0;
        for (int i = 0; i < 4; ++i) v |= std::uint32_t{static_cast<unsigned char>(s[pos + i])} << (8 * i);
        m.ints.emplace(field, v);
        pos += 4;
        break;
      }
      default: FAIL("unexpected wire type " << (key & 7));
    }
  }
  return m;
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Parsed {
  Message model, graph;
  std::vector<std::string> ops;
  std::map<std::string, Message> initializers;
  std::vector<std::int64_t> input_dims, output_dims;
  std::int64_t input_type = 0;
};

std::int64_t value_type(const std::string& value_info) { return parse(parse(parse(value_info).one(2)).one(1)).one_int(1); }

std::vector<std::int64_t> value_dims(const std::string& value_info, std::int64_t elem_type = 1 /* float */) {
  const Message tensor = parse(parse(parse(value_info).one(2)).one(1));
  CHECK(tensor.one_int(1) == elem_type);
  std::vector<std::int64_t> dims;
  for (const auto& d : parse(tensor.one(2)).all(1)) dims.push_back(parse(d).one_int(1));
  return dims;
}

Parsed read_model(const std::filesystem::path& p) {
  Parsed r;
  r.model = parse(read_file(p));
  r.graph = parse(r.model.one(7));
  for (const auto& n : r.graph.all(1)) r.ops.push_back(parse(n).one(4));
  for (const auto& t : r.graph.all(5)) {
    const Message m = parse(t);
    r.initializers.emplace(m.one(8), m);
  }
  r.input_type = value_type(r.graph.one(11));
  r.input_dims = value_dims(r.graph.one(11), r.input_type);
  r.output_dims = value_dims(r.graph.one(12));
  return r;
}

}  // namespace

TEST_CASE("onnx protobuf writer: hand-computed encodings", "[onnx]") {
  proto::Writer v;
  v.varint(0);
  v.varint(1);
  v.varint(127);
  v.varint(128);
  v.varint(300);
  CHECK(v.bytes() == bytes({0x00, 0x01, 0x7f, 0x80, 0x01, 0xac, 0x02}));

  proto::Writer a;
  a.int_field(1, 150);
  CHECK(a.bytes() == bytes({0x08, 0x96, 0x01}));

  proto::Writer neg;
  neg.int_field(1, -1);
  CHECK(neg.bytes() == bytes({0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}));

  proto::Writer s;
  s.string_field(2, "testing");
  CHECK(s.bytes() == bytes({0x12, 0x07, 't', 'e', 's', 't', 'i', 'n', 'g'}));

  proto::Writer nested;
  nested.message(3, a);
  CHECK(nested.bytes() == bytes({0x1a, 0x03, 0x08, 0x96, 0x01}));
  proto::Writer twice;  // a message two levels down: each length counts its whole content
  twice.message(1, nested);
  CHECK(twice.bytes() == bytes({0x0a, 0x05, 0x1a, 0x03, 0x08, 0x96, 0x01}));

  proto::Writer f;
  f.float_field(2, 1.0f);
  CHECK(f.bytes() == bytes({0x15, 0x00, 0x00, 0x80, 0x3f}));

  const std::vector<std::int64_t> ints{3, 270, 86942};
  proto::Writer packed;
  packed.packed_ints(4, ints);
  CHECK(packed.bytes() == bytes({0x22, 0x06, 0x03, 0x8e, 0x02, 0x9e, 0xa7, 0x05}));
  proto::Writer unpacked;
  unpacked.ints_field(8, ints);
  CHECK(unpacked.bytes() == bytes({0x40, 0x03, 0x40, 0x8e, 0x02, 0x40, 0x9e, 0xa7, 0x05}));

  const std::vector<float> fl{1.0f, -2.0f};
  proto::Writer pf;
  pf.packed_floats(7, fl);
  CHECK(pf.bytes() == bytes({0x3a, 0x08, 0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0}));
  CHECK(proto::raw_floats(fl) == bytes({0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0}));

  // A long field: its length takes two varint bytes.
  proto::Writer big;
  big.bytes_field(1, std::string(200, 'x'));
  CHECK(big.bytes().substr(0, 3) == bytes({0x0a, 0xc8, 0x01}));
  CHECK(big.size() == 203);
}

TEST_CASE("export_onnx: the Fashion-MNIST reference CNN", "[onnx]") {
  TempDir dir("onnx_cnn");
  Rng rng(7);
  auto net = nn::fashion_mnist_cnn<float>(rng);
  const auto info = deploy::export_onnx(net, dir / "cnn.onnx", Shape{2, 1, 28, 28});
  const Parsed m = read_model(dir / "cnn.onnx");

  CHECK(m.model.one_int(1) == 8);  // IR version
  const Message opset = parse(m.model.one(8));
  CHECK(opset.one_int(2) == 17);
  CHECK(opset.one(1).empty());
  CHECK(m.model.one(2) == "cutrain");

  const std::vector<std::string> want{"Conv", "BatchNormalization", "Relu", "MaxPool", "Conv",  "BatchNormalization",
                                      "Relu", "MaxPool",            "Flatten", "Gemm", "Relu", "Gemm"};
  CHECK(m.ops == want);
  CHECK(info.op_types == want);
  CHECK(m.initializers.size() == 16);
  CHECK(info.initializers == 16);
  CHECK(m.input_dims == std::vector<std::int64_t>{2, 1, 28, 28});
  CHECK(m.output_dims == std::vector<std::int64_t>{2, 10});
  CHECK(parse(m.graph.one(12)).one(1) == "output");
  CHECK(parse(m.graph.all(1).back()).one(2) == "output");

  // The first conv's weight: dims, f32, and its bytes little-endian.
  const Message& w = m.initializers.at("0.weight");
  CHECK(w.all_ints(1) == std::vector<std::int64_t>{32, 1, 3, 3});
  CHECK(w.one_int(2) == 1);
  const auto values = net.at<nn::Conv2d<float>>(0).weight.value().to_vector();
  CHECK(w.one(9) == proto::raw_floats(values));

  // The conv's attributes: pads [1, 1, 1, 1], strides [1, 1], group 1.
  const Message conv = parse(m.graph.all(1).front());
  std::map<std::string, Message> attrs;
  for (const auto& a : conv.all(5)) {
    const Message am = parse(a);
    attrs.emplace(am.one(1), am);
  }
  CHECK(attrs.at("pads").all_ints(8) == std::vector<std::int64_t>{1, 1, 1, 1});
  CHECK(attrs.at("pads").one_int(20) == 7);  // INTS
  CHECK(attrs.at("kernel_shape").all_ints(8) == std::vector<std::int64_t>{3, 3});
  CHECK(attrs.at("group").one_int(3) == 1);
  CHECK(attrs.at("group").one_int(20) == 2);  // INT
}

TEST_CASE("export_onnx: resnet18_cifar's residual blocks", "[onnx]") {
  TempDir dir("onnx_resnet");
  Rng rng(3);
  auto net = nn::resnet18_cifar<float>(rng);
  const auto info = deploy::export_onnx(net, dir / "resnet.onnx", Shape{1, 3, 32, 32});
  const Parsed m = read_model(dir / "resnet.onnx");
  // stem 3; eight blocks of 7 nodes, 3 of them with a 1x1 conv + BN shortcut; pool, flatten, gemm.
  CHECK(m.ops.size() == 3 + 8 * 7 + 3 * 2 + 3);
  CHECK(info.initializers == 5 + 8 * 10 + 3 * 5 + 2);
  CHECK(m.initializers.size() == info.initializers);
  int adds = 0;
  for (const auto& op : m.ops) adds += op == "Add";
  CHECK(adds == 8);
  const std::vector<std::string> block_with_shortcut{"Conv", "BatchNormalization", "Relu", "Conv", "BatchNormalization",
                                                     "Conv", "BatchNormalization", "Add",  "Relu"};
  // Block 3 (index 5 of the Sequential) is the first one with a shortcut: after the stem (3) and
  // two 7-node blocks.
  CHECK(std::vector<std::string>(m.ops.begin() + 17, m.ops.begin() + 26) == block_with_shortcut);
  CHECK(m.initializers.count("5.shortcut.conv.weight") == 1);
  CHECK(m.initializers.at("5.shortcut.conv.weight").all_ints(1) == std::vector<std::int64_t>{128, 64, 1, 1});
  CHECK(std::vector<std::string>(m.ops.end() - 3, m.ops.end()) ==
        std::vector<std::string>{"GlobalAveragePool", "Flatten", "Gemm"});
  CHECK(m.output_dims == std::vector<std::int64_t>{1, 10});
}

TEST_CASE("export_onnx: activations, pools and dropout", "[onnx]") {
  TempDir dir("onnx_acts");
  nn::Sequential<float> net{nn::Linear<float>({.in = 4, .out = 4}),
                            nn::Activation({.kind = Activation::gelu_tanh}),
                            nn::Dropout({.p = 0.3}),
                            nn::Activation({.kind = Activation::leaky_relu, .alpha = 0.2}),
                            nn::Activation({.kind = Activation::silu})};
  const auto info = deploy::export_onnx(net, dir / "a.onnx", Shape{3, 4});
  const Parsed m = read_model(dir / "a.onnx");
  CHECK(m.ops == std::vector<std::string>{"Gemm", "Mul", "Mul", "Mul", "Add", "Mul", "Tanh", "Add", "Mul", "Mul",
                                          "LeakyRelu", "Sigmoid", "Mul"});
  CHECK(info.initializers == 2 + 4);  // weight, bias; 0.044715, sqrt(2/pi), 1, 0.5

  nn::Sequential<float> pools{nn::MaxPool2d({.kernel = 3, .stride = 2, .padding = 1}),
                              nn::AvgPool2d({.kernel = 2, .count_include_pad = false}), nn::AdaptiveAvgPool2d(1)};
  deploy::export_onnx(pools, dir / "p.onnx", Shape{1, 2, 9, 9});
  const Parsed p = read_model(dir / "p.onnx");
  CHECK(p.ops == std::vector<std::string>{"MaxPool", "AveragePool", "GlobalAveragePool"});
  CHECK(p.output_dims == std::vector<std::int64_t>{1, 2, 1, 1});

  nn::Sequential<float> only_dropout{nn::Dropout{}};
  deploy::export_onnx(only_dropout, dir / "d.onnx", Shape{2, 5});
  CHECK(read_model(dir / "d.onnx").ops == std::vector<std::string>{"Identity"});
}

TEST_CASE("export_onnx: layer norm, RMS norm and softmax", "[onnx]") {
  TempDir dir("onnx_norms");
  nn::Sequential<float> net{nn::LayerNorm<float>({.shape = {4}}), nn::RMSNorm<float>({.shape = {4}, .eps = 1e-3}),
                            nn::Softmax{}};
  const auto info = deploy::export_onnx(net, dir / "n.onnx", Shape{2, 4});
  const Parsed m = read_model(dir / "n.onnx");
  // LayerNormalization is opset 17's; RMS norm is x / sqrt(mean(x^2) + eps) * weight.
  CHECK(m.ops == std::vector<std::string>{"LayerNormalization", "Mul", "ReduceMean", "Add", "Sqrt", "Div", "Mul",
                                          "Softmax"});
  CHECK(info.initializers == 2 + 1 + 1);  // layer norm weight and bias; eps; RMS norm weight
  CHECK(m.output_dims == std::vector<std::int64_t>{2, 4});
  // Over [C, H, W] of an image: axis 1.
  nn::Sequential<float> img{nn::LayerNorm<float>({.shape = {3, 5, 5}}), nn::Softmax{.axis = 1}};
  CHECK(deploy::export_onnx(img, dir / "i.onnx", Shape{1, 3, 5, 5}).op_types ==
        std::vector<std::string>{"LayerNormalization", "Softmax"});
}

namespace {
struct Twice {
  template <class T>
  autograd::Var<T> operator()(const autograd::Var<T>& x) const { return x; }
};
}  // namespace

TEST_CASE("export_onnx: nn::GPT on int32 tokens", "[onnx]") {
  TempDir dir("onnx_gpt");
  nn::GPT<float> gpt({.vocab = 11, .context = 8, .dim = 16, .heads = 2, .layers = 2, .seed = 3});
  const auto info = deploy::export_onnx(gpt, dir / "gpt.onnx", Shape{2, 5});
  const Parsed m = read_model(dir / "gpt.onnx");
  CHECK(m.ops == info.op_types);
  CHECK(m.input_type == 6);  // int32
  CHECK(m.input_dims == std::vector<std::int64_t>{2, 5});
  CHECK(m.output_dims == std::vector<std::int64_t>{10, 11});
  CHECK(info.output_shape == Shape{10, 11});
  CHECK(parse(m.graph.one(11)).one(1) == "tokens");
  CHECK(parse(m.graph.one(12)).one(1) == "logits");
  const auto count = [&](const std::string& op) { return std::count(m.ops.begin(), m.ops.end(), op); };
  CHECK(count("LayerNormalization") == 5);  // two per block and ln_f
  CHECK(count("Softmax") == 2);
  CHECK(count("Gather") == 2 + 3 * 2);  // the embeddings, then q, k and v per block
  CHECK(count("Gemm") == 4 * 2 + 1);    // qkv, proj, fc1, fc2 per block and the tied head
  CHECK(m.ops.front() == "Gather");
  CHECK(m.ops.back() == "Gemm");

  // The tied head reads the token embedding: one initializer, named as in visit_params.
  CHECK(m.initializers.at("wte.weight").one(9) == proto::raw_floats(gpt.wte.weight.value().to_vector()));
  CHECK(m.initializers.at("h.1.attn.qkv.weight").all_ints(1) == std::vector<std::int64_t>{48, 16});
  CHECK(m.initializers.count("h.0.fc2.bias") == 1);
  CHECK(m.initializers.count("ln_f.weight") == 1);
  // Positions 0..4 (int64), and the causal mask: -inf above the diagonal of [5, 5].
  const Message& mask = m.initializers.at("causal_mask");
  CHECK(mask.all_ints(1) == std::vector<std::int64_t>{5, 5});
  std::vector<float> want_mask(25, 0.0f);
  for (int i = 0; i < 5; ++i)
    for (int j = i + 1; j < 5; ++j) want_mask[static_cast<std::size_t>(i * 5 + j)] = -INFINITY;
  CHECK(mask.one(9) == proto::raw_floats(want_mask));
  const std::vector<std::int64_t> pos{0, 1, 2, 3, 4};
  bool found_positions = false;
  for (const auto& [name, t] : m.initializers)
    found_positions |= t.one_int(2) == 7 && t.one(9) == proto::raw_int64s(pos);
  CHECK(found_positions);

  // A non-causal model has no mask.
  nn::GPT<float> plain({.vocab = 11, .context = 8, .dim = 16, .heads = 2, .layers = 1, .seed = 3});
  for (auto& b : plain.blocks) b.attn = nn::MultiheadAttention<float>({.dim = 16, .heads = 2, .causal = false});
  deploy::export_onnx(plain, dir / "plain.onnx", Shape{1, 8});
  CHECK(read_model(dir / "plain.onnx").initializers.count("causal_mask") == 0);
}

TEST_CASE("export_onnx: transformer blocks and attention in a Sequential", "[onnx]") {
  TempDir dir("onnx_transformer");
  nn::Sequential<float> net{nn::TransformerBlock<float>({.dim = 16, .heads = 2, .seed = 1}),
                            nn::MultiheadAttention<float>({.dim = 16, .heads = 4, .causal = false, .seed = 2}),
                            nn::Flatten{}, nn::Linear<float>({.in = 5 * 16, .out = 3})};
  const auto info = deploy::export_onnx(net, dir / "t.onnx", Shape{2, 5, 16});
  const Parsed m = read_model(dir / "t.onnx");
  CHECK(m.ops == info.op_types);
  CHECK(m.input_dims == std::vector<std::int64_t>{2, 5, 16});
  CHECK(m.output_dims == std::vector<std::int64_t>{2, 3});
  const auto count = [&](const std::string& op) { return std::count(m.ops.begin(), m.ops.end(), op); };
  CHECK(count("LayerNormalization") == 2);
  CHECK(count("Softmax") == 2);
  CHECK(count("Gemm") == 4 + 2 + 1);  // the block's qkv, proj, fc1, fc2; the attention's qkv, proj; the head
  // Initializers named as in visit_params; the block's mask (causal), none for the attention.
  CHECK(m.initializers.at("0.attn.qkv.weight").all_ints(1) == std::vector<std::int64_t>{48, 16});
  CHECK(m.initializers.count("1.proj.bias") == 1);
  CHECK(m.initializers.at("causal_mask").all_ints(1) == std::vector<std::int64_t>{5, 5});
}

TEST_CASE("export_onnx: bad input", "[onnx][bad_input]") {
  TempDir dir("onnx_bad");
  const auto file = dir / "bad.onnx";
  const nn::GPT<float> gpt({.vocab = 11, .context = 8, .dim = 16, .heads = 2, .layers = 1});
  test::run_cases({
      bad<InvalidArgument>("empty model", "deploy::export_onnx", {"no modules"},
                           [&] { deploy::export_onnx(nn::Sequential<float>{}, file, Shape{1, 1, 4, 4}); }),
      bad<InvalidArgument>("5-d example", "deploy::export_onnx", {"example_shape", "[1,4,4,1,1]"},
                           [&] {
                             nn::Sequential<float> n{nn::ReLU{}};
                             deploy::export_onnx(n, file, Shape{1, 4, 4, 1, 1});
                           }),
      bad<InvalidArgument>("tokens of another width", "deploy::export_onnx",
                           {"module 0", "TransformerBlock of dim 16", "[2,3,8]"},
                           [&] {
                             nn::Sequential<float> n{nn::TransformerBlock<float>({.dim = 16, .heads = 2})};
                             deploy::export_onnx(n, file, Shape{2, 3, 8});
                           }),
      bad<InvalidArgument>("zero dim", "deploy::export_onnx", {"example_shape", "zero or negative"},
                           [&] {
                             nn::Sequential<float> n{nn::ReLU{}};
                             deploy::export_onnx(n, file, Shape{0, 4});
                           }),
      bad<NotImplemented>("unknown module", "deploy::export_onnx", {"module 1", "Twice"},
                          [&] {
                            nn::Sequential<float> n{nn::ReLU{}, Twice{}};
                            deploy::export_onnx(n, file, Shape{1, 4});
                          }),
      bad<InvalidArgument>("conv on 2-d", "deploy::export_onnx", {"module 0", "Conv2d", "[2,3]"},
                           [&] {
                             nn::Sequential<float> n{nn::Conv2d<float>({.in = 3, .out = 2})};
                             deploy::export_onnx(n, file, Shape{2, 3});
                           }),
      bad<InvalidArgument>("wrong channels", "deploy::export_onnx", {"[1,2,8,8]"},
                           [&] {
                             nn::Sequential<float> n{nn::Conv2d<float>({.in = 3, .out = 2})};
                             deploy::export_onnx(n, file, Shape{1, 2, 8, 8});
                           }),
      bad<InvalidArgument>("layer norm of other dims", "deploy::export_onnx",
                           {"module 1 (LayerNorm over [5])", "does not take [2,4]"},
                           [&] {
                             nn::Sequential<float> n{nn::ReLU{}, nn::LayerNorm<float>({.shape = {5}})};
                             deploy::export_onnx(n, file, Shape{2, 4});
                           }),
      bad<InvalidArgument>("RMS norm over the batch too", "deploy::export_onnx", {"module 0 (RMSNorm over [2,4])"},
                           [&] {
                             nn::Sequential<float> n{nn::RMSNorm<float>({.shape = {2, 4}})};
                             deploy::export_onnx(n, file, Shape{2, 4});
                           }),
      bad<InvalidArgument>("softmax axis", "deploy::export_onnx", {"module 0 (Softmax): axis 2", "2-d input [2,4]"},
                           [&] {
                             nn::Sequential<float> n{nn::Softmax{.axis = 2}};
                             deploy::export_onnx(n, file, Shape{2, 4});
                           }),
      bad<NotImplemented>("linear on 3-d", "deploy::export_onnx", {"module 0", "Gemm", "[2,3,4,1]"},
                          [&] {
                            nn::Sequential<float> n{nn::Linear<float>({.in = 4, .out = 2})};
                            deploy::export_onnx(n, file, Shape{2, 3, 4, 1});
                          }),
      bad<InvalidArgument>("GPT tokens longer than the context", "deploy::export_onnx", {"context 8", "[2,9]"},
                           [&] { deploy::export_onnx(gpt, file, Shape{2, 9}); }),
      bad<InvalidArgument>("GPT tokens of rank 3", "deploy::export_onnx", {"tokens [B, S]", "[1,2,3]"},
                           [&] { deploy::export_onnx(gpt, file, Shape{1, 2, 3}); }),
      bad<InvalidArgument>("GPT batch 0", "deploy::export_onnx", {"B >= 1", "[0,4]"},
                           [&] { deploy::export_onnx(gpt, file, Shape{0, 4}); }),
  });
  CHECK(!std::filesystem::exists(file));
}

}  // namespace cutrain_test_onnx_export
