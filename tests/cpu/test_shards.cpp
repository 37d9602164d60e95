// data/shards.hpp on shards written to a temp directory: the file format byte for byte, round
// trips, finding llm.c-named files, the sequential walk against a plain re-statement of llm.c's
// DataLoader, rank sharding, seeded random windows, resume from a saved state, evaluation
// batches, bad files (each naming the file and the reason), bad options, and mutated files.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "bad_input.hpp"
#include "cutrain/data/shards.hpp"
#include "temp_dir.hpp"

namespace cutrain_test_shards {  // one per file: the unity build compiles files together

using namespace cutrain;
using data::ShardLoader;
using data::ShardLoaderOptions;
using data::TokenShards;
using Tokens = std::vector<std::uint16_t>;

namespace {
// n tokens whose values identify their position: token at global position g is g * 7919 mod 65521.
Tokens numbered(std::int64_t first, std::int64_t n) {
  Tokens t(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) t[static_cast<std::size_t>(i)] = static_cast<std::uint16_t>((first + i) * 7919 % 65521);
  return t;
}

// Shards of the given sizes in dir, named NAME_train_00000i.bin, tokens numbered across them.
std::vector<std::filesystem::path> write_shards(const test::TempDir& dir, const std::vector<std::int64_t>& sizes,
                                                const std::string& name = "corpus", const std::string& split = "train") {
  std::vector<std::filesystem::path> out;
  std::int64_t first = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    char file[64];
    std::snprintf(file, sizeof file, "%s_%s_%06zu.bin", name.c_str(), split.c_str(), i);
    out.push_back(dir / file);
    data::write_token_shard(out.back(), numbered(first, sizes[i]));
    first += sizes[i];
  }
  return out;
}

std::vector<unsigned char> read_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<unsigned char>(std::istreambuf_iterator<char>(in), {});
}
void write_bytes(const std::filesystem::path& p, const std::vector<unsigned char>& b) {
  std::ofstream(p, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(b.data()),
                                                             static_cast<std::streamsize>(b.size()));
}
// A raw shard: the header's first three ints as given, tokens, then extra bytes.
std::vector<unsigned char> raw_shard(std::int32_t magic, std::int32_t version, std::int32_t count, const Tokens& tokens,
                                     std::size_t extra = 0) {
  std::vector<unsigned char> b(1024, 0);
  const std::int32_t h[3] = {magic, version, count};
  std::memcpy(b.data(), h, sizeof h);
  const auto* t = reinterpret_cast<const unsigned char*>(tokens.data());
  b.insert(b.end(), t, t + 2 * tokens.size());
  b.insert(b.end(), extra, 0x5a);
  return b;
}

std::vector<std::int32_t> row(const Tensor<std::int32_t>& t, std::int64_t r) {
  const std::int64_t c = t.shape()[1];
  return std::vector<std::int32_t>(t.data() + r * c, t.data() + (r + 1) * c);
}
// What a window at global position o holds: x = tokens o..o+T-1, y = o+1..o+T.
std::vector<std::int32_t> expected(std::int64_t o, std::int64_t n) {
  const auto t = numbered(o, n);
  return std::vector<std::int32_t>(t.begin(), t.end());
}
// Every row of b holds the numbered tokens at its offset, and y is x shifted by one.
void check_rows(const data::TokenBatch& b, std::int64_t context) {
  REQUIRE(b.x.shape()[0] == static_cast<std::int64_t>(b.offsets.size()));
  REQUIRE(b.x.shape()[1] == context);
  for (std::size_t r = 0; r < b.offsets.size(); ++r) {
    INFO("row " << r << " at offset " << b.offsets[r]);
    CHECK(row(b.x, static_cast<std::int64_t>(r)) == expected(b.offsets[r], context));
    CHECK(row(b.y, static_cast<std::int64_t>(r)) == expected(b.offsets[r] + 1, context));
  }
}
}  // namespace

