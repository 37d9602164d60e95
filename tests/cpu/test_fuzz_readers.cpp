// Seeded random fuzzing of the file readers: the IDX reader (data/idx.hpp), the checkpoint
// reader (core/checkpoint.hpp) and the autotune cache reader (cuda/autotune/cache.hpp, host-only,
// over core/json.hpp). Each driver mutates a valid file (bit flips, truncations, length and size
// fields set huge, inserted and deleted bytes) and asserts that every mutant either loads or
// throws a cutrain::Error: no crash, no other exception, and no allocation beyond what the file
// could justify (peak RSS is checked). Seeds are fixed, so a failure reproduces.
#include <catch2/catch.hpp>
#include <sys/resource.h>
#include <zlib.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <random>
#include <typeinfo>
#include <string>
#include <vector>

#include "cutrain/core/checkpoint.hpp"
#include "cutrain/core/json.hpp"
#include "cutrain/cuda/autotune/cache.hpp"
#include "cutrain/data/idx.hpp"
#include "temp_dir.hpp"

namespace cutrain_test_fuzz_readers {  // one per file: the unity build compiles files together

using namespace cutrain;
using Bytes = std::vector<unsigned char>;

namespace {

// Each driver runs a fixed number of mutants (about 2 s in a Release build, a few times that
// under ASan); the time cap only guards a machine far slower than that.
constexpr auto time_budget = std::chrono::seconds(15);

Bytes read_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), {});
}
void write_bytes(const std::filesystem::path& p, const Bytes& b) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}
void write_gz(const std::filesystem::path& p, const Bytes& b) {
  gzFile f = gzopen(p.c_str(), "wb");
  REQUIRE(f != nullptr);
  if (!b.empty()) gzwrite(f, b.data(), static_cast<unsigned>(b.size()));
  gzclose(f);
}
// How much the peak RSS may grow during one driver. ASan keeps freed blocks in its quarantine
// (256 MiB by default) and has its own overhead, so under it the bound is looser.
#if defined(__SANITIZE_ADDRESS__)
constexpr long rss_growth_limit_kib = 1024 * 1024;
#else
constexpr long rss_growth_limit_kib = 256 * 1024;
#endif
long peak_rss_kib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

// Values a length or size field is most likely to be wrong with.
std::uint64_t interesting(std::mt19937_64& rng) {
  static constexpr std::uint64_t values[] = {0,
                                             1,
                                             2,
                                             0x7f,
                                             0xff,
                                             0xffff,
                                             (1ull << 28) - 1,
                                             1ull << 28,
                                             0x7fffffffull,
                                             0x80000000ull,
                                             0xffffffffull,
                                             1ull << 32,
                                             1ull << 40,
                                             0x7fffffffffffffffull,
                                             0x8000000000000000ull,
                                             0xffffffffffffffffull};
  if (rng() % 4 == 0) return rng();
  return values[rng() % std::size(values)];
}

// One random mutation of b: flips, a truncation, a field overwritten with an interesting value
// (width 1, 4 or 8, little- or big-endian), bytes inserted or erased.
void mutate(Bytes& b, std::mt19937_64& rng) {
  const auto at = [&](std::size_t n) { return n ? static_cast<std::size_t>(rng() % n) : 0; };
  switch (rng() % 6) {
    case 0:
      for (int k = 1 + static_cast<int>(rng() % 4); k > 0 && !b.empty(); --k) b[at(b.size())] ^= static_cast<unsigned char>(1u << (rng() % 8));
      break;
    case 1:
      b.resize(at(b.size() + 1));
      break;
    case 2: {
      const std::size_t width = std::array<std::size_t, 3>{1, 4, 8}[rng() % 3];
      if (b.size() < width) break;
      const std::size_t pos = at(b.size() - width + 1);
      const std::uint64_t v = interesting(rng);
      const bool big = rng() % 2;
      for (std::size_t i = 0; i < width; ++i)
        b[pos + i] = static_cast<unsigned char>(v >> (8 * (big ? width - 1 - i : i)));
      break;
    }
    case 3: {
      const std::size_t pos = at(b.size() + 1);
      Bytes ins(1 + at(16));
      for (auto& c : ins) c = static_cast<unsigned char>(rng());
      b.insert(b.begin() + static_cast<std::ptrdiff_t>(pos), ins.begin(), ins.end());
      break;
    }
    case 4:
      if (!b.empty()) {
        const std::size_t pos = at(b.size());
        b.erase(b.begin() + static_cast<std::ptrdiff_t>(pos),
                b.begin() + static_cast<std::ptrdiff_t>(std::min(b.size(), pos + 1 + at(16))));
      }
      break;
    default:
      if (!b.empty()) b[at(b.size())] = static_cast<unsigned char>(rng());
      break;
  }
}

