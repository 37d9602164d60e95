// Checkpoints: every record kind and dtype round-trips bit-exactly; modules and SGD/AdamW state
// round-trip; a run interrupted by save/load is bit-identical to an uninterrupted one; truncated,
// corrupted, foreign, empty and missing files each give an IoError with the reason (and never
// crash); saving leaves no temp files; load_state refuses mismatched optimizers untouched.
#include "gradcheck.hpp"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "cutrain/nn.hpp"
#include "cutrain/nn/checkpoint.hpp"
#include "cutrain/optim/adamw.hpp"
#include "cutrain/optim/sgd.hpp"
#include "temp_dir.hpp"

namespace cutrain_test_checkpoint {  // one per file: the unity build compiles files together

using namespace cutrain;
using cutrain::test::make_batch;
using autograd::Var;
namespace fs = std::filesystem;

namespace {

using TempDir = cutrain::test::TempDir;

std::vector<char> read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}
void write_bytes(const fs::path& p, const std::vector<char>& b) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(b.data(), static_cast<std::streamsize>(b.size()));
}
template <class U>
void poke(std::vector<char>& b, std::size_t at, U v) {  // little-endian, as the format stores it
  for (std::size_t i = 0; i < sizeof(U); ++i) b[at + i] = static_cast<char>(static_cast<std::uint64_t>(v) >> (8 * i));
}

// The message of the IoError that f throws ("" and a failed check when it throws none).
template <class F>
std::string io_error(F&& f) {
  try {
    f();
  } catch (const IoError& e) {
    return e.what();
  }
  FAIL_CHECK("expected an IoError");
  return {};
}
bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Same elements, same bits (NaN payloads and -0.0 included).
template <class T>
bool bits_equal(const Tensor<T>& a, const Tensor<T>& b) {
  if (a.shape() != b.shape()) return false;
  const auto va = a.to_vector(), vb = b.to_vector();
  return va.size() == vb.size() && (va.empty() || std::memcmp(va.data(), vb.data(), va.size() * sizeof(T)) == 0);
}

nn::Sequential<float> tiny_net(std::uint64_t seed) {
  return nn::Sequential<float>{nn::Conv2d<float>({.in = 1, .out = 3, .kernel = 3, .padding = 1, .seed = seed}),
                               nn::BatchNorm2d<float>({.features = 3}), nn::ReLU{}, nn::Flatten{},
                               nn::Linear<float>({.in = 3 * 8 * 8, .out = 2, .seed = seed + 1})};
}

template <class Opt>
float train_step(nn::Sequential<float>& net, Opt& opt, Rng& data, double lr) {
  Tensor<float> x;
  Tensor<std::int32_t> y;
  make_batch(data, 16, x, y);
  auto loss = nn::cross_entropy(net(x), y);
  opt.zero_grad();
  loss.backward();
  opt.set_lr(lr);
  opt.step();
  return loss.item();
}

template <class T>
Tensor<T> random_bits(const Shape& s, Rng& rng) {
  Tensor<T> t(s);
  auto* p = reinterpret_cast<unsigned char*>(t.data());
  for (std::size_t i = 0; i < static_cast<std::size_t>(t.numel()) * sizeof(T); ++i) p[i] = static_cast<unsigned char>(rng.below(256));
  return t;
}

}  // namespace

