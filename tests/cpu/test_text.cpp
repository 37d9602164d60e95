// data::CharCorpus on hand-made files: the byte vocabulary, encode/decode, the split by
// position, the x/y shift, the eval windows' formula and determinism, the sampler's offsets,
// bad input, and the real fortunes corpus when scripts/char-corpus has written one.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "bad_input.hpp"
#include "cutrain/data/text.hpp"
#include "temp_dir.hpp"

namespace cutrain_test_text {  // one per file: the unity build compiles files together

using namespace cutrain;
using data::CharCorpus;
using data::Split;

namespace {
std::string write_file(const test::TempDir& dir, const std::string& name, const std::string& bytes) {
  const auto p = (dir / name).string();
  std::ofstream(p, std::ios::binary) << bytes;
  return p;
}

// 1000 bytes with every id appearing, and no short period (so a window identifies its offset).
std::string varied_text(std::size_t n = 1000) {
  const std::string alphabet = "abcdefghij\n %";
  std::string s;
  Rng rng(7);
  for (std::size_t i = 0; i < n; ++i) s += alphabet[rng.below(alphabet.size())];
  return s;
}

// Row r of a [B, T] int32 tensor.
std::vector<std::int32_t> row(const Tensor<std::int32_t>& t, std::int64_t r) {
  const std::int64_t c = t.shape()[1];
  return std::vector<std::int32_t>(t.data() + r * c, t.data() + (r + 1) * c);
}

std::vector<std::int32_t> slice(const std::vector<std::int32_t>& v, std::int64_t from, std::int64_t n) {
  return std::vector<std::int32_t>(v.begin() + from, v.begin() + from + n);
}
}  // namespace

TEST_CASE("text: the vocabulary is the sorted distinct bytes of the file") {
  test::TempDir dir("text_vocab");
  const std::string text = std::string("hello, world\n%\n") + '\x00' + "\xc3\xa9\xff";
  const CharCorpus c(write_file(dir, "t.txt", text));
  const std::set<unsigned char> distinct(text.begin(), text.end());
  CHECK(c.vocab_size() == static_cast<std::int64_t>(distinct.size()));
  CHECK(c.vocab() == std::vector<unsigned char>(distinct.begin(), distinct.end()));
  CHECK(c.vocab().front() == 0);
  CHECK(c.vocab().back() == 0xff);
  CHECK(c.size() == static_cast<std::int64_t>(text.size()));
  // A byte's id is its rank: '\n' (10) is id 1 after the NUL byte.
  CHECK(c.encode("\n") == std::vector<std::int32_t>{1});
}

TEST_CASE("text: encode and decode round trip, on text and on every id") {
  const auto c = CharCorpus::from_text(varied_text());
  const std::string s = "abc\n% jih";
  const auto ids = c.encode(s);
  REQUIRE(ids.size() == s.size());
  CHECK(c.decode(ids) == s);
  std::vector<std::int32_t> all;
  for (std::int32_t i = 0; i < c.vocab_size(); ++i) all.push_back(i);
  CHECK(c.encode(c.decode(all)) == all);
  CHECK(c.encode("").empty());
  // Sorted: ids follow byte order.
  CHECK(c.encode("\n %a") == std::vector<std::int32_t>{0, 1, 2, 3});
}

TEST_CASE("text: train is the first 90%, val the last 10%, by position") {
  const std::string text = varied_text(1000);
  const auto c = CharCorpus::from_text(text);
  CHECK(c.size(Split::train) == 900);
  CHECK(c.size(Split::val) == 100);
  CHECK(c.tokens(Split::train) == c.encode(text.substr(0, 900)));
  CHECK(c.tokens(Split::val) == c.encode(text.substr(900)));

  // n_train = floor(n * fraction): 1001 * 0.9 = 900.9 -> 900.
  const auto odd = CharCorpus::from_text(varied_text(1001));
  CHECK(odd.size(Split::train) == 900);
  CHECK(odd.size(Split::val) == 101);
  const auto half = CharCorpus::from_text(text, 0.5);
  CHECK(half.size(Split::train) == 500);
  CHECK(half.train_fraction() == 0.5);
}

TEST_CASE("text: sample gives windows at offsets in range, y shifted by one") {
  const auto c = CharCorpus::from_text(varied_text(2000));
  const std::int64_t batch = 16, context = 32;
  Rng rng(1337);
  std::set<std::int64_t> seen;
  for (int k = 0; k < 200; ++k) {
    for (const Split s : {Split::train, Split::val}) {
      const auto b = c.sample(s, batch, context, rng);
      REQUIRE(b.x.shape() == Shape{batch, context});
      REQUIRE(b.y.shape() == Shape{batch, context});
      REQUIRE(b.offsets.size() == static_cast<std::size_t>(batch));
      const auto& tok = c.tokens(s);
      for (std::int64_t r = 0; r < batch; ++r) {
        const std::int64_t o = b.offsets[static_cast<std::size_t>(r)];
        REQUIRE(o >= 0);
        REQUIRE(o <= c.size(s) - context - 1);
        CHECK(row(b.x, r) == slice(tok, o, context));
        CHECK(row(b.y, r) == slice(tok, o + 1, context));
        if (s == Split::val) seen.insert(o);
      }
    }
  }
  // 3200 draws over the 200 - 32 = 168 val offsets: the first and last are reached.
  CHECK(seen.count(0) == 1);
  CHECK(seen.count(200 - context - 1) == 1);

  // The same seed gives the same batches; another seed another.
  Rng a(5), b(5), other(6);
  const auto ba = c.sample(Split::train, batch, context, a), bb = c.sample(Split::train, batch, context, b);
  CHECK(ba.offsets == bb.offsets);
  CHECK(ba.x.to_vector() == bb.x.to_vector());
  CHECK(c.sample(Split::train, batch, context, other).offsets != ba.offsets);
}

TEST_CASE("text: a context of split size - 1 has one window, at 0") {
  const auto c = CharCorpus::from_text(varied_text(100));  // val: 10 tokens
  Rng rng(1);
  const auto b = c.sample(Split::val, 4, 9, rng);
  CHECK(b.offsets == std::vector<std::int64_t>(4, 0));
  CHECK(row(b.y, 3) == slice(c.tokens(Split::val), 1, 9));
}

TEST_CASE("text: eval windows are evenly spaced, first at 0, last at the end, deterministic") {
  const auto c = CharCorpus::from_text(varied_text(5000));  // val: 500 tokens
  const std::int64_t batch = 4, context = 20, count = 3;
  const auto off = c.eval_offsets(Split::val, batch, context, count);
  REQUIRE(off.size() == 12);
  const std::int64_t last = 500 - context - 1;  // 479
  for (std::int64_t i = 0; i < 12; ++i) CHECK(off[static_cast<std::size_t>(i)] == i * last / 11);
  CHECK(off.front() == 0);
  CHECK(off.back() == last);
  CHECK(off[1] == 43);  // 479 / 11 = 43.5: floor

  const auto e1 = c.eval_batches(Split::val, batch, context, count);
  const auto e2 = c.eval_batches(Split::val, batch, context, count);
  REQUIRE(e1.size() == static_cast<std::size_t>(count));
  for (std::int64_t k = 0; k < count; ++k) {
    const auto& b = e1[static_cast<std::size_t>(k)];
    CHECK(b.x.shape() == Shape{batch, context});
    CHECK(b.x.to_vector() == e2[static_cast<std::size_t>(k)].x.to_vector());
    CHECK(b.y.to_vector() == e2[static_cast<std::size_t>(k)].y.to_vector());
    for (std::int64_t r = 0; r < batch; ++r) {
      const std::int64_t o = off[static_cast<std::size_t>(k * batch + r)];
      CHECK(b.offsets[static_cast<std::size_t>(r)] == o);
      CHECK(row(b.x, r) == slice(c.tokens(Split::val), o, context));
      CHECK(row(b.y, r) == slice(c.tokens(Split::val), o + 1, context));
    }
  }
  // One window: offset 0.
  CHECK(c.eval_offsets(Split::val, 1, context, 1) == std::vector<std::int64_t>{0});
  // More windows than offsets: they repeat, still in range and non-decreasing.
  const auto many = c.eval_offsets(Split::val, 64, 480, 2);  // offsets 0..19, 128 windows
  CHECK(std::is_sorted(many.begin(), many.end()));
  CHECK(many.back() == 19);
}

TEST_CASE("text: bad input throws naming the function and the values") {
  test::TempDir dir("text_bad");
  const auto empty = write_file(dir, "empty.txt", "");
  const auto missing = (dir / "missing.txt").string();
  const auto c = CharCorpus::from_text(varied_text(1000));  // train 900, val 100
  Rng rng(0);
  using test::bad;
  test::run_cases({
      bad<IoError>("missing file", "data::CharCorpus", {missing, "cannot open"}, [&] { CharCorpus x(missing); }),
      bad<IoError>("empty file", "data::CharCorpus", {empty, "empty"}, [&] { CharCorpus x(empty); }),
      bad<InvalidArgument>("empty text", "data::CharCorpus", {"empty"}, [] { (void)CharCorpus::from_text(""); }),
      bad<InvalidArgument>("fraction 1", "data::CharCorpus", {"train_fraction", "got 1"},
                           [] { (void)CharCorpus::from_text("abc", 1.0); }),
      bad<InvalidArgument>("fraction 0", "data::CharCorpus", {"train_fraction", "got 0"},
                           [] { (void)CharCorpus::from_text("abc", 0.0); }),
      bad<InvalidArgument>("one byte", "data::CharCorpus", {"1 bytes", "0.9", "0 train, 1 val"},
                           [] { (void)CharCorpus::from_text("a", 0.9); }),
      bad<InvalidArgument>("empty train split", "data::CharCorpus", {"2 bytes", "0 train"},
                           [] { (void)CharCorpus::from_text("ab", 0.4); }),
      bad<InvalidArgument>("context = val size", "data::CharCorpus::sample", {"context 100", "val split", "has 100"},
                           [&] { (void)c.sample(Split::val, 2, 100, rng); }),
      bad<InvalidArgument>("context > train size", "data::CharCorpus::sample", {"context 5000", "train split", "has 900"},
                           [&] { (void)c.sample(Split::train, 2, 5000, rng); }),
      bad<InvalidArgument>("batch 0", "data::CharCorpus::sample", {"batch", "got 0"},
                           [&] { (void)c.sample(Split::train, 0, 8, rng); }),
      bad<InvalidArgument>("negative batch", "data::CharCorpus::eval_batches", {"batch", "got -3"},
                           [&] { (void)c.eval_batches(Split::val, -3, 8, 2); }),
      bad<InvalidArgument>("context 0", "data::CharCorpus::sample", {"context", "got 0"},
                           [&] { (void)c.sample(Split::train, 2, 0, rng); }),
      bad<InvalidArgument>("eval context too long", "data::CharCorpus::eval_batches", {"context 200", "has 100"},
                           [&] { (void)c.eval_batches(Split::val, 2, 200, 2); }),
      bad<InvalidArgument>("eval count 0", "data::CharCorpus::eval_batches", {"count", "got 0"},
                           [&] { (void)c.eval_batches(Split::val, 2, 8, 0); }),
      bad<InvalidArgument>("eval too many windows", "data::CharCorpus::eval_batches", {"batch 65536", "count 65536"},
                           [&] { (void)c.eval_offsets(Split::val, 65536, 8, 65536); }),
      bad<InvalidArgument>("unknown split", "data::CharCorpus::sample", {"unknown split 7"},
                           [&] { (void)c.sample(static_cast<Split>(7), 2, 8, rng); }),
      bad<InvalidArgument>("byte outside the vocabulary", "data::CharCorpus::encode", {"byte 90", "0x5a", "position 2"},
                           [&] { (void)c.encode("abZ"); }),
      bad<InvalidArgument>("high byte outside the vocabulary", "data::CharCorpus::encode", {"byte 195", "0xc3", "position 0"},
                           [&] { (void)c.encode("\xc3\xa9"); }),
      bad<InvalidArgument>("id outside the vocabulary", "data::CharCorpus::decode", {"token 13", "position 1", "[0, 13)"},
                           [&] { (void)c.decode({0, 13}); }),
      bad<InvalidArgument>("negative id", "data::CharCorpus::decode", {"token -1", "position 0"},
                           [&] { (void)c.decode({-1}); }),
  });
}

TEST_CASE("text: the fortunes corpus, when one is given") {
  // CUTRAIN_CHAR_CORPUS names a file scripts/char-corpus wrote; without it the check is skipped.
  const char* path = std::getenv("CUTRAIN_CHAR_CORPUS");
  if (!path || !*path || !std::filesystem::exists(path)) {
    WARN("CUTRAIN_CHAR_CORPUS not set (scripts/char-corpus FILE): real corpus not checked");
    return;
  }
  const CharCorpus c(path);
  CHECK(c.vocab_size() > 64);
  CHECK(c.vocab_size() <= 256);
  CHECK(c.size(Split::val) == c.size() - static_cast<std::int64_t>(static_cast<double>(c.size()) * 0.9));
  CHECK(c.decode(c.encode("%\n")) == "%\n");
  const auto ev = c.eval_batches(Split::val, 64, 256, 50);
  CHECK(ev.size() == 50);
  CHECK(ev.back().offsets.back() == c.size(Split::val) - 257);
}

}  // namespace cutrain_test_text
