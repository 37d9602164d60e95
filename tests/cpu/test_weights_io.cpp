// Weights in and out: .safetensors and .npy round trips in every dtype and for strided, NHWC,
// empty and rank-0 tensors; files written by Python's safetensors and numpy
// (scripts/make-weight-fixtures -> tests/data/weights) read back to the values the script
// computes; damaged files each give the exception and reason; a resnet18_cifar saved in PyTorch's
// names and loaded back into another net computes the same logits.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "bad_input.hpp"
#include "cutrain/cpu.hpp"
#include "cutrain/nn.hpp"
#include "temp_dir.hpp"

namespace cutrain_test_weights_io {  // one per file: the unity build compiles files together

using namespace cutrain;
namespace fs = std::filesystem;
using cutrain::test::bad;
using cutrain::test::TempDir;

namespace {

const fs::path fixtures = fs::path(__FILE__).parent_path().parent_path() / "data" / "weights";

// The script's values: floats (i - n/2) * 0.375, ints 7 i - 5.
std::vector<double> script_floats(std::int64_t n) {
  std::vector<double> v;
  for (std::int64_t i = 0; i < n; ++i) v.push_back(static_cast<double>(i - n / 2) * 0.375);
  return v;
}
std::vector<double> script_ints(std::int64_t n) {
  std::vector<double> v;
  for (std::int64_t i = 0; i < n; ++i) v.push_back(static_cast<double>(7 * i - 5));
  return v;
}
template <class T>
std::vector<double> as_doubles(const Tensor<T>& t) {
  std::vector<double> out;
  for (const T& x : t.to_vector()) out.push_back(static_cast<double>(x));
  return out;
}
template <class T>
std::vector<unsigned char> bytes_of(const Tensor<T>& t) {
  const auto v = t.to_vector();
  std::vector<unsigned char> b(v.size() * sizeof(T));
  if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}
template <class T>
Tensor<T> random_tensor(const Shape& s, Rng& rng) {
  std::vector<T> v(static_cast<std::size_t>(s.numel()));
  for (auto& x : v) {
    if constexpr (std::is_integral_v<T>) x = static_cast<T>(rng.next_u64() % 251);
    else x = T(static_cast<float>(rng.normal()));
  }
  return Tensor<T>::from_vector(v, s);
}

std::vector<char> read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}
void write_file(const fs::path& p, const std::string& b) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(b.data(), static_cast<std::streamsize>(b.size()));
}
// A safetensors file from a header text and a data buffer of `data` bytes.
std::string st_file(const std::string& header, std::size_t data, std::uint64_t claimed_len = ~0ull) {
  const std::uint64_t n = claimed_len == ~0ull ? header.size() : claimed_len;
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>(n >> (8 * i));
  return out + header + std::string(data, '\x01');
}

template <class T>
void check_round_trip(const Tensor<T>& t, const AnyTensor& back) {
  INFO(t.describe() << " -> " << back.describe());
  REQUIRE(back.holds<T>());
  CHECK(back.shape() == t.shape());
  CHECK(back.get<T>().layout() != Layout::strided);
  CHECK(bytes_of(back.get<T>()) == bytes_of(t));
}

}  // namespace

