// The autotune cache: the JSON reader and writer under it, the file's round trip, keys and
// environments, damaged and foreign files, merging, and processes that save at the same time.
#include <catch2/catch.hpp>

#include "scoped_config.hpp"
#include "temp_dir.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cutrain/core/json.hpp"
#include "cutrain/cuda/autotune/cache.hpp"

namespace cutrain_test_autotune_cache {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::cuda::autotune;
using namespace std::string_literals;
using Catch::Matchers::Contains;
using cutrain::test::ScopedConfig;
using TempDir = cutrain::test::TempDir;

namespace {

std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  REQUIRE(in);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void write_text(const std::filesystem::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  REQUIRE(out);
  out << text;
}
std::vector<std::string> names_in(const std::filesystem::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

Environment h200() { return {"NVIDIA H200", 132, "9.0", 91900, 13200}; }
Environment a100() { return {"NVIDIA A100-SXM4-80GB", 108, "8.0", 91900, 13200}; }

Key conv_key(int i, const Environment& env = h200()) {
  return Key::make("conv2d.fprop", "x[" + std::to_string(i) + ",64,32,32] w[64,64,3,3] pad1 bf16 nhwc align16", "cudnn",
                   env);
}
Choice choice(int i) {
  Choice c;
  c.engine_id = i;
  c.knobs = {{1, i}, {3, 0}};
  c.median_ms = 0.05 + i * 1e-3;
  c.workspace_bytes = std::int64_t{1} << 33;
  c.heuristic_ms = 0.0612345678901234;
  c.candidates_tried = 12;
  c.candidates_failed = 2;
  c.tuning_ms = 40.25;
  c.runner_up = RunnerUp{i + 1, {{2, 7}}, 0.051 + i * 1e-3};
  return c;
}

// Collects a cache's warnings instead of printing them.
struct Warnings {
  std::mutex mutex;
  std::vector<std::string> messages;
  Cache::WarningSink sink() {
    return [this](const std::string& m) {
      std::lock_guard lock(mutex);
      messages.push_back(m);
    };
  }
};
void setup(Cache& c, Warnings& w, const Environment& env = h200()) {
  c.set_environment(env);
  c.set_warning_sink(w.sink());
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// JSON

TEST_CASE("json: every kind of value round-trips through dump and parse", "[autotune]") {
  const json::Value v = json::Value::object(
      {{"null", nullptr},
       {"yes", true},
       {"no", false},
       {"int", -42},
       {"max", std::numeric_limits<std::int64_t>::max()},
       {"min", std::numeric_limits<std::int64_t>::min()},
       {"pi", 3.141592653589793},
       {"tenth", 0.1},
       {"tiny", 5e-324},
       {"huge", 1.7976931348623157e308},
       {"neg0", -0.0},
       {"one", 1.0},
       {"text", "caf\xc3\xa9 \xf0\x9f\x98\x80 \"quoted\" back\\slash/\n\t\x01"},
       {"nul", "a\0b"s},
       {"list", json::Value::array({1, 2.5, "x", json::Value::array(), json::Value::object()})},
       {"nested", json::Value::object({{"knobs", json::Value::array({json::Value::array({1, 2}),
                                                                     json::Value::array({3, 0})})}})}});
  for (int indent : {0, 2, 4}) {
    INFO("indent " << indent);
    const std::string text = json::dump(v, indent);
    const json::Value back = json::parse(text);
    CHECK(back == v);
    CHECK(json::dump(back, indent) == text);  // stable: the same value gives the same bytes
  }
  const json::Value back = json::parse(json::dump(v));
  CHECK(back["max"].is_number_integer());
  CHECK(json::as_int(back["max"]) == std::numeric_limits<std::int64_t>::max());
  CHECK(json::as_int(back["min"]) == std::numeric_limits<std::int64_t>::min());
  CHECK(json::as_double(back["tiny"]) == 5e-324);
  CHECK(json::as_double(back["huge"]) == 1.7976931348623157e308);
  CHECK(std::signbit(json::as_double(back["neg0"])));
  CHECK(back["one"].is_number_float());  // a double stays a double
  CHECK(json::as_string(back["nul"]) == "a\0b"s);
  CHECK(json::dump(json::Value(1.0)) == "1.0");
  CHECK(json::dump(json::Value(0.1)) == "0.1");
  CHECK(json::dump(json::Value(1e300)) == "1e+300");
  CHECK(json::dump(json::Value(-7)) == "-7");

  // Layout: one member a line, arrays of scalars on one line, compact with indent 0.
  const auto doc = json::parse(R"( {"a":[1,2], "b":{"c":[[1,2]]}, "e":[], "o":{}} )");
  CHECK(json::dump(doc, 2) ==
        "{\n  \"a\": [1, 2],\n  \"b\": {\n    \"c\": [\n      [1, 2]\n    ]\n  },\n  \"e\": [],\n  \"o\": {}\n}");
  CHECK(json::dump(doc, 0) == R"({"a":[1,2],"b":{"c":[[1,2]]},"e":[],"o":{}})");
  // Keys keep their order.
  CHECK(json::dump(json::parse(R"({"z":1,"a":2})"), 0) == R"({"z":1,"a":2})");
}

TEST_CASE("json: as_int is exact as long as int64 holds the value", "[autotune]") {
  CHECK(json::as_int(json::parse("9223372036854775807")) == std::numeric_limits<std::int64_t>::max());
  CHECK(json::as_int(json::parse("-9223372036854775808")) == std::numeric_limits<std::int64_t>::min());
  CHECK(json::as_int(json::parse("123456789012345678")) == 123456789012345678);  // not a double's 53 bits
  CHECK_THROWS_AS(json::as_int(json::parse("9223372036854775808")), InvalidArgument);
  CHECK_THROWS_AS(json::as_int(json::Value(std::numeric_limits<std::uint64_t>::max())), InvalidArgument);
  CHECK(json::as_int(json::Value(std::uint64_t{42})) == 42);
  CHECK(json::as_int(json::parse("1e2")) == 100);  // an integral double reads as an integer
  CHECK_THROWS_WITH(json::as_int(json::parse("1.5")), Contains("expected an integer"));
  CHECK_THROWS_WITH(json::as_int(json::parse("\"7\"")), Contains("expected a number, got a string"));
}

TEST_CASE("json: escapes, \\u and surrogate pairs", "[autotune]") {
  const auto v = json::parse(R"("q\" b\\ s\/ \b\f\n\r\t \u0041\u00e9\u20AC \ud83d\ude00 \u0000")");
  CHECK(json::as_string(v) == "q\" b\\ s/ \b\f\n\r\t A\xc3\xa9\xe2\x82\xac \xf0\x9f\x98\x80 \0"s);
  CHECK(json::as_string(json::parse("\"raw \xc3\xa9 \xf0\x9f\x98\x80\"")) == "raw \xc3\xa9 \xf0\x9f\x98\x80");
  CHECK(json::dump(json::Value("\"\\/\b\f\n\r\t")) == R"("\"\\/\b\f\n\r\t")");
  CHECK(json::dump(json::Value("\x01\x1f\x7f"s + "\0"s)) == "\"\\u0001\\u001f\x7f\\u0000\"");
  CHECK(json::as_string(json::parse(json::dump(v))) == json::as_string(v));
}

TEST_CASE("json: bad input is a ParseError with the reason", "[autotune]") {
  static_assert(std::is_base_of_v<cutrain::Error, json::ParseError>);
  struct Bad {
    std::string text;
    std::string reason;  // empty: any of nlohmann's syntax errors
  };
  const std::vector<Bad> cases = {
      {"", ""},
      {" \n", ""},
      {"{} x", ""},
      {"{\"a\":1}}", ""},
      {"[1,]", ""},
      {"[1,2", ""},
      {"[1 2]", ""},
      {"{\"a\":1,}", ""},
      {"{1:2}", ""},
      {"{\"a\" 1}", ""},
      {"{\"a\":1,\"a\":2}", "duplicate key \"a\""},
      {"[{\"a\":1},{\"a\":2,\"b\":{\"a\":3},\"b\":4}]", "duplicate key \"b\""},
      {"\"abc", ""},
      {R"("\x")", ""},
      {R"("\u12G4")", ""},
      {R"("\u12)", ""},
      {R"("\ud800")", "surrogate"},
      {R"("\ud800\u0041")", "surrogate"},
      {R"("\udc00")", "surrogate"},
      {"\"a\x01\"", "control character"},
      {"\"\xff\"", "UTF-8"},
      {"\"\xc0\xaf\"", "UTF-8"},      // overlong '/'
      {"\"\xed\xa0\x80\"", "UTF-8"},  // an encoded surrogate
      {"\"\xe2\x82\"", "UTF-8"},      // truncated sequence
      {"01", ""},
      {"1.", ""},
      {".5", ""},
      {"+1", ""},
      {"-", ""},
      {"1e", ""},
      {"1e999", "number overflow"},
      {"nul", ""},
      {"NaN", ""},
      {std::string(65, '[') + std::string(65, ']'), "nesting deeper than 64 levels"},
      {std::string(1000000, '['), "nesting deeper than 64 levels"},
  };
  for (const auto& c : cases) {
    INFO("input: " << c.text.substr(0, 40));
    bool threw = false;
    try {
      (void)json::parse(c.text);
    } catch (const json::ParseError& e) {
      threw = true;
      CHECK_FALSE(e.reason().empty());
      CHECK_THAT(e.reason(), Contains(c.reason));
      CHECK_THAT(std::string(e.what()), Contains("json::parse: " + e.reason()));
      if (c.reason.empty()) CHECK_THAT(e.reason(), Contains("parse error at line"));
    }
    CHECK(threw);
  }
  // 64 levels is the limit, not beyond it.
  CHECK(json::parse(std::string(64, '[') + std::string(64, ']')).is_array());
  CHECK(json::parse("[1]", 1).is_array());
  CHECK_THROWS_AS(json::parse("[[1]]", 1), json::ParseError);
  std::string objects;
  for (int i = 0; i < 200; ++i) objects += "{\"a\":";
  CHECK_THROWS_AS(json::parse(objects), json::ParseError);
  // Objects count as arrays do: an array holding 63 nested objects is 64 levels, 64 are too many.
  const auto nested = [](int n) {
    std::string t = "[";
    for (int i = 0; i < n; ++i) t += "{\"a\":";
    return t + "1" + std::string(static_cast<std::size_t>(n), '}') + "]";
  };
  CHECK(json::parse(nested(63)).is_array());
  CHECK_THROWS_WITH(json::parse(nested(64)), Contains("nesting deeper than 64 levels"));
  // The same key in different objects is fine.
  CHECK(json::parse(R"({"a":{"a":1},"b":[{"a":2},{"a":3}]})").size() == 2);
}

TEST_CASE("json: values JSON cannot hold are refused, and reading names what was expected", "[autotune]") {
  CHECK_THROWS_WITH(json::dump(json::Value(std::nan(""))), Contains("json::dump") && Contains("NaN or infinity"));
  CHECK_THROWS_AS(json::dump(json::Value(std::numeric_limits<double>::infinity())), InvalidArgument);
  CHECK_THROWS_AS(json::dump(json::Value::array({1, std::nan("")})), InvalidArgument);
  CHECK_THROWS_WITH(json::dump(json::Value("ok \xff")),
                    Contains("json::dump") && Contains("UTF-8") && Contains("index 3"));
  CHECK_THROWS_WITH(json::dump(json::Value::object({{"ok \xff", 1}})), Contains("UTF-8"));
  CHECK(json::utf8_problem("caf\xc3\xa9").empty());
  CHECK_THAT(json::utf8_problem("GPU \xff"), Contains("UTF-8") && Contains("index 4"));
  CHECK_THROWS_WITH(json::as_string(json::Value(1)), Contains("expected a string, got a number"));
  CHECK_THROWS_WITH(json::as_array(json::Value::object()), Contains("expected an array, got an object"));
  CHECK_THROWS_WITH(json::as_double(json::Value("x")), Contains("expected a number, got a string"));
  CHECK_THROWS_WITH(json::as_bool(json::Value()), Contains("expected a boolean, got null"));
  CHECK(json::as_bool(json::Value(true)));
  CHECK_THROWS_WITH(json::at(json::parse("{}"), "engine_id"), Contains("missing key \"engine_id\""));
  CHECK_THROWS_WITH(json::at(json::parse("[]"), "engine_id"), Contains("expected an object, got an array"));
  CHECK(json::find(json::parse("{}"), "a") == nullptr);
  CHECK(json::as_int(*json::find(json::parse(R"({"a":3})"), "a")) == 3);
}

TEST_CASE("json: mutated cache files parse or throw cutrain::Error, never crash", "[autotune]") {
  // A real cache file is the seed, so that mutations hit the structure the cache reads.
  TempDir dir("autotune");
  {
    Warnings w;
    Cache c(dir / "seed.json");
    setup(c, w);
    for (int i = 0; i < 4; ++i) c.insert(conv_key(i), choice(i));
    c.insert(conv_key(7, a100()), choice(7));
    Choice blas = choice(9);
    blas.algo = "00ff10a0";
    c.insert(Key::make("linear.fwd+relu", "m512 n1024 k768 bf16 tn \"q\" caf\xc3\xa9", "cublaslt", h200()), blas);
    c.save();
    REQUIRE(w.messages.empty());
  }
  const std::string seed = read_text(dir / "seed.json");
  std::string alphabet = "{}[]\",:\\/0123456789.eE-+tfnulu \n\t\xff\x80\xc3";
  alphabet.push_back('\0');

  std::mt19937_64 rng(20261129);
  const auto below = [&rng](std::size_t n) { return n == 0 ? std::size_t{0} : static_cast<std::size_t>(rng() % n); };
  const auto mutate = [&](std::string s) {
    for (std::size_t e = 0, edits = 1 + below(4); e < edits; ++e) {
      const std::size_t at = below(s.size());
      switch (below(6)) {
        case 0: if (!s.empty()) s[at] = static_cast<char>(rng()); break;              // a random byte
        case 1: if (!s.empty()) s[at] = static_cast<char>(s[at] ^ (1 << below(8))); break;  // a flipped bit
        case 2: s.insert(at, 1, alphabet[below(alphabet.size())]); break;            // an inserted byte
        case 3: s.erase(at, 1 + below(8)); break;                                     // deleted bytes
        case 4: s.insert(at, s.substr(below(s.size()), below(16))); break;           // a duplicated run
        default: s.resize(at); break;                                                 // truncated
      }
    }
    return s;
  };

  int parsed = 0, rejected = 0, mismatched = 0;
  for (int round = 0; round < 20000; ++round) {
    const std::string s = mutate(seed);
    try {
      const json::Value v = json::parse(s);
      ++parsed;
      if (json::parse(json::dump(v)) != v) ++mismatched;
    } catch (const cutrain::Error&) {  // anything else escapes and fails the test
      ++rejected;
    }
  }
  INFO(parsed << " parsed, " << rejected << " rejected");
  CHECK(mismatched == 0);
  CHECK(parsed > 100);
  CHECK(rejected > 100);

  // The cache itself on mutated files: never throws, at most one warning, and save() leaves a
  // file that loads cleanly.
  int warned = 0;
  for (int round = 0; round < 200; ++round) {
    const auto path = dir / ("mutant" + std::to_string(round) + ".json");
    write_text(path, mutate(seed));
    Warnings w;
    Cache c(path);
    setup(c, w);
    CHECK(c.size() <= 6);
    (void)c.find(conv_key(1));
    CHECK(w.messages.size() <= 1);
    warned += !w.messages.empty();
    c.save();
    CHECK(w.messages.size() <= 1);
    Warnings w2;
    Cache again(path);
    setup(again, w2);
    CHECK(again.size() == c.size());
    CHECK(w2.messages.empty());
  }
  CHECK(warned > 20);
}

// ---------------------------------------------------------------------------------------------
// Keys

TEST_CASE("autotune: every key field takes part in equality, hash and text", "[autotune]") {
  const Key base = Key::make("conv2d.fprop", "sig", "cudnn", h200());
  CHECK(base.text() == "cudnn|conv2d.fprop|sig|NVIDIA H200|132|9.0|91900|13200");
  CHECK(base == Key::make("conv2d.fprop", "sig", "cudnn", h200()));
  CHECK(std::hash<Key>{}(base) == std::hash<Key>{}(Key::make("conv2d.fprop", "sig", "cudnn", h200())));
  CHECK(base.environment() == h200());
  CHECK(same_environment(base, h200()));
  CHECK_FALSE(same_environment(base, a100()));

  std::vector<std::pair<std::string, Key>> variants;
  const auto vary = [&](const std::string& name, auto change) {
    Key k = base;
    change(k);
    variants.emplace_back(name, k);
  };
  vary("op", [](Key& k) { k.op = "conv2d.dgrad+relu_bwd"; });
  vary("signature", [](Key& k) { k.signature = "sig2"; });
  vary("library", [](Key& k) { k.library = "cublaslt"; });
  vary("gpu_name", [](Key& k) { k.gpu_name = "NVIDIA H100 80GB HBM3"; });
  vary("sm_count", [](Key& k) { k.sm_count = 114; });
  vary("compute_capability", [](Key& k) { k.compute_capability = "9.1"; });
  vary("cudnn_version", [](Key& k) { k.cudnn_version = 91901; });
  vary("frontend_version", [](Key& k) { k.frontend_version = 13201; });
  const std::hash<Key> hash;
  for (std::size_t i = 0; i < variants.size(); ++i) {
    const auto& [name, k] = variants[i];
    INFO("changed: " << name);
    CHECK(k != base);
    CHECK(k.text() != base.text());
    CHECK(hash(k) != hash(base));
    if (i >= 3) CHECK_FALSE(same_environment(k, h200()));  // the environment fields
    else CHECK(same_environment(k, h200()));
    for (std::size_t j = 0; j < i; ++j) CHECK(k.text() != variants[j].second.text());
  }

  // Separators inside fields cannot make two different keys read the same.
  Key a = base, b = base;
  a.op = "x|y";
  a.signature = "z";
  b.op = "x";
  b.signature = "y|z";
  CHECK(a != b);
  CHECK(a.text() != b.text());
  Key c = base;
  c.signature = "a\\|b\n";
  CHECK_THAT(c.text(), Contains("|a\\\\\\|b\\x0a|"));
}

// ---------------------------------------------------------------------------------------------
// The cache file

TEST_CASE("autotune: the cache round-trips through its file", "[autotune]") {
  TempDir dir("autotune");
  const auto path = dir / "sub" / "autotune.json";  // save() creates the directory
  unsigned char algo_bytes[64];
  for (int i = 0; i < 64; ++i) algo_bytes[i] = static_cast<unsigned char>(i * 37);
  const Key blas_key = Key::make("linear.fwd+relu", "m512 n1024 k768 bf16 tn align16", "cublaslt", h200());
  Choice blas = choice(9);
  blas.algo = hex_encode(algo_bytes, sizeof algo_bytes);
  blas.runner_up.reset();
  blas.heuristic_ms = -1;
  Warnings w;
  {
    Cache c(path);
    setup(c, w);
    CHECK(c.size() == 0);  // no file yet: empty, and no warning
    CHECK_FALSE(c.find(conv_key(1)));
    for (int i = 0; i < 5; ++i) c.insert(conv_key(i), choice(i));
    c.insert(blas_key, blas);
    CHECK(c.find(conv_key(3)) == choice(3));
    CHECK(c.size() == 6);
    c.save();
  }
  CHECK(w.messages.empty());

  Cache d(path);
  setup(d, w);
  CHECK(d.size() == 6);
  for (int i = 0; i < 5; ++i) CHECK(d.find(conv_key(i)) == choice(i));
  REQUIRE(d.find(blas_key));
  CHECK(*d.find(blas_key) == blas);
  unsigned char back[64] = {};
  CHECK(hex_decode(d.find(blas_key)->algo, back, sizeof back));
  CHECK(std::equal(back, back + 64, algo_bytes));
  CHECK_FALSE(hex_decode("0g", back, 1));
  CHECK_FALSE(hex_decode("abc", back, 2));

  const std::string text = read_text(path);
  CHECK(text.starts_with("{\n  \"format\": \"cutrain-autotune\",\n  \"version\": 1,\n  \"entries\": [\n    {\n"));
  CHECK(text.ends_with("}\n"));
  const auto doc = json::parse(text);
  const auto& list = json::as_array(json::at(doc, "entries"));
  REQUIRE(list.size() == 6);
  std::vector<std::string> order;
  for (const auto& e : list) order.push_back(cutrain::cuda::autotune::detail::key_from_json(e.at("key")).text());
  CHECK(std::is_sorted(order.begin(), order.end()));  // stable and diffable
  CHECK(list[0]["key"]["library"] == "cublaslt");  // sorted by library first
  CHECK(list[0]["choice"]["algo"] == blas.algo);
  CHECK(json::find(list[1]["choice"], "algo") == nullptr);  // cuDNN entries carry no algo
  CHECK(names_in(path.parent_path()) == std::vector<std::string>{"autotune.json", "autotune.json.lock"});

  d.save();  // nothing changed: the same bytes
  CHECK(read_text(path) == text);
  CHECK(w.messages.empty());
}

TEST_CASE("autotune: entries of another GPU or library version stay in the file but are never found", "[autotune]") {
  TempDir dir("autotune");
  const auto path = dir / "autotune.json";
  Warnings w;
  {
    Cache other(path);
    setup(other, w, a100());
    other.insert(conv_key(1, a100()), choice(1));
    other.save();
  }
  // A field a newer writer might add survives in the entries this build does not own.
  std::string text = read_text(path);
  const auto at = text.find("\"tuning_ms\"");
  REQUIRE(at != std::string::npos);
  text.insert(at, "\"future_field\": [1, 2],\n        ");
  write_text(path, text);
  {
    Cache mine(path);
    setup(mine, w);
    CHECK(mine.size() == 1);
    CHECK_FALSE(mine.find(conv_key(1, a100())));  // another GPU
    CHECK_FALSE(mine.find(conv_key(1)));          // never tuned here
    mine.insert(conv_key(2), choice(2));
    CHECK(mine.find(conv_key(2)) == choice(2));
    Environment newer = h200();
    newer.cudnn_version = 92000;
    mine.set_environment(newer);
    CHECK_FALSE(mine.find(conv_key(2)));  // tuned with another cuDNN
    mine.set_environment(h200());
    mine.save();
  }
  CHECK(w.messages.empty());
  const std::string saved = read_text(path);
  CHECK_THAT(saved, Contains("\"future_field\": [1, 2]"));
  CHECK_THAT(saved, Contains("NVIDIA A100-SXM4-80GB"));
  Cache back(path);
  setup(back, w, a100());
  CHECK(back.size() == 2);
  CHECK(back.find(conv_key(1, a100())) == choice(1));
  CHECK_FALSE(back.find(conv_key(2)));
  CHECK(w.messages.empty());
}

TEST_CASE("autotune: a corrupt, truncated, empty or foreign file is one warning and an empty cache", "[autotune]") {
  TempDir dir("autotune");
  {
    Warnings w;
    Cache good(dir / "good.json");
    setup(good, w);
    for (int i = 0; i < 3; ++i) good.insert(conv_key(i), choice(i));
    good.save();
  }
  const std::string valid = read_text(dir / "good.json");
  struct Case {
    std::string name, text, warning;
  };
  const std::vector<Case> cases = {
      {"garbage", "\x7f" "ELF\x02\x01\x01 binary", "corrupt (not valid JSON: parse error at line 1, column 1"},
      {"truncated", valid.substr(0, valid.size() / 2), "corrupt (not valid JSON: parse error at line"},
      {"truncated_by_one", valid.substr(0, valid.size() - 2), "corrupt (not valid JSON: parse error at line"},
      {"empty", "", "the file is empty"},
      {"blank", " \n", "corrupt (not valid JSON: parse error at line 2, column 1"},
      {"duplicate_key", R"({"format": "cutrain-autotune", "format": "x"})", "duplicate key \"format\""},
      {"depth_bomb", std::string(100000, '['), "nesting deeper than 64"},
      {"other_format", R"({"format": "something-else", "version": 1, "entries": []})", "not a cutrain autotune cache"},
      {"no_format", "[1, 2, 3]", "not a cutrain autotune cache"},
      {"newer_version", R"({"format": "cutrain-autotune", "version": 2, "entries": []})", "format version 2 is not"},
      {"no_entries", R"({"format": "cutrain-autotune", "version": 1, "entries": {}})", "\"entries\" is not an array"},
  };
  for (const auto& c : cases) {
    INFO("case " << c.name);
    const auto path = dir / (c.name + ".json");
    write_text(path, c.text);
    Warnings w;
    Cache cache(path);
    setup(cache, w);
    CHECK(cache.size() == 0);
    CHECK_FALSE(cache.find(conv_key(1)));
    REQUIRE(w.messages.size() == 1);
    CHECK_THAT(w.messages[0], Contains(path.string()) && Contains(c.warning) && Contains("ignored"));
    cache.insert(conv_key(5), choice(5));
    cache.save();  // replaces the bad file; the same problem is not reported twice
    CHECK(w.messages.size() == 1);

    Warnings w2;
    Cache again(path);
    setup(again, w2);
    CHECK(again.size() == 1);
    CHECK(again.find(conv_key(5)) == choice(5));
    CHECK(w2.messages.empty());
  }

  // One bad entry costs that entry only.
  std::string text = valid;
  const auto at = text.find("\"median_ms\": ");
  REQUIRE(at != std::string::npos);
  text.replace(at, 13, "\"median_ms\": \"fast\", \"was\": ");
  write_text(dir / "one_bad.json", text);
  Warnings w;
  Cache partly(dir / "one_bad.json");
  setup(partly, w);
  CHECK(partly.size() == 2);
  REQUIRE(w.messages.size() == 1);
  CHECK_THAT(w.messages[0], Contains("1 malformed entry ignored") && Contains("expected a number, got a string"));

  // The default sink: one line on std::cerr.
  write_text(dir / "stderr.json", "{\"format\":");
  std::ostringstream captured;
  auto* old = std::cerr.rdbuf(captured.rdbuf());
  {
    Cache quiet(dir / "stderr.json");
    quiet.set_environment(h200());
    (void)quiet.find(conv_key(1));
    (void)quiet.size();
    quiet.save();
  }
  std::cerr.rdbuf(old);
  const std::string line = captured.str();
  CHECK(line.starts_with("cutrain: autotune cache: " + (dir / "stderr.json").string() + ": corrupt"));
  CHECK(std::count(line.begin(), line.end(), '\n') == 1);
  CHECK(json::parse(read_text(dir / "stderr.json"))["format"] == "cutrain-autotune");
}

TEST_CASE("autotune: a cache that cannot be written warns and keeps working in memory", "[autotune]") {
  TempDir dir("autotune");
  write_text(dir / "a_file", "x");
  Warnings w;
  Cache c(dir / "a_file" / "sub" / "autotune.json");  // its directory cannot exist
  setup(c, w);
  c.insert(conv_key(1), choice(1));
  c.save();
  c.save();
  REQUIRE(w.messages.size() == 1);  // not a line per save
  CHECK_THAT(w.messages[0], Contains("not saved: cannot create"));
  CHECK(c.find(conv_key(1)) == choice(1));

  // A directory where the file should be: unreadable and unwritable, still only warnings.
  std::filesystem::create_directories(dir / "a_dir.json");
  Warnings w2;
  Cache d(dir / "a_dir.json");
  setup(d, w2);
  CHECK(d.size() == 0);
  d.insert(conv_key(2), choice(2));
  d.save();
  REQUIRE(w2.messages.size() == 2);
  CHECK_THAT(w2.messages[0], Contains("not a regular file"));
  CHECK_THAT(w2.messages[1], Contains("not saved: cannot rename"));
  CHECK(d.find(conv_key(2)) == choice(2));
  // No temp file left behind.
  CHECK(names_in(dir.path()) == std::vector<std::string>{"a_dir.json", "a_dir.json.lock", "a_file"});

  // No path at all: a cache in memory only.
  Warnings w3;
  Cache memory({});
  setup(memory, w3);
  memory.insert(conv_key(3), choice(3));
  memory.save();
  CHECK(memory.find(conv_key(3)) == choice(3));
  CHECK(w3.messages.empty());
}

TEST_CASE("autotune: insert refuses what no file could hold", "[autotune]") {
  Warnings w;
  Cache c({});
  setup(c, w);
  const auto refuse = [&](Key k, Choice ch, const std::string& reason) {
    INFO("expecting: " << reason);
    CHECK_THROWS_AS(c.insert(k, ch), InvalidArgument);
    CHECK_THROWS_WITH(c.insert(k, ch), Contains("autotune::Cache::insert") && Contains(reason));
  };
  Choice bad = choice(1);
  bad.median_ms = std::nan("");
  refuse(conv_key(1), bad, "median_ms");
  bad = choice(1);
  bad.tuning_ms = std::numeric_limits<double>::infinity();
  refuse(conv_key(1), bad, "tuning_ms");
  bad = choice(1);
  bad.heuristic_ms = -2;
  refuse(conv_key(1), bad, "heuristic_ms");
  bad = choice(1);
  bad.workspace_bytes = -1;
  refuse(conv_key(1), bad, "workspace_bytes");
  bad = choice(1);
  bad.algo = "abc";
  refuse(conv_key(1), bad, "algo");
  bad.algo = "ABCD";
  refuse(conv_key(1), bad, "algo");
  Key k = conv_key(1);
  k.library = "cublas";
  refuse(k, choice(1), "library \"cublas\"");
  k = conv_key(1);
  k.op.clear();
  refuse(k, choice(1), "empty op");
  k = conv_key(1);
  k.gpu_name = "GPU \xff";
  refuse(k, choice(1), "not valid UTF-8");
  CHECK(c.size() == 0);
}

// ---------------------------------------------------------------------------------------------
// Merging and concurrency

TEST_CASE("autotune: save merges with the file as it is on disk", "[autotune]") {
  TempDir dir("autotune");
  const auto path = dir / "autotune.json";
  Warnings w;
  Cache a(path), b(path);
  setup(a, w);
  setup(b, w);
  Choice other = choice(2);
  other.engine_id = 99;

  a.insert(conv_key(1), choice(1));
  a.save();  // file: 1
  b.insert(conv_key(2), choice(2));
  b.save();  // file: 1, 2 (b keeps what a wrote)
  CHECK(b.find(conv_key(1)) == choice(1));
  a.insert(conv_key(2), other);
  a.save();  // both have 2: a's new value wins
  b.insert(conv_key(3), choice(3));
  b.save();  // b's older copy of 2 does not overwrite a's newer one
  CHECK(b.find(conv_key(2)) == other);

  Cache fresh(path);
  setup(fresh, w);
  CHECK(fresh.size() == 3);
  CHECK(fresh.find(conv_key(1)) == choice(1));
  CHECK(fresh.find(conv_key(2)) == other);
  CHECK(fresh.find(conv_key(3)) == choice(3));

  // clear() forgets memory only; the next save reads the file back.
  a.clear();
  CHECK(a.size() == 0);
  CHECK_FALSE(a.find(conv_key(1)));
  a.save();
  CHECK(a.size() == 3);
  CHECK(json::parse(read_text(path))["entries"].size() == 3);
  CHECK(w.messages.empty());
}

TEST_CASE("autotune: threads share one cache", "[autotune]") {
  TempDir dir("autotune");
  Warnings w;
  Cache c(dir / "autotune.json");
  setup(c, w);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&c, t] {
      for (int i = 0; i < 100; ++i) {
        c.insert(conv_key(1000 * t + i), choice(i));
        (void)c.find(conv_key(1000 * t + i / 2));
        if (i % 25 == 24) c.save();
      }
    });
  for (auto& t : threads) t.join();
  CHECK(c.size() == 400);
  Cache back(dir / "autotune.json");
  setup(back, w);
  CHECK(back.size() == 400);
  CHECK(w.messages.empty());
}

TEST_CASE("autotune: four processes saving at once lose no entry", "[autotune]") {
  TempDir dir("autotune");
  const auto path = dir / "shared" / "autotune.json";
  constexpr int children = 4, per_child = 50, own = 25;
  std::vector<pid_t> pids;
  for (int child = 0; child < children; ++child) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      // No Catch2 in the child: it answers through its exit status only.
      int status = 0;
      try {
        Cache cache(path);
        int warnings = 0;
        cache.set_environment(h200());
        cache.set_warning_sink([&](const std::string& m) {
          ++warnings;
          std::fprintf(stderr, "child %d: %s\n", child, m.c_str());
        });
        for (int i = 0; i < per_child; ++i) {
          cache.insert(conv_key(1000 * (child + 1) + i), choice(i));
          cache.save();
        }
        status = warnings == 0 ? 0 : 2;
      } catch (...) {
        status = 3;
      }
      ::_exit(status);
    }
    pids.push_back(pid);
  }
  Warnings w;
  {
    Cache parent(path);  // saving while the children do
    setup(parent, w);
    for (int i = 0; i < own; ++i) {
      parent.insert(conv_key(i), choice(i));
      parent.save();
    }
  }
  for (const pid_t pid : pids) {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
  CHECK(w.messages.empty());

  Cache all(path);
  setup(all, w);
  CHECK(all.size() == children * per_child + own);
  int missing = 0;
  for (int child = 0; child < children; ++child)
    for (int i = 0; i < per_child; ++i) missing += all.find(conv_key(1000 * (child + 1) + i)) != choice(i);
  for (int i = 0; i < own; ++i) missing += all.find(conv_key(i)) != choice(i);
  CHECK(missing == 0);
  CHECK(names_in(path.parent_path()) == std::vector<std::string>{"autotune.json", "autotune.json.lock"});
}

TEST_CASE("autotune: default_path follows CUTRAIN_AUTOTUNE_CACHE, XDG_CACHE_HOME, HOME", "[autotune]") {
  ScopedConfig home("HOME", "/home/u");
  ScopedConfig xdg("XDG_CACHE_HOME", "/xdg");
  {
    ScopedConfig cache("CUTRAIN_AUTOTUNE_CACHE", "/somewhere/tune.json");
    CHECK(Cache::default_path() == "/somewhere/tune.json");
  }
  {
    ScopedConfig cache("CUTRAIN_AUTOTUNE_CACHE", "");  // empty is unset
    CHECK(Cache::default_path() == "/xdg/cutrain/autotune.json");
  }
  ScopedConfig cache("CUTRAIN_AUTOTUNE_CACHE", "");
  {
    ScopedConfig relative("XDG_CACHE_HOME", "relative/cache");  // the XDG spec says to ignore a relative path
    CHECK(Cache::default_path() == "/home/u/.cache/cutrain/autotune.json");
  }
  ScopedConfig no_xdg("XDG_CACHE_HOME", "");
  CHECK(Cache::default_path() == "/home/u/.cache/cutrain/autotune.json");
  ScopedConfig no_home("HOME", "");
  CHECK(Cache::default_path().empty());  // nowhere to keep it: memory only
}

TEST_CASE("autotune: global_cache is one cache for the process", "[autotune]") {
  CHECK(&global_cache() == &global_cache());  // nothing is read or written until it is used
}

}  // namespace cutrain_test_autotune_cache
