// What the weights-file readers and writers share (core/safetensors.hpp, core/npy.hpp): a file
// read in order with every failure an IoError naming the caller, the file and what it was
// reading; a tensor's elements as host row-major little-endian bytes; element conversion for
// the dtypes a file may hold that cutrain has no tensor for (64-bit integers).
#pragma once

#include "cutrain/core/abi.hpp"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "cutrain/core/any_tensor.hpp"
#include "cutrain/core/error.hpp"
#include "cutrain/core/files.hpp"
#include "cutrain/core/tensor.hpp"

namespace cutrain::inline CUTRAIN_ABI::detail::weights {

// A file opened for reading, checked to be a regular file. fail() and the reads throw
// IoError(op, "<path>: <reason>").
class InFile {
 public:
  InFile(const std::filesystem::path& path, std::string_view op) : path_(path), op_(op) {
    std::error_code ec;
    const auto st = std::filesystem::status(path, ec);
    if (ec && ec != std::errc::no_such_file_or_directory) fail(cat("cannot stat: ", ec.message()));
    if (!std::filesystem::exists(st)) fail("no such file");
    if (!std::filesystem::is_regular_file(st)) fail("not a regular file");
    size_ = std::filesystem::file_size(path, ec);
    if (ec) fail(cat("cannot read its size: ", ec.message()));
    f_ = std::fopen(path.string().c_str(), "rb");
    if (!f_) fail(cat("cannot open: ", files::errno_text(errno)));
  }
  InFile(const InFile&) = delete;
  InFile& operator=(const InFile&) = delete;
  ~InFile() {
    if (f_) std::fclose(f_);
  }

  std::uint64_t size() const { return size_; }
  std::uint64_t pos() const { return pos_; }
  std::uint64_t left() const { return size_ - pos_; }
  const std::filesystem::path& path() const { return path_; }

  [[noreturn]] void fail(std::string_view reason) const { throw IoError(op_, cat(path_.string(), ": ", reason)); }

  // Reads n bytes at the current position; a file that ends first is "truncated" inside `what`.
  void read(void* dst, std::uint64_t n, std::string_view what) {
    if (n == 0) return;
    if (n > left())
      fail(cat("truncated: the file (", size_, " bytes) ends inside ", what, " (", n, " bytes at offset ", pos_, ")"));
    const auto got = std::fread(dst, 1, static_cast<std::size_t>(n), f_);
    if (got != n) {
      if (std::ferror(f_)) fail(cat("read failed in ", what, ": ", files::errno_text(errno)));
      fail(cat("truncated: the file shrank while ", what, " was read"));
    }
    pos_ += n;
  }
  void seek(std::uint64_t at) {
    if (at == pos_) return;
    if (at > size_ || at > static_cast<std::uint64_t>(std::numeric_limits<long>::max()) ||
        std::fseek(f_, static_cast<long>(at), SEEK_SET) != 0)
      fail(cat("cannot seek to offset ", at));
    pos_ = at;
  }

 private:
  std::filesystem::path path_;
  std::string_view op_;
  std::FILE* f_ = nullptr;
  std::uint64_t size_ = 0, pos_ = 0;
};

// Every multi-byte value in these files is little-endian (npy may also say big-endian): bytes of
// elements `width` wide are reversed in place when they differ from the host's order.
inline void swap_bytes(unsigned char* p, std::size_t bytes, std::size_t width) {
  if (width > 1)
    for (std::size_t i = 0; i + width <= bytes; i += width) std::reverse(p + i, p + i + width);
}
inline void from_endian(unsigned char* p, std::size_t bytes, std::size_t width, bool file_little) {
  if (file_little != (std::endian::native == std::endian::little)) swap_bytes(p, bytes, width);
}

// t's elements on the host, contiguous in logical row-major order (what both formats store):
// a view when t already is that, else a copy (from the GPU, from NHWC or from a strided view).
template <class T>
Tensor<T> host_row_major(const Tensor<T>& t) {
  const Tensor<T> host = t.device().is_cpu() ? t.view() : t.to(Device::cpu());
  return host.contiguous(Layout::row_major);
}

// Writes host's elements (host_row_major) to f little-endian, a chunk at a time on a
// big-endian host.
template <class T>
void write_elements(files::AtomicFile& f, const Tensor<T>& host) {
  const std::size_t n = static_cast<std::size_t>(host.numel()) * sizeof(T);
  const auto* p = reinterpret_cast<const unsigned char*>(host.data());
  if constexpr (std::endian::native == std::endian::little) {
    if (n) f.write(p, n);
  } else {
    std::vector<unsigned char> chunk;
    for (std::size_t at = 0; at < n;) {
      const std::size_t len = std::min<std::size_t>(n - at, std::size_t{1} << 20);
      chunk.assign(p + at, p + at + len);
      swap_bytes(chunk.data(), len, sizeof(T));
      f.write(chunk.data(), len);
      at += len;
    }
  }
}

// Reads numel elements of `width` bytes from f into a new host tensor of element type T and the
// given shape, converting byte order.
template <class T>
Tensor<T> read_elements(InFile& f, const Shape& shape, bool file_little, std::string_view what) {
  Tensor<T> t(shape);
  const std::size_t n = static_cast<std::size_t>(t.numel()) * sizeof(T);
  f.read(t.data(), n, what);
  from_endian(reinterpret_cast<unsigned char*>(t.data()), n, sizeof(T), file_little);
  return t;
}

// numel * width as a byte count, false when it overflows uint64 or the tensor's strides would
// overflow int64.
inline bool byte_count(const Shape& shape, std::size_t width, std::uint64_t& bytes) {
  if (!shape_fits(shape, width)) return false;
  std::uint64_t n = width;
  for (auto d : shape) n *= static_cast<std::uint64_t>(d);
  bytes = n;
  return true;
}

}  // namespace cutrain::inline CUTRAIN_ABI::detail::weights
