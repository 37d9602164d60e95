// Makes GPT token shards from text: trains a SentencePiece BPE tokenizer (or loads one), encodes
// the text and writes llm.c-format shards (data/shards.hpp) that data::ShardLoader reads.
//
//   make_shards --input FILE [--input FILE ...] --out DIR --name NAME --vocab N [--model PREFIX]
//               [--val-fraction X] [--shard-tokens N] [--check]
//   make_shards --decode MODEL < ids      (token ids, e.g. examples/gpt's samples, to text)
//
// The inputs are read as bytes and concatenated in the order given. The last --val-fraction of
// the bytes (default 0.1; 0: no val split), from the first line start at or after that point, is
// the validation text; the rest is the training text. Without --model a BPE model of --vocab
// pieces is trained on the training text's lines and written as DIR/NAME.model (and NAME.vocab:
// piece and score per line); --model PREFIX loads PREFIX.model instead (or PREFIX itself when it
// ends in .model). The tokenizer is set up so that decode(encode(text)) == text byte for byte:
// identity normalization, no dummy prefix, whitespace kept, byte fallback (every byte the
// pieces miss, '\n' included, is one <0xNN> token). SentencePiece cannot keep invalid UTF-8
// or the character U+2581 (its space marker), so text holding either is refused.
//
// Writes DIR/NAME_train_000000.bin, _000001, ... and DIR/NAME_val_000000.bin, ...: each split
// cut into ceil(tokens / --shard-tokens) shards of near-equal size (default 100,000,000 tokens a
// shard, llm.c's size); shards of NAME left from an earlier run with more shards are removed.
// --check reads the shards back (checking every token against the vocabulary), decodes them
// with the model and compares with the text. Needs SentencePiece (Debian libsentencepiece-dev).
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cutrain/core/error.hpp"
#include "cutrain/core/files.hpp"
#include "cutrain/data/shards.hpp"

using namespace cutrain;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  std::vector<std::string> inputs;
  std::string out, name, model;
  std::int64_t vocab = 0, shard_tokens = 100'000'000;
  double val_fraction = 0.1;
  bool check = false;
  std::string decode;  // --decode MODEL: ids on stdin to text on stdout
};

[[noreturn]] void usage(const std::string& why) {
  std::cerr << "make_shards: " << why << "\n"
            << "usage: make_shards --input FILE [--input FILE ...] --out DIR --name NAME --vocab N [--model PREFIX]\n"
            << "                   [--val-fraction X] [--shard-tokens N] [--check]\n"
            << "       make_shards --decode MODEL < ids\n"
            << "  (scripts/make-shards DIR builds the fortunes shards with it)\n";
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(f + " needs a value");
      return argv[++i];
    };
    const auto num = [&] {
      const std::string v = value();
      try {
        std::size_t used = 0;
        const long long n = std::stoll(v, &used);
        if (used != v.size() || n <= 0) throw std::invalid_argument(v);
        return static_cast<std::int64_t>(n);
      } catch (const std::exception&) {
        usage(f + " wants a positive integer, got " + v);
      }
    };
    if (f == "--input") a.inputs.push_back(value());
    else if (f == "--out") a.out = value();
    else if (f == "--name") a.name = value();
    else if (f == "--vocab") a.vocab = num();
    else if (f == "--model") a.model = value();
    else if (f == "--shard-tokens") a.shard_tokens = num();
    else if (f == "--check") a.check = true;
    else if (f == "--decode") a.decode = value();
    else if (f == "--val-fraction") {
      const std::string v = value();
      try {
        std::size_t used = 0;
        a.val_fraction = std::stod(v, &used);
        if (used != v.size() || !(a.val_fraction >= 0 && a.val_fraction < 1)) throw std::invalid_argument(v);
      } catch (const std::exception&) {
        usage("--val-fraction wants a number in [0, 1), got " + v);
      }
    } else if (f == "--help" || f == "-h") usage("makes llm.c-format token shards with a SentencePiece BPE tokenizer");
    else usage("unknown flag " + f);
  }
  if (!a.decode.empty()) return a;
  if (a.inputs.empty()) usage("--input FILE is required");
  if (a.out.empty()) usage("--out DIR is required");
  if (a.name.empty() || a.name.find('/') != std::string::npos) usage("--name NAME is required (a file name prefix, no '/')");
  if (a.model.empty() && a.vocab == 0) usage("--vocab N is required to train a model (or --model PREFIX)");
  if (a.vocab > data::shard_max_vocab)
    usage("--vocab " + std::to_string(a.vocab) + " does not fit uint16 tokens (at most 65536)");
  if (a.shard_tokens > data::shard_max_tokens) usage("--shard-tokens must be at most 2^31 - 1");
  return a;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  CUTRAIN_REQUIRE(in.is_open(), IoError, "make_shards", "cannot open ", path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CUTRAIN_REQUIRE(!in.bad(), IoError, "make_shards", "error while reading ", path);
  return text;
}