TEST_CASE("safetensors: every dtype, strided, NHWC, empty and rank-0 tensors round-trip bit-exactly", "[weights]") {
  TempDir dir("st_round_trip");
  Rng rng(11);
  TensorMap m;
  m.emplace("f64", random_tensor<double>({3, 4}, rng));
  m.emplace("f32", random_tensor<float>({2, 3, 5}, rng));
  m.emplace("f16", random_tensor<half>({7}, rng));
  m.emplace("bf16", random_tensor<bfloat16>({2, 2, 2, 3}, rng));
  m.emplace("i32", random_tensor<std::int32_t>({5, 1}, rng));
  m.emplace("i64", random_tensor<std::int64_t>({2, 3}, rng));
  m.emplace("u8", random_tensor<std::uint8_t>({9}, rng));
  const auto base = random_tensor<float>({4, 6}, rng);
  m.emplace("transposed", base.as_strided(Shape{6, 4}, Strides{1, 6}, 0));
  m.emplace("sliced", base.slice(1, 2, 5));
  m.emplace("nhwc", random_tensor<float>({2, 3, 4, 5}, rng).contiguous(Layout::nhwc));
  m.emplace("empty", Tensor<float>(Shape{0, 3}));
  m.emplace("scalar", Tensor<float>::full(Shape{}, 4.25f));
  const SafetensorsMetadata meta{{"format", "pt"}, {"epoch", "12"}};
  save_safetensors(dir / "w.safetensors", m, meta);
  CHECK(dir.entries() == std::set<std::string>{"w.safetensors"});  // no temp file left

  const Safetensors back = read_safetensors(dir / "w.safetensors");
  CHECK(back.metadata == meta);
  REQUIRE(back.tensors.size() == m.size());
  for (const auto& [name, t] : m) {
    INFO(name);
    REQUIRE(back.tensors.count(name));
    std::visit([&](const auto& x) { check_round_trip(x, back.tensors.at(name)); }, t.variant());
  }
  // The data starts 8-byte aligned, as the reference writer leaves it.
  const auto raw = read_file(dir / "w.safetensors");
  std::uint64_t n = 0;
  std::memcpy(&n, raw.data(), 8);
  CHECK(n % 8 == 0);

  // A state dict of one type saves through the same call.
  nn::StateDict<double> sd;
  sd.emplace("a.weight", random_tensor<double>({2, 2}, rng));
  save_safetensors(dir / "sd.safetensors", sd);
  CHECK(bytes_of(load_safetensors(dir / "sd.safetensors").at("a.weight").get<double>()) == bytes_of(sd.at("a.weight")));
}

TEST_CASE("npy: every numpy dtype, strided, NHWC, empty and rank-0 tensors round-trip bit-exactly", "[weights]") {
  TempDir dir("npy_round_trip");
  Rng rng(12);
  const auto trip = [&](const auto& t) {
    save_npy(dir / "a.npy", t);
    check_round_trip(t, load_npy(dir / "a.npy"));
  };
  trip(random_tensor<double>({3, 4}, rng));
  trip(random_tensor<float>({2, 3, 5}, rng));
  trip(random_tensor<half>({7}, rng));
  trip(random_tensor<std::int32_t>({5, 1}, rng));
  trip(random_tensor<std::int64_t>({2, 3}, rng));
  trip(random_tensor<std::uint8_t>({9}, rng));
  const auto base = random_tensor<float>({4, 6}, rng);
  trip(base.as_strided(Shape{6, 4}, Strides{1, 6}, 0));
  trip(base.slice(0, 1, 3));
  trip(random_tensor<float>({2, 3, 4, 5}, rng).contiguous(Layout::nhwc));
  trip(Tensor<float>(Shape{0, 3}));
  trip(Tensor<float>::full(Shape{}, -2.0f));
  // The header is padded so that the data starts on a 64-byte boundary, as numpy does.
  save_npy(dir / "b.npy", random_tensor<float>({3}, rng));
  CHECK((read_file(dir / "b.npy").size() - 12) % 64 == 0);
  // A header past 65535 bytes needs version 2.0.
  const auto wide = Tensor<float>(Shape(std::vector<std::int64_t>(25000, 1)));
  save_npy(dir / "v2.npy", wide);
  CHECK(read_file(dir / "v2.npy")[6] == 2);
  check_round_trip(wide, load_npy(dir / "v2.npy"));
}

TEST_CASE("safetensors: reads what Python's safetensors writes", "[weights]") {
  const Safetensors f = read_safetensors(fixtures / "py_numpy.safetensors");
  CHECK(f.metadata.at("format") == "pt");
  CHECK(f.tensors.size() == 10);
  const auto& t = f.tensors;
  CHECK(t.at("f32").shape() == Shape{2, 3});
  CHECK(as_doubles(t.at("f32").get<float>()) == script_floats(6));
  CHECK(as_doubles(t.at("f64").get<double>()) == script_floats(4));
  CHECK(as_doubles(t.at("f16").get<half>()) == script_floats(6));
  CHECK(t.at("f16").shape() == Shape{3, 2});
  CHECK(as_doubles(t.at("i32").get<std::int32_t>()) == script_ints(4));
  CHECK(as_doubles(t.at("u8").get<std::uint8_t>()) == std::vector<double>{0, 1, 2, 3, 4});
  CHECK(as_doubles(t.at("i64").get<std::int64_t>()) == script_ints(3));
  CHECK(as_doubles(t.at("flag").get<std::uint8_t>()) == std::vector<double>{1, 0, 1});
  CHECK(t.at("scalar").shape() == Shape{});
  CHECK(t.at("scalar").get<float>().to_vector() == std::vector<float>{2.5f});
  CHECK(t.at("empty").shape() == Shape{0, 3});
  CHECK(as_doubles(t.at("layer.conv.weight").get<float>()) == script_floats(108));

  const TensorMap b = load_safetensors(fixtures / "py_bf16.safetensors");
  CHECK(b.at("bf16").shape() == Shape{2, 4});
  CHECK(as_doubles(b.at("bf16").get<bfloat16>()) == script_floats(8));
}