TEST_CASE("checkpoint: every record kind and dtype round-trips bit-exactly", "[checkpoint]") {
  TempDir dir("checkpoint");
  Rng rng(11);
  Checkpoint c;
  // Random bit patterns: every NaN payload, infinity, subnormal and -0 a dtype has is fair game.
  c.put("f64", random_bits<double>(Shape{3, 5}, rng));
  c.put("f32", random_bits<float>(Shape{7}, rng));
  c.put("f16", random_bits<half>(Shape{2, 3, 4}, rng));
  c.put("bf16", random_bits<bfloat16>(Shape{33}, rng));
  c.put("i32", random_bits<std::int32_t>(Shape{4, 4}, rng));
  c.put("u8", random_bits<std::uint8_t>(Shape{3, 1, 2, 5}, rng));
  const auto nhwc = Tensor<float>::randn(Shape{2, 3, 4, 5}, rng, 1.0, {.layout = Layout::nhwc});
  c.put("nhwc", nhwc);
  const auto base = Tensor<double>::randn(Shape{6, 5}, rng);
  const auto strided = base.slice(1, 1, 4);  // a view with row stride 5: stored contiguous
  REQUIRE_FALSE(strided.is_contiguous());
  c.put("strided", strided);
  c.put("scalar", Tensor<float>::full(Shape{}, 2.5f));
  c.put("empty", Tensor<float>(Shape{0, 3}));
  c.put_int("int_min", std::numeric_limits<std::int64_t>::min());
  c.put_int("int_max", std::numeric_limits<std::int64_t>::max());
  c.put_int("int_neg", -1);
  const double weird[] = {-0.0, std::numeric_limits<double>::infinity(), std::numeric_limits<double>::denorm_min(),
                          std::bit_cast<double>(0x7ff4000000000123ull)};
  for (int i = 0; i < 4; ++i) c.put_double("double" + std::to_string(i), weird[i]);
  const std::string binary("a\0b\xff\n", 5);
  c.put_string("empty_string", "");
  c.put_string("binary", binary);
  c.put_string("long", std::string(100000, 'x'));
  // Putting a name again replaces the record in its place.
  c.put_int("replaced", 1);
  c.put_string("replaced", "now a string");
  CHECK(c.contains("replaced"));
  CHECK_FALSE(c.contains("nope"));

  const fs::path file = dir.path() / "all.ckpt";
  c.save(file);
  const Checkpoint d = Checkpoint::load(file);
  CHECK(d.names() == c.names());
  CHECK(bits_equal(d.get<double>("f64"), c.get<double>("f64")));
  CHECK(bits_equal(d.get<float>("f32"), c.get<float>("f32")));
  CHECK(bits_equal(d.get<half>("f16"), c.get<half>("f16")));
  CHECK(bits_equal(d.get<bfloat16>("bf16"), c.get<bfloat16>("bf16")));
  CHECK(bits_equal(d.get<std::int32_t>("i32"), c.get<std::int32_t>("i32")));
  CHECK(bits_equal(d.get<std::uint8_t>("u8"), c.get<std::uint8_t>("u8")));
  const auto nhwc_back = d.get<float>("nhwc");
  CHECK(nhwc_back.layout() == Layout::nhwc);
  CHECK(bits_equal(nhwc_back, nhwc));
  const auto strided_back = d.get<double>("strided");
  CHECK(strided_back.is_contiguous());
  CHECK(bits_equal(strided_back, strided));
  CHECK(d.get<float>("scalar").to_vector() == std::vector<float>{2.5f});
  CHECK(d.get<float>("empty").shape() == Shape{0, 3});
  CHECK(d.get_int("int_min") == std::numeric_limits<std::int64_t>::min());
  CHECK(d.get_int("int_max") == std::numeric_limits<std::int64_t>::max());
  CHECK(d.get_int("int_neg") == -1);
  for (int i = 0; i < 4; ++i)
    CHECK(std::bit_cast<std::uint64_t>(d.get_double("double" + std::to_string(i))) == std::bit_cast<std::uint64_t>(weird[i]));
  CHECK(d.get_string("empty_string").empty());
  CHECK(d.get_string("binary") == binary);
  CHECK(d.get_string("long") == std::string(100000, 'x'));
  CHECK(d.get_string("replaced") == "now a string");

  // Asking for the wrong thing names the record and what it holds.
  CUTRAIN_REQUIRE_THROWS_OP(d.get<float>("missing"), InvalidArgument, "no record \"missing\"");
  CUTRAIN_REQUIRE_THROWS_OP(d.get<float>("f64"), InvalidArgument, "record \"f64\" is a f64 tensor [3,5], not f32");
  CUTRAIN_REQUIRE_THROWS_OP(d.get<float>("int_neg"), InvalidArgument, "record \"int_neg\" is an int, not a tensor");
  CUTRAIN_REQUIRE_THROWS_OP(d.get_int("binary"), InvalidArgument, "is a string, not an int");
  CUTRAIN_REQUIRE_THROWS_OP(d.get_string("f32"), InvalidArgument, "is a f32 tensor [7], not a string");
  CUTRAIN_REQUIRE_THROWS_OP(c.put("", Tensor<float>(Shape{1})), InvalidArgument, "must not be empty");
  CUTRAIN_REQUIRE_THROWS_OP(c.put("undefined", Tensor<float>{}), InvalidArgument, "undefined");
  // get_like converts to the layout it is asked for.
  const auto as_rows = d.get_like("nhwc", Tensor<float>(Shape{2, 3, 4, 5}));
  CHECK(as_rows.layout() == Layout::nchw);
  CHECK(bits_equal(as_rows, nhwc));
  CUTRAIN_REQUIRE_THROWS_OP(d.get_like("f32", Tensor<float>(Shape{8})), InvalidArgument, "record \"f32\"");
  Checkpoint e;
  e.put_int("a", 1);
  e.put_int("b", 2);
  e.put_int("c", 3);
  CHECK(e.erase("b"));
  CHECK_FALSE(e.erase("b"));
  e.put_int("d", 4);
  CHECK(e.names() == std::vector<std::string>{"a", "c", "d"});
  CHECK(e.get_int("c") == 3);
}

