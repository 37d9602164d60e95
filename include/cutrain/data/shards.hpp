// Token shards for GPT training, in the .bin format of llm.c (and the nanoGPT-style scripts that
// write it): a header of 256 little-endian int32 (header[0] = 20240520, header[1] = 1, header[2] =
// the token count N), then N uint16 tokens, and nothing after them.
//
//   data::write_token_shard("out/fortunes_train_000000.bin", tokens);        // atomic
//   data::TokenShards train(data::find_shards("out", data::Split::train), 8192); // *_train_*.bin
//   data::ShardLoader loader(train, {.batch = 16, .context = 1024, .rank = r, .world = w});
//   auto [x, y, offsets] = loader.next();                                      // int32 [16, 1024]
//   auto val = data::eval_batches(data::TokenShards(data::find_shards("out", data::Split::val)),
//                                 {.batch = 16, .context = 1024, .rank = r, .world = w}, 20);
//
// Positions. The shards of a TokenShards are one token sequence, shard after shard: token j of
// shard i is at start(i) + j, and a TokenBatch's offsets[b] is where row b's window starts in it.
// A window at o holds x[t] = s[o + t], y[t] = s[o + t + 1] (t < context) within one shard.
//
// Sequential mode walks the shards as llm.c's DataLoader does. With S = batch * context, a step
// takes world * S + 1 tokens of the current shard from its position p: rank r gets the batch
// of B rows at p + r * S + b * context (b < B; B * context + 1 tokens, consecutive rows overlap
// by one token), then p += world * S. A step that would pass the shard's end moves to position
// 0 of the next shard; after the last shard comes the first again. So ranks see disjoint windows,
// and ranks 0..w-1 together see what one rank with batch w * B sees. Random mode draws each row
// from all windows of all shards, uniformly: rng.below(sum_i (size(i) - context)), one draw per
// row in row order, with Rng(shard_rank_seed(seed, rank)).
//
// Limits: tokens are uint16 (version 1; llm.c's version 2, uint32 tokens, is refused); files are
// mapped read-only (read into memory where there is no mmap), so a file truncated in place while
// mapped is undefined behaviour; write_token_shard replaces files by rename, which is safe.
// Little-endian hosts only. Batches are host tensors (move them to the device with .to(dev)).
#pragma once

#include "cutrain/core/abi.hpp"

#ifndef _WIN32
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "cutrain/core/error.hpp"
#include "cutrain/core/files.hpp"
#include "cutrain/core/random.hpp"
#include "cutrain/core/tensor.hpp"
#include "cutrain/data/text.hpp"

namespace cutrain::inline CUTRAIN_ABI::data {

static_assert(std::endian::native == std::endian::little, "cutrain: token shards are read in place: little-endian hosts only");

inline constexpr std::int32_t shard_magic = 20240520;
inline constexpr std::int32_t shard_version = 1;                // uint16 tokens
inline constexpr std::int64_t shard_header_bytes = 256 * 4;     // int32[256]
inline constexpr std::int64_t shard_max_tokens = std::numeric_limits<std::int32_t>::max();
inline constexpr std::int64_t shard_max_vocab = std::int64_t{1} << 16;  // ids 0..65535

// Writes tokens as a shard at path, atomically (files::AtomicFile: a reader sees the old file or
// the new one). More than shard_max_tokens tokens throw InvalidArgument; I/O failures FileError.
inline void write_token_shard(const std::filesystem::path& path, std::span<const std::uint16_t> tokens) {
  constexpr const char* op = "data::write_token_shard";
  CUTRAIN_REQUIRE(static_cast<std::int64_t>(tokens.size()) <= shard_max_tokens, InvalidArgument, op, path.string(),
                  ": ", tokens.size(), " tokens, a shard holds at most ", shard_max_tokens);
  std::array<std::int32_t, 256> header{};
  header[0] = shard_magic;
  header[1] = shard_version;
  header[2] = static_cast<std::int32_t>(tokens.size());
  files::AtomicFile f(path, op);
  f.write(header.data(), sizeof header);
  f.write(tokens.data(), tokens.size_bytes());
  f.commit();
}

namespace detail {

// A shard file's bytes: mapped read-only, or read into memory where there is no mmap. Errors are
// FileErrors naming the path, thrown as op.
class ShardBytes {
 public:
  ShardBytes(const std::filesystem::path& path, const char* op) {
#ifndef _WIN32
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw files::FileError(op, path, cutrain::detail::cat("cannot open: ", files::errno_text(errno)));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      const int err = errno;
      ::close(fd);
      throw files::FileError(op, path, S_ISDIR(st.st_mode) ? std::string("is a directory, not a shard file")
                                                           : cutrain::detail::cat("not a regular file (", files::errno_text(err), ")"));
    }
    size_ = static_cast<std::size_t>(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        const int err = errno;
        ::close(fd);
        throw files::FileError(op, path, cutrain::detail::cat("cannot map ", size_, " bytes: ", files::errno_text(err)));
      }
      map_ = p;
      data_ = static_cast<const unsigned char*>(p);
    }
    ::close(fd);  // the mapping stays valid
#else
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) throw files::FileError(op, path, "cannot open: no such file");
    if (std::filesystem::is_directory(path, ec)) throw files::FileError(op, path, "is a directory, not a shard file");
    std::ifstream in(path, std::ios::binary);
    if (!in) throw files::FileError(op, path, "cannot open");
    owned_.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    if (in.bad()) throw files::FileError(op, path, "read error");
    data_ = owned_.data();
    size_ = owned_.size();
#endif
  }
  ShardBytes(const ShardBytes&) = delete;
  ShardBytes& operator=(const ShardBytes&) = delete;
  ~ShardBytes() {
#ifndef _WIN32
    if (map_) ::munmap(map_, size_);
#endif
  }

  const unsigned char* data() const { return data_; }
  std::size_t size() const { return size_; }

 private:
  void* map_ = nullptr;
  std::vector<unsigned char> owned_;
  const unsigned char* data_ = nullptr;
  std::size_t size_ = 0;
};

