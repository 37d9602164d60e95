// Checkpoint: an ordered set of named records (tensors of any cutrain dtype, 64-bit ints,
// doubles, strings) held on the host, saved as one versioned file with a CRC-32 and written
// atomically (files::AtomicFile: temp file in the same directory, fsync, rename). The format
// and the error cases are in docs/checkpoints.md.
//
// It lives in core, below nn and optim, because both write into it: nn/checkpoint.hpp adds the
// module and Rng helpers, optim::SGD / optim::AdamW have save_state / load_state.
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

#include "cutrain/core/checkpoint_format.hpp"
#include "cutrain/core/dtype.hpp"
#include "cutrain/core/error.hpp"
#include "cutrain/core/files.hpp"
#include "cutrain/core/shape.hpp"
#include "cutrain/core/tensor.hpp"

namespace cutrain::inline CUTRAIN_ABI {

class Checkpoint {
 public:
  // Puts a host copy of t (contiguous, in its layout: nhwc stays nhwc) under name, replacing
  // any record of that name (in its place in the order).
  template <class T>
  void put(const std::string& name, const Tensor<T>& t) {
    constexpr std::string_view op = "Checkpoint::put";
    check_name(op, name);
    CUTRAIN_REQUIRE(t.defined(), InvalidArgument, op, "tensor \"", name, "\" is undefined");
    const Layout want = t.layout() == Layout::nhwc ? Layout::nhwc : Layout::row_major;
    // A host tensor that is already contiguous is read in place: no copy before the byte copy.
    const Tensor<T> host = t.device().is_cpu() ? t.contiguous(want) : t.to(Device::cpu());
    Record r{.name = name, .kind = detail::ckpt::Kind::tensor, .dtype = dtype_of<T>, .layout = host.layout(),
             .dims = host.shape().dims(), .bytes = {}};
    const std::size_t n = static_cast<std::size_t>(host.numel()) * sizeof(T);
    r.bytes.resize(n);
    if (n) std::memcpy(r.bytes.data(), host.data(), n);
    detail::ckpt::to_little_endian(r.bytes.data(), n, sizeof(T));
    store(std::move(r));
  }

  // A new host tensor holding the record, in the layout it was saved in.
  template <class T>
  Tensor<T> get(const std::string& name) const {
    const Record& r = find("Checkpoint::get", name, detail::ckpt::Kind::tensor);
    CUTRAIN_REQUIRE(r.dtype == dtype_of<T>, InvalidArgument, "Checkpoint::get", "record \"", name, "\" is ",
                    describe(r), ", not ", dtype_of<T>);
    Tensor<T> t(Shape(r.dims), {.layout = r.layout});
    const std::size_t n = r.bytes.size();
    if (n) {
      std::memcpy(t.data(), r.bytes.data(), n);
      detail::ckpt::to_little_endian(reinterpret_cast<unsigned char*>(t.data()), n, sizeof(T));
    }
    return t;
  }

  // The record, checked to have like's shape, in like's layout on like's device: what loading
  // into an existing tensor (optimizer state, a parameter) needs.
  template <class T>
  Tensor<T> get_like(const std::string& name, const Tensor<T>& like) const {
    Tensor<T> host = get<T>(name);
    CUTRAIN_REQUIRE(host.shape() == like.shape(), InvalidArgument, "Checkpoint::get", "record \"", name, "\" is ",
                    host.describe(), " but a tensor shaped like ", like.describe(), " is needed");
    const Layout l = like.layout() == Layout::nhwc ? Layout::nhwc : Layout::row_major;
    if (like.device().is_cpu() && (host.layout() == Layout::nhwc) == (l == Layout::nhwc)) return host;
    Tensor<T> out(like.shape(), {.layout = l, .device = like.device()});
    out.copy_from(host);
    return out;
  }