TEST_CASE("shards: the file is llm.c's format, written atomically, and reads back") {
  test::TempDir dir("shards_format");
  const Tokens tokens = {0, 1, 2, 50256, 65535, 7, 7};
  const auto p = dir / "x_train_000000.bin";
  data::write_token_shard(p, tokens);
  CHECK(dir.entries() == std::set<std::string>{"x_train_000000.bin"});  // no temp file left

  const auto b = read_bytes(p);
  REQUIRE(b.size() == 1024 + 2 * tokens.size());
  // 20240520 = 0x0134D888, little-endian; version 1; count 7; the rest of the header zero.
  CHECK(std::vector<unsigned char>(b.begin(), b.begin() + 12) ==
        std::vector<unsigned char>{0x88, 0xD8, 0x34, 0x01, 1, 0, 0, 0, 7, 0, 0, 0});
  CHECK(std::all_of(b.begin() + 12, b.begin() + 1024, [](unsigned char c) { return c == 0; }));
  CHECK(b[1024 + 2 * 4] == 0xFF);  // 65535
  CHECK(b[1024 + 2 * 3] == (50256 & 0xFF));
  CHECK(b[1024 + 2 * 3 + 1] == (50256 >> 8));

  CHECK(data::read_token_shard(p) == tokens);
  CHECK(data::read_token_shard(p, 65536) == tokens);

  // An empty shard is a valid file; rewriting replaces the content.
  data::write_token_shard(p, Tokens{});
  CHECK(read_bytes(p).size() == 1024);
  CHECK(data::read_token_shard(p).empty());
  const auto big = numbered(0, 100000);
  data::write_token_shard(p, big);
  CHECK(data::read_token_shard(p) == big);
}

TEST_CASE("shards: find_shards lists llm.c names in order, TokenShards concatenates them") {
  test::TempDir dir("shards_find");
  const auto train = write_shards(dir, {50, 30, 20});
  write_shards(dir, {40}, "corpus", "val");
  std::ofstream(dir / "corpus_train_notes.txt") << "not a shard";
  std::filesystem::create_directory(dir / "sub_train_000000.bin");  // a directory is not listed

  CHECK(data::find_shards(dir.path(), data::Split::train) == train);
  CHECK(data::find_shards(dir / "corpus_train_00000?.bin") == train);
  CHECK(data::find_shards(dir / "*_val_*.bin") == std::vector<std::filesystem::path>{dir / "corpus_val_000000.bin"});
  CHECK(data::find_shards(dir / "corpus_train_000001.bin") == std::vector<std::filesystem::path>{train[1]});

  const TokenShards s(data::find_shards(dir.path(), data::Split::train), 65521);
  REQUIRE(s.count() == 3);
  CHECK(s.total() == 100);
  CHECK(s.size(1) == 30);
  CHECK(s.start(0) == 0);
  CHECK(s.start(2) == 80);
  CHECK(s.path(2) == train[2]);
  CHECK(Tokens(s.tokens(1).begin(), s.tokens(1).end()) == numbered(50, 30));
  const TokenShards copy = s;  // shares the mapped files
  CHECK(copy.tokens(2).data() == s.tokens(2).data());
}

TEST_CASE("shards: the sequential walk is llm.c's, shard after shard, wrapping around") {
  test::TempDir dir("shards_seq");
  // B 3 x T 4: a step takes 12 tokens (13 read). Shard sizes give 2, 1 and 3 steps.
  const std::vector<std::int64_t> sizes = {30, 13, 40};
  const TokenShards s(write_shards(dir, sizes));
  const std::int64_t B = 3, T = 4;
  ShardLoader loader(s, {.batch = B, .context = T});
  CHECK(loader.steps_per_pass() == 2 + 1 + 3);

  // llm.c: batch k of a shard starts at k * B * T and holds B * T + 1 tokens; rows are
  // consecutive T-token chunks.
  std::vector<std::int64_t> want;  // the first row's offset, step by step, over two passes
  for (int pass = 0; pass < 2; ++pass) {
    std::int64_t start = 0;
    for (const auto n : sizes) {
      for (std::int64_t k = 0; k < (n - 1) / (B * T); ++k) want.push_back(start + k * B * T);
      start += n;
    }
  }
  for (std::size_t step = 0; step < want.size(); ++step) {
    INFO("step " << step);
    const auto b = loader.next();
    REQUIRE(b.offsets.size() == 3);
    CHECK(b.offsets[0] == want[step]);
    CHECK(b.offsets[1] == want[step] + T);
    CHECK(b.offsets[2] == want[step] + 2 * T);
    check_rows(b, T);
  }
}