// One opened, checked shard: its bytes and its tokens within them.
struct Shard {
  std::filesystem::path path;
  std::shared_ptr<const ShardBytes> bytes;
  std::span<const std::uint16_t> tokens;
};

inline std::int32_t header_int(const unsigned char* p, int i) {
  std::int32_t v;
  std::memcpy(&v, p + 4 * i, sizeof v);
  return v;
}

// Opens path and checks the header against the file's size; with vocab > 0, every token too.
inline Shard open_shard(const std::filesystem::path& path, std::int64_t vocab, const char* op) {
  auto bytes = std::make_shared<const ShardBytes>(path, op);
  const auto size = static_cast<std::int64_t>(bytes->size());
  const auto fail = [&](std::string reason) { throw files::FileError(op, path, std::move(reason)); };
  if (size < shard_header_bytes)
    fail(cutrain::detail::cat("truncated header: ", size, " bytes, shorter than the ", shard_header_bytes,
                              "-byte header of a token shard"));
  const std::int32_t magic = header_int(bytes->data(), 0), version = header_int(bytes->data(), 1),
                     count = header_int(bytes->data(), 2);
  if (magic != shard_magic)
    fail(cutrain::detail::cat("bad magic number ", magic, ", expected ", shard_magic, " (not an llm.c token shard)"));
  if (version != shard_version)
    fail(cutrain::detail::cat("unsupported version ", version, ", expected ", shard_version, " (uint16 tokens)",
                              version == 2 ? "; version 2 holds uint32 tokens (llm.c's Llama 3 shards)" : ""));
  if (count < 0) fail(cutrain::detail::cat("bad token count ", count, " in the header"));
  const std::int64_t want = shard_header_bytes + 2 * std::int64_t{count};
  if (size < want)
    fail(cutrain::detail::cat("truncated: the header declares ", count, " tokens (", want, " bytes), the file has ",
                              size, " bytes"));
  if (size > want)
    fail(cutrain::detail::cat(size - want, " trailing bytes after the ", count, " tokens the header declares (", want,
                              " bytes expected, the file has ", size, ")"));
  // The data starts 1024 bytes into a page-aligned mapping (or a new[]-aligned buffer): aligned.
  const std::span<const std::uint16_t> tokens(
      reinterpret_cast<const std::uint16_t*>(bytes->data() + shard_header_bytes), static_cast<std::size_t>(count));
  if (vocab > 0) {
    const auto bad = std::find_if(tokens.begin(), tokens.end(), [&](std::uint16_t t) { return t >= vocab; });
    if (bad != tokens.end())
      fail(cutrain::detail::cat("token ", *bad, " at position ", bad - tokens.begin(), " is outside the vocabulary [0, ",
                                vocab, ")"));
  }
  return {path, std::move(bytes), tokens};
}

inline void check_vocab(std::int64_t vocab, const char* op) {
  CUTRAIN_REQUIRE(vocab >= 0 && vocab <= shard_max_vocab, InvalidArgument, op, "vocab must be in [0, ", shard_max_vocab,
                  "] (0: unchecked), got ", vocab);
}