  void put_int(const std::string& name, std::int64_t v) {
    put_scalar("Checkpoint::put_int", name, detail::ckpt::Kind::int64, std::bit_cast<std::uint64_t>(v));
  }
  std::int64_t get_int(const std::string& name) const {
    return std::bit_cast<std::int64_t>(get_scalar("Checkpoint::get_int", name, detail::ckpt::Kind::int64));
  }
  void put_double(const std::string& name, double v) {
    put_scalar("Checkpoint::put_double", name, detail::ckpt::Kind::float64, std::bit_cast<std::uint64_t>(v));
  }
  double get_double(const std::string& name) const {
    return std::bit_cast<double>(get_scalar("Checkpoint::get_double", name, detail::ckpt::Kind::float64));
  }
  void put_string(const std::string& name, const std::string& v) {
    check_name("Checkpoint::put_string", name);
    Record r{.name = name, .kind = detail::ckpt::Kind::string, .dtype = DType::u8, .layout = Layout::row_major,
             .dims = {}, .bytes = std::vector<unsigned char>(v.begin(), v.end())};
    store(std::move(r));
  }
  std::string get_string(const std::string& name) const {
    const Record& r = find("Checkpoint::get_string", name, detail::ckpt::Kind::string);
    return std::string(r.bytes.begin(), r.bytes.end());
  }

  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  // Copies from's record `name` (of any kind) into this checkpoint as `as`.
  void copy_record(const Checkpoint& from, const std::string& name, const std::string& as) {
    check_name("Checkpoint::copy_record", as);
    auto it = from.index_.find(name);
    CUTRAIN_REQUIRE(it != from.index_.end(), InvalidArgument, "Checkpoint::copy_record",
                    "the source checkpoint has no record \"", name, "\"");
    Record r = from.records_[it->second];
    r.name = as;
    store(std::move(r));
  }
  // Removes the record of that name; false when there was none.
  bool erase(const std::string& name) {
    auto it = index_.find(name);
    if (it == index_.end()) return false;
    const std::size_t k = it->second;
    records_.erase(records_.begin() + static_cast<std::ptrdiff_t>(k));
    index_.erase(it);
    for (auto& [n, i] : index_)
      if (i > k) --i;
    return true;
  }
  // Record names in the order they were first put (the order in the file).
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    out.reserve(records_.size());
    for (const auto& r : records_) out.push_back(r.name);
    return out;
  }
  std::size_t size() const { return records_.size(); }

  // prefix.name, or name alone for an empty prefix: how modules and optimizers name records.
  static std::string key(const std::string& prefix, const std::string& name) {
    return prefix.empty() ? name : prefix + "." + name;
  }

  // Writes the checkpoint to a temp file next to path, syncs it and renames it over path, so
  // path holds either the old file or the complete new one, never a partial write.
  void save(const std::filesystem::path& path) const {
    namespace ck = detail::ckpt;
    constexpr std::string_view op = "Checkpoint::save";
    if (path.empty() || !path.has_filename()) throw IoError(op, detail::cat(path.string(), ": not a file name"));
    files::AtomicFile file(path, std::string(op));
    ck::Writer w(file);
    w.bytes(ck::magic, sizeof ck::magic);
    w.scalar<std::uint32_t>(ck::format_version);
    w.scalar<std::uint64_t>(records_.size());
    for (const auto& r : records_) {
      w.scalar<std::uint32_t>(static_cast<std::uint32_t>(r.name.size()));
      w.bytes(r.name.data(), r.name.size());
      const bool tensor = r.kind == ck::Kind::tensor;
      w.scalar<std::uint8_t>(static_cast<std::uint8_t>(r.kind));
      w.scalar<std::uint8_t>(tensor ? ck::dtype_code(r.dtype) : 0);
      w.scalar<std::uint8_t>(tensor ? ck::layout_code(r.layout) : 0);
      w.scalar<std::uint32_t>(static_cast<std::uint32_t>(r.dims.size()));
      for (auto d : r.dims) w.scalar<std::uint64_t>(static_cast<std::uint64_t>(d));
      w.scalar<std::uint64_t>(r.bytes.size());
      w.bytes(r.bytes.data(), r.bytes.size());
    }
    // The checksum is not part of what it covers: written straight, outside the Writer's CRC.
    unsigned char trailer[ck::trailer_bytes];
    const std::uint64_t crc = w.crc();
    for (std::size_t i = 0; i < sizeof trailer; ++i) trailer[i] = static_cast<unsigned char>(crc >> (8 * i));
    file.write(trailer, sizeof trailer);
    file.commit();
  }

