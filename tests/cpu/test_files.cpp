// core/files.hpp: where the caches live, and the atomic writer the caches and checkpoints share.
#include <catch2/catch.hpp>

#include "scoped_env.hpp"
#include "temp_dir.hpp"

#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>

#include "cutrain/core/files.hpp"

namespace cutrain_test_files {  // one per file: the unity build compiles files together

using namespace cutrain;
using Catch::Matchers::Contains;
using cutrain::test::ScopedEnv;
using cutrain::test::TempDir;
namespace fs = std::filesystem;

namespace {
std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
}  // namespace

TEST_CASE("files: cache_path follows its variable, an absolute XDG_CACHE_HOME, then HOME", "[files]") {
  ScopedEnv home("HOME", "/home/u");
  ScopedEnv xdg("XDG_CACHE_HOME", "/xdg");
  ScopedEnv own("CUTRAIN_TEST_CACHE", "/own/place");
  CHECK(files::cache_path("CUTRAIN_TEST_CACHE", "kernels") == fs::path("/own/place"));
  ::setenv("CUTRAIN_TEST_CACHE", "", 1);  // empty is unset
  CHECK(files::cache_path("CUTRAIN_TEST_CACHE", "kernels") == fs::path("/xdg/cutrain/kernels"));
  CHECK(files::cache_path("CUTRAIN_TEST_CACHE", "autotune.json") == fs::path("/xdg/cutrain/autotune.json"));
  ::setenv("XDG_CACHE_HOME", "relative/cache", 1);  // the XDG spec says to ignore a relative path
  CHECK(files::cache_path("CUTRAIN_TEST_CACHE", "kernels") == fs::path("/home/u/.cache/cutrain/kernels"));
  ::unsetenv("XDG_CACHE_HOME");
  CHECK(files::cache_path("CUTRAIN_TEST_CACHE", "kernels") == fs::path("/home/u/.cache/cutrain/kernels"));
  ::unsetenv("HOME");
  CHECK(files::cache_path("CUTRAIN_TEST_CACHE", "kernels").empty());
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
