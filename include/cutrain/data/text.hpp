// data::CharCorpus: a text file as byte-level tokens, split into train and validation, with a
// random window sampler for training and evenly spaced windows for the validation loss.
//
//   data::CharCorpus corpus("fortunes.txt");              // scripts/char-corpus writes it
//   Rng rng(1337);
//   auto [x, y, offsets] = corpus.sample(data::Split::train, 64, 256, rng);  // int32 [64, 256]
//   for (auto& b : corpus.eval_batches(data::Split::val, 64, 256, 50)) { ... }
//
// Tokens are bytes: the vocabulary is the distinct bytes of the file, sorted, and a byte's id is
// its rank in that list (no UTF-8 decoding: a multi-byte character is several tokens). The split
// is by position: train = tokens [0, n_train), validation = tokens [n_train, n) with
// n_train = floor(n * train_fraction) computed in double. A window at offset o of a split s of
// length L holds x[t] = s[o + t] and y[t] = s[o + t + 1], t < context, so 0 <= o <= L - context - 1.
//
// bench/torch_char_gpt.py reads the same file the same way: same vocabulary, split, and
// eval_batches windows (formula at eval_offsets), so the two validation losses compare.
// Limits: the whole file is held in memory, 4 bytes per token, on the host; batches are host
// tensors (move them to the device with .to(dev)).
#pragma once

#include "cutrain/core/abi.hpp"

#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cutrain/core/error.hpp"
#include "cutrain/core/random.hpp"
#include "cutrain/core/tensor.hpp"

namespace cutrain::inline CUTRAIN_ABI::data {

enum class Split { train, val };

inline std::string_view to_string(Split s) { return s == Split::train ? "train" : "val"; }

struct TokenBatch {
  Tensor<std::int32_t> x;             // [batch, context]
  Tensor<std::int32_t> y;             // [batch, context]: x shifted left by one token
  std::vector<std::int64_t> offsets;  // row b's window starts at token offsets[b] of its split
};

class CharCorpus {
 public:
  // Reads path as bytes. Throws IoError for a file that cannot be read or is empty.
  explicit CharCorpus(const std::string& path, double train_fraction = 0.9)
      : CharCorpus(read_bytes(path), train_fraction, path) {}

  // The same from bytes in memory; name says where they came from, in error messages.
  static CharCorpus from_text(std::string text, double train_fraction = 0.9, std::string name = "<text>") {
    CUTRAIN_REQUIRE(!text.empty(), InvalidArgument, "data::CharCorpus", name, ": the text is empty");
    return CharCorpus(std::move(text), train_fraction, std::move(name));
  }

  const std::string& name() const { return name_; }
  double train_fraction() const { return train_fraction_; }
  std::int64_t vocab_size() const { return static_cast<std::int64_t>(bytes_.size()); }
  // The vocabulary: token id i is byte vocab()[i].
  const std::vector<unsigned char>& vocab() const { return bytes_; }
  std::int64_t size() const { return static_cast<std::int64_t>(train_.size() + val_.size()); }
  std::int64_t size(Split s) const { return static_cast<std::int64_t>(tokens(s).size()); }
  const std::vector<std::int32_t>& tokens(Split s) const { return s == Split::train ? train_ : val_; }

  // Byte string to token ids; a byte that is not in the vocabulary throws InvalidArgument.
  std::vector<std::int32_t> encode(std::string_view text) const {
    std::vector<std::int32_t> out;
    out.reserve(text.size());
    for (std::size_t i = 0; i < text.size(); ++i) {
      const auto b = static_cast<unsigned char>(text[i]);
      CUTRAIN_REQUIRE(id_[b] >= 0, InvalidArgument, "data::CharCorpus::encode", "byte ", int(b), " (0x", hex(b),
                      ") at position ", i, " is not in the vocabulary of ", name_, " (", vocab_size(), " bytes)");
      out.push_back(id_[b]);
    }
    return out;
  }