// Runs load(): loading or a cutrain::Error are both fine; anything else fails the test.
template <class Load>
void expect_load_or_error(Load&& load, std::uint64_t seed, int iteration, int& loaded, int& refused) {
  try {
    load();
    ++loaded;
  } catch (const Error&) {
    ++refused;
  } catch (const std::exception& e) {
    FAIL("seed " << seed << " iteration " << iteration << ": " << typeid(e).name() << " escaped: " << e.what());
  }
}

Bytes idx_file() {
  Bytes b{0, 0, 0x08, 3, 0, 0, 0, 3, 0, 0, 0, 4, 0, 0, 0, 5};
  for (int i = 0; i < 60; ++i) b.push_back(static_cast<unsigned char>(i * 7));
  return b;
}

}  // namespace

TEST_CASE("fuzz: the IDX reader loads or throws cutrain::Error on mutated files", "[fuzz]") {
  test::TempDir dir("fuzz_idx");
  const auto plain = dir / "f.idx", gz = dir / "f.idx.gz";
  const Bytes good = idx_file();
  write_bytes(plain, good);
  REQUIRE(data::read_idx(plain.string()).values.size() == 60);
  write_gz(gz, good);
  const Bytes good_gz = read_bytes(gz);
  const long rss_before = peak_rss_kib();
  const auto start = std::chrono::steady_clock::now();
  int loaded = 0, refused = 0, run = 0;
  for (std::uint64_t seed = 1; seed <= 500 && std::chrono::steady_clock::now() - start < time_budget; ++seed, ++run) {
    std::mt19937_64 rng(seed);
    Bytes b = good;
    for (int k = 1 + static_cast<int>(rng() % 3); k > 0; --k) mutate(b, rng);
    switch (seed % 3) {
      case 0: write_bytes(plain, b); break;                     // a damaged plain file
      case 1: write_gz(plain, b); break;                        // damaged content, valid gzip
      default: {                                                // damaged gzip stream
        Bytes z = good_gz;
        mutate(z, rng);
        write_bytes(plain, z);
      }
    }
    expect_load_or_error([&] { (void)data::read_idx(plain.string()); }, seed, run, loaded, refused);
  }
  INFO("runs " << run << ", loaded " << loaded << ", refused " << refused);
  CHECK(run >= 100);
  CHECK(refused > 0);
  // A header may claim up to 2^33 bytes: the reader must allocate what the file holds instead.
  CHECK(peak_rss_kib() - rss_before < rss_growth_limit_kib);
}

TEST_CASE("fuzz: the checkpoint reader loads or throws cutrain::Error on mutated files", "[fuzz]") {
  test::TempDir dir("fuzz_ckpt");
  const auto path = dir / "c.ckpt";
  {
    Checkpoint c;
    c.put("conv.weight", Tensor<float>::full({2, 1, 3, 3}, 0.5f));
    c.put("bn.mean", Tensor<double>::full({3}, 1.5));
    c.put("nhwc", Tensor<float>::zeros({1, 2, 2, 2}, {.layout = Layout::nhwc}));
    c.put("labels", Tensor<std::int32_t>::full({4}, 7));
    c.put("empty", Tensor<float>::zeros({0, 3}));
    c.put_int("step", 12);
    c.put_double("lr", 0.1);
    c.put_string("type", "optim::SGD");
    c.save(path);
  }
  const Bytes good = read_bytes(path);
  REQUIRE(Checkpoint::load(path).size() == 8);
  const long rss_before = peak_rss_kib();
  const auto start = std::chrono::steady_clock::now();
  int loaded = 0, refused = 0, run = 0;
  for (std::uint64_t seed = 1; seed <= 500 && std::chrono::steady_clock::now() - start < time_budget; ++seed, ++run) {
    std::mt19937_64 rng(seed);
    Bytes b = good;
    for (int k = 1 + static_cast<int>(rng() % 3); k > 0; --k) mutate(b, rng);
    // Half the mutants get a valid checksum, so that what the fields say is what gets tested.
    if (seed % 2 == 0 && b.size() >= 8) {
      const auto crc = static_cast<std::uint64_t>(crc32(0, b.data(), static_cast<uInt>(b.size() - 8)));
      for (std::size_t i = 0; i < 8; ++i) b[b.size() - 8 + i] = static_cast<unsigned char>(crc >> (8 * i));
    }
    write_bytes(path, b);
    expect_load_or_error(
        [&] {
          const Checkpoint c = Checkpoint::load(path);
          // What loaded must be usable: every record read back as each kind (wrong kinds throw).
          for (const auto& n : c.names()) {
            for (const auto& get : std::initializer_list<std::function<void()>>{
                     [&] { (void)c.get<float>(n).to_vector(); }, [&] { (void)c.get<double>(n).to_vector(); },
                     [&] { (void)c.get<std::int32_t>(n).to_vector(); }, [&] { (void)c.get_int(n); },
                     [&] { (void)c.get_double(n); }, [&] { (void)c.get_string(n); }}) {
              try {
                get();
              } catch (const Error&) {
              }
            }
          }
        },
        seed, run, loaded, refused);
  }
  INFO("runs " << run << ", loaded " << loaded << ", refused " << refused);
  CHECK(run >= 100);
  CHECK(refused > 0);
  CHECK(loaded > 0);
  CHECK(peak_rss_kib() - rss_before < rss_growth_limit_kib);
}