TEST_CASE("checkpoint: module, AdamW and SGD state round trip", "[checkpoint]") {
  TempDir dir("checkpoint");
  Rng data(5);
  auto net = tiny_net(1);
  optim::AdamW<float> adam(net.parameters(), {.lr = 1e-2});
  for (int i = 0; i < 2; ++i) train_step(net, adam, data, 1e-2);
  // SGD with momentum over the net plus one parameter that never gets a gradient: its buffer
  // stays undefined and must come back undefined.
  auto unused = autograd::parameter(Tensor<float>::zeros(Shape{3}));
  auto sgd_params = net.parameters();
  sgd_params.push_back(unused);
  optim::SGD<float> sgd(sgd_params, {.lr = 0.05, .momentum = 0.9});
  train_step(net, sgd, data, 0.05);

  Checkpoint c;
  nn::save_module(c, "model", net);
  adam.save_state(c, "adam");
  sgd.save_state(c, "sgd");
  CHECK(c.contains("model.0.weight"));
  CHECK(c.contains("model.1.running_var"));
  CHECK(c.contains("sgd.0.momentum_buffer"));
  CHECK_FALSE(c.contains("sgd.6.momentum_buffer"));
  const fs::path file = dir.path() / "state.ckpt";
  c.save(file);
  const Checkpoint d = Checkpoint::load(file);

  auto net2 = tiny_net(77);
  const auto before = net2.state_dict();
  CHECK_FALSE(bits_equal(before.at("0.weight"), net.state_dict().at("0.weight")));
  nn::load_module(d, "model", net2);
  const auto want = net.state_dict(), got = net2.state_dict();
  REQUIRE(want.size() == got.size());
  for (const auto& [name, t] : want) {
    INFO(name);
    CHECK(bits_equal(got.at(name), t));
  }

  optim::AdamW<float> adam2(net2.parameters());
  adam2.load_state(d, "adam");
  CHECK(adam2.lr() == adam.lr());
  for (std::size_t k = 0; k < adam.params().size(); ++k) {
    CHECK(adam2.step_count(k) == 2);
    CHECK(bits_equal(adam2.exp_avg(k), adam.exp_avg(k)));
    CHECK(bits_equal(adam2.exp_avg_sq(k), adam.exp_avg_sq(k)));
  }
  auto params2 = net2.parameters();
  params2.push_back(autograd::parameter(Tensor<float>::zeros(Shape{3})));
  optim::SGD<float> sgd2(params2, {.lr = 0.5, .momentum = 0.9});
  sgd2.load_state(d, "sgd");
  CHECK(sgd2.lr() == 0.05);
  for (std::size_t k = 0; k + 1 < params2.size(); ++k) CHECK(bits_equal(sgd2.momentum_buffer(k), sgd.momentum_buffer(k)));
  CHECK_FALSE(sgd2.momentum_buffer(params2.size() - 1).defined());

  // Saving a fresh optimizer into the same Checkpoint object drops the old buffers.
  optim::SGD<float> fresh(params2, {.momentum = 0.9});
  fresh.save_state(c, "sgd");
  CHECK_FALSE(c.contains("sgd.0.momentum_buffer"));
  sgd2.load_state(c, "sgd");
  CHECK_FALSE(sgd2.momentum_buffer(0).defined());

  // A module entry missing from the checkpoint: refused, module unchanged.
  Checkpoint partial = Checkpoint::load(file);
  partial.erase("model.1.running_mean");
  auto net3 = tiny_net(9);
  const auto w3 = net3.state_dict();
  CUTRAIN_REQUIRE_THROWS_OP(nn::load_module(partial, "model", net3), InvalidArgument, "model.1.running_mean");
  for (const auto& [name, t] : w3) CHECK(bits_equal(net3.state_dict().at(name), t));
  // Records under a longer prefix are someone else's.
  Checkpoint extra = Checkpoint::load(file);
  extra.put("model.ema.0.weight", Tensor<float>(Shape{1}));
  nn::load_module(extra, "model", net3);
  CHECK(bits_equal(net3.state_dict().at("0.weight"), want.at("0.weight")));

  // Rng state.
  Rng r(123);
  for (int i = 0; i < 17; ++i) r.uniform();
  nn::put_rng(c, "rng", r);
  Rng r2(0);
  nn::get_rng(c, "rng", r2);
  CHECK(r2.seed() == 123);
  CHECK(r2.counter() == 17);
  CHECK(r2.next_u64() == r.next_u64());
  CUTRAIN_REQUIRE_THROWS_OP(nn::get_rng(c, "nope", r2), InvalidArgument, "nope.seed");
}