TEST_CASE("npy: reads what numpy writes", "[weights]") {
  CHECK(as_doubles(load_npy(fixtures / "f32.npy").get<float>()) == script_floats(6));
  CHECK(load_npy(fixtures / "f32.npy").shape() == Shape{2, 3});
  CHECK(as_doubles(load_npy(fixtures / "f64.npy").get<double>()) == script_floats(5));
  CHECK(as_doubles(load_npy(fixtures / "f16.npy").get<half>()) == script_floats(4));
  CHECK(as_doubles(load_npy(fixtures / "i32.npy").get<std::int32_t>()) == script_ints(3));
  CHECK(as_doubles(load_npy(fixtures / "u8.npy").get<std::uint8_t>()) == std::vector<double>{0, 1, 2, 3});
  CHECK(as_doubles(load_npy(fixtures / "i64.npy").get<std::int64_t>()) == script_ints(6));
  CHECK(load_npy(fixtures / "i64_too_big.npy").get<std::int64_t>().to_vector().at(1) == std::int64_t{1} << 40);
  CHECK(as_doubles(load_npy(fixtures / "bool.npy").get<std::uint8_t>()) == std::vector<double>{1, 0, 0, 1});
  CHECK(as_doubles(load_npy(fixtures / "f32_big_endian.npy").get<float>()) == script_floats(3));
  CHECK(load_npy(fixtures / "scalar.npy").get<float>().to_vector() == std::vector<float>{-1.5f});
  CHECK(load_npy(fixtures / "scalar.npy").shape() == Shape{});
  CHECK(load_npy(fixtures / "empty.npy").shape() == Shape{0, 3});
  const AnyTensor v2 = load_npy(fixtures / "f32_v2.npy");
  CHECK(v2.shape() == Shape{2, 2, 2});
  CHECK(as_doubles(v2.get<float>()) == script_floats(8));
  // as<T>() converts.
  CHECK(as_doubles(load_npy(fixtures / "f16.npy").as<double>()) == script_floats(4));
}