// The offset of the first byte that is not strict UTF-8 (RFC 3629: no overlong forms, no
// surrogates, nothing above U+10FFFF), or of the character U+2581; npos when there is none.
std::size_t first_unkeepable(std::string_view s, bool& is_marker) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  is_marker = false;
  for (std::size_t i = 0; i < n;) {
    const unsigned c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    const std::size_t len = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    if (len == 0 || i + len > n) return i;
    unsigned lo = 0x80, hi = 0xBF;  // the second byte's range
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
    if (p[i + 1] < lo || p[i + 1] > hi) return i;
    for (std::size_t k = 2; k < len; ++k)
      if (p[i + k] < 0x80 || p[i + k] > 0xBF) return i;
    if (len == 3 && c == 0xE2 && p[i + 1] == 0x96 && p[i + 2] == 0x81) {
      is_marker = true;
      return i;
    }
    i += len;
  }
  return std::string_view::npos;
}

void check_keepable(const std::string& path, std::string_view text) {
  bool marker = false;
  const auto at = first_unkeepable(text, marker);
  if (at == std::string_view::npos) return;
  const auto line = 1 + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(at), '\n');
  throw InvalidArgument("make_shards",
                        cutrain::detail::cat(path, ": byte ", at, " (line ", line, ") ",
                                             marker ? "is the character U+2581, SentencePiece's space marker"
                                                    : "is not valid UTF-8",
                                             ": SentencePiece would change it and the text would not round-trip"));
}

// The lines of a text (without their '\n') for the trainer.
class LineIterator : public sentencepiece::SentenceIterator {
 public:
  explicit LineIterator(std::string_view text) : rest_(text) { Next(); }
  bool done() const override { return done_; }
  void Next() override {
    if (rest_.empty()) {
      done_ = true;
      return;
    }
    const auto nl = rest_.find('\n');
    line_.assign(rest_.substr(0, nl));
    rest_.remove_prefix(nl == std::string_view::npos ? rest_.size() : nl + 1);
  }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  std::string_view rest_;
  std::string line_;
  bool done_ = false;
};

void require_ok(const sentencepiece::util::Status& s, const std::string& what) {
  CUTRAIN_REQUIRE(s.ok(), Error, "make_shards", what, ": ", s.ToString());
}

// Trains the BPE model on text's lines; returns the serialized model.
std::string train_model(std::string_view text, std::int64_t vocab) {
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  const std::unordered_map<std::string, std::string> spec = {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(vocab)},
      {"byte_fallback", "true"},                 // any byte outside the pieces is a <0xNN> token
      {"normalization_rule_name", "identity"},   // no NFKC: the text as it is
      {"add_dummy_prefix", "false"},             // no space added before the text
      {"remove_extra_whitespaces", "false"},     // spaces kept as they are
      {"allow_whitespace_only_pieces", "true"},  // runs of spaces (indentation) as pieces
      {"split_digits", "true"},
      {"num_threads", std::to_string(threads)},
      {"minloglevel", "1"},                      // warnings only
  };
  LineIterator lines(text);
  std::string model;
  require_ok(sentencepiece::SentencePieceTrainer::Train(spec, &lines, &model), "training the BPE model");
  return model;
}