TEST_CASE("checkpoint: a resumed run is bit-identical to an uninterrupted one", "[checkpoint]") {
  TempDir dir("checkpoint");
  const optim::CosineSchedule sched{.lr = 2e-2, .total_steps = 6, .min_lr = 1e-3, .warmup_steps = 2};
  const optim::AdamWOptions adam_opts{.lr = 2e-2, .weight_decay = 1e-2};

  // Uninterrupted: 6 steps.
  std::vector<float> losses;
  nn::StateDict<float> final_state;
  {
    auto net = tiny_net(3);
    optim::AdamW<float> opt(net.parameters(), adam_opts);
    Rng data(2024);
    for (std::int64_t step = 0; step < 6; ++step) losses.push_back(train_step(net, opt, data, sched(step)));
    final_state = net.state_dict();
  }

  // Interrupted: 3 steps, checkpoint, everything dropped.
  const fs::path file = dir.path() / "run.ckpt";
  {
    auto net = tiny_net(3);
    optim::AdamW<float> opt(net.parameters(), adam_opts);
    Rng data(2024);
    std::int64_t step = 0;
    for (; step < 3; ++step) {
      const float loss = train_step(net, opt, data, sched(step));
      CHECK(std::bit_cast<std::uint32_t>(loss) == std::bit_cast<std::uint32_t>(losses[static_cast<std::size_t>(step)]));
    }
    Checkpoint c;
    nn::save_module(c, "model", net);
    opt.save_state(c, "opt");
    c.put_int("step", step);
    nn::put_rng(c, "data_rng", data);
    c.save(file);
  }

  // Resumed: a differently initialised model, a fresh optimizer and Rng, all loaded.
  auto net = tiny_net(1000);
  optim::AdamW<float> opt(net.parameters(), {.lr = 0.5, .weight_decay = 1e-2});
  Rng data(1);
  const Checkpoint c = Checkpoint::load(file);
  nn::load_module(c, "model", net);
  opt.load_state(c, "opt");
  nn::get_rng(c, "data_rng", data);
  std::int64_t step = c.get_int("step");
  REQUIRE(step == 3);
  for (; step < 6; ++step) {
    const float loss = train_step(net, opt, data, sched(step));
    INFO("step " << step << ": resumed " << loss << ", uninterrupted " << losses[static_cast<std::size_t>(step)]);
    CHECK(std::bit_cast<std::uint32_t>(loss) == std::bit_cast<std::uint32_t>(losses[static_cast<std::size_t>(step)]));
  }
  const auto got = net.state_dict();
  REQUIRE(got.size() == final_state.size());
  for (const auto& [name, t] : final_state) {
    INFO(name);
    CHECK(bits_equal(got.at(name), t));
  }
}

