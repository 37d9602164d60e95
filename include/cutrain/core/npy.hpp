// .npy files, numpy's format for one array: the magic "\x93NUMPY", a version (1.0: a 2-byte
// header length; 2.0 and 3.0: 4 bytes), a header that is a Python dict literal
// {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } padded with spaces to a multiple
// of 64 bytes and ended by '\n', then the elements.
//
//   save_npy(path, tensor)     f64 '<f8', f32 '<f4', f16 '<f2', i32 '<i4', i64 '<i8', u8 '|u1'; any
//                              device,
//                              layout or strides (written in C order); bf16 is refused: numpy
//                              has no bfloat16 (save cast<float>(t), which is exact)
//   load_npy(path) -> AnyTensor   also reads big-endian ('>f4' ...) and '|b1' as
//                              u8; fortran_order True is refused
//
// See docs/weights.md.
#pragma once

#include "cutrain/core/abi.hpp"

#include <bit>
#include <cctype>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cutrain/core/any_tensor.hpp"
#include "cutrain/core/error.hpp"
#include "cutrain/core/files.hpp"
#include "cutrain/core/weights_file.hpp"

namespace cutrain::inline CUTRAIN_ABI {

namespace detail::npy {

inline constexpr char magic[6] = {'\x93', 'N', 'U', 'M', 'P', 'Y'};
// A sane bound on the header (numpy's own reader stops at 10000 bytes unless told otherwise; an
// array of numpy's at most 64 dims needs far less). Version 2.0 exists for headers past 65535.
inline constexpr std::uint64_t max_header_bytes = std::uint64_t{1} << 20;

inline std::string_view descr_of(DType d) {
  switch (d) {
    case DType::f64: return "<f8";
    case DType::f32: return "<f4";
    case DType::f16: return "<f2";
    case DType::i32: return "<i4";
    case DType::u8: return "|u1";
    case DType::i64: return "<i8";
    case DType::bf16: break;
  }
  return "";
}

struct Header {
  std::string descr;
  bool fortran_order = false;
  std::vector<std::int64_t> shape;
};

// A strict parser of the one dict literal numpy writes: string keys, and values that are strings,
// True/False or tuples of non-negative integers. fail(reason) throws.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const weights::InFile& in) : s_(text), in_(in) {}

  Header parse() {
    Header h;
    bool descr = false, order = false, shape = false;
    expect('{');
    for (;;) {
      ws();
      if (peek() == '}') break;
      const std::string key = string("a key");
      ws();
      expect(':');
      ws();
      if (key == "descr") {
        if (peek() != '\'' && peek() != '"')
          throw NotImplemented("load_npy", cutrain::detail::cat(in_.path().string(), ": descr ", rest(),
                                                                " is a structured dtype, which cutrain cannot read"));
        h.descr = string("descr");
        descr = true;
      } else if (key == "fortran_order") {
        h.fortran_order = boolean();
        order = true;
      } else if (key == "shape") {
        h.shape = tuple();
        shape = true;
      } else {
        fail(cutrain::detail::cat("unknown key '", key, "' (a .npy header has descr, fortran_order and shape)"));
      }
      ws();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      if (peek() != '}') fail(cutrain::detail::cat("expected ',' or '}' at ", rest()));
    }
    ++i_;
    for (; i_ < s_.size(); ++i_)
      if (!std::isspace(static_cast<unsigned char>(s_[i_]))) fail(cutrain::detail::cat("text after the dict: ", rest()));
    if (!descr || !order || !shape) fail("the header lacks descr, fortran_order or shape");
    return h;
  }