// text's tokens, encoded in pieces of about 64 KiB cut after a '\n' (no piece holds a '\n').
std::vector<std::uint16_t> encode(const sentencepiece::SentencePieceProcessor& sp, std::string_view text) {
  std::vector<std::uint16_t> out;
  std::vector<int> ids;
  while (!text.empty()) {
    std::size_t cut = text.size();
    if (cut > (std::size_t{1} << 16)) {
      const auto nl = text.find('\n', std::size_t{1} << 16);
      cut = nl == std::string_view::npos ? text.size() : nl + 1;
    }
    require_ok(sp.Encode(text.substr(0, cut), &ids), "encoding");
    for (const int id : ids) out.push_back(static_cast<std::uint16_t>(id));
    text.remove_prefix(cut);
  }
  return out;
}

std::string shard_name(const std::string& name, const char* split, std::int64_t i) {
  char index[24];
  std::snprintf(index, sizeof index, "%06lld", static_cast<long long>(i));
  return name + "_" + split + "_" + index + ".bin";
}

// Writes tokens as ceil(n / shard_tokens) shards of near-equal size (none when there are no
// tokens) and removes NAME_split_*.bin shards numbered past them. Returns the paths written.
std::vector<fs::path> write_split(const Args& a, const char* split, const std::vector<std::uint16_t>& tokens) {
  const auto n = static_cast<std::int64_t>(tokens.size());
  const std::int64_t k = (n + a.shard_tokens - 1) / a.shard_tokens;
  CUTRAIN_REQUIRE(k < 1'000'000, InvalidArgument, "make_shards", n, " ", split, " tokens make ", k,
                  " shards, more than six digits number: raise --shard-tokens");
  std::vector<fs::path> paths;
  for (std::int64_t i = 0; i < k; ++i) {
    paths.push_back(fs::path(a.out) / shard_name(a.name, split, i));
    const auto* first = tokens.data() + i * n / k;
    data::write_token_shard(paths.back(), std::span<const std::uint16_t>(first, tokens.data() + (i + 1) * n / k));
  }
  const std::string prefix = a.name + "_" + split + "_";
  for (const auto& e : fs::directory_iterator(a.out)) {
    const std::string f = e.path().filename().string();
    if (f.size() != prefix.size() + 10 || !f.starts_with(prefix) || !f.ends_with(".bin")) continue;
    const std::string digits = f.substr(prefix.size(), 6);
    if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) continue;
    if (std::stoll(digits) >= k) {
      fs::remove(e.path());
      std::printf("make_shards: removed %s (left from an earlier run)\n", e.path().c_str());
    }
  }
  return paths;
}

std::vector<std::uint16_t> read_split(const std::vector<fs::path>& paths, std::int64_t vocab) {
  std::vector<std::uint16_t> out;
  for (const auto& p : paths) {
    const auto t = data::read_token_shard(p, vocab);
    out.insert(out.end(), t.begin(), t.end());
  }
  return out;
}