// Shell-style match of a file name: '*' any run of characters, '?' one character.
inline bool glob_match(std::string_view pattern, std::string_view name) {
  std::size_t p = 0, n = 0, star = std::string_view::npos, resume = 0;
  while (n < name.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == name[n])) {
      ++p;
      ++n;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      resume = n;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      n = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

}  // namespace detail

// The tokens of one shard file, checked as TokenShards checks them (vocab > 0: every token < vocab).
inline std::vector<std::uint16_t> read_token_shard(const std::filesystem::path& path, std::int64_t vocab = 0) {
  detail::check_vocab(vocab, "data::read_token_shard");
  const auto s = detail::open_shard(path, vocab, "data::read_token_shard");
  return std::vector<std::uint16_t>(s.tokens.begin(), s.tokens.end());
}

// The regular files whose names match pattern's last component ('*' and '?' wildcards; the
// directory part is taken literally), sorted by name: "out/fortunes_train_*.bin" lists
// fortunes_train_000000.bin, fortunes_train_000001.bin, ... in that order. Throws IoError when
// the directory cannot be read or nothing matches.
inline std::vector<std::filesystem::path> find_shards(const std::filesystem::path& pattern) {
  constexpr const char* op = "data::find_shards";
  const auto dir = pattern.parent_path().empty() ? std::filesystem::path(".") : pattern.parent_path();
  const std::string name = pattern.filename().string();
  CUTRAIN_REQUIRE(dir.string().find_first_of("*?") == std::string::npos, InvalidArgument, op, pattern.string(),
                  ": wildcards are allowed in the file name only, not in the directory");
  std::error_code ec;
  std::vector<std::filesystem::path> out;
  std::filesystem::directory_iterator it(dir, ec);
  CUTRAIN_REQUIRE(!ec, IoError, op, "cannot list ", dir.string(), " for ", pattern.string(), ": ", ec.message());
  for (const auto& e : it) {
    if (e.is_regular_file(ec) && detail::glob_match(name, e.path().filename().string())) out.push_back(e.path());
  }
  CUTRAIN_REQUIRE(!out.empty(), IoError, op, "no files match ", pattern.string());
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.filename().string() < b.filename().string(); });
  return out;
}

// The shards of split s in dir as llm.c names them: *_train_*.bin or *_val_*.bin.
inline std::vector<std::filesystem::path> find_shards(const std::filesystem::path& dir, Split s) {
  return find_shards(dir / ("*_" + std::string(to_string(s)) + "_*.bin"));
}

// Shard files opened and checked at construction, in the order given, read in place. Copies
// share the mapped files.
class TokenShards {
 public:
  // Every file's header and size are checked here (FileError naming the file and the reason);
  // with vocab > 0, every token too (which reads each file once). No files: InvalidArgument.
  explicit TokenShards(const std::vector<std::filesystem::path>& files, std::int64_t vocab = 0) : vocab_(vocab) {
    constexpr const char* op = "data::TokenShards";
    detail::check_vocab(vocab, op);
    CUTRAIN_REQUIRE(!files.empty(), InvalidArgument, op, "no shard files given");
    starts_.push_back(0);
    for (const auto& f : files) {
      shards_.push_back(detail::open_shard(f, vocab, op));
      starts_.push_back(starts_.back() + static_cast<std::int64_t>(shards_.back().tokens.size()));
    }
  }

  std::int64_t count() const { return static_cast<std::int64_t>(shards_.size()); }
  std::int64_t vocab() const { return vocab_; }  // 0: not checked
  std::int64_t total() const { return starts_.back(); }
  const std::filesystem::path& path(std::int64_t i) const { return at(i).path; }
  std::span<const std::uint16_t> tokens(std::int64_t i) const { return at(i).tokens; }
  std::int64_t size(std::int64_t i) const { return static_cast<std::int64_t>(at(i).tokens.size()); }
  // Where shard i starts in the shards' concatenation (the origin of TokenBatch::offsets).
  std::int64_t start(std::int64_t i) const {
    at(i);  // the range check
    return starts_[static_cast<std::size_t>(i)];
  }

 private:
  const detail::Shard& at(std::int64_t i) const {
    CUTRAIN_REQUIRE(i >= 0 && i < count(), InvalidArgument, "data::TokenShards", "shard ", i, " out of range [0, ",
                    count(), ")");
    return shards_[static_cast<std::size_t>(i)];
  }

