// The checkpoint file's format (core/checkpoint.hpp): the codes of dtypes and layouts on disk,
// little-endian values, the CRC-32, and the Writer and Reader that stream a file in order,
// checking every length against what is left before the trailer. See docs/checkpoints.md.
#pragma once

#include "cutrain/core/abi.hpp"

#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "cutrain/core/dtype.hpp"
#include "cutrain/core/error.hpp"
#include "cutrain/core/files.hpp"
#include "cutrain/core/shape.hpp"
#include "cutrain/core/tensor.hpp"


namespace cutrain::inline CUTRAIN_ABI {

namespace detail::ckpt {

inline constexpr char magic[12] = {'C', 'U', 'T', 'R', 'A', 'I', 'N', 'C', 'K', 'P', 'T', '\0'};
inline constexpr std::uint32_t format_version = 1;
// The smallest record on disk: name length, kind, dtype, layout, rank, byte length.
inline constexpr std::uint64_t min_record_bytes = 4 + 1 + 1 + 1 + 4 + 8;
inline constexpr std::uint64_t trailer_bytes = 8;

// Codes on disk. They are spelled out rather than taken from the enums so that reordering an
// enum can never change what an existing file means.
enum class Kind : std::uint8_t { tensor = 1, int64 = 2, float64 = 3, string = 4 };

inline std::uint8_t dtype_code(DType d) {
  switch (d) {
    case DType::f64: return 1;
    case DType::f32: return 2;
    case DType::f16: return 3;
    case DType::bf16: return 4;
    case DType::i32: return 5;
    case DType::u8: return 6;
    case DType::i64: return 7;
  }
  return 0;
}
inline bool dtype_from_code(std::uint8_t c, DType& d) {
  constexpr DType all[] = {DType::f64, DType::f32, DType::f16, DType::bf16, DType::i32, DType::u8, DType::i64};
  if (c < 1 || c > 7) return false;
  d = all[c - 1];
  return true;
}
inline std::uint8_t layout_code(Layout l) {
  switch (l) {
    case Layout::row_major: return 1;
    case Layout::nchw: return 2;
    case Layout::nhwc: return 3;
    case Layout::strided: return 0;
  }
  return 0;
}
inline bool layout_from_code(std::uint8_t c, Layout& l) {
  constexpr Layout all[] = {Layout::row_major, Layout::nchw, Layout::nhwc};
  if (c < 1 || c > 3) return false;
  l = all[c - 1];
  return true;
}

// The file stores every multi-byte value little-endian; on a big-endian host each element of
// width `width` is reversed in place (a no-op everywhere cutrain is built today).
inline void to_little_endian(unsigned char* p, std::size_t bytes, std::size_t width) {
  if constexpr (std::endian::native == std::endian::big) {
    if (width > 1)
      for (std::size_t i = 0; i + width <= bytes; i += width) std::reverse(p + i, p + i + width);
  } else {
    (void)p, (void)bytes, (void)width;
  }
}

// zlib's crc32 takes a uInt length: feed large buffers in pieces.
inline std::uint32_t crc_update(std::uint32_t crc, const void* data, std::size_t n) {
  auto p = static_cast<const Bytef*>(data);
  uLong c = crc;
  while (n > 0) {
    const auto chunk = static_cast<uInt>(std::min<std::size_t>(n, std::size_t{1} << 30));
    c = crc32(c, p, chunk);
    p += chunk;
    n -= chunk;
  }
  return static_cast<std::uint32_t>(c);
}

inline std::string errno_text() { return std::strerror(errno); }

// Streams the file out, keeping the CRC of everything written.
class Writer {
 public:
  explicit Writer(files::AtomicFile& f) : f_(f) {}
  void bytes(const void* p, std::size_t n) {
    if (n == 0) return;
    f_.write(p, n);
    crc_ = crc_update(crc_, p, n);
  }
  template <class U>
  void scalar(U v) {
    static_assert(std::is_integral_v<U> && std::is_unsigned_v<U>);
    unsigned char b[sizeof(U)];
    for (std::size_t i = 0; i < sizeof(U); ++i) b[i] = static_cast<unsigned char>(v >> (8 * i));
    bytes(b, sizeof(U));
  }
  std::uint32_t crc() const { return crc_; }

 private:
  files::AtomicFile& f_;
  std::uint32_t crc_ = 0;
};

// Reads the file in order, checking every length against what is left before the trailer, so
// that no size field can make it allocate more than the file holds.
class Reader {
 public:
  Reader(std::FILE* f, std::uint64_t size, const std::filesystem::path& path) : f_(f), size_(size), path_(path) {}

  std::uint64_t pos() const { return pos_; }
  std::uint64_t size() const { return size_; }
  // Bytes left before the checksum trailer.
  std::uint64_t body_left() const { return pos_ + trailer_bytes <= size_ ? size_ - trailer_bytes - pos_ : 0; }

  [[noreturn]] void fail(std::string_view reason) const {
    throw IoError("Checkpoint::load", cat(path_.string(), ": ", reason));
  }
  [[noreturn]] void truncated(std::string_view what) const {
    fail(cat("truncated: the file (", size_, " bytes) ends inside ", what));
  }

  // Reads n bytes that must lie before the trailer.
  void body(void* dst, std::uint64_t n, std::string_view what) {
    if (n > body_left()) truncated(what);
    raw(dst, n, what);
  }
  template <class U>
  U scalar(std::string_view what) {
    unsigned char b[sizeof(U)];
    body(b, sizeof(U), what);
    return decode<U>(b);
  }
  // Reads n bytes anywhere in the file (the magic, the version and the trailer).
  void raw(void* dst, std::uint64_t n, std::string_view what) {
    if (n == 0) return;
    if (n > size_ - pos_) truncated(what);
    const auto got = std::fread(dst, 1, static_cast<std::size_t>(n), f_);
    if (got != n) {
      if (std::ferror(f_)) fail(cat("read failed: ", errno_text()));
      truncated(what);  // the file shrank while being read
    }
    pos_ += n;
  }
  void add_to_crc(const void* p, std::size_t n) { crc_ = crc_update(crc_, p, n); }
  std::uint32_t crc() const { return crc_; }

  template <class U>
  static U decode(const unsigned char* b) {
    U v = 0;
    for (std::size_t i = 0; i < sizeof(U); ++i) v = static_cast<U>(v | static_cast<U>(static_cast<U>(b[i]) << (8 * i)));
    return v;
  }

 private:
  std::FILE* f_;
  std::uint64_t size_;
  std::uint64_t pos_ = 0;
  const std::filesystem::path& path_;
  std::uint32_t crc_ = 0;
};

}  // namespace detail::ckpt

}  // namespace cutrain::inline CUTRAIN_ABI