// decode(tokens) == text, or an exception saying where they part.
void check_round_trip(const sentencepiece::SentencePieceProcessor& sp, const char* split,
                      const std::vector<std::uint16_t>& tokens, std::string_view text) {
  const std::vector<int> ids(tokens.begin(), tokens.end());
  std::string back;
  require_ok(sp.Decode(ids, &back), cutrain::detail::cat("decoding the ", split, " shards"));
  if (back == text) return;
  const auto diff = std::mismatch(back.begin(), back.end(), text.begin(), text.end());
  throw Error("make_shards", cutrain::detail::cat("check failed: the ", split, " shards decode to ", back.size(),
                                                  " bytes, the text has ", text.size(), "; first difference at byte ",
                                                  diff.second - text.begin()));
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  try {
    if (!a.decode.empty()) {  // ids (whitespace-separated) on stdin -> text
      sentencepiece::SentencePieceProcessor sp;
      require_ok(sp.Load(a.decode), "loading " + a.decode);
      std::vector<int> ids;
      for (long long id; std::cin >> id;) {
        CUTRAIN_REQUIRE(id >= 0 && id < sp.GetPieceSize(), InvalidArgument, "make_shards", "token ", id,
                        " is outside the vocabulary of ", a.decode, " (", sp.GetPieceSize(), " pieces)");
        ids.push_back(static_cast<int>(id));
      }
      std::string text;
      require_ok(sp.Decode(ids, &text), "decoding");
      std::cout << text << std::endl;
      return 0;
    }
    std::string text;
    for (const auto& path : a.inputs) {
      const std::string t = read_file(path);
      check_keepable(path, t);
      text += t;
    }
    CUTRAIN_REQUIRE(!text.empty(), InvalidArgument, "make_shards", "the inputs are empty");
    std::printf("make_shards: %zu bytes from %zu file%s\n", text.size(), a.inputs.size(), a.inputs.size() == 1 ? "" : "s");

    // The validation text starts at the first line start at or after (1 - val_fraction) * size.
    std::size_t split = text.size();
    if (a.val_fraction > 0) {
      const auto at = static_cast<std::size_t>(static_cast<double>(text.size()) * (1.0 - a.val_fraction));
      if (at == 0) {
        split = 0;
      } else {  // a line starts at at when the byte before it is a '\n'
        const auto nl = text.find('\n', at - 1);
        split = nl == std::string::npos ? text.size() : nl + 1;
      }
      CUTRAIN_REQUIRE(split > 0 && split < text.size(), InvalidArgument, "make_shards", "--val-fraction ",
                      a.val_fraction, " of ", text.size(), " bytes leaves an empty split (no line starts at or after byte ",
                      at, ")");
    }
    const std::string_view train_text = std::string_view(text).substr(0, split), val_text = std::string_view(text).substr(split);

    fs::create_directories(a.out);
    sentencepiece::SentencePieceProcessor sp;
    if (a.model.empty()) {
      const auto t0 = Clock::now();
      const std::string model = train_model(train_text, a.vocab);
      require_ok(sp.LoadFromSerializedProto(model), "loading the trained model");
      const auto model_path = fs::path(a.out) / (a.name + ".model");
      files::write_atomically(model_path, model, "make_shards");
      std::string vocab;
      for (int i = 0; i < sp.GetPieceSize(); ++i) vocab += cutrain::detail::cat(sp.IdToPiece(i), "\t", sp.GetScore(i), "\n");
      files::write_atomically(fs::path(a.out) / (a.name + ".vocab"), vocab, "make_shards");
      std::printf("make_shards: trained a BPE model of %d pieces on %zu bytes in %.1f s: %s\n", sp.GetPieceSize(),
                  train_text.size(), std::chrono::duration<double>(Clock::now() - t0).count(), model_path.c_str());
    } else {
      const std::string path = a.model.ends_with(".model") ? a.model : a.model + ".model";
      require_ok(sp.Load(path), "loading " + path);
      std::printf("make_shards: model %s, %d pieces\n", path.c_str(), sp.GetPieceSize());
    }
    const std::int64_t vocab = sp.GetPieceSize();
    CUTRAIN_REQUIRE(vocab <= data::shard_max_vocab, InvalidArgument, "make_shards", "the model has ", vocab,
                    " pieces, more than uint16 tokens hold (65536)");
    CUTRAIN_REQUIRE(a.vocab == 0 || a.vocab == vocab, InvalidArgument, "make_shards", "--vocab ", a.vocab,
                    " but the model has ", vocab, " pieces");

    const auto t0 = Clock::now();
    const auto train = encode(sp, train_text), val = encode(sp, val_text);
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    const auto train_paths = write_split(a, "train", train), val_paths = write_split(a, "val", val);
    std::printf("make_shards: encoded %zu bytes in %.1f s (%.2f bytes a token)\n", text.size(), seconds,
                static_cast<double>(text.size()) / static_cast<double>(std::max<std::size_t>(1, train.size() + val.size())));
    std::printf("make_shards: train %zu tokens in %zu shard%s: %s%s\n", train.size(), train_paths.size(),
                train_paths.size() == 1 ? "" : "s", train_paths.front().c_str(), train_paths.size() > 1 ? " ..." : "");
    if (!val_paths.empty())
      std::printf("make_shards: val %zu tokens in %zu shard%s: %s%s\n", val.size(), val_paths.size(),
                  val_paths.size() == 1 ? "" : "s", val_paths.front().c_str(), val_paths.size() > 1 ? " ..." : "");

    if (a.check) {
      check_round_trip(sp, "train", read_split(train_paths, vocab), train_text);
      check_round_trip(sp, "val", read_split(val_paths, vocab), val_text);
      std::printf("make_shards: check: the shards decode to the text, all %zu bytes\n", text.size());
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "make_shards: " << e.what() << "\n";
    return 1;
  }
}