TEST_CASE("shards: two ranks see disjoint windows whose union is the one-rank walk") {
  test::TempDir dir("shards_ranks");
  // S = B * T = 8; each shard holds an even number of one-rank steps (2 S m + 1 + r, r < S).
  const TokenShards s(write_shards(dir, {2 * 8 * 3 + 1 + 5, 2 * 8 * 1 + 1, 2 * 8 * 2 + 1 + 7}));
  const std::int64_t B = 2, T = 4;
  ShardLoader one(s, {.batch = B, .context = T});
  ShardLoader wide(s, {.batch = 2 * B, .context = T});
  ShardLoader r0(s, {.batch = B, .context = T, .rank = 0, .world = 2});
  ShardLoader r1(s, {.batch = B, .context = T, .rank = 1, .world = 2});
  REQUIRE(one.steps_per_pass() == 12);
  REQUIRE(r0.steps_per_pass() == 6);

  std::multiset<std::int64_t> single, ranks;
  for (int i = 0; i < 12; ++i)
    for (auto o : one.next().offsets) single.insert(o);
  for (int k = 0; k < 6; ++k) {
    const auto a = r0.next(), b = r1.next(), w = wide.next();
    check_rows(a, T);
    check_rows(b, T);
    for (auto o : a.offsets) ranks.insert(o);
    for (auto o : b.offsets) ranks.insert(o);
    // Ranks 0 and 1 together are one rank with batch 2B: rank r is rows [rB, (r+1)B).
    for (std::int64_t r = 0; r < B; ++r) {
      CHECK(row(a.x, r) == row(w.x, r));
      CHECK(row(b.x, r) == row(w.x, B + r));
      CHECK(row(b.y, r) == row(w.y, B + r));
    }
  }
  CHECK(std::set<std::int64_t>(ranks.begin(), ranks.end()).size() == ranks.size());  // disjoint
  CHECK(ranks == single);
}

TEST_CASE("shards: random windows are seeded by (seed, rank) and stay within a shard") {
  test::TempDir dir("shards_random");
  const TokenShards s(write_shards(dir, {40, 30, 200}));
  const std::int64_t T = 8;
  const ShardLoaderOptions opts{.batch = 16, .context = T, .random = true, .seed = 42};
  ShardLoader a(s, opts), b(s, opts);
  auto other_seed = opts, other_rank = opts;
  other_seed.seed = 43;
  other_rank.world = 2;
  other_rank.rank = 1;
  ShardLoader c(s, other_seed), d(s, other_rank);

  std::set<std::int64_t> shards_hit;
  for (int step = 0; step < 20; ++step) {
    const auto x = a.next(), y = b.next();
    CHECK(x.offsets == y.offsets);
    CHECK(row(x.x, 3) == row(y.x, 3));
    CHECK(c.next().offsets != x.offsets);
    CHECK(d.next().offsets != x.offsets);
    check_rows(x, T);
    for (const auto o : x.offsets) {
      std::int64_t i = 0;
      while (i + 1 < s.count() && s.start(i + 1) <= o) ++i;
      CHECK(o - s.start(i) + T + 1 <= s.size(i));  // the whole window in shard i
      shards_hit.insert(i);
    }
  }
  CHECK(shards_hit.size() == 3);

  // The offsets are Rng(shard_rank_seed(seed, rank)).below(sum of windows), in row order.
  Rng rng(data::shard_rank_seed(42, 0));
  ShardLoader fresh(s, opts);
  const auto first = fresh.next();
  const auto w = static_cast<std::int64_t>(rng.below(32 + 22 + 192));  // windows: size - T per shard
  const std::int64_t want = w < 32 ? w : w < 54 ? 40 + (w - 32) : 70 + (w - 54);
  CHECK(first.offsets[0] == want);
}

