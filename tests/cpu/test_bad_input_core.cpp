// Bad input to the core layer: undefined tensors, shapes whose counts overflow int64, indices
// out of range, and damaged IDX, checkpoint and JSON files. Each case asserts the exception type
// and that the message names the op and the offending shape or value.
#include <catch2/catch.hpp>
#include <zlib.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "bad_input.hpp"
#include "cutrain/autograd/var.hpp"
#include "cutrain/core/checkpoint.hpp"
#include "cutrain/core/json.hpp"
#include "cutrain/cpu.hpp"
#include "cutrain/data/idx.hpp"
#include "cutrain/data/loader.hpp"
#include "temp_dir.hpp"

namespace cutrain_test_bad_input_core {  // one per file: the unity build compiles files together

using namespace cutrain;
using cutrain::test::bad;
using cutrain::test::BadCase;

namespace {

using F = Tensor<float>;
constexpr std::int64_t big32 = std::int64_t{1} << 32;

F t23() { return F::zeros({2, 3}); }

void write_file(const std::filesystem::path& p, const std::vector<unsigned char>& bytes) {
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}
void write_gz(const std::filesystem::path& p, const std::vector<unsigned char>& bytes) {
  gzFile f = gzopen(p.c_str(), "wb");
  REQUIRE(f != nullptr);
  if (!bytes.empty()) gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
}
void be32(std::vector<unsigned char>& b, std::uint32_t v) {
  for (int i = 3; i >= 0; --i) b.push_back(static_cast<unsigned char>(v >> (8 * i)));
}
std::vector<unsigned char> idx_header(unsigned char type, std::vector<std::uint32_t> dims) {
  std::vector<unsigned char> b{0, 0, type, static_cast<unsigned char>(dims.size())};
  for (auto d : dims) be32(b, d);
  return b;
}

// A checkpoint file with one tensor record and a valid CRC, whatever its fields say.
struct CkptBytes {
  std::vector<unsigned char> b;
  void raw(const void* p, std::size_t n) { b.insert(b.end(), static_cast<const unsigned char*>(p), static_cast<const unsigned char*>(p) + n); }
  template <class U>
  void le(U v) {
    for (std::size_t i = 0; i < sizeof(U); ++i) b.push_back(static_cast<unsigned char>(static_cast<std::uint64_t>(v) >> (8 * i)));
  }
  std::vector<unsigned char> finish() const {
    std::vector<unsigned char> out = b;
    const auto crc = static_cast<std::uint64_t>(crc32(0, b.data(), static_cast<uInt>(b.size())));
    for (std::size_t i = 0; i < 8; ++i) out.push_back(static_cast<unsigned char>(crc >> (8 * i)));
    return out;
  }
};
std::vector<unsigned char> ckpt_one_tensor(std::uint8_t dtype, std::uint8_t layout, std::vector<std::uint64_t> dims,
                                           std::uint64_t len, std::uint32_t version = 1) {
  CkptBytes c;
  c.raw("CUTRAINCKPT", 12);
  c.le<std::uint32_t>(version);
  c.le<std::uint64_t>(1);
  c.le<std::uint32_t>(1);
  c.raw("t", 1);
  c.le<std::uint8_t>(1);  // tensor
  c.le<std::uint8_t>(dtype);
  c.le<std::uint8_t>(layout);
  c.le<std::uint32_t>(static_cast<std::uint32_t>(dims.size()));
  for (auto d : dims) c.le<std::uint64_t>(d);
  c.le<std::uint64_t>(len);
  for (std::uint64_t i = 0; i < len; ++i) c.b.push_back(0);
  return c.finish();
}

std::vector<BadCase> tensor_cases() {
  return {
      // Undefined (default-constructed) tensors: rank 0, numel 1, over no storage.
      bad<InvalidArgument>("clone of undefined", "Tensor::clone", {"undefined"}, [] { (void)F{}.clone(); }),
      bad<InvalidArgument>("to of undefined", "Tensor::to", {"undefined"}, [] { (void)F{}.to(Device::cpu()); }),
      bad<InvalidArgument>("contiguous of undefined", "Tensor::contiguous", {"undefined"},
                           [] { (void)F{}.contiguous(Layout::nhwc); }),
      bad<InvalidArgument>("to_vector of undefined", "Tensor::to_vector", {"undefined"}, [] { (void)F{}.to_vector(); }),
      bad<InvalidArgument>("fill of undefined", "Tensor::fill", {"undefined"}, [] { F{}.fill(1.0f); }),
      bad<InvalidArgument>("assign to undefined", "Tensor::assign", {"undefined"}, [] { F{}.assign({1.0f}); }),
      bad<InvalidArgument>("copy_from into undefined", "Tensor::copy_from", {"undefined"},
                           [] { F{}.copy_from(F::zeros({1})); }),
      bad<InvalidArgument>("copy_from an undefined source", "Tensor::copy_from", {"source", "undefined", "[2,3]"},
                           [] { t23().copy_from(F{}); }),
      bad<InvalidArgument>("reshape of undefined", "Tensor::reshape", {"undefined"}, [] { (void)F{}.reshape({1}); }),
      bad<InvalidArgument>("slice of undefined", "Tensor::slice", {"undefined"}, [] { (void)F{}.slice(0, 0, 0); }),
      bad<InvalidArgument>("flat of undefined", "Tensor::flat", {"undefined"}, [] { (void)F{}.flat(0); }),
      bad<InvalidArgument>("item of an undefined tensor", "Var::item", {"undefined"},
                           [] { (void)autograd::Var<float>(F{}).item(); }),
      bad<InvalidArgument>("item of a tensor of 6", "Var::item", {"[2,3]"}, [] { (void)autograd::Var<float>(t23()).item(); }),
      // Element and byte counts that overflow int64.
      bad<InvalidArgument>("Tensor of 2^64 elements", "Tensor", {"[4294967296,4294967296]", "overflows"},
                           [] { F t({big32, big32}); }),
      bad<InvalidArgument>("full of 2^62 elements", "Tensor", {"[2147483648,2147483648]", "4-byte", "overflows"},
                           [] { (void)F::full({big32 / 2, big32 / 2}, 1.0f); }),
      bad<InvalidArgument>("zeros with a zero dim hiding an overflowing stride", "Tensor",
                           {"[0,1099511627776,1099511627776]", "overflows"},
                           [] { (void)F::zeros({0, std::int64_t{1} << 40, std::int64_t{1} << 40}); }),
      bad<InvalidArgument>("double tensor of 2^61 elements", "Tensor", {"[2305843009213693952]", "8-byte"},
                           [] { Tensor<double> t({std::int64_t{1} << 61}); }),
      bad<InvalidArgument>("negative dim", "Tensor", {"[-1,2]", "negative"}, [] { F t({-1, 2}); }),
      bad<InvalidArgument>("from_vector onto an overflowing shape", "Tensor::from_vector",
                           {"[4294967296,4294967296]"}, [] { (void)F::from_vector({1.0f}, {big32, big32}); }),
      bad<InvalidArgument>("from_vector with too few values", "Tensor::from_vector", {"got 2 values", "[2,3]"},
                           [] { (void)F::from_vector({1.0f, 2.0f}, {2, 3}); }),
      bad<InvalidArgument>("randn with a negative dim", "Tensor::randn", {"[3,-2]", "negative"}, [] {
        Rng rng(1);
        (void)F::randn({3, -2}, rng);
      }),
      bad<InvalidArgument>("uniform of 2^64 elements", "Tensor::uniform", {"[4294967296,4294967296]"}, [] {
        Rng rng(1);
        (void)F::uniform({big32, big32}, rng, 0, 1);
      }),
      bad<InvalidArgument>("nhwc layout on a 3-d shape", "Tensor", {"nhwc", "[2,3,4]"},
                           [] { F t({2, 3, 4}, {.layout = Layout::nhwc}); }),
      bad<InvalidArgument>("allocating strided", "Tensor", {"strided"}, [] { F t({2}, {.layout = Layout::strided}); }),
      bad<InvalidArgument>("reshape to 2^64 elements", "Tensor::reshape", {"[4294967296,4294967296]"},
                           [] { (void)t23().reshape({big32, big32}); }),
      bad<InvalidArgument>("reshape to a negative dim", "Tensor::reshape", {"[-2,-3]", "negative"},
                           [] { (void)t23().reshape({-2, -3}); }),
      bad<InvalidArgument>("reshape changing the element count", "Tensor::reshape", {"[2,3]", "[7]", "differ"},
                           [] { (void)t23().reshape({7}); }),
      bad<InvalidArgument>("reshape of an nhwc tensor", "Tensor::reshape", {"nhwc", "contiguous"},
                           [] { (void)F({1, 2, 2, 2}, {.layout = Layout::nhwc}).reshape({8}); }),
      bad<InvalidArgument>("Shape::numel overflowing", "Shape::numel", {"[4294967296,4294967296]", "overflows"},
                           [] { (void)Shape({big32, big32}).numel(); }),
      // Indices.
      bad<InvalidArgument>("operator() with more indices than the rank", "Tensor::operator()",
                           {"3 indices", "[2,3]", "rank 2"}, [] { (void)t23()(0, 0, 0); }),
      bad<InvalidArgument>("operator() with fewer indices than the rank", "Tensor::operator()", {"1 indices", "[2,3]"},
                           [] { (void)t23()(1); }),
      bad<InvalidArgument>("operator() past dim 0", "Tensor::operator()", {"index 2", "dim 0", "[2,3]"},
                           [] { (void)t23()(2, 0); }),
      bad<InvalidArgument>("operator() negative index", "Tensor::operator()", {"index -1", "dim 1"},
                           [] { (void)t23()(0, -1); }),
      bad<InvalidArgument>("flat past the end", "Tensor::flat", {"index 6", "[2,3]", "6 elements"},
                           [] { (void)t23().flat(6); }),
      bad<InvalidArgument>("flat negative", "Tensor::flat", {"index -1"}, [] { (void)t23().flat(-1); }),
      bad<InvalidArgument>("dim(5) of a 2-d tensor", "Tensor::dim", {"dim 5", "[2,3]", "rank 2"},
                           [] { (void)t23().dim(5); }),
      bad<InvalidArgument>("dim(-1)", "Tensor::dim", {"dim -1"}, [] { (void)t23().dim(-1); }),
      bad<InvalidArgument>("Shape index 7", "Shape", {"dim 7", "[2,3]", "rank 2"}, [] { (void)Shape({2, 3})[7]; }),
      bad<InvalidArgument>("slice dim out of range", "Tensor::slice", {"dim 3", "[2,3]"},
                           [] { (void)t23().slice(3, 0, 1); }),
      bad<InvalidArgument>("slice range past the end", "Tensor::slice", {"[0,5)", "dim 1"},
                           [] { (void)t23().slice(1, 0, 5); }),
      bad<InvalidArgument>("slice begin after end", "Tensor::slice", {"[2,1)"}, [] { (void)t23().slice(1, 2, 1); }),
      bad<InvalidArgument>("copy_from another shape", "Tensor::copy_from", {"[3,2]", "[2,3]", "differ in shape"},
                           [] { t23().copy_from(F::zeros({3, 2})); }),
      bad<InvalidArgument>("assign the wrong count", "Tensor::assign", {"got 1 values", "[2,3]"},
                           [] { t23().assign({1.0f}); }),
      bad<InvalidArgument>("nhwc strides of a 3-d shape", "contiguous_strides", {"nhwc", "[1,2,3]"},
                           [] { (void)contiguous_strides(Shape{1, 2, 3}, Layout::nhwc); }),
      bad<DeviceError>("a cuda tensor without a backend", "Storage", {"cuda"},
                       [] { F t({2}, {.device = Device::cuda(0)}); }),
  };
}

std::vector<BadCase> file_cases(const test::TempDir& dir) {
  const auto p = [&](const std::string& n) { return (dir / n).string(); };
  // IDX files.
  write_file(p("type0d.idx"), idx_header(0x0d, {2}));
  write_file(p("type1f.idx"), idx_header(0x1f, {2}));
  write_file(p("rank5.idx"), idx_header(0x08, {1, 1, 1, 1, 1}));
  write_file(p("rank0.idx"), idx_header(0x08, {}));
  write_file(p("dim0.idx"), idx_header(0x08, {3, 0}));
  write_file(p("dimhuge.idx"), idx_header(0x08, {1u << 28}));
  // The issue's 24-byte file: a header claiming (2^28 - 1) x 2 x 2 bytes (1 GiB), then 8 bytes.
  auto claims = idx_header(0x08, {(1u << 28) - 1, 2, 2});
  claims.resize(claims.size() + 8);
  write_file(p("claims.idx"), claims);
  write_gz(p("claims.idx.gz"), claims);
  write_file(p("magic.idx"), {0x1f, 0x00, 0x08, 0x01, 0, 0, 0, 1, 7});
  auto extra = idx_header(0x08, {2});
  extra.insert(extra.end(), {1, 2, 3});
  write_file(p("extra.idx"), extra);
  write_file(p("short.idx"), {0, 0});
  // Checkpoints.
  write_file(p("empty.ckpt"), {});
  write_file(p("magic.ckpt"), {'N', 'O', 'T', 'A', 'C', 'K', 'P', 'T', 0, 0, 0, 0, 1, 0, 0, 0});
  write_file(p("version.ckpt"), ckpt_one_tensor(2, 1, {2}, 8, 7));
  write_file(p("overflow.ckpt"), ckpt_one_tensor(2, 1, {0, 1ull << 40, 1ull << 40}, 0));
  write_file(p("int64dim.ckpt"), ckpt_one_tensor(6, 1, {1ull << 63}, 0));
  write_file(p("dtype.ckpt"), ckpt_one_tensor(9, 1, {2}, 8));
  write_file(p("layout.ckpt"), ckpt_one_tensor(2, 3, {2}, 8));
  write_file(p("len.ckpt"), ckpt_one_tensor(2, 1, {2}, 12));
  auto bad_crc = ckpt_one_tensor(2, 1, {2}, 8);
  bad_crc[bad_crc.size() - 9] ^= 0x40;
  write_file(p("crc.ckpt"), bad_crc);
  auto trunc = ckpt_one_tensor(2, 1, {2}, 8);
  trunc.resize(trunc.size() - 11);
  write_file(p("trunc.ckpt"), trunc);

  return {
      bad<IoError>("IDX missing file", "read_idx", {"nope.idx"}, [=] { (void)data::read_idx(p("nope.idx")); }),
      bad<IoError>("IDX float data, type in hex", "read_idx", {"element type 0x0d", "0x08"},
                   [=] { (void)data::read_idx(p("type0d.idx")); }),
      bad<IoError>("IDX type 0x1f in hex", "read_idx", {"element type 0x1f"}, [=] { (void)data::read_idx(p("type1f.idx")); }),
      bad<IoError>("IDX rank 5", "read_idx", {"unsupported rank 5"}, [=] { (void)data::read_idx(p("rank5.idx")); }),
      bad<IoError>("IDX rank 0", "read_idx", {"unsupported rank 0"}, [=] { (void)data::read_idx(p("rank0.idx")); }),
      bad<IoError>("IDX zero dimension", "read_idx", {"dimension 1 is 0"}, [=] { (void)data::read_idx(p("dim0.idx")); }),
      bad<IoError>("IDX dimension 2^28", "read_idx", {"dimension 0 is 268435456"},
                   [=] { (void)data::read_idx(p("dimhuge.idx")); }),
      bad<IoError>("IDX header claiming 2^28 rows, plain file", "read_idx",
                   {"truncated", "[268435455,2,2]", "the file has 24 bytes"}, [=] { (void)data::read_idx(p("claims.idx")); }),
      bad<IoError>("IDX header claiming 2^28 rows, gzip", "read_idx", {"truncated", "file has 8"},
                   [=] { (void)data::read_idx(p("claims.idx.gz")); }),
      bad<IoError>("IDX bad magic", "read_idx", {"bad magic"}, [=] { (void)data::read_idx(p("magic.idx")); }),
      bad<IoError>("IDX extra bytes", "read_idx", {"extra bytes after 2 elements"},
                   [=] { (void)data::read_idx(p("extra.idx")); }),
      bad<IoError>("IDX 2-byte file", "read_idx", {"truncated", "magic number"}, [=] { (void)data::read_idx(p("short.idx")); }),
      bad<IoError>("checkpoint missing", "Checkpoint::load", {"no such file"}, [=] { (void)Checkpoint::load(p("nope.ckpt")); }),
      bad<IoError>("checkpoint empty", "Checkpoint::load", {"empty file"}, [=] { (void)Checkpoint::load(p("empty.ckpt")); }),
      bad<IoError>("checkpoint a directory", "Checkpoint::load", {"not a regular file"},
                   [d = dir.path()] { (void)Checkpoint::load(d); }),
      bad<IoError>("checkpoint wrong magic", "Checkpoint::load", {"wrong magic"},
                   [=] { (void)Checkpoint::load(p("magic.ckpt")); }),
      bad<IoError>("checkpoint version 7", "Checkpoint::load", {"unsupported format version 7"},
                   [=] { (void)Checkpoint::load(p("version.ckpt")); }),
      bad<IoError>("checkpoint with a valid CRC and a shape whose strides overflow", "Checkpoint::load",
                   {"[0,1099511627776,1099511627776]", "too large"}, [=] { (void)Checkpoint::load(p("overflow.ckpt")); }),
      bad<IoError>("checkpoint with a dim of 2^63", "Checkpoint::load", {"negative dimension"},
                   [=] { (void)Checkpoint::load(p("int64dim.ckpt")); }),
      bad<IoError>("checkpoint unknown dtype", "Checkpoint::load", {"unknown dtype code 9"},
                   [=] { (void)Checkpoint::load(p("dtype.ckpt")); }),
      bad<IoError>("checkpoint nhwc at rank 1", "Checkpoint::load", {"nhwc", "rank 1"},
                   [=] { (void)Checkpoint::load(p("layout.ckpt")); }),
      bad<IoError>("checkpoint byte length disagreeing with the shape", "Checkpoint::load", {"holds 12 bytes", "need 8"},
                   [=] { (void)Checkpoint::load(p("len.ckpt")); }),
      bad<IoError>("checkpoint checksum", "Checkpoint::load", {"checksum mismatch"},
                   [=] { (void)Checkpoint::load(p("crc.ckpt")); }),
      bad<IoError>("checkpoint truncated", "Checkpoint::load", {"truncated"}, [=] { (void)Checkpoint::load(p("trunc.ckpt")); }),
      bad<InvalidArgument>("checkpoint put of undefined", "Checkpoint::put", {"\"w\"", "undefined"}, [] {
        Checkpoint c;
        c.put("w", F{});
      }),
      bad<InvalidArgument>("checkpoint empty name", "Checkpoint::put_int", {"must not be empty"}, [] {
        Checkpoint c;
        c.put_int("", 1);
      }),
      bad<InvalidArgument>("checkpoint get missing", "Checkpoint::get", {"no record \"w\""}, [] {
        Checkpoint c;
        (void)c.get<float>("w");
      }),
      bad<InvalidArgument>("checkpoint get wrong dtype", "Checkpoint::get", {"\"w\"", "f32", "f64"}, [] {
        Checkpoint c;
        c.put("w", F::zeros({2}));
        (void)c.get<double>("w");
      }),
      bad<InvalidArgument>("checkpoint get_int of a tensor", "Checkpoint::get_int", {"\"w\"", "not an int"}, [] {
        Checkpoint c;
        c.put("w", F::zeros({2}));
        (void)c.get_int("w");
      }),
      bad<InvalidArgument>("checkpoint get_like wrong shape", "Checkpoint::get", {"[2]", "[3]"}, [] {
        Checkpoint c;
        c.put("w", F::zeros({2}));
        (void)c.get_like("w", F::zeros({3}));
      }),
      bad<IoError>("checkpoint save to a directory name", "Checkpoint::save", {"not a file name"}, [d = dir.path()] {
        Checkpoint c;
        c.save(d / "");
      }),
      // JSON.
      bad<json::ParseError>("json unterminated object", "json::parse", {"parse error"}, [] { (void)json::parse("{"); }),
      bad<json::ParseError>("json duplicate key", "json::parse", {"duplicate key \"a\""},
                            [] { (void)json::parse(R"({"a": 1, "a": 2})"); }),
      bad<json::ParseError>("json too deep", "json::parse", {"deeper than 4"}, [] { (void)json::parse("[[[[[1]]]]]", 4); }),
      bad<json::ParseError>("json trailing garbage", "json::parse", {"parse error"}, [] { (void)json::parse("1 2"); }),
      bad<json::ParseError>("json 1e999", "json::parse", {"1e999"}, [] { (void)json::parse("1e999"); }),
      bad<InvalidArgument>("json missing key", "json::Value", {"missing key \"b\""},
                           [] { (void)json::at(json::parse(R"({"a": 1})"), "b"); }),
      bad<InvalidArgument>("json wrong kind", "json::Value", {"expected a boolean", "a string"},
                           [] { (void)json::as_bool(json::parse(R"("x")")); }),
      bad<InvalidArgument>("json dump NaN", "json::dump", {"nan", "no NaN"},
                           [] { (void)json::dump(json::Value(std::numeric_limits<double>::quiet_NaN())); }),
      // Data sets and the loader.
      bad<InvalidArgument>("fashion_mnist split val", "fashion_mnist", {"'val'"}, [] { (void)data::fashion_mnist("val"); }),
      bad<IoError>("fashion_mnist missing directory", "fashion_mnist", {"/nonexistent/fm"},
                   [] { (void)data::fashion_mnist("train", "/nonexistent/fm"); }),
      bad<InvalidArgument>("loader batch 0", "data::Loader", {"batch must be positive, got 0"}, [] {
        data::ImageDataset<float> ds{F::zeros({4, 1, 2, 2}), Tensor<std::int32_t>::zeros({4})};
        data::Loader<float> l(ds, {.batch = 0});
      }),
      bad<InvalidArgument>("loader normalize_std 0", "data::Loader", {"normalize_std", "0"}, [] {
        data::ImageDataset<float> ds{F::zeros({4, 1, 2, 2}), Tensor<std::int32_t>::zeros({4})};
        data::Loader<float> l(ds, {.normalize_std = 0});
      }),
      bad<InvalidArgument>("loader labels disagree", "data::Loader", {"N = 4 images", "[3]"}, [] {
        data::ImageDataset<float> ds{F::zeros({4, 1, 2, 2}), Tensor<std::int32_t>::zeros({3})};
        data::Loader<float> l(ds);
      }),
      bad<InvalidArgument>("loader crop padding past the image", "data::Loader", {"random_crop_padding", "5"}, [] {
        data::ImageDataset<float> ds{F::zeros({4, 1, 2, 2}), Tensor<std::int32_t>::zeros({4})};
        data::Loader<float> l(ds, {.random_crop_padding = 5});
      }),
      bad<InvalidArgument>("loader epoch -1", "data::Loader::set_epoch", {"got -1"}, [] {
        data::ImageDataset<float> ds{F::zeros({4, 1, 2, 2}), Tensor<std::int32_t>::zeros({4})};
        data::Loader<float> l(ds, {.batch = 2});
        l.set_epoch(-1);
      }),
  };
}

}  // namespace

TEST_CASE("bad input: tensors and shapes", "[bad_input]") { test::run_cases(tensor_cases()); }

TEST_CASE("bad input: IDX, checkpoint and JSON files, data sets", "[bad_input]") {
  test::TempDir dir("bad_input_files");
  test::run_cases(file_cases(dir));
}

// The 24-byte header of the issue makes the reader allocate what the file holds, not the 210 MB
// it claims: read_growing starts at 1 MiB. (Checked by the message: it fails on the first read.)
TEST_CASE("bad input: an IDX header claiming 2^28 rows is refused before allocating", "[bad_input]") {
  test::TempDir dir("bad_input_idx_claim");
  const auto path = dir / "claims.idx";
  auto bytes = idx_header(0x08, {(1u << 28) - 1, 1});
  bytes.resize(bytes.size() + 100);
  write_file(path, bytes);
  CHECK_THROWS_WITH(data::read_idx(path.string()), Catch::Matchers::Contains("the file has 112 bytes in all"));
  write_gz(dir / "claims.gz", bytes);
  CHECK_THROWS_WITH(data::read_idx((dir / "claims.gz").string()), Catch::Matchers::Contains("file has 100"));
}

std::size_t bad_input_core_case_count() {
  test::TempDir dir("bad_input_count");
  return tensor_cases().size() + file_cases(dir).size();
}

}  // namespace cutrain_test_bad_input_core