  std::int64_t vocab_;
  std::vector<detail::Shard> shards_;
  std::vector<std::int64_t> starts_;  // count() + 1 prefix sums of the sizes
};

struct ShardLoaderOptions {
  std::int64_t batch = 0;    // rows per batch, on each rank
  std::int64_t context = 0;  // tokens per row
  std::int64_t rank = 0;     // this process, in [0, world)
  std::int64_t world = 1;    // data-parallel processes
  bool random = false;       // false: llm.c's sequential walk; true: uniformly random windows
  std::uint64_t seed = 0;    // random mode: the Rng is seeded with shard_rank_seed(seed, rank)
};

// The seed of rank's Rng in random mode: different for every rank of one seed.
inline std::uint64_t shard_rank_seed(std::uint64_t seed, std::int64_t rank) {
  return splitmix64(seed ^ (0x9e3779b97f4a7c15ull * (static_cast<std::uint64_t>(rank) + 1)));
}

// Endless int32 batches x, y [batch, context] of a TokenShards, sequential or random (see the
// top of this file). state() and set_state() save and restore where it is as two int64s:
// sequential {shard, position of the next step}, the same on every rank (so one rank's state
// resumes all, and a run may resume with another world size); random {Rng seed, Rng counter}.
class ShardLoader {
 public:
  ShardLoader(TokenShards shards, const ShardLoaderOptions& opts) : shards_(std::move(shards)), opts_(opts) {
    constexpr const char* op = "data::ShardLoader";
    CUTRAIN_REQUIRE(opts.batch > 0, InvalidArgument, op, "batch must be positive, got ", opts.batch);
    CUTRAIN_REQUIRE(opts.context > 0, InvalidArgument, op, "context must be positive, got ", opts.context);
    CUTRAIN_REQUIRE(opts.world >= 1 && opts.rank >= 0 && opts.rank < opts.world, InvalidArgument, op,
                    "rank must be in [0, world) with world >= 1, got rank ", opts.rank, ", world ", opts.world);
    constexpr std::int64_t most = std::int64_t{1} << 40;
    CUTRAIN_REQUIRE(opts.batch <= most / opts.context && opts.batch * opts.context <= most / opts.world,
                    InvalidArgument, op, "world ", opts.world, " x batch ", opts.batch, " x context ", opts.context,
                    " tokens per step is implausibly many (at most 2^40)");
    const std::int64_t step = this->step();
    for (std::int64_t i = 0; i < shards_.count(); ++i) {
      const std::int64_t n = shards_.size(i);
      CUTRAIN_REQUIRE(n >= opts.context + 1, InvalidArgument, op, shards_.path(i).string(), " has ", n,
                      " tokens, shorter than a window of context ", opts.context, " + 1");
      CUTRAIN_REQUIRE(opts.random || n >= step + 1, InvalidArgument, op, shards_.path(i).string(), " has ", n,
                      " tokens, fewer than one sequential step needs: world ", opts.world, " x batch ", opts.batch,
                      " x context ", opts.context, " + 1 = ", step + 1);
      windows_.push_back((windows_.empty() ? 0 : windows_.back()) + n - opts.context);
    }
    reset();
  }

  const TokenShards& shards() const { return shards_; }
  const ShardLoaderOptions& options() const { return opts_; }

  // Steps in one sequential pass over all shards (each shard: floor((size - 1) / (world * batch * context))).
  std::int64_t steps_per_pass() const {
    std::int64_t steps = 0;
    for (std::int64_t i = 0; i < shards_.count(); ++i) steps += (shards_.size(i) - 1) / step();
    return steps;
  }

  // Back to the first step: shard 0, position 0; random mode: the Rng's first draw.
  void reset() {
    shard_ = 0;
    position_ = 0;
    rng_ = Rng(shard_rank_seed(opts_.seed, opts_.rank));
  }

  TokenBatch next() {
    const std::int64_t rows = opts_.batch, context = opts_.context;
    std::vector<std::int64_t> offsets(static_cast<std::size_t>(rows));
    if (opts_.random) {
      for (auto& o : offsets) {
        const auto w = static_cast<std::int64_t>(rng_.below(static_cast<std::uint64_t>(windows_.back())));
        const auto i = std::upper_bound(windows_.begin(), windows_.end(), w) - windows_.begin();
        o = shards_.start(i) + w - (i == 0 ? 0 : windows_[static_cast<std::size_t>(i - 1)]);
      }
    } else {
      if (position_ + step() + 1 > shards_.size(shard_)) {
        shard_ = (shard_ + 1) % shards_.count();
        position_ = 0;
      }
      const std::int64_t first = shards_.start(shard_) + position_ + opts_.rank * rows * context;
      for (std::int64_t b = 0; b < rows; ++b) offsets[static_cast<std::size_t>(b)] = first + b * context;
      position_ += step();
    }
    return windows(std::move(offsets));
  }