TEST_CASE("shards: state() and set_state() resume where a loader stopped") {
  test::TempDir dir("shards_state");
  const TokenShards s(write_shards(dir, {70, 33, 90}));
  for (const bool random : {false, true}) {
    INFO("random " << random);
    const ShardLoaderOptions opts{.batch = 2, .context = 4, .rank = 1, .world = 2, .random = random, .seed = 5};
    ShardLoader run(s, opts);
    for (int i = 0; i < 7; ++i) run.next();
    const auto saved = run.state();
    std::vector<std::vector<std::int64_t>> rest;
    for (int i = 0; i < 9; ++i) rest.push_back(run.next().offsets);

    ShardLoader resumed(s, opts);
    resumed.set_state(saved);
    for (const auto& want : rest) CHECK(resumed.next().offsets == want);
    resumed.reset();
    ShardLoader again(s, opts);
    CHECK(resumed.next().offsets == again.next().offsets);
  }
  // A sequential state is the same on every rank: rank 0's resumes rank 1.
  ShardLoader r0(s, {.batch = 2, .context = 4, .rank = 0, .world = 2});
  ShardLoader r1(s, {.batch = 2, .context = 4, .rank = 1, .world = 2});
  for (int i = 0; i < 5; ++i) r0.next(), r1.next();
  CHECK(r0.state() == r1.state());
  ShardLoader r1b(s, {.batch = 2, .context = 4, .rank = 1, .world = 2});
  r1b.set_state(r0.state());
  CHECK(r1b.next().offsets == r1.next().offsets);
}

TEST_CASE("shards: eval batches are the first sequential steps, the same every time") {
  test::TempDir dir("shards_eval");
  const TokenShards val(write_shards(dir, {60, 45}, "corpus", "val"));
  const ShardLoaderOptions opts{.batch = 2, .context = 5, .rank = 1, .world = 2};
  const auto a = data::eval_batches(val, opts, 3), b = data::eval_batches(val, opts, 3);
  ShardLoader loader(val, opts);
  REQUIRE(a.size() == 3);
  for (std::size_t k = 0; k < a.size(); ++k) {
    CHECK(a[k].offsets == b[k].offsets);
    CHECK(a[k].offsets == loader.next().offsets);
    CHECK(row(a[k].x, 1) == row(b[k].x, 1));
    check_rows(a[k], 5);
  }
  CHECK(loader.steps_per_pass() == 2 + 2);
  CHECK(data::eval_batches(val, opts, 4).size() == 4);
}