TEST_CASE("safetensors: damaged files give IoError or NotImplemented naming the file, tensor and reason",
          "[weights][bad_input]") {
  TempDir dir("st_bad");
  const fs::path p = dir / "bad.safetensors";
  const std::string file = p.string();
  const std::string ok = R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";
  // A good file, then each way of spoiling it.
  write_file(p, st_file(ok, 16));
  CHECK(load_safetensors(p).at("a").shape() == Shape{2, 2});
  const auto with = [&](std::string bytes) {
    return [p, bytes] {
      write_file(p, bytes);
      (void)load_safetensors(p);
    };
  };
  const auto entry = [](const std::string& name, const std::string& dtype, const std::string& shape, int b, int e) {
    return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" +
           std::to_string(b) + "," + std::to_string(e) + "]}";
  };
  const std::string good = st_file(ok, 16);
  using test::run_cases;
  run_cases({
      bad<IoError>("missing file", "load_safetensors", {"no such file", "nowhere.safetensors"},
                   [&] { (void)load_safetensors(dir / "nowhere.safetensors"); }),
      bad<IoError>("shorter than the length", "load_safetensors", {file, "truncated"}, with("abc")),
      bad<IoError>("truncated in the header", "load_safetensors", {file, "bad header length", "truncated"},
                   with(good.substr(0, 30))),
      bad<IoError>("truncated in the data", "load_safetensors", {file, "tensor \"a\"", "out of range", "truncated"},
                   with(good.substr(0, good.size() - 3))),
      bad<IoError>("huge header length", "load_safetensors", {file, "bad header length 1099511627776", "limit"},
                   with(st_file(ok, 16, 1ull << 40))),
      bad<IoError>("header length 1", "load_safetensors", {file, "bad header length 1"}, with(st_file("{", 0))),
      bad<IoError>("not JSON", "load_safetensors", {file, "not valid JSON"}, with(st_file("{\"a\":", 0))),
      bad<IoError>("duplicate key", "load_safetensors", {file, "duplicate key \"a\""},
                   with(st_file("{" + entry("a", "F32", "[1]", 0, 4) + "," + entry("a", "F32", "[1]", 4, 8) + "}", 8))),
      bad<IoError>("not an object", "load_safetensors", {file, "does not start with '{'"}, with(st_file("[1, 2]", 0))),
      bad<IoError>("offsets out of range", "load_safetensors", {file, "tensor \"a\"", "[0, 16]", "out of range"},
                   with(st_file(ok, 12))),
      bad<IoError>("overlap", "load_safetensors", {file, "tensor \"b\"", "overlap tensor \"a\""},
                   with(st_file("{" + entry("a", "F32", "[2]", 0, 8) + "," + entry("b", "F32", "[2]", 4, 12) + "}", 12))),
      bad<IoError>("gap", "load_safetensors", {file, "tensor \"b\"", "unused"},
                   with(st_file("{" + entry("a", "F32", "[1]", 0, 4) + "," + entry("b", "F32", "[1]", 8, 12) + "}", 12))),
      bad<IoError>("bytes after the last tensor", "load_safetensors", {file, "belong to no tensor"}, with(st_file(ok, 20))),
      bad<IoError>("unknown dtype", "load_safetensors", {file, "tensor \"a\"", "unknown dtype \"F17\""},
                   with(st_file("{" + entry("a", "F17", "[1]", 0, 4) + "}", 4))),
      bad<NotImplemented>("a dtype cutrain lacks", "load_safetensors", {file, "tensor \"a\"", "dtype I8"},
                          with(st_file("{" + entry("a", "I8", "[4]", 0, 4) + "}", 4))),
      bad<IoError>("shape and size disagree", "load_safetensors", {file, "tensor \"a\"", "needs 12 bytes", "hold 16"},
                   with(st_file("{" + entry("a", "F32", "[3]", 0, 16) + "}", 16))),
      bad<IoError>("negative dim", "load_safetensors", {file, "tensor \"a\"", "negative"},
                   with(st_file("{" + entry("a", "F32", "[-1]", 0, 4) + "}", 4))),
      bad<IoError>("offsets reversed", "load_safetensors", {file, "tensor \"a\"", "end before they begin"},
                   with(st_file("{" + entry("a", "U8", "[1]", 4, 3) + "}", 4))),
      bad<IoError>("no shape", "load_safetensors", {file, "tensor \"a\"", "no \"shape\""},
                   with(st_file(R"({"a":{"dtype":"F32","data_offsets":[0,4]}})", 4))),
      bad<IoError>("metadata not strings", "load_safetensors", {file, "__metadata__ \"n\"", "not a string"},
                   with(st_file(R"({"__metadata__":{"n":3}})", 0))),
      bad<InvalidArgument>("saving a reserved name", "save_safetensors", {"\"__metadata__\"", "reserved"},
                           [&] {
                             TensorMap m;
                             m.emplace("__metadata__", Tensor<float>(Shape{1}));
                             save_safetensors(p, m);
                           }),
      bad<InvalidArgument>("saving an undefined tensor", "save_safetensors", {"tensor \"x\"", "undefined"},
                           [&] {
                             TensorMap m;
                             m.emplace("x", Tensor<float>());
                             save_safetensors(p, m);
                           }),
  });
}