TEST_CASE("checkpoint: damaged, foreign, empty and missing files give IoError with the reason", "[checkpoint]") {
  TempDir dir("checkpoint");
  Rng rng(3);
  Checkpoint c;
  c.put("w", Tensor<float>::randn(Shape{40, 25}, rng));  // 4000 bytes: the middle of the file is tensor data
  c.put_int("step", 12);
  c.put_string("note", "hello");
  const fs::path good = dir.path() / "good.ckpt";
  c.save(good);
  const std::vector<char> bytes = read_bytes(good);
  REQUIRE(bytes.size() > 4000);
  const fs::path bad = dir.path() / "bad.ckpt";
  auto load_bad = [&](const std::vector<char>& b) {
    write_bytes(bad, b);
    return io_error([&] { Checkpoint::load(bad); });
  };

  SECTION("truncated at every offset") {
    CHECK(has(load_bad({}), "empty file"));
    int wrong = 0;
    for (std::size_t cut = 1; cut < bytes.size(); ++cut) {
      const std::string msg = load_bad(std::vector<char>(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(cut)));
      if (!has(msg, "truncated") || !has(msg, bad.string())) {
        ++wrong;
        INFO("cut at " << cut << ": " << msg);
        CHECK(has(msg, "truncated"));
      }
    }
    CHECK(wrong == 0);
  }
  SECTION("a flipped byte in the middle fails the checksum") {
    auto b = bytes;
    b[b.size() / 2] = static_cast<char>(b[b.size() / 2] ^ 0x10);
    const std::string msg = load_bad(b);
    CHECK(has(msg, "corrupt: checksum mismatch"));
    CHECK(has(msg, bad.string()));
    // A damaged trailer too.
    b = bytes;
    b.back() = static_cast<char>(b.back() ^ 1);
    CHECK(has(load_bad(b), "checksum mismatch"));
  }
  SECTION("any flipped byte is an IoError, never a crash or a silent success") {
    int wrong = 0;
    for (std::size_t at = 0; at < bytes.size(); at += (at < 200 || at + 200 > bytes.size()) ? 1 : 97) {
      auto b = bytes;
      b[at] = static_cast<char>(b[at] ^ 0xff);
      const std::string msg = load_bad(b);
      const bool known = has(msg, "corrupt") || has(msg, "truncated") || has(msg, "not a cutrain checkpoint") ||
                         has(msg, "unsupported format version");
      if (!known) {
        ++wrong;
        INFO("byte " << at << ": " << msg);
        CHECK(known);
      }
    }
    CHECK(wrong == 0);
  }
  SECTION("wrong magic, other files, unknown version") {
    auto b = bytes;
    b[0] = 'X';
    CHECK(has(load_bad(b), "not a cutrain checkpoint (wrong magic)"));
    CHECK(has(load_bad({'h', 'e', 'l', 'l', 'o', '\n'}), "not a cutrain checkpoint"));
    CHECK(has(load_bad(std::vector<char>(bytes.begin(), bytes.begin() + 5)), "truncated"));  // starts like one
    b = bytes;
    poke<std::uint32_t>(b, 12, 2);
    CHECK(has(load_bad(b), "unsupported format version 2 (this build reads version 1)"));
    b = bytes;
    b.push_back(0);  // extra byte: the last 8 bytes are no longer the checksum
    CHECK(has(load_bad(b), "corrupt"));
  }
  SECTION("absurd sizes are refused before allocating") {
    // Header: magic (12), version (4), count (8); first record: name length (4) at 24, "w" at 28,
    // kind/dtype/layout at 29..31, rank (4) at 32, dims at 36 and 44, byte length at 52.
    REQUIRE(std::string(bytes.begin() + 28, bytes.begin() + 29) == "w");
    auto b = bytes;
    poke<std::uint64_t>(b, 16, std::numeric_limits<std::uint64_t>::max());
    CHECK(has(load_bad(b), "records cannot fit"));
    b = bytes;
    poke<std::uint32_t>(b, 24, std::numeric_limits<std::uint32_t>::max());
    CHECK(has(load_bad(b), "truncated or corrupt: the name of record 0 claims 4294967295 bytes"));
    b = bytes;
    poke<std::uint32_t>(b, 32, std::numeric_limits<std::uint32_t>::max());
    CHECK(has(load_bad(b), "claims rank 4294967295"));
    b = bytes;
    poke<std::uint64_t>(b, 52, std::uint64_t{1} << 62);
    CHECK(has(load_bad(b), "truncated or corrupt: record 0 (\"w\") claims 4611686018427387904 bytes"));
    b = bytes;
    poke<std::uint64_t>(b, 36, std::uint64_t{1} << 40);  // dims [2^40, 2^40]: the product overflows
    poke<std::uint64_t>(b, 44, std::uint64_t{1} << 40);
    CHECK(has(load_bad(b), "corrupt: record 0 (\"w\") holds 4000 bytes but its dtype and shape need more than 2^64"));
    b = bytes;
    poke<std::uint64_t>(b, 36, 41);  // [41, 25] floats is not 4000 bytes
    CHECK(has(load_bad(b), "holds 4000 bytes but its dtype and shape need 4100"));
    b = bytes;
    b[30] = 9;  // dtype code
    CHECK(has(load_bad(b), "unknown dtype code 9"));
  }
  SECTION("missing file and directories") {
    const std::string missing = io_error([&] { Checkpoint::load(dir.path() / "nope.ckpt"); });
    CHECK(has(missing, "nope.ckpt: no such file"));
    CHECK(has(io_error([&] { Checkpoint::load(dir.path()); }), "not a regular file"));
  }
  // The good file still loads after all that.
  CHECK(Checkpoint::load(good).get_int("step") == 12);
}