TEST_CASE("shards: bad files throw FileError naming the file and the reason") {
  test::TempDir dir("shards_bad");
  const auto tokens = numbered(0, 20);
  const auto path = [&](const std::string& name) { return (dir / name).string(); };
  write_bytes(dir / "magic.bin", raw_shard(20240521, 1, 20, tokens));
  write_bytes(dir / "v2.bin", raw_shard(20240520, 2, 20, tokens));
  write_bytes(dir / "v0.bin", raw_shard(20240520, 0, 20, tokens));
  auto short_header = raw_shard(20240520, 1, 20, tokens);
  short_header.resize(1000);
  write_bytes(dir / "short_header.bin", short_header);
  write_bytes(dir / "empty.bin", {});
  write_bytes(dir / "truncated.bin", raw_shard(20240520, 1, 21, tokens));
  write_bytes(dir / "odd.bin", raw_shard(20240520, 1, 20, tokens, 1));
  write_bytes(dir / "trailing.bin", raw_shard(20240520, 1, 20, tokens, 6));
  write_bytes(dir / "negative.bin", raw_shard(20240520, 1, -3, tokens));
  Tokens high(20, 8191);
  high[13] = 9000;
  data::write_token_shard(dir / "vocab.bin", high);
  std::filesystem::create_directory(dir / "a_dir.bin");

  using files::FileError;
  using test::bad;
  const auto open = [](const std::string& p, std::int64_t vocab = 0) {
    return [p, vocab] { TokenShards s({p}, vocab); };
  };
  test::run_cases({
      bad<FileError>("wrong magic", "data::TokenShards", {path("magic.bin"), "bad magic number 20240521", "expected 20240520"},
                     open(path("magic.bin"))),
      bad<FileError>("version 2", "data::TokenShards", {path("v2.bin"), "unsupported version 2", "uint32 tokens"},
                     open(path("v2.bin"))),
      bad<FileError>("version 0", "data::TokenShards", {path("v0.bin"), "unsupported version 0, expected 1"},
                     open(path("v0.bin"))),
      bad<FileError>("short header", "data::TokenShards", {path("short_header.bin"), "truncated header: 1000 bytes"},
                     open(path("short_header.bin"))),
      bad<FileError>("empty file", "data::TokenShards", {path("empty.bin"), "truncated header: 0 bytes"},
                     open(path("empty.bin"))),
      bad<FileError>("truncated tokens", "data::TokenShards",
                     {path("truncated.bin"), "truncated: the header declares 21 tokens (1066 bytes), the file has 1064 bytes"},
                     open(path("truncated.bin"))),
      bad<FileError>("one trailing byte", "data::TokenShards", {path("odd.bin"), "1 trailing bytes after the 20 tokens"},
                     open(path("odd.bin"))),
      bad<FileError>("trailing bytes", "data::TokenShards", {path("trailing.bin"), "6 trailing bytes"},
                     open(path("trailing.bin"))),
      bad<FileError>("negative count", "data::TokenShards", {path("negative.bin"), "bad token count -3"},
                     open(path("negative.bin"))),
      bad<FileError>("missing file", "data::TokenShards", {path("missing.bin"), "cannot open: No such file or directory"},
                     open(path("missing.bin"))),
      bad<FileError>("a directory", "data::TokenShards", {path("a_dir.bin"), "is a directory"}, open(path("a_dir.bin"))),
      bad<FileError>("token >= vocab", "data::TokenShards",
                     {path("vocab.bin"), "token 9000 at position 13 is outside the vocabulary [0, 8192)"},
                     open(path("vocab.bin"), 8192)),
      bad<FileError>("read_token_shard: magic", "data::read_token_shard", {path("magic.bin"), "bad magic number"},
                     [&] { data::read_token_shard(path("magic.bin")); }),
      bad<FileError>("read_token_shard: token >= vocab", "data::read_token_shard",
                     {path("vocab.bin"), "token 9000 at position 13"}, [&] { data::read_token_shard(path("vocab.bin"), 9000); }),
  });
  // The same files load where nothing is wrong with them for the reader.
  CHECK(data::read_token_shard(dir / "vocab.bin", 9001) == high);
  // A bad file among good ones is named, not its neighbours.
  write_shards(dir, {20});
  try {
    TokenShards s({dir / "corpus_train_000000.bin", dir / "trailing.bin"});
    FAIL("no exception");
  } catch (const FileError& e) {
    CHECK(e.path() == dir / "trailing.bin");
    CHECK(e.reason().find("trailing bytes") != std::string::npos);
  }
}

