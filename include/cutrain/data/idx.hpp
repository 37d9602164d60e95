// IDX files (the MNIST / Fashion-MNIST format), read straight from .gz with zlib.
// Only unsigned-byte data (type 0x08) is read: that is what the data sets use.
#pragma once

#include "cutrain/core/abi.hpp"
#include "cutrain/core/config.hpp"

#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "cutrain/core/tensor.hpp"

namespace cutrain::inline CUTRAIN_ABI::data {

struct IdxArray {
  std::vector<std::int64_t> dims;
  std::vector<std::uint8_t> values;
};

namespace detail {
class GzFile {
 public:
  explicit GzFile(const std::string& path) : f_(gzopen(path.c_str(), "rb")), path_(path) {
    CUTRAIN_REQUIRE(f_ != nullptr, IoError, "read_idx", "cannot open ", path);
  }
  ~GzFile() { if (f_) gzclose(f_); }
  GzFile(const GzFile&) = delete;
  GzFile& operator=(const GzFile&) = delete;

  // Reads exactly n bytes or throws, naming what was being read.
  void read(void* dst, std::size_t n, const char* what) {
    std::size_t got = 0;
    while (got < n) {
      const unsigned chunk = static_cast<unsigned>(std::min<std::size_t>(n - got, 1u << 30));
      const int r = gzread(f_, static_cast<char*>(dst) + got, chunk);
      if (r < 0) {
        int errnum = 0;
        const char* msg = gzerror(f_, &errnum);
        throw IoError("read_idx", cutrain::detail::cat(path_, ": corrupt gzip data while reading ", what, ": ", msg));
      }
      if (r == 0) break;
      got += static_cast<std::size_t>(r);
    }
    CUTRAIN_REQUIRE(got == n, IoError, "read_idx", path_, ": truncated: ", what, " needs ", n, " bytes, file has ", got);
  }
  // Reads n bytes into out, growing it as the bytes arrive: a header that claims more data than
  // the file holds costs at most twice what the file has, never what it claims.
  void read_growing(std::vector<std::uint8_t>& out, std::size_t n, const char* what) {
    out.clear();
    std::size_t got = 0;
    while (got < n) {
      const std::size_t want = std::min(n, std::max<std::size_t>(got * 2, std::size_t{1} << 20));
      out.resize(want);
      const std::size_t before = got;
      while (got < want) {
        const unsigned chunk = static_cast<unsigned>(std::min<std::size_t>(want - got, 1u << 30));
        const int r = gzread(f_, out.data() + got, chunk);
        if (r < 0) {
          int errnum = 0;
          const char* msg = gzerror(f_, &errnum);
          throw IoError("read_idx", cutrain::detail::cat(path_, ": corrupt gzip data while reading ", what, ": ", msg));
        }
        if (r == 0) break;
        got += static_cast<std::size_t>(r);
      }
      if (got < want || got == before) break;
    }
    CUTRAIN_REQUIRE(got == n, IoError, "read_idx", path_, ": truncated: ", what, " needs ", n, " bytes, file has ", got);
  }
  bool is_gzip() { return gzdirect(f_) == 0; }
  bool at_end() {
    char c;
    return gzread(f_, &c, 1) == 0;
  }