  std::array<std::int64_t, 2> state() const {
    if (opts_.random) return {static_cast<std::int64_t>(rng_.seed()), static_cast<std::int64_t>(rng_.counter())};
    return {shard_, position_};
  }

  void set_state(const std::array<std::int64_t, 2>& s) {
    constexpr const char* op = "data::ShardLoader::set_state";
    if (opts_.random) {
      const auto seed = shard_rank_seed(opts_.seed, opts_.rank);
      CUTRAIN_REQUIRE(static_cast<std::uint64_t>(s[0]) == seed && s[1] >= 0, InvalidArgument, op, "state {", s[0],
                      ", ", s[1], "} is not one of this random loader's (seed ", opts_.seed, ", rank ", opts_.rank,
                      "): saved with another seed, rank or mode");
      rng_.set_state(seed, static_cast<std::uint64_t>(s[1]));
      return;
    }
    CUTRAIN_REQUIRE(s[0] >= 0 && s[0] < shards_.count() && s[1] >= 0 && s[1] <= shards_.size(s[0]), InvalidArgument,
                    op, "state {", s[0], ", ", s[1], "} is not a position in these ", shards_.count(),
                    " shards (saved with other shards, or by a random loader)");
    shard_ = s[0];
    position_ = s[1];
  }

 private:
  std::int64_t step() const { return opts_.world * opts_.batch * opts_.context; }

  // The rows at offsets (positions in the shards' concatenation) as a batch.
  TokenBatch windows(std::vector<std::int64_t> offsets) const {
    const auto rows = static_cast<std::int64_t>(offsets.size());
    const std::int64_t context = opts_.context;
    TokenBatch b{Tensor<std::int32_t>::empty({rows, context}), Tensor<std::int32_t>::empty({rows, context}),
                 std::move(offsets)};
    std::int32_t *x = b.x.data(), *y = b.y.data();
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t o = b.offsets[static_cast<std::size_t>(r)];
      const std::int64_t i = shard_of(o);
      const std::uint16_t* w = shards_.tokens(i).data() + (o - shards_.start(i));
      for (std::int64_t t = 0; t < context; ++t) {
        x[r * context + t] = w[t];
        y[r * context + t] = w[t + 1];
      }
    }
    return b;
  }

  std::int64_t shard_of(std::int64_t offset) const {
    std::int64_t lo = 0, hi = shards_.count() - 1;  // the last shard whose start is <= offset
    while (lo < hi) {
      const std::int64_t mid = (lo + hi + 1) / 2;
      if (shards_.start(mid) <= offset) lo = mid;
      else hi = mid - 1;
    }
    return lo;
  }

  TokenShards shards_;
  ShardLoaderOptions opts_;
  std::vector<std::int64_t> windows_;  // prefix sums of the shards' window counts (size - context)
  std::int64_t shard_ = 0, position_ = 0;
  Rng rng_;
};

// The first count sequential steps of val for this rank (opts.random must be false): the same
// batches on every call and every machine, none repeated. Throws InvalidArgument when val holds
// fewer than count steps of world x batch x context.
inline std::vector<TokenBatch> eval_batches(const TokenShards& val, const ShardLoaderOptions& opts, std::int64_t count) {
  constexpr const char* op = "data::eval_batches";
  CUTRAIN_REQUIRE(!opts.random, InvalidArgument, op, "evaluation batches are sequential: set .random = false");
  CUTRAIN_REQUIRE(count > 0, InvalidArgument, op, "count must be positive, got ", count);
  ShardLoader loader(val, opts);
  const std::int64_t steps = loader.steps_per_pass();
  CUTRAIN_REQUIRE(count <= steps, InvalidArgument, op, "asked for ", count, " batches; the ", val.count(),
                  " val shards (", val.total(), " tokens) hold ", steps, " steps of world ", opts.world, " x batch ",
                  opts.batch, " x context ", opts.context);
  std::vector<TokenBatch> out;
  out.reserve(static_cast<std::size_t>(count));
  for (std::int64_t k = 0; k < count; ++k) out.push_back(loader.next());
  return out;
}

}  // namespace cutrain::inline CUTRAIN_ABI::data