namespace {
namespace at = cutrain::cuda::autotune;
at::Choice fuzz_choice(int i) {
  at::Choice c;
  c.engine_id = i;
  c.knobs = {{1, i}, {3, 0}};
  c.median_ms = 0.05 + i * 1e-3;
  c.workspace_bytes = std::int64_t{1} << 33;
  c.heuristic_ms = 0.06;
  c.candidates_tried = 12;
  c.candidates_failed = 2;
  c.tuning_ms = 40.25;
  if (i % 2) c.runner_up = at::RunnerUp{i + 1, {{2, 7}}, 0.051};
  if (i == 2) c.algo = "00ff10";
  return c;
}
// Mutations of JSON text that keep it closer to JSON than byte noise does.
void mutate_json(std::string& s, std::mt19937_64& rng) {
  static const char* tokens[] = {"1e999", "-1", "99999999999999999999", "null", "[]", "{}", "\"\\ud800\"", "\"x\"",
                                 "true", "0.5", "[[1,2],[3]]", "\xff", ",", ":", "\"engine_id\": 1, \"engine_id\"",
                                 "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1"};
  if (s.empty()) return;
  const std::size_t pos = static_cast<std::size_t>(rng() % s.size());
  if (rng() % 2) {
    const std::size_t len = static_cast<std::size_t>(rng() % 12);
    s.replace(pos, len, tokens[rng() % std::size(tokens)]);
  } else {
    Bytes b(s.begin(), s.end());
    mutate(b, rng);
    s.assign(b.begin(), b.end());
  }
}
}  // namespace

TEST_CASE("fuzz: the autotune cache reader and json::parse survive mutated files", "[fuzz]") {
  test::TempDir dir("fuzz_autotune");
  const auto path = dir / "autotune.json";
  const at::Environment env{"NVIDIA H200", 132, "9.0", 91900, 13200};
  {
    at::Cache c(path);
    c.set_warning_sink({});
    for (int i = 0; i < 4; ++i)
      c.insert(at::Key::make(i == 3 ? "linear.fwd+relu" : "conv2d.fprop", "x[" + std::to_string(i) + ",64,32,32]",
                             i == 3 ? "cublaslt" : "cudnn", env),
               fuzz_choice(i));
    c.save();
  }
  std::string good;
  {
    const Bytes b = read_bytes(path);
    good.assign(b.begin(), b.end());
  }
  {
    at::Cache c(path);
    REQUIRE(c.size() == 4);
  }
  const auto start = std::chrono::steady_clock::now();
  int loaded = 0, refused = 0, run = 0, warned = 0;
  for (std::uint64_t seed = 1; seed <= 300 && std::chrono::steady_clock::now() - start < time_budget; ++seed, ++run) {
    std::mt19937_64 rng(seed);
    std::string text = good;
    for (int k = 1 + static_cast<int>(rng() % 3); k > 0; --k) mutate_json(text, rng);
    // json::parse and the entry readers: a value, or a cutrain::Error.
    expect_load_or_error(
        [&] {
          const json::Value doc = json::parse(text);
          if (const auto* entries = doc.is_object() ? json::find(doc, "entries") : nullptr; entries && entries->is_array())
            for (const auto& e : *entries) {
              try {
                (void)at::detail::key_from_json(json::at(e, "key"));
                (void)at::detail::choice_from_json(json::at(e, "choice"));
              } catch (const Error&) {
              }
            }
        },
        seed, run, loaded, refused);
    // The cache itself never throws for a damaged file: it warns and starts empty.
    write_bytes(path, Bytes(text.begin(), text.end()));
    try {
      at::Cache c(path);
      c.set_environment(env);
      c.set_warning_sink([&](const std::string&) { ++warned; });
      (void)c.size();
      (void)c.entries();
      (void)c.find(at::Key::make("conv2d.fprop", "x[0,64,32,32]", "cudnn", env));
    } catch (const std::exception& e) {
      FAIL("seed " << seed << ": the cache threw " << typeid(e).name() << ": " << e.what());
    }
  }
  INFO("runs " << run << ", parsed " << loaded << ", refused " << refused << ", cache warnings " << warned);
  CHECK(run >= 100);
  CHECK(refused > 0);
  CHECK(warned > 0);
}

}  // namespace cutrain_test_fuzz_readers