  // Reads a checkpoint written by save(). Every problem is an IoError naming the path and the
  // reason: no such file, empty, not a cutrain checkpoint, unsupported version, truncated,
  // corrupt (bad field, sizes that do not fit, checksum mismatch).
  static Checkpoint load(const std::filesystem::path& path) {
    namespace fs = std::filesystem;
    namespace ck = detail::ckpt;
    constexpr std::string_view op = "Checkpoint::load";
    auto fail = [&](std::string_view reason) { throw IoError(op, detail::cat(path.string(), ": ", reason)); };
    std::error_code ec;
    const auto st = fs::status(path, ec);
    if (ec && ec != std::errc::no_such_file_or_directory) fail(detail::cat("cannot stat: ", ec.message()));
    if (!fs::exists(st)) fail("no such file");
    if (!fs::is_regular_file(st)) fail("not a regular file");
    const std::uintmax_t size = fs::file_size(path, ec);
    if (ec) fail(detail::cat("cannot read its size: ", ec.message()));
    if (size == 0) fail("empty file (0 bytes), not a cutrain checkpoint");

    std::FILE* f = std::fopen(path.string().c_str(), "rb");
    if (!f) fail(detail::cat("cannot open: ", ck::errno_text()));
    struct Closer {
      std::FILE* f;
      ~Closer() { std::fclose(f); }
    } closer{f};

    ck::Reader in(f, size, path);
    // The magic first: a short file that starts like one is truncated, anything else is not ours.
    unsigned char head[sizeof ck::magic];
    const std::size_t head_n = static_cast<std::size_t>(std::min<std::uintmax_t>(size, sizeof head));
    in.raw(head, head_n, "the magic");
    if (std::memcmp(head, ck::magic, head_n) != 0) fail("not a cutrain checkpoint (wrong magic)");
    if (head_n < sizeof head) in.truncated("the magic");
    in.add_to_crc(head, head_n);

    unsigned char vb[4];
    in.raw(vb, 4, "the format version");
    in.add_to_crc(vb, 4);
    const auto version = ck::Reader::decode<std::uint32_t>(vb);
    if (version != ck::format_version)
      fail(detail::cat("unsupported format version ", version, " (this build reads version ", ck::format_version, ")"));

    // From here on every byte read goes through read(), which also feeds the CRC.
    auto read = [&](void* dst, std::uint64_t n, std::string_view what) {
      in.body(dst, n, what);
      in.add_to_crc(dst, static_cast<std::size_t>(n));
    };
    auto read_u = [&]<class U>(std::type_identity<U>, std::string_view what) {
      unsigned char b[sizeof(U)];
      read(b, sizeof(U), what);
      return ck::Reader::decode<U>(b);
    };
    auto u8 = [&](std::string_view what) { return read_u(std::type_identity<std::uint8_t>{}, what); };
    auto u32 = [&](std::string_view what) { return read_u(std::type_identity<std::uint32_t>{}, what); };
    auto u64 = [&](std::string_view what) { return read_u(std::type_identity<std::uint64_t>{}, what); };
    auto corrupt = [&](std::string_view reason) { fail(detail::cat("corrupt: ", reason)); };

    const std::uint64_t count = u64("the record count");
    if (count > in.body_left() / ck::min_record_bytes)
      fail(detail::cat("truncated or corrupt: ", count, " records cannot fit in the ", in.body_left(),
                       " bytes that follow the header"));

    Checkpoint out;
    for (std::uint64_t k = 0; k < count; ++k) {
      const std::string at = detail::cat("record ", k);
      const std::uint32_t name_len = u32(detail::cat("the name length of ", at));
      if (name_len > in.body_left())
        fail(detail::cat("truncated or corrupt: the name of ", at, " claims ", name_len, " bytes but only ",
                         in.body_left(), " remain before the checksum"));
      Record r;
      r.name.resize(name_len);
      read(r.name.data(), name_len, detail::cat("the name of ", at));
      const std::string rec = detail::cat(at, " (\"", r.name, "\")");
      if (r.name.empty()) corrupt(detail::cat(at, " has an empty name"));
      if (out.contains(r.name)) corrupt(detail::cat(rec, " appears twice"));

      const std::uint8_t kind = u8(detail::cat("the kind of ", rec));
      const std::uint8_t dtype = u8(detail::cat("the dtype of ", rec));
      const std::uint8_t layout = u8(detail::cat("the layout of ", rec));
      const std::uint32_t rank = u32(detail::cat("the rank of ", rec));
      if (kind < 1 || kind > 4) corrupt(detail::cat(rec, " has unknown kind ", int{kind}));
      r.kind = static_cast<ck::Kind>(kind);
      const bool tensor = r.kind == ck::Kind::tensor;
      if (tensor) {
        if (!ck::dtype_from_code(dtype, r.dtype)) corrupt(detail::cat(rec, " has unknown dtype code ", int{dtype}));
        if (!ck::layout_from_code(layout, r.layout)) corrupt(detail::cat(rec, " has unknown layout code ", int{layout}));
        if (r.layout != Layout::row_major && rank != 4)
          corrupt(detail::cat(rec, " has layout ", r.layout, " but rank ", rank));
      } else if (dtype != 0 || layout != 0 || rank != 0) {
        corrupt(detail::cat(rec, " is a scalar with a dtype, layout or rank"));
      }
      if (std::uint64_t{rank} * 8 > in.body_left())
        fail(detail::cat("truncated or corrupt: ", rec, " claims rank ", rank, " but only ", in.body_left(),
                         " bytes remain before the checksum"));
      // numel * element size, refusing anything that overflows: it must equal the byte length.
      std::uint64_t expect = tensor ? dtype_size(r.dtype) : 0;
      bool overflow = false;
      r.dims.resize(rank);
      for (std::uint32_t d = 0; d < rank; ++d) {
        const std::uint64_t dim = u64(detail::cat("the dims of ", rec));
        if (dim > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
          corrupt(detail::cat(rec, " has a negative dimension"));
        r.dims[d] = static_cast<std::int64_t>(dim);
        if (dim != 0 && expect > std::numeric_limits<std::uint64_t>::max() / dim) overflow = true;
        expect *= dim;
      }
      const std::uint64_t len = u64(detail::cat("the byte length of ", rec));
      if (len > in.body_left())
        fail(detail::cat("truncated or corrupt: ", rec, " claims ", len, " bytes of data but only ", in.body_left(),
                         " remain before the checksum"));
      if (r.kind == ck::Kind::int64 || r.kind == ck::Kind::float64) expect = 8;
      if (r.kind != ck::Kind::string && (overflow || len != expect))
        corrupt(detail::cat(rec, " holds ", len, " bytes but its ", tensor ? "dtype and shape need " : "kind needs ",
                            overflow ? std::string("more than 2^64") : std::to_string(expect)));
      // A zero dim makes the byte count 0 but not the strides: [0, 2^40, 2^40] must be refused
      // here, where the file is named, not when a tensor is made from it.
      if (tensor && !shape_fits(Shape(r.dims), dtype_size(r.dtype)))
        corrupt(detail::cat(rec, " has shape ", Shape(r.dims), ", too large for a ", r.dtype,
                            " tensor: its byte count overflows int64"));
      r.bytes.resize(static_cast<std::size_t>(len));
      read(r.bytes.data(), len, detail::cat("the data of ", rec));
      out.store(std::move(r));
    }

    if (in.body_left() > 0)
      corrupt(detail::cat(in.body_left(), " unexpected bytes after the last record"));
    unsigned char trailer[ck::trailer_bytes];
    in.raw(trailer, sizeof trailer, "the checksum");
    const auto stored = ck::Reader::decode<std::uint64_t>(trailer);
    if (stored != in.crc())
      fail(detail::cat("corrupt: checksum mismatch (stored 0x", hex(stored), ", computed 0x", hex(in.crc()), ")"));
    return out;
  }

 private:
  struct Record {
    std::string name;
    detail::ckpt::Kind kind = detail::ckpt::Kind::tensor;
    DType dtype = DType::u8;            // tensors only
    Layout layout = Layout::row_major;  // tensors only
    std::vector<std::int64_t> dims;     // tensors only
    std::vector<unsigned char> bytes;   // little-endian
  };

  static void check_name(std::string_view op, const std::string& name) {
    CUTRAIN_REQUIRE(!name.empty(), InvalidArgument, op, "record names must not be empty");
    CUTRAIN_REQUIRE(name.size() <= std::numeric_limits<std::uint32_t>::max(), InvalidArgument, op,
                    "record name of ", name.size(), " bytes is too long");
  }

  static std::string describe(const Record& r) {
    switch (r.kind) {
      case detail::ckpt::Kind::tensor: return detail::cat("a ", r.dtype, " tensor ", Shape(r.dims));
      case detail::ckpt::Kind::int64: return "an int";
      case detail::ckpt::Kind::float64: return "a double";
      case detail::ckpt::Kind::string: return "a string";
    }
    return "?";
  }
  static std::string_view kind_name(detail::ckpt::Kind k) {
    switch (k) {
      case detail::ckpt::Kind::tensor: return "a tensor";
      case detail::ckpt::Kind::int64: return "an int";
      case detail::ckpt::Kind::float64: return "a double";
      case detail::ckpt::Kind::string: return "a string";
    }
    return "?";
  }
  static std::string hex(std::uint64_t v) {
    char buf[17];
    std::snprintf(buf, sizeof buf, "%08llx", static_cast<unsigned long long>(v));
    return buf;
  }

  const Record& find(std::string_view op, const std::string& name, detail::ckpt::Kind kind) const {
    auto it = index_.find(name);
    CUTRAIN_REQUIRE(it != index_.end(), InvalidArgument, op, "the checkpoint has no record \"", name, "\"");
    const Record& r = records_[it->second];
    CUTRAIN_REQUIRE(r.kind == kind, InvalidArgument, op, "record \"", name, "\" is ", describe(r), ", not ",
                    kind_name(kind));
    return r;
  }

  void put_scalar(std::string_view op, const std::string& name, detail::ckpt::Kind kind, std::uint64_t bits) {
    check_name(op, name);
    Record r{.name = name, .kind = kind, .dtype = DType::u8, .layout = Layout::row_major, .dims = {},
             .bytes = std::vector<unsigned char>(8)};
    for (std::size_t i = 0; i < 8; ++i) r.bytes[i] = static_cast<unsigned char>(bits >> (8 * i));
    store(std::move(r));
  }
  std::uint64_t get_scalar(std::string_view op, const std::string& name, detail::ckpt::Kind kind) const {
    return detail::ckpt::Reader::decode<std::uint64_t>(find(op, name, kind).bytes.data());
  }

  void store(Record&& r) {
    auto it = index_.find(r.name);
    if (it != index_.end()) {
      records_[it->second] = std::move(r);
      return;
    }
    index_.emplace(r.name, records_.size());
    records_.push_back(std::move(r));
  }

  std::vector<Record> records_;
  std::map<std::string, std::size_t> index_;  // name -> position in records_
};

}  // namespace cutrain::inline CUTRAIN_ABI