 private:
  gzFile f_;
  std::string path_;
};
}  // namespace detail

// Reads an IDX file (gzip-compressed or not: zlib reads both), checking the magic number,
// the dimensions and that the data is neither truncated nor followed by extra bytes.
inline IdxArray read_idx(const std::string& path) {
  detail::GzFile f(path);
  unsigned char magic[4];
  f.read(magic, 4, "the magic number");
  CUTRAIN_REQUIRE(magic[0] == 0 && magic[1] == 0, IoError, "read_idx", path, ": bad magic number (not an IDX file)");
  constexpr char hex[] = "0123456789abcdef";
  CUTRAIN_REQUIRE(magic[2] == 0x08, IoError, "read_idx", path, ": element type 0x", hex[magic[2] >> 4],
                  hex[magic[2] & 15], " is not unsigned byte (0x08)");
  const int rank = magic[3];
  CUTRAIN_REQUIRE(rank >= 1 && rank <= 4, IoError, "read_idx", path, ": unsupported rank ", rank);
  IdxArray a;
  std::int64_t n = 1;
  for (int i = 0; i < rank; ++i) {
    unsigned char b[4];
    f.read(b, 4, "the dimensions");
    const std::int64_t d = (std::int64_t{b[0]} << 24) | (b[1] << 16) | (b[2] << 8) | b[3];
    CUTRAIN_REQUIRE(d > 0 && d < (1 << 28), IoError, "read_idx", path, ": dimension ", i, " is ", d);
    a.dims.push_back(d);
    n *= d;
  }
  CUTRAIN_REQUIRE(n < (std::int64_t{1} << 33), IoError, "read_idx", path, ": ", n, " elements is implausibly many");
  // An uncompressed file's size is known: check it before reading. (zlib reads plain files as
  // they are; a gzip file's size says nothing exact, so read_growing bounds what it allocates.)
  std::error_code ec;
  const auto file_bytes = std::filesystem::file_size(path, ec);
  if (!ec && !f.is_gzip()) {
    const auto need = static_cast<std::uintmax_t>(4 + 4 * rank + n);
    CUTRAIN_REQUIRE(file_bytes >= need, IoError, "read_idx", path, ": truncated: the header claims ", Shape(a.dims), " (",
                    n, " bytes of data), the file has ", file_bytes, " bytes in all, not ", need);
  }
  f.read_growing(a.values, static_cast<std::size_t>(n), "the data");
  CUTRAIN_REQUIRE(f.at_end(), IoError, "read_idx", path, ": extra bytes after ", n, " elements");
  return a;
}

// Images scaled to [0, 1] as [N, 1, H, W] floats, labels as int32 [N].
template <class T>
struct ImageDataset {
  Tensor<T> images;
  Tensor<std::int32_t> labels;
  std::int64_t size() const { return labels.numel(); }
};

// The directory of Fashion-MNIST: $CUTRAIN_FASHION_MNIST_DIR, else the Debian package's.
inline std::string fashion_mnist_dir() {
  if (auto c = config(); !c->fashion_mnist_dir.empty()) return c->fashion_mnist_dir;
  return "/usr/share/datasets/fashion-mnist";
}

// split: "train" (60000) or "test" (10000).
template <class T = float>
ImageDataset<T> fashion_mnist(const std::string& split, const std::string& dir = fashion_mnist_dir()) {
  CUTRAIN_REQUIRE(split == "train" || split == "test", InvalidArgument, "fashion_mnist", "split must be train or test, got '",
                  split, "'");
  const std::string prefix = dir + "/" + (split == "train" ? "train" : "t10k");
  const std::string img_path = prefix + "-images-idx3-ubyte.gz", lbl_path = prefix + "-labels-idx1-ubyte.gz";
  CUTRAIN_REQUIRE(std::filesystem::exists(img_path) && std::filesystem::exists(lbl_path), IoError, "fashion_mnist",
                  "Fashion-MNIST not found in ", dir, " (install the Debian package dataset-fashion-mnist, or set ",
                  "CUTRAIN_FASHION_MNIST_DIR)");
  const IdxArray img = read_idx(img_path), lbl = read_idx(lbl_path);
  CUTRAIN_REQUIRE(img.dims.size() == 3 && lbl.dims.size() == 1 && img.dims[0] == lbl.dims[0], IoError, "fashion_mnist",
                  img_path, " and ", lbl_path, " disagree: ", Shape(img.dims), " images, ", Shape(lbl.dims), " labels");
  const std::int64_t n = img.dims[0], h = img.dims[1], w = img.dims[2];
  ImageDataset<T> ds{Tensor<T>({n, 1, h, w}), Tensor<std::int32_t>({n})};
  T* px = ds.images.data();
  for (std::size_t i = 0; i < img.values.size(); ++i) px[i] = static_cast<T>(img.values[i]) / T(255);
  for (std::int64_t i = 0; i < n; ++i) {
    CUTRAIN_REQUIRE(lbl.values[static_cast<std::size_t>(i)] < 10, IoError, "fashion_mnist", lbl_path, ": label ",
                    int(lbl.values[static_cast<std::size_t>(i)]), " at ", i, " is not a class 0-9");
    ds.labels.data()[i] = lbl.values[static_cast<std::size_t>(i)];
  }
  return ds;
}

}  // namespace cutrain::inline CUTRAIN_ABI::data