 private:
  [[noreturn]] void fail(std::string_view reason) const { in_.fail(cutrain::detail::cat("bad header: ", reason)); }
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  std::string rest() const { return std::string(s_.substr(i_, 40)); }
  void ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n')) ++i_;
  }
  void expect(char c) {
    if (peek() != c) fail(cutrain::detail::cat("expected '", c, "' at ", rest().empty() ? "the end" : rest()));
    ++i_;
  }
  std::string string(std::string_view what) {
    const char q = peek();
    if (q != '\'' && q != '"') fail(cutrain::detail::cat("expected ", what, " as a quoted string at ", rest()));
    const auto end = s_.find(q, i_ + 1);
    if (end == std::string_view::npos) fail(cutrain::detail::cat("unterminated string in ", what));
    std::string out(s_.substr(i_ + 1, end - i_ - 1));
    i_ = end + 1;
    return out;
  }
  bool boolean() {
    if (s_.substr(i_, 4) == "True") return i_ += 4, true;
    if (s_.substr(i_, 5) == "False") return i_ += 5, false;
    fail(cutrain::detail::cat("fortran_order must be True or False, got ", rest()));
  }
  std::vector<std::int64_t> tuple() {
    std::vector<std::int64_t> out;
    expect('(');
    for (;;) {
      ws();
      if (peek() == ')') break;
      if (!std::isdigit(static_cast<unsigned char>(peek())))
        fail(cutrain::detail::cat("shape must be a tuple of non-negative integers, got ", rest()));
      std::int64_t v = 0;
      while (std::isdigit(static_cast<unsigned char>(peek()))) {
        if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, peek() - '0', &v))
          fail("a shape dimension overflows int64");
        ++i_;
      }
      while (peek() == 'L') ++i_;  // Python 2's long literals
      out.push_back(v);
      ws();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      if (peek() != ')') fail(cutrain::detail::cat("expected ',' or ')' in shape at ", rest()));
    }
    ++i_;
    return out;
  }

  std::string_view s_;
  const weights::InFile& in_;
  std::size_t i_ = 0;
};

struct Descr {
  DType dtype;
  std::size_t width;
  bool little;
};

// descr as cutrain reads it; NotImplemented for dtypes it has no tensor for.
inline Descr parse_descr(const std::string& d, const weights::InFile& in) {
  const auto lacking = [&]() {
    throw NotImplemented("load_npy", cutrain::detail::cat(in.path().string(), ": dtype '", d,
                                                          "' has no cutrain tensor (it reads f8, f4, f2, i4, u1, "
                                                          "i8, b1 as u8)"));
  };
  if (d.size() < 3) lacking();
  const char order = d[0];
  const std::string code = d.substr(1);
  if (order != '<' && order != '>' && order != '|' && order != '=') lacking();
  const bool little = order == '>' ? false : order == '=' ? std::endian::native == std::endian::little : true;
  std::optional<Descr> r;
  if (code == "f8") r = Descr{DType::f64, 8, little};
  else if (code == "f4") r = Descr{DType::f32, 4, little};
  else if (code == "f2") r = Descr{DType::f16, 2, little};
  else if (code == "i4") r = Descr{DType::i32, 4, little};
  else if (code == "u1" || code == "b1") r = Descr{DType::u8, 1, true};
  else if (code == "i8") r = Descr{DType::i64, 8, little};
  if (!r) lacking();
  if (order == '|' && r->width != 1)
    in.fail(cutrain::detail::cat("bad header: descr '", d, "' says no byte order for a ", r->width, "-byte type"));
  return *r;
}

inline std::string shape_literal(const Shape& s) {
  std::string out = "(";
  for (int i = 0; i < s.rank(); ++i) out += cutrain::detail::cat(i ? ", " : "", s[i]);
  if (s.rank() == 1) out += ",";
  return out + ")";
}

}  // namespace detail::npy

