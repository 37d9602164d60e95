// core/files.hpp: where the caches live, and the atomic writer the caches and checkpoints share.
#include <catch2/catch.hpp>

#include "scoped_config.hpp"
#include "temp_dir.hpp"

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>

#include "cutrain/core/files.hpp"

namespace cutrain_test_files {  // one per file: the unity build compiles files together

using namespace cutrain;
using Catch::Matchers::Contains;
using cutrain::test::ScopedConfig;
using cutrain::test::TempDir;
namespace fs = std::filesystem;

namespace {
std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
}  // namespace

TEST_CASE("files: cache_path takes its chosen place, an absolute XDG_CACHE_HOME, then HOME", "[files]") {
  ScopedConfig home("HOME", "/home/u");
  {
    ScopedConfig xdg("XDG_CACHE_HOME", "/xdg");
    CHECK(files::cache_path("/own/place", "kernels") == fs::path("/own/place"));
    CHECK(files::cache_path("", "kernels") == fs::path("/xdg/cutrain/kernels"));  // empty: not chosen
    CHECK(files::cache_path("", "autotune.json") == fs::path("/xdg/cutrain/autotune.json"));
  }
  {
    ScopedConfig xdg("XDG_CACHE_HOME", "relative/cache");  // the XDG spec says to ignore a relative path
    CHECK(files::cache_path("", "kernels") == fs::path("/home/u/.cache/cutrain/kernels"));
  }
  ScopedConfig no_xdg("XDG_CACHE_HOME", "");
  CHECK(files::cache_path("", "kernels") == fs::path("/home/u/.cache/cutrain/kernels"));
  ScopedConfig no_home("HOME", "");
  CHECK(files::cache_path("", "kernels").empty());
}

TEST_CASE("Config: every variable read from a lookup, overrides nest and end in order", "[files][config]") {
  const std::map<std::string, std::string> env{
      {"CUTRAIN_AUTOTUNE", "benchmark"},   {"CUTRAIN_AUTOTUNE_CACHE", "/a.json"}, {"CUTRAIN_KERNEL_CACHE", "/k"},
      {"CUTRAIN_KERNEL_SEED", "/s1:/s2"},  {"CUTRAIN_KERNEL_PREFETCH", "0"},      {"CUTRAIN_PLAN_CACHE", "0"},
      {"CUTRAIN_PLAN_LOG", "1"},           {"CUTRAIN_CUDNN_FULL_ERRORS", "1"},    {"CUTRAIN_BN_FORWARD", "fast"},
      {"CUTRAIN_BN_BACKWARD", "cudnn"},    {"CUTRAIN_PROFILE", "1"},              {"CUTRAIN_PROFILE_DIR", "/p"},
      {"CUTRAIN_FASHION_MNIST_DIR", "/f"}, {"XDG_CACHE_HOME", "/x"},              {"HOME", "/h"}};
  REQUIRE(env.size() == Config::variables.size());
  const Config c = Config::from([&](const char* n) -> const char* {
    auto it = env.find(n);
    return it == env.end() ? nullptr : it->second.c_str();
  });
  CHECK(c.autotune == "benchmark");
  CHECK(c.autotune_cache == "/a.json");
  CHECK(c.kernel_cache == "/k");
  CHECK(c.kernel_seed == "/s1:/s2");
  CHECK_FALSE(c.kernel_prefetch);
  CHECK_FALSE(c.plan_cache);
  CHECK(c.plan_log);
  CHECK(c.cudnn_full_errors);
  CHECK(c.bn_forward == "fast");
  CHECK(c.bn_backward == "cudnn");
  CHECK(c.profile);
  CHECK(c.profile_dir == "/p");
  CHECK(c.fashion_mnist_dir == "/f");
  CHECK(c.xdg_cache_home == "/x");
  CHECK(c.home == "/h");
  // Nothing set: the defaults.
  const Config d = Config::from([](const char*) -> const char* { return nullptr; });
  CHECK(d.kernel_prefetch);
  CHECK(d.plan_cache);
  CHECK_FALSE(d.plan_log);
  CHECK_FALSE(d.profile);
  CHECK(d.kernel_cache.empty());
  Config e = d;
  CHECK_FALSE(Config::set(e, "CUTRAIN_NO_SUCH", "1"));

  const std::string before = config()->kernel_cache;
  {
    ConfigOverride outer([](Config& o) { o.kernel_cache = "/outer"; });
    CHECK(config()->kernel_cache == "/outer");
    {
      ConfigOverride inner([](Config& o) { o.plan_log = true; });
      CHECK(config()->kernel_cache == "/outer");  // an override starts from the one before it
      CHECK(config()->plan_log);
    }
    CHECK(config()->kernel_cache == "/outer");
    ConfigOverride moved = std::move(outer);  // the moved-to one ends it
  }
  CHECK(config()->kernel_cache == before);
  ConfigOverride nothing;  // changes nothing
  CHECK(config()->kernel_cache == before);
}

TEST_CASE("files: AtomicFile replaces a file whole on commit and leaves nothing otherwise", "[files]") {
  TempDir dir("files");
  const fs::path file = dir / "data.bin";
  files::write_atomically(file, "old");
  CHECK(read_text(file) == "old");

  // Larger than the writer's buffer, written in small and large pieces.
  std::string big;
  for (int i = 0; i < 300000; ++i) big += static_cast<char>('a' + i % 26);
  {
    files::AtomicFile f(file);
    f.write(std::string_view(big).substr(0, 10));
    CHECK(read_text(file) == "old");  // not yet
    f.write(std::string_view(big).substr(10, 100000));
    f.write(std::string_view(big).substr(100010));
    f.commit();
  }
  CHECK(read_text(file) == big);
  CHECK(dir.entries() == std::set<std::string>{"data.bin"});

  // Given up before commit (an exception, say): the old content stays and the temp file goes.
  {
    files::AtomicFile f(file);
    f.write("half");
    CHECK(dir.entries().size() == 2);  // data.bin and its data.bin.tmp-<pid>-<n>
  }
  CHECK(read_text(file) == big);
  CHECK(dir.entries() == std::set<std::string>{"data.bin"});
}

TEST_CASE("files: a failed write is a FileError naming the path and the reason", "[files]") {
  TempDir dir("files");
  const fs::path missing = dir / "no" / "such.bin";
  try {
    files::write_atomically(missing, "x", "Test::save");
    FAIL("no exception");
  } catch (const files::FileError& e) {
    CHECK(e.path() == missing);
    CHECK_THAT(e.reason(), Contains("cannot create a temp file in " + (dir / "no").string()) &&
                               Contains("No such file or directory"));
    CHECK_THAT(std::string(e.what()), Contains("cutrain::Test::save: " + missing.string() + ": cannot create"));
  }
  fs::create_directory(dir / "sub");
  CHECK_THROWS_AS(files::write_atomically(dir / "sub", "x"), IoError);  // a directory cannot be replaced
  CHECK_THROWS_WITH(files::write_atomically(dir / "sub", "x"), Contains("cannot rename the temp file over it"));
  CHECK(dir.entries() == std::set<std::string>{"sub"});
}

}  // namespace cutrain_test_files