  // Token ids to the byte string; an id outside [0, vocab_size()) throws InvalidArgument.
  std::string decode(const std::vector<std::int32_t>& ids) const {
    std::string out;
    out.reserve(ids.size());
    for (std::size_t i = 0; i < ids.size(); ++i) {
      CUTRAIN_REQUIRE(ids[i] >= 0 && ids[i] < vocab_size(), InvalidArgument, "data::CharCorpus::decode", "token ", ids[i],
                      " at position ", i, " is outside the vocabulary [0, ", vocab_size(), ")");
      out += static_cast<char>(bytes_[static_cast<std::size_t>(ids[i])]);
    }
    return out;
  }

  // batch windows of split s at offsets drawn uniformly from [0, size(s) - context - 1]
  // (rng.below(size(s) - context), one draw per row, in row order).
  TokenBatch sample(Split s, std::int64_t batch, std::int64_t context, Rng& rng) const {
    check_window("data::CharCorpus::sample", s, batch, context);
    std::vector<std::int64_t> offsets(static_cast<std::size_t>(batch));
    const auto starts = static_cast<std::uint64_t>(size(s) - context);
    for (auto& o : offsets) o = static_cast<std::int64_t>(rng.below(starts));
    return windows(s, context, std::move(offsets));
  }

  // The offsets of the validation windows, count batches of batch rows: with W = batch * count
  // windows and M = size(s) - context - 1 the last possible offset, window i (i < W) starts at
  //   i * M / (W - 1)   (integer division; 0 when W == 1)
  // so the first starts at 0, the last at M, evenly spaced between. Window i is row i % batch of
  // batch i / batch. bench/torch_char_gpt.py uses the same formula.
  std::vector<std::int64_t> eval_offsets(Split s, std::int64_t batch, std::int64_t context, std::int64_t count) const {
    check_window("data::CharCorpus::eval_batches", s, batch, context);
    CUTRAIN_REQUIRE(count > 0, InvalidArgument, "data::CharCorpus::eval_batches", "count must be positive, got ", count);
    CUTRAIN_REQUIRE(batch <= (std::int64_t{1} << 24) / count, InvalidArgument, "data::CharCorpus::eval_batches", "batch ",
                    batch, " x count ", count, " windows is implausibly many (at most 2^24)");
    const std::int64_t w = batch * count, last = size(s) - context - 1;
    std::vector<std::int64_t> offsets(static_cast<std::size_t>(w));
    for (std::int64_t i = 0; i < w; ++i) offsets[static_cast<std::size_t>(i)] = w == 1 ? 0 : i * last / (w - 1);
    return offsets;
  }

  // count batches of the windows eval_offsets gives: the same on every call and every machine.
  std::vector<TokenBatch> eval_batches(Split s, std::int64_t batch, std::int64_t context, std::int64_t count) const {
    const auto all = eval_offsets(s, batch, context, count);
    std::vector<TokenBatch> out;
    out.reserve(static_cast<std::size_t>(count));
    for (std::int64_t k = 0; k < count; ++k) {
      const auto first = all.begin() + k * batch;
      out.push_back(windows(s, context, std::vector<std::int64_t>(first, first + batch)));
    }
    return out;
  }

 private:
  CharCorpus(std::string text, double train_fraction, std::string name)
      : name_(std::move(name)), train_fraction_(train_fraction) {
    CUTRAIN_REQUIRE(train_fraction > 0.0 && train_fraction < 1.0, InvalidArgument, "data::CharCorpus", name_,
                    ": train_fraction must be in (0, 1), got ", train_fraction);
    const auto n = static_cast<std::int64_t>(text.size());
    const auto n_train = static_cast<std::int64_t>(static_cast<double>(n) * train_fraction);
    CUTRAIN_REQUIRE(n_train >= 1 && n_train < n, InvalidArgument, "data::CharCorpus", name_, ": ", n,
                    " bytes split at train_fraction ", train_fraction, " leave an empty split (", n_train, " train, ",
                    n - n_train, " val)");
    std::array<bool, 256> seen{};
    for (const char c : text) seen[static_cast<unsigned char>(c)] = true;
    id_.fill(-1);
    for (int b = 0; b < 256; ++b) {
      if (!seen[static_cast<std::size_t>(b)]) continue;
      id_[static_cast<std::size_t>(b)] = static_cast<std::int32_t>(bytes_.size());
      bytes_.push_back(static_cast<unsigned char>(b));
    }
    train_.reserve(static_cast<std::size_t>(n_train));
    val_.reserve(static_cast<std::size_t>(n - n_train));
    for (std::int64_t i = 0; i < n; ++i)
      (i < n_train ? train_ : val_).push_back(id_[static_cast<unsigned char>(text[static_cast<std::size_t>(i)])]);
  }

