// The IDX reader on good, truncated, corrupt and foreign files, and on the real data set.
#include "gradcheck.hpp"

#include <zlib.h>

#include <filesystem>
#include <fstream>

#include "cutrain/data/idx.hpp"

namespace cutrain_test_idx {  // one per file: the unity build compiles files together

using namespace cutrain;

namespace {
std::string temp_path(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / "cutrain_test_idx";
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}
void write_gz(const std::string& path, const std::vector<unsigned char>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) == static_cast<int>(bytes.size()));
  gzclose(f);
}
std::vector<unsigned char> idx3(int n, int h, int w) {
  std::vector<unsigned char> b = {0, 0, 8, 3, 0, 0, 0, static_cast<unsigned char>(n), 0, 0, 0,
                                  static_cast<unsigned char>(h), 0, 0, 0, static_cast<unsigned char>(w)};
  for (int i = 0; i < n * h * w; ++i) b.push_back(static_cast<unsigned char>(i * 7));
  return b;
}
}  // namespace

TEST_CASE("idx: reads a gzip IDX file") {
  const auto p = temp_path("good.gz");
  write_gz(p, idx3(2, 3, 4));
  const auto a = data::read_idx(p);
  CHECK(a.dims == std::vector<std::int64_t>{2, 3, 4});
  REQUIRE(a.values.size() == 24);
  CHECK(a.values[5] == 35);
}

TEST_CASE("idx: bad files throw IoError naming read_idx") {
  auto bytes = idx3(2, 3, 4);
  const auto truncated = temp_path("truncated.gz");
  write_gz(truncated, std::vector<unsigned char>(bytes.begin(), bytes.end() - 3));
  CUTRAIN_REQUIRE_THROWS_OP(data::read_idx(truncated), IoError, "read_idx");

  const auto header_only = temp_path("header.gz");
  write_gz(header_only, std::vector<unsigned char>(bytes.begin(), bytes.begin() + 6));
  CUTRAIN_REQUIRE_THROWS_OP(data::read_idx(header_only), IoError, "read_idx");

  auto bad_magic = bytes;
  bad_magic[0] = 0x1f;
  write_gz(temp_path("magic.gz"), bad_magic);
  CUTRAIN_REQUIRE_THROWS_OP(data::read_idx(temp_path("magic.gz")), IoError, "read_idx");

  auto bad_type = bytes;
  bad_type[2] = 0x0d;  // float data
  write_gz(temp_path("type.gz"), bad_type);
  CUTRAIN_REQUIRE_THROWS_OP(data::read_idx(temp_path("type.gz")), IoError, "read_idx");

  auto extra = bytes;
  extra.push_back(1);
  write_gz(temp_path("extra.gz"), extra);
  CUTRAIN_REQUIRE_THROWS_OP(data::read_idx(temp_path("extra.gz")), IoError, "read_idx");

  // A gzip stream whose compressed bytes were damaged.
  const auto corrupt = temp_path("corrupt.gz");
  write_gz(corrupt, idx3(4, 16, 16));
  std::string raw;
  {
    std::ifstream in(corrupt, std::ios::binary);
    raw.assign(std::istreambuf_iterator<char>(in), {});
  }
  for (std::size_t i = 20; i < raw.size() - 8; i += 3) raw[i] = static_cast<char>(raw[i] ^ 0x5a);
  std::ofstream(corrupt, std::ios::binary) << raw;
  CUTRAIN_REQUIRE_THROWS_OP(data::read_idx(corrupt), IoError, "read_idx");

  CUTRAIN_REQUIRE_THROWS_OP(data::read_idx(temp_path("does_not_exist.gz")), IoError, "read_idx");
  CUTRAIN_REQUIRE_THROWS_OP(data::fashion_mnist("train", temp_path("nowhere")), IoError, "fashion_mnist");
  CUTRAIN_REQUIRE_THROWS_OP(data::fashion_mnist("validation"), InvalidArgument, "fashion_mnist");
}

TEST_CASE("idx: the Fashion-MNIST test split") {
  if (!std::filesystem::exists(data::fashion_mnist_dir() + "/t10k-images-idx3-ubyte.gz")) {
    WARN("SKIPPED: Fashion-MNIST is not installed (Debian package dataset-fashion-mnist)");
    return;
  }
  const auto ds = data::fashion_mnist<float>("test");
  CHECK(ds.images.shape() == Shape{10000, 1, 28, 28});
  CHECK(ds.size() == 10000);
  std::vector<int> count(10);
  for (std::int64_t i = 0; i < ds.size(); ++i) ++count[static_cast<std::size_t>(ds.labels.data()[i])];
  for (int c : count) CHECK(c == 1000);  // the test split is balanced
}

}  // namespace cutrain_test_idx
