// A minimal protocol-buffers writer for the ONNX messages that deploy::export_onnx emits.
//
// Why a hand-written writer and not libprotobuf with onnx.proto: cutrain is header-only and
// builds with no generated code; the export needs only the encoding side of a handful of
// messages, which is four wire-format rules (varint, 64-bit, length-delimited, 32-bit) and a
// few field numbers. libprotobuf would add a link dependency, a protoc step and a version to
// keep in step with the onnx.proto copy, for ~150 lines of encoding. Reading is left to the
// tools that consume the file (onnx.checker, ONNX Runtime, TensorRT).
//
// Field numbers are those of onnx/onnx.proto (proto2; repeated scalars are written unpacked,
// proto2's default, except where a packed helper is called by name).
#pragma once

#include "cutrain/core/abi.hpp"

#include <bit>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

namespace cutrain::inline CUTRAIN_ABI::deploy::proto {

enum class WireType : std::uint32_t { varint = 0, fixed64 = 1, length_delimited = 2, fixed32 = 5 };

// One message being encoded. Nested messages are encoded into their own Writer first and then
// added with message(), which prefixes their length.
class Writer {
 public:
  void varint(std::uint64_t v) {
    while (v >= 0x80) {
      buf_ += static_cast<char>((v & 0x7f) | 0x80);
      v >>= 7;
    }
    buf_ += static_cast<char>(v);
  }
  void tag(std::uint32_t field, WireType w) { varint((std::uint64_t{field} << 3) | static_cast<std::uint32_t>(w)); }

  // int32/int64/enum fields: a negative value is its 64-bit two's complement (10 bytes).
  void int_field(std::uint32_t field, std::int64_t v) {
    tag(field, WireType::varint);
    varint(static_cast<std::uint64_t>(v));
  }
  void float_field(std::uint32_t field, float v) {
    tag(field, WireType::fixed32);
    fixed32(std::bit_cast<std::uint32_t>(v));
  }
  void bytes_field(std::uint32_t field, std::string_view bytes) {
    tag(field, WireType::length_delimited);
    varint(bytes.size());
    buf_.append(bytes);
  }
  void string_field(std::uint32_t field, std::string_view s) { bytes_field(field, s); }
  void message(std::uint32_t field, const Writer& m) { bytes_field(field, m.bytes()); }

  // Repeated int64, unpacked: one tag per element.
  void ints_field(std::uint32_t field, std::span<const std::int64_t> v) {
    for (const std::int64_t x : v) int_field(field, x);
  }
  // Repeated int64 / float, packed: one tag, the length, the elements.
  void packed_ints(std::uint32_t field, std::span<const std::int64_t> v) {
    Writer body;
    for (const std::int64_t x : v) body.varint(static_cast<std::uint64_t>(x));
    message(field, body);
  }
  void packed_floats(std::uint32_t field, std::span<const float> v) {
    Writer body;
    for (const float x : v) body.fixed32(std::bit_cast<std::uint32_t>(x));
    message(field, body);
  }

  void fixed32(std::uint32_t v) {
    for (int i = 0; i < 4; ++i) buf_ += static_cast<char>((v >> (8 * i)) & 0xff);
  }

  const std::string& bytes() const { return buf_; }
  std::size_t size() const { return buf_.size(); }

 private:
  std::string buf_;
};

// Floats as little-endian bytes, for TensorProto.raw_data.
inline std::string raw_floats(std::span<const float> v) {
  std::string out(v.size() * 4, '\0');
  for (std::size_t i = 0; i < v.size(); ++i) {
    const std::uint32_t b = std::bit_cast<std::uint32_t>(v[i]);
    for (int k = 0; k < 4; ++k) out[i * 4 + k] = static_cast<char>((b >> (8 * k)) & 0xff);
  }
  return out;
}

// int64s as little-endian bytes, for TensorProto.raw_data.
inline std::string raw_int64s(std::span<const std::int64_t> v) {
  std::string out(v.size() * 8, '\0');
  for (std::size_t i = 0; i < v.size(); ++i) {
    const auto b = static_cast<std::uint64_t>(v[i]);
    for (int k = 0; k < 8; ++k) out[i * 8 + k] = static_cast<char>((b >> (8 * k)) & 0xff);
  }
  return out;
}

// The field numbers of onnx.proto used by the exporter.
namespace field {
namespace model {
inline constexpr std::uint32_t ir_version = 1, producer_name = 2, producer_version = 3, doc_string = 6, graph = 7,
                               opset_import = 8;
}
namespace opset {
inline constexpr std::uint32_t domain = 1, version = 2;
}
namespace graph {
inline constexpr std::uint32_t node = 1, name = 2, initializer = 5, input = 11, output = 12;
}
namespace node {
inline constexpr std::uint32_t input = 1, output = 2, name = 3, op_type = 4, attribute = 5;
}
namespace attribute {
inline constexpr std::uint32_t name = 1, f = 2, i = 3, s = 4, floats = 7, ints = 8, type = 20;
}
namespace tensor {
inline constexpr std::uint32_t dims = 1, data_type = 2, name = 8, raw_data = 9;
}
namespace value_info {
inline constexpr std::uint32_t name = 1, type = 2;
}
namespace type_proto {
inline constexpr std::uint32_t tensor_type = 1;      // TypeProto
inline constexpr std::uint32_t elem_type = 1, shape = 2;  // TypeProto.Tensor
inline constexpr std::uint32_t dim = 1;              // TensorShapeProto
inline constexpr std::uint32_t dim_value = 1;        // TensorShapeProto.Dimension
}  // namespace type_proto
}  // namespace field

// AttributeProto.AttributeType and TensorProto.DataType values.
enum class AttributeType : std::int64_t { floating = 1, integer = 2, string = 3, floats = 6, ints = 7 };
inline constexpr std::int64_t data_type_float = 1, data_type_int32 = 6, data_type_int64 = 7;
// IR version 8 is the one that goes with opset 17 (onnx 1.12).
inline constexpr std::int64_t ir_version = 8;

}  // namespace cutrain::inline CUTRAIN_ABI::deploy::proto