TEST_CASE("npy: damaged or unsupported files give IoError or NotImplemented naming the file and reason",
          "[weights][bad_input]") {
  TempDir dir("npy_bad");
  const fs::path p = dir / "bad.npy";
  const std::string file = p.string();
  const auto good = read_file(fixtures / "f32.npy");
  const std::string g(good.begin(), good.end());
  const auto with = [&](std::string bytes) {
    return [p, bytes] {
      write_file(p, bytes);
      (void)load_npy(p);
    };
  };
  const auto header = [](const std::string& dict) {
    std::string d = dict + "\n";
    std::string out = std::string("\x93NUMPY\x01\x00", 8);
    out += static_cast<char>(d.size() & 0xff);
    out += static_cast<char>(d.size() >> 8);
    return out + d;
  };
  using test::run_cases;
  run_cases({
      bad<IoError>("wrong magic", "load_npy", {file, "wrong magic"}, with("\x93NUMPX" + g.substr(6))),
      bad<IoError>("truncated data", "load_npy", {file, "size mismatch", "needs 24 bytes", "truncated"},
                   with(g.substr(0, g.size() - 4))),
      bad<IoError>("extra data", "load_npy", {file, "size mismatch", "needs 24 bytes"}, with(g + "abcd")),
      bad<IoError>("truncated header", "load_npy", {file, "bad header length"}, with(g.substr(0, 40))),
      bad<IoError>("too short", "load_npy", {file, "truncated"}, with("\x93NUMPY")),
      bad<IoError>("version 4", "load_npy", {file, "unsupported .npy version 4.0"},
                   with(std::string("\x93NUMPY\x04\x00", 8) + g.substr(8))),
      bad<NotImplemented>("fortran order", "load_npy", {"fortran.npy", "Fortran order", "[2,3]"},
                          [] { (void)load_npy(fixtures / "fortran.npy"); }),
      bad<NotImplemented>("complex dtype", "load_npy", {file, "dtype '<c8'"},
                          with(header("{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }") + std::string(8, 0))),
      bad<NotImplemented>("structured dtype", "load_npy", {file, "structured dtype"},
                          with(header("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }") +
                               std::string(4, 0))),
      bad<IoError>("unknown key", "load_npy", {file, "bad header", "unknown key 'order'"},
                   with(header("{'descr': '<f4', 'order': False, 'shape': (1,), }") + std::string(4, 0))),
      bad<IoError>("missing key", "load_npy", {file, "bad header", "lacks"},
                   with(header("{'descr': '<f4', 'shape': (1,), }") + std::string(4, 0))),
      bad<IoError>("bad shape", "load_npy", {file, "bad header", "shape must be a tuple"},
                   with(header("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }"))),
      bad<IoError>("byte order missing", "load_npy", {file, "'|f4'", "no byte order"},
                   with(header("{'descr': '|f4', 'fortran_order': False, 'shape': (1,), }") + std::string(4, 0))),
      bad<NotImplemented>("saving bf16", "save_npy", {"no bfloat16", "cast<float>"},
                          [&] { save_npy(p, Tensor<bfloat16>(Shape{2})); }),
      bad<InvalidArgument>("saving an undefined tensor", "save_npy", {"undefined"},
                           [&] { save_npy(p, Tensor<float>()); }),
  });
}