TEST_CASE("shards: bad options and states throw InvalidArgument naming the values") {
  test::TempDir dir("shards_options");
  const auto files = write_shards(dir, {40, 20});
  const TokenShards s(files);
  const auto name = files[1].string();
  const auto loader = [&](ShardLoaderOptions o) { return [&s, o] { ShardLoader l(s, o); }; };
  using test::bad;
  test::run_cases({
      bad<InvalidArgument>("batch 0", "data::ShardLoader", {"batch must be positive, got 0"}, loader({.batch = 0, .context = 4})),
      bad<InvalidArgument>("context -1", "data::ShardLoader", {"context must be positive, got -1"},
                           loader({.batch = 2, .context = -1})),
      bad<InvalidArgument>("rank >= world", "data::ShardLoader", {"rank must be in [0, world)", "got rank 2, world 2"},
                           loader({.batch = 2, .context = 4, .rank = 2, .world = 2})),
      bad<InvalidArgument>("world 0", "data::ShardLoader", {"got rank 0, world 0"},
                           loader({.batch = 2, .context = 4, .world = 0})),
      bad<InvalidArgument>("huge step", "data::ShardLoader", {"implausibly many"},
                           loader({.batch = std::int64_t{1} << 30, .context = std::int64_t{1} << 20})),
      bad<InvalidArgument>("shard shorter than a window", "data::ShardLoader",
                           {name, "has 20 tokens, shorter than a window of context 20 + 1"},
                           loader({.batch = 1, .context = 20, .random = true})),
      bad<InvalidArgument>("shard shorter than a step", "data::ShardLoader",
                           {name, "has 20 tokens, fewer than one sequential step needs: world 2 x batch 2 x context 5 + 1 = 21"},
                           loader({.batch = 2, .context = 5, .rank = 1, .world = 2})),
      bad<InvalidArgument>("no files", "data::TokenShards", {"no shard files given"}, [] { TokenShards t({}); }),
      bad<InvalidArgument>("vocab too big", "data::TokenShards", {"vocab must be in [0, 65536]", "got 65537"},
                           [&] { TokenShards t(files, 65537); }),
      bad<InvalidArgument>("shard index", "data::TokenShards", {"shard 2 out of range [0, 2)"}, [&] { (void)s.size(2); }),
      bad<IoError>("no match", "data::find_shards", {"no files match", "nothing_*.bin"},
                   [&] { data::find_shards(dir / "nothing_*.bin"); }),
      bad<IoError>("no directory", "data::find_shards", {"cannot list", "absent"},
                   [&] { data::find_shards(dir / "absent" / "*.bin"); }),
      bad<InvalidArgument>("wildcard directory", "data::find_shards", {"wildcards are allowed in the file name only"},
                           [&] { data::find_shards(dir / "*" / "x.bin"); }),
      bad<InvalidArgument>("sequential state out of range", "data::ShardLoader::set_state", {"state {2, 0}", "2 shards"},
                           [&] { ShardLoader(s, {.batch = 1, .context = 4}).set_state({2, 0}); }),
      bad<InvalidArgument>("position past the shard", "data::ShardLoader::set_state", {"state {1, 21}"},
                           [&] { ShardLoader(s, {.batch = 1, .context = 4}).set_state({1, 21}); }),
      bad<InvalidArgument>("random state from another seed", "data::ShardLoader::set_state",
                           {"not one of this random loader's (seed 2, rank 0)"}, [&] {
                             ShardLoader a(s, {.batch = 1, .context = 4, .random = true, .seed = 1});
                             ShardLoader(s, {.batch = 1, .context = 4, .random = true, .seed = 2}).set_state(a.state());
                           }),
      bad<InvalidArgument>("eval random", "data::eval_batches", {"set .random = false"},
                           [&] { data::eval_batches(s, {.batch = 1, .context = 4, .random = true}, 1); }),
      bad<InvalidArgument>("eval count 0", "data::eval_batches", {"count must be positive, got 0"},
                           [&] { data::eval_batches(s, {.batch = 1, .context = 4}, 0); }),
      // 40 tokens: 39 / 8 = 4 steps; 20 tokens: 19 / 8 = 2 steps.
      bad<InvalidArgument>("eval past the end", "data::eval_batches",
                           {"asked for 7 batches", "2 val shards (60 tokens) hold 6 steps of world 1 x batch 2 x context 4"},
                           [&] { data::eval_batches(s, {.batch = 2, .context = 4}, 7); }),
  });
}

TEST_CASE("shards: mutated files load or throw cutrain::Error, never crash") {
  test::TempDir dir("shards_fuzz");
  const auto good = raw_shard(20240520, 1, 40, numbered(0, 40));
  Rng rng(2024);
  int loaded = 0, thrown = 0;
  for (int i = 0; i < 300; ++i) {
    auto b = good;
    switch (rng.below(4)) {
      case 0: b[rng.below(12)] ^= static_cast<unsigned char>(1u << rng.below(8)); break;   // header bit flip
      case 1: b.resize(rng.below(b.size() + 1)); break;                                    // truncation
      case 2: b.insert(b.end(), rng.below(9), 0); break;                                   // extra bytes
      default: std::memset(b.data() + 8, static_cast<int>(rng.below(256)), 4); break;      // count bytes
    }
    const auto p = dir / "m.bin";
    write_bytes(p, b);
    try {
      const auto t = data::read_token_shard(p, 65521);
      CHECK(static_cast<std::int64_t>(b.size()) == 1024 + 2 * static_cast<std::int64_t>(t.size()));
      ++loaded;
    } catch (const Error&) {
      ++thrown;
    }
  }
  CHECK(loaded > 0);
  CHECK(thrown > 0);
}

}  // namespace cutrain_test_shards