TEST_CASE("checkpoint: save writes atomically and cleans up after itself", "[checkpoint]") {
  TempDir dir("checkpoint");
  const fs::path file = dir.path() / "model.ckpt";
  Checkpoint a;
  a.put_int("version", 1);
  a.save(file);
  Checkpoint b;
  b.put_int("version", 2);
  b.put("w", Tensor<double>::full(Shape{100}, 1.5));
  b.save(file);  // over the existing one
  CHECK(dir.entries() == std::set<std::string>{"model.ckpt"});
  CHECK(Checkpoint::load(file).get_int("version") == 2);

  // A target that cannot be replaced (a directory): IoError naming it, the temp file removed.
  fs::create_directory(dir.path() / "sub");
  const std::string msg = io_error([&] { b.save(dir.path() / "sub"); });
  CHECK(has(msg, "cannot rename"));
  CHECK(has(msg, (dir.path() / "sub").string()));
  CHECK(dir.entries() == std::set<std::string>{"model.ckpt", "sub"});
  CHECK(fs::is_empty(dir.path() / "sub"));
  // A directory that does not exist.
  CHECK(has(io_error([&] { b.save(dir.path() / "no" / "such.ckpt"); }), "cannot create a temp file"));
  CHECK(dir.entries() == std::set<std::string>{"model.ckpt", "sub"});
  CHECK(Checkpoint::load(file).get_int("version") == 2);  // the old checkpoint is intact
}

