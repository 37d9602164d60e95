// .safetensors files, the format PyTorch and Hugging Face users exchange weights in: an 8-byte
// little-endian header length N, N bytes of JSON ({"name": {"dtype": "F32", "shape": [..],
// "data_offsets": [begin, end]}, ..., "__metadata__": {"key": "value"}}), then the raw
// little-endian, C-order bytes of every tensor, offsets relative to the end of the header.
//
//   save_safetensors(path, tensors, metadata)    any cutrain dtype, any device, layout or strides
//   load_safetensors(path) -> TensorMap          host tensors, row-major
//   read_safetensors(path) -> {tensors, metadata}
//
// Reading checks everything before it trusts it: the header length against the file and the
// format's 100 MB limit, the JSON (strict: a duplicate key is an error), each dtype, shape and
// offset pair, that each tensor's bytes match its shape, and that the tensors tile the data
// buffer exactly (no overlap, no gap, nothing past the end). See docs/weights.md.
#pragma once

#include "cutrain/core/abi.hpp"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cutrain/core/any_tensor.hpp"
#include "cutrain/core/error.hpp"
#include "cutrain/core/files.hpp"
#include "cutrain/core/json.hpp"
#include "cutrain/core/weights_file.hpp"

namespace cutrain::inline CUTRAIN_ABI {

using SafetensorsMetadata = std::map<std::string, std::string>;

struct Safetensors {
  TensorMap tensors;
  SafetensorsMetadata metadata;
};

namespace detail::safetensors {

// The limit the reference implementation puts on the header.
inline constexpr std::uint64_t max_header_bytes = 100'000'000;

// How a file dtype is read: into which cutrain dtype, from elements how wide.
struct FileDType {
  DType dtype;
  std::size_t width;
};

inline std::string_view name_of(DType d) {
  switch (d) {
    case DType::f64: return "F64";
    case DType::f32: return "F32";
    case DType::f16: return "F16";
    case DType::bf16: return "BF16";
    case DType::i32: return "I32";
    case DType::u8: return "U8";
    case DType::i64: return "I64";
  }
  return "?";
}

// The file dtype s as cutrain reads it; nullopt when s is not a safetensors dtype at all.
// Throws NotImplemented (via lacking) for dtypes of the format that cutrain has no tensor for.
inline std::optional<FileDType> parse_dtype(const std::string& s, bool& lacking) {
  lacking = false;
  if (s == "F64") return FileDType{DType::f64, 8};
  if (s == "F32") return FileDType{DType::f32, 4};
  if (s == "F16") return FileDType{DType::f16, 2};
  if (s == "BF16") return FileDType{DType::bf16, 2};
  if (s == "I32") return FileDType{DType::i32, 4};
  if (s == "U8") return FileDType{DType::u8, 1};
  if (s == "BOOL") return FileDType{DType::u8, 1};  // one byte, 0 or 1
  if (s == "I64") return FileDType{DType::i64, 8};
  for (const char* other : {"I8", "I16", "U16", "U32", "U64", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F6_E2M3", "F6_E3M2",
                            "F4", "C64"})
    if (s == other) lacking = true;
  return std::nullopt;
}

struct Entry {
  std::string name;
  FileDType type;
  Shape shape;
  std::uint64_t begin = 0, end = 0;
};

// One tensor's header entry, checked; fail(reason) throws.
inline Entry parse_entry(const std::string& name, const json::Value& v, std::string_view op,
                         const weights::InFile& in) {
  const auto fail = [&](std::string_view reason) { in.fail(reason); };
  const std::string at = cutrain::detail::cat("tensor \"", name, "\"");
  if (!v.is_object()) fail(cutrain::detail::cat(at, ": its header entry is ", json::detail::kind_name(v), ", not an object"));
  auto member = [&](const char* key) -> const json::Value& {
    const auto it = v.find(key);
    if (it == v.end()) in.fail(cutrain::detail::cat(at, ": its header entry has no \"", key, "\""));
    return *it;
  };
  const json::Value& dt = member("dtype");
  if (!dt.is_string()) fail(cutrain::detail::cat(at, ": dtype is ", json::detail::kind_name(dt), ", not a string"));
  bool lacking = false;
  const auto type = parse_dtype(dt.get<std::string>(), lacking);
  if (lacking)
    throw NotImplemented(op, cutrain::detail::cat(in.path().string(), ": ", at, " has dtype ", dt.get<std::string>(),
                                                  ", which cutrain has no tensor for (it reads F64, F32, F16, BF16, "
                                                  "I32, I64, U8, BOOL as u8)"));
  if (!type) fail(cutrain::detail::cat(at, ": unknown dtype \"", dt.get<std::string>(), "\""));

  auto index = [&](const json::Value& x, const char* what) -> std::uint64_t {
    if (!x.is_number_integer()) in.fail(cutrain::detail::cat(at, ": ", what, " holds ", x.dump(), ", not an integer"));
    if (!x.is_number_unsigned() && x.get<std::int64_t>() < 0)
      in.fail(cutrain::detail::cat(at, ": ", what, " holds the negative ", x.dump()));
    return x.get<std::uint64_t>();
  };
  const json::Value& sh = member("shape");
  if (!sh.is_array()) fail(cutrain::detail::cat(at, ": shape is ", json::detail::kind_name(sh), ", not an array"));
  std::vector<std::int64_t> dims;
  for (const auto& d : sh) {
    const std::uint64_t n = index(d, "shape");
    if (n > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      fail(cutrain::detail::cat(at, ": shape dimension ", n, " is too large"));
    dims.push_back(static_cast<std::int64_t>(n));
  }
  const json::Value& off = member("data_offsets");
  if (!off.is_array() || off.size() != 2)
    fail(cutrain::detail::cat(at, ": data_offsets is ", off.dump(), ", not [begin, end]"));
  Entry e{.name = name, .type = *type, .shape = Shape(std::move(dims)), .begin = index(off[0], "data_offsets"),
          .end = index(off[1], "data_offsets")};
  if (e.begin > e.end) fail(cutrain::detail::cat(at, ": data_offsets [", e.begin, ", ", e.end, "] end before they begin"));
  std::uint64_t need = 0;
  if (!weights::byte_count(e.shape, e.type.width, need))
    fail(cutrain::detail::cat(at, ": shape ", e.shape, " is too large: its byte count overflows int64"));
  if (need != e.end - e.begin)
    fail(cutrain::detail::cat(at, ": shape ", e.shape, " of ", dt.get<std::string>(), " needs ", need,
                              " bytes but data_offsets [", e.begin, ", ", e.end, "] hold ", e.end - e.begin));
  return e;
}

}  // namespace detail::safetensors

// Writes tensors (names not empty and not "__metadata__"; any dtype, device, layout or strides:
// each is copied to the host in C order first where it is not already so) and metadata to path,
// atomically (files::AtomicFile). The header is padded with spaces to a multiple of 8 bytes, so
// that the data starts aligned, as the reference writer does.
inline void save_safetensors(const std::filesystem::path& path, const TensorMap& tensors,
                             const SafetensorsMetadata& metadata = {}) {
  constexpr std::string_view op = "save_safetensors";
  namespace st = detail::safetensors;
  json::Value header = json::Value::object();
  if (!metadata.empty()) {
    json::Value m = json::Value::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = std::move(m);
  }
  std::vector<AnyTensor> host;
  std::uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    CUTRAIN_REQUIRE(!name.empty() && name != "__metadata__", InvalidArgument, op, path.string(), ": tensor name \"",
                    name, "\" is reserved or empty");
    CUTRAIN_REQUIRE(t.defined(), InvalidArgument, op, path.string(), ": tensor \"", name, "\" is undefined");
    host.push_back(std::visit([](const auto& x) { return AnyTensor(detail::weights::host_row_major(x)); }, t.variant()));
    const std::uint64_t bytes = static_cast<std::uint64_t>(t.shape().numel()) * dtype_size(t.dtype());
    json::Value entry = json::Value::object();
    entry["dtype"] = std::string(st::name_of(t.dtype()));
    entry["shape"] = t.shape().dims();
    entry["data_offsets"] = json::Value::array({offset, offset + bytes});
    header[name] = std::move(entry);
    offset += bytes;
  }
  std::string text;
  try {
    text = json::dump(header, 0);
  } catch (const InvalidArgument& e) {  // a name or metadata string that is not UTF-8
    throw InvalidArgument(op, detail::cat(path.string(), ": cannot write the header: ", e.what()));
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(static_cast<std::uint64_t>(text.size()) >> (8 * i));
  files::AtomicFile f(path, std::string(op));
  f.write(len, sizeof len);
  f.write(text);
  for (const auto& t : host) std::visit([&](const auto& x) { detail::weights::write_elements(f, x); }, t.variant());
  f.commit();
}

// The same for tensors of one type, such as a module's state_dict() (nn/weights.hpp adds the
// PyTorch name maps on top).
template <class T>
void save_safetensors(const std::filesystem::path& path, const std::map<std::string, Tensor<T>>& tensors,
                      const SafetensorsMetadata& metadata = {}) {
  TensorMap any;
  for (const auto& [name, t] : tensors) any.emplace(name, t.defined() ? t.view() : Tensor<T>());
  save_safetensors(path, any, metadata);
}

// Reads every tensor (to host tensors, row-major) and the metadata. Every problem throws IoError
// naming the function, the file, the tensor and the reason; a dtype of the format that cutrain
// has no tensor for (I8, U16, F8_E4M3, ...), or I64 values past int32, throws NotImplemented.
inline Safetensors read_safetensors(const std::filesystem::path& path, std::string_view op = "read_safetensors") {
  namespace st = detail::safetensors;
  detail::weights::InFile in(path, op);
  const auto fail = [&](std::string_view reason) { in.fail(reason); };
  if (in.size() < 8) fail(detail::cat("truncated: ", in.size(), " bytes, too short for the 8-byte header length"));
  unsigned char lb[8];
  in.read(lb, 8, "the header length");
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<std::uint64_t>(lb[i]) << (8 * i);
  if (n > st::max_header_bytes)
    fail(detail::cat("bad header length ", n, ": more than the format's limit of ", st::max_header_bytes, " bytes"));
  if (n > in.left())
    fail(detail::cat("bad header length ", n, ": truncated or not a safetensors file, only ", in.left(),
                     " bytes follow it"));
  if (n < 2) fail(detail::cat("bad header length ", n, ": too short for a JSON object"));
  std::string text(static_cast<std::size_t>(n), '\0');
  in.read(text.data(), n, "the header");
  if (text.front() != '{') fail("the header does not start with '{': not a safetensors file");
  json::Value header;
  try {
    header = json::parse(text);
  } catch (const json::ParseError& e) {
    fail(detail::cat("the header is not valid JSON: ", e.reason()));
  }
  if (!header.is_object()) fail("the header is not a JSON object");

  Safetensors out;
  std::vector<st::Entry> entries;
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) fail("__metadata__ is not an object of strings");
      for (const auto& [k, s] : v.items()) {
        if (!s.is_string()) fail(detail::cat("__metadata__ \"", k, "\" is ", json::detail::kind_name(s), ", not a string"));
        out.metadata.emplace(k, s.get<std::string>());
      }
      continue;
    }
    entries.push_back(st::parse_entry(name, v, op, in));
  }

  // The tensors must tile the data buffer: sorted by offset, each begins where the one before ends.
  const std::uint64_t buffer = in.left();
  std::sort(entries.begin(), entries.end(),
            [](const st::Entry& a, const st::Entry& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  std::uint64_t covered = 0;
  const st::Entry* prev = nullptr;
  for (const auto& e : entries) {
    const std::string at = detail::cat("tensor \"", e.name, "\": data_offsets [", e.begin, ", ", e.end, "]");
    if (e.end > buffer)
      fail(detail::cat(at, " out of range: the data buffer holds ", buffer, " bytes (truncated file?)"));
    if (e.begin < covered) fail(detail::cat(at, " overlap tensor \"", prev->name, "\", which ends at ", covered));
    if (e.begin > covered) fail(detail::cat(at, " leave bytes [", covered, ", ", e.begin, ") of the data buffer unused"));
    covered = e.end;
    prev = &e;
  }
  if (covered != buffer)
    fail(detail::cat("bytes [", covered, ", ", buffer, ") at the end of the data buffer belong to no tensor"));

  const std::uint64_t base = in.pos();
  for (const auto& e : entries) {
    in.seek(base + e.begin);
    const std::string what = detail::cat("the data of tensor \"", e.name, "\"");
    out.tensors.emplace(e.name, visit_dtype(e.type.dtype, [&]<class T>(std::type_identity<T>) {
                          return AnyTensor(detail::weights::read_elements<T>(in, e.shape, true, what));
                        }));
  }
  return out;
}

inline TensorMap load_safetensors(const std::filesystem::path& path) {
  return read_safetensors(path, "load_safetensors").tensors;
}

}  // namespace cutrain::inline CUTRAIN_ABI