// Writes t (C order, little-endian; any device, layout or strides) as a .npy file, atomically.
// Version 1.0 unless the header needs more than 65535 bytes (then 2.0).
template <class T>
void save_npy(const std::filesystem::path& path, const Tensor<T>& t) {
  constexpr std::string_view op = "save_npy";
  CUTRAIN_REQUIRE(t.defined(), InvalidArgument, op, path.string(), ": the tensor is undefined");
  CUTRAIN_REQUIRE(t.dtype() != DType::bf16, NotImplemented, op, path.string(), ": numpy has no bfloat16 dtype; save ",
                  "cast<float>(t) (exact), or use save_safetensors, which keeps BF16");
  const Tensor<T> host = detail::weights::host_row_major(t);
  std::string dict = detail::cat("{'descr': '", detail::npy::descr_of(t.dtype()), "', 'fortran_order': False, 'shape': ",
                                 detail::npy::shape_literal(t.shape()), ", }");
  // Pad with spaces so that the data starts on a 64-byte boundary; the header ends in '\n'.
  const bool v2 = dict.size() + 1 + 64 > 65535;
  const std::size_t prefix = v2 ? 12 : 10;
  dict.append((64 - (prefix + dict.size() + 1) % 64) % 64, ' ');
  dict += '\n';
  std::string head(detail::npy::magic, sizeof detail::npy::magic);
  head += static_cast<char>(v2 ? 2 : 1);
  head += '\0';
  const auto len = static_cast<std::uint32_t>(dict.size());
  for (std::size_t i = 0; i < (v2 ? 4u : 2u); ++i) head += static_cast<char>((len >> (8 * i)) & 0xff);
  files::AtomicFile f(path, std::string(op));
  f.write(head);
  f.write(dict);
  detail::weights::write_elements(f, host);
  f.commit();
}

inline void save_npy(const std::filesystem::path& path, const AnyTensor& t) {
  CUTRAIN_REQUIRE(t.defined(), InvalidArgument, "save_npy", path.string(), ": the tensor is undefined");
  std::visit([&](const auto& x) { save_npy(path, x); }, t.variant());
}

// Reads a .npy file into a host tensor (row-major). A damaged file throws IoError naming the
// file and the reason; a dtype cutrain has no tensor for, or fortran_order True, NotImplemented.
// load_npy(path).as<float>() converts.
inline AnyTensor load_npy(const std::filesystem::path& path) {
  constexpr std::string_view op = "load_npy";
  namespace np = detail::npy;
  detail::weights::InFile in(path, op);
  if (in.size() < 10) in.fail(detail::cat("truncated: ", in.size(), " bytes, too short for a .npy header"));
  unsigned char pre[8];
  in.read(pre, 8, "the magic and version");
  if (std::memcmp(pre, np::magic, sizeof np::magic) != 0) in.fail("not a .npy file (wrong magic)");
  if (pre[6] < 1 || pre[6] > 3 || pre[7] != 0)
    in.fail(detail::cat("unsupported .npy version ", int{pre[6]}, ".", int{pre[7]}, " (cutrain reads 1.0, 2.0, 3.0)"));
  unsigned char lb[4] = {0, 0, 0, 0};
  in.read(lb, pre[6] == 1 ? 2 : 4, "the header length");
  const std::uint64_t n = lb[0] | (std::uint64_t{lb[1]} << 8) | (std::uint64_t{lb[2]} << 16) | (std::uint64_t{lb[3]} << 24);
  if (n > in.left())
    in.fail(detail::cat("bad header length ", n, ": truncated, only ", in.left(), " bytes follow it"));
  if (n > np::max_header_bytes)
    in.fail(detail::cat("bad header length ", n, ": more than the ", np::max_header_bytes, " bytes cutrain reads"));
  std::string text(static_cast<std::size_t>(n), '\0');
  in.read(text.data(), n, "the header");
  const np::Header h = np::HeaderParser(text, in).parse();
  const np::Descr d = np::parse_descr(h.descr, in);
  const Shape shape(h.shape);
  if (h.fortran_order)
    throw NotImplemented(op, detail::cat(path.string(), ": the array ", shape, " is in Fortran order (fortran_order True); ",
                                         "save it from numpy with np.ascontiguousarray(a)"));
  std::uint64_t need = 0;
  if (!detail::weights::byte_count(shape, d.width, need))
    in.fail(detail::cat("shape ", shape, " is too large: its byte count overflows int64"));
  if (need != in.left())
    in.fail(detail::cat("size mismatch: shape ", shape, " of '", h.descr, "' needs ", need, " bytes of data but the file has ",
                        in.left(), need > in.left() ? " (truncated)" : ""));
  const std::string what = detail::cat("the data of ", shape);
  return visit_dtype(d.dtype, [&]<class T>(std::type_identity<T>) {
    return AnyTensor(detail::weights::read_elements<T>(in, shape, d.little, what));
  });
}

}  // namespace cutrain::inline CUTRAIN_ABI