TEST_CASE("weights: resnet18_cifar through PyTorch's names loads back to the same logits", "[weights][nn]") {
  TempDir dir("resnet_names");
  Rng init_a(21), init_b(22), data(23);
  auto a = nn::resnet18_cifar<float>(init_a);
  // Non-trivial running statistics, so that eval-mode batch norm depends on them.
  a.visit_buffers("", [&](const std::string& name, Tensor<float>& t) {
    const bool var = name.ends_with("running_var");
    t = Tensor<float>::uniform(t.shape(), data, var ? 0.5 : -0.2, var ? 1.5 : 0.2);
  });
  const nn::NameMap names = nn::resnet18_cifar_torch_names();
  const auto sd = a.state_dict();
  REQUIRE(names.size() == sd.size());  // every entry mapped, none twice (NameMap::add refuses that)
  for (const auto& [n, t] : sd) CHECK(names.file_name(n) != nullptr);

  const fs::path p = dir / "resnet18.safetensors";
  nn::save_safetensors_state(p, sd, names, {{"format", "pt"}});
  const TensorMap file = load_safetensors(p);
  CHECK(file.count("conv1.weight"));
  CHECK(file.count("layer2.0.downsample.0.weight"));
  CHECK(file.count("layer4.1.bn2.running_var"));
  CHECK(file.at("fc.weight").shape() == Shape{10, 512});
  CHECK(file.at("layer3.0.conv1.weight").shape() == Shape{256, 128, 3, 3});

  auto b = nn::resnet18_cifar<float>(init_b);
  b.load_state_dict(nn::load_safetensors_state<float>(p, names));
  a.eval();
  b.eval();
  autograd::NoGradGuard no_grad;
  const auto x = Tensor<float>::uniform(Shape{2, 3, 8, 8}, data, -1, 1);
  const auto ya = a(x).value().to_vector();
  CHECK(b(x).value().to_vector() == ya);

  // A PyTorch file also has num_batches_tracked (I64 scalars): skipped by the map's rule.
  TensorMap torch_like = load_safetensors(p);
  torch_like.emplace("bn1.num_batches_tracked", Tensor<std::int32_t>::full(Shape{}, 7));
  auto c = nn::resnet18_cifar<float>(init_b);
  c.eval();
  c.load_state_dict(nn::state_dict_from<float>(torch_like, names));
  CHECK(c(x).value().to_vector() == ya);

  // A channels-last module loads the same C-order file.
  auto d = nn::resnet18_cifar<float>(init_b);
  d.to(Layout::nhwc).eval();
  d.load_state_dict(nn::load_safetensors_state<float>(p, names));
  const auto yd = d(x.contiguous(Layout::nhwc)).value().to_vector();
  for (std::size_t i = 0; i < ya.size(); ++i) CHECK(yd[i] == Approx(ya[i]).margin(1e-4));

  // An f64 file converts exactly into the f32 module; a bf16 one rounds each weight.
  TensorMap wide;
  for (const auto& [n, t] : file) wide.emplace(n, t.as<double>());
  save_safetensors(dir / "f64.safetensors", wide);
  auto e = nn::resnet18_cifar<float>(init_b);
  e.eval();
  e.load_state_dict(nn::load_safetensors_state<float>(dir / "f64.safetensors", names));
  CHECK(e(x).value().to_vector() == ya);
  TensorMap narrow;
  for (const auto& [n, t] : file) narrow.emplace(n, t.as<bfloat16>());
  save_safetensors(dir / "bf16.safetensors", narrow);
  const auto from_bf16 = nn::load_safetensors_state<float>(dir / "bf16.safetensors", names);
  const auto w = sd.at("0.weight").to_vector(), wb = from_bf16.at("0.weight").to_vector();
  for (std::size_t i = 0; i < w.size(); ++i) CHECK(wb[i] == static_cast<float>(bfloat16(w[i])));
}

TEST_CASE("weights: name-map and dtype errors name the entry", "[weights][bad_input]") {
  TempDir dir("names_bad");
  const nn::NameMap names = nn::resnet18_cifar_torch_names();
  Rng init(31);
  auto net = nn::resnet18_cifar<float>(init);
  const fs::path p = dir / "w.safetensors";
  nn::save_safetensors_state(p, net.state_dict(), names);
  TensorMap file = load_safetensors(p);
  using test::run_cases;
  run_cases({
      bad<InvalidArgument>("an entry the map lacks", "nn::state_dict_from", {"entry \"head.weight\"", "not in the name map"},
                           [&] {
                             TensorMap m = load_safetensors(p);
                             m.emplace("head.weight", Tensor<float>(Shape{2}));
                             (void)nn::state_dict_from<float>(m, names);
                           }),
      bad<InvalidArgument>("a mapped entry missing", "nn::load_safetensors_state",
                           {p.string(), "no entry \"fc.bias\"", "cutrain's \"13.bias\""},
                           [&] {
                             TensorMap m = load_safetensors(p);
                             m.erase("fc.bias");
                             save_safetensors(p, m);
                             (void)nn::load_safetensors_state<float>(p, names);
                           }),
      bad<InvalidArgument>("an integer entry into a float module", "nn::state_dict_from",
                           {"entry \"w\"", "i32", "floating-point entries only"},
                           [&] {
                             TensorMap m;
                             m.emplace("w", Tensor<std::int32_t>(Shape{2}));
                             (void)nn::state_dict_from<float>(m);
                           }),
      bad<InvalidArgument>("a state dict entry the map lacks", "nn::tensors_from", {"entry \"extra\"", "not in the name map"},
                           [&] {
                             auto sd = net.state_dict();
                             sd.emplace("extra", Tensor<float>(Shape{1}));
                             (void)nn::tensors_from(sd, names);
                           }),
      bad<InvalidArgument>("a name mapped twice", "nn::NameMap::add", {"\"a\" is mapped twice"},
                           [] { nn::NameMap().add("a", "x").add("a", "y"); }),
  });
}

}  // namespace cutrain_test_weights_io