TEST_CASE("checkpoint: load_state refuses mismatched optimizers and changes nothing", "[checkpoint]") {
  auto p = [](const Shape& s, double v) { return autograd::parameter(Tensor<double>::full(s, v)); };
  auto a1 = p(Shape{2, 3}, 1.0), a2 = p(Shape{4}, 2.0);
  optim::AdamW<double> src({a1, a2}, {.lr = 0.1});
  a1.grad() = Tensor<double>::full(Shape{2, 3}, 0.5);
  a2.grad() = Tensor<double>::full(Shape{4}, -0.5);
  src.step();
  src.step();
  Checkpoint c;
  src.save_state(c, "opt");

  auto b1 = p(Shape{2, 3}, 1.0), b2 = p(Shape{5}, 2.0);
  optim::AdamW<double> dst({b1, b2}, {.lr = 0.3});
  b1.grad() = Tensor<double>::full(Shape{2, 3}, 0.25);
  b2.grad() = Tensor<double>::full(Shape{5}, 0.25);
  dst.step();
  const auto m0 = dst.exp_avg(0).to_vector(), v0 = dst.exp_avg_sq(0).to_vector();
  auto unchanged = [&] {
    CHECK(dst.lr() == 0.3);
    CHECK(dst.step_count(0) == 1);
    CHECK(dst.step_count(1) == 1);
    CHECK(dst.exp_avg(0).to_vector() == m0);
    CHECK(dst.exp_avg_sq(0).to_vector() == v0);
  };
  // Parameter 1 has another shape; parameter 0 matches and must not be loaded either.
  CUTRAIN_REQUIRE_THROWS_OP(dst.load_state(c, "opt"), InvalidArgument, "parameter 1 is f64[5]");
  unchanged();
  optim::AdamW<double> fewer({b1});
  CUTRAIN_REQUIRE_THROWS_OP(fewer.load_state(c, "opt"), InvalidArgument, "state for 2 parameters, this optimizer has 1");
  CUTRAIN_REQUIRE_THROWS_OP(dst.load_state(c, "other"), InvalidArgument, "no optimizer state under \"other\"");
  optim::SGD<double> sgd({b1, b2}, {.lr = 0.2, .momentum = 0.9});
  CUTRAIN_REQUIRE_THROWS_OP(sgd.load_state(c, "opt"), InvalidArgument, "holds optim::AdamW state, not optim::SGD");
  // Same shapes, other dtype: the record says what it holds.
  auto f1 = autograd::parameter(Tensor<float>::zeros(Shape{2, 3}));
  auto f2 = autograd::parameter(Tensor<float>::zeros(Shape{4}));
  optim::AdamW<float> wrong_dtype({f1, f2});
  CUTRAIN_REQUIRE_THROWS_OP(wrong_dtype.load_state(c, "opt"), InvalidArgument, "is a f64 tensor [2,3], not f32");
  CHECK(wrong_dtype.step_count(0) == 0);
  // Inconsistent state (moments without a step count).
  Checkpoint broken;
  src.save_state(broken, "opt");
  broken.put_int("opt.1.step", 0);
  optim::AdamW<double> matching({p(Shape{2, 3}, 0.0), p(Shape{4}, 0.0)});
  CUTRAIN_REQUIRE_THROWS_OP(matching.load_state(broken, "opt"), InvalidArgument, "step count 0 with exp_avg");
  CHECK(matching.step_count(0) == 0);
  matching.load_state(c, "opt");
  CHECK(matching.step_count(1) == 2);
  unchanged();

  // SGD: a mismatched shape leaves the buffers and lr alone.
  sgd.step();
  const auto buf0 = sgd.momentum_buffer(0).to_vector();
  optim::SGD<double> other({p(Shape{2, 3}, 0.0), p(Shape{4}, 0.0)}, {.momentum = 0.9});
  Checkpoint s;
  other.save_state(s, "sgd");
  CUTRAIN_REQUIRE_THROWS_OP(sgd.load_state(s, "sgd"), InvalidArgument, "optim::SGD::load_state");
  CHECK(sgd.momentum_buffer(0).to_vector() == buf0);
  CHECK(sgd.lr() == 0.2);
  // And a matching one loads (the never-stepped optimizer has no buffers: they become undefined).
  optim::SGD<double> same({p(Shape{2, 3}, 0.0), p(Shape{5}, 0.0)}, {.lr = 0.7, .momentum = 0.9});
  same.save_state(s, "sgd");
  sgd.load_state(s, "sgd");
  CHECK_FALSE(sgd.momentum_buffer(0).defined());
  CHECK(sgd.lr() == 0.7);
}

}  // namespace cutrain_test_checkpoint