  static std::string read_bytes(const std::string& path) {
    std::error_code ec;
    CUTRAIN_REQUIRE(!std::filesystem::is_directory(path, ec), IoError, "data::CharCorpus", path,
                    " is a directory, not a text file");
    std::ifstream in(path, std::ios::binary);
    CUTRAIN_REQUIRE(in.is_open(), IoError, "data::CharCorpus", "cannot open ", path,
                    " (for the fortunes corpus: scripts/setup, then scripts/char-corpus FILE)");
    std::string text;
    try {  // a stream error of the standard library (an unreadable file) becomes this library's
      text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    } catch (const std::exception& e) {
      throw IoError("data::CharCorpus", cutrain::detail::cat("error while reading ", path, ": ", e.what()));
    }
    CUTRAIN_REQUIRE(!in.bad(), IoError, "data::CharCorpus", "error while reading ", path);
    CUTRAIN_REQUIRE(!text.empty(), IoError, "data::CharCorpus", path, " is empty");
    return text;
  }

  static std::string hex(unsigned char b) {
    constexpr char digits[] = "0123456789abcdef";
    return {digits[b >> 4], digits[b & 15]};
  }

  void check_window(const char* op, Split s, std::int64_t batch, std::int64_t context) const {
    CUTRAIN_REQUIRE(s == Split::train || s == Split::val, InvalidArgument, op, "unknown split ", static_cast<int>(s));
    CUTRAIN_REQUIRE(batch > 0, InvalidArgument, op, "batch must be positive, got ", batch);
    CUTRAIN_REQUIRE(context > 0, InvalidArgument, op, "context must be positive, got ", context);
    CUTRAIN_REQUIRE(batch <= (std::int64_t{1} << 31) / context, InvalidArgument, op, "batch ", batch, " x context ",
                    context, " tokens is implausibly many (at most 2^31 a batch)");
    CUTRAIN_REQUIRE(context < size(s), InvalidArgument, op, "context ", context, " needs ", context, " + 1 tokens, the ",
                    to_string(s), " split of ", name_, " has ", size(s));
  }

  TokenBatch windows(Split s, std::int64_t context, std::vector<std::int64_t> offsets) const {
    const auto batch = static_cast<std::int64_t>(offsets.size());
    TokenBatch b{Tensor<std::int32_t>({batch, context}), Tensor<std::int32_t>({batch, context}), std::move(offsets)};
    const std::int32_t* src = tokens(s).data();
    std::int32_t *x = b.x.data(), *y = b.y.data();
    for (std::int64_t r = 0; r < batch; ++r) {
      const std::int32_t* w = src + b.offsets[static_cast<std::size_t>(r)];
      for (std::int64_t t = 0; t < context; ++t) {
        x[r * context + t] = w[t];
        y[r * context + t] = w[t + 1];
      }
    }
    return b;
  }

  std::string name_;
  double train_fraction_;
  std::vector<unsigned char> bytes_;   // id -> byte, sorted
  std::array<std::int32_t, 256> id_;  // byte -> id, -1 when absent
  std::vector<std::int32_t> train_, val_;
};

}  // namespace cutrain::inline CUTRAIN_ABI::data
