// dist/ on the CPU: the torchrun-style environment and its bad values; the TCP rendezvous store
// with several processes on loopback (a 128-byte id handed from rank 0, barrier, timeouts, a
// mismatched world, a rank that dies); the gradient bucket assignment; the loader's sharding.
// Ranks are fork()ed children that report through their exit status; each has an alarm and the
// parent kills what is left after a deadline, so no case can hang.
#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "bad_input.hpp"
#include "dist_ranks.hpp"
#include "cutrain/core/random.hpp"
#include "cutrain/data/loader.hpp"
#include "cutrain/dist/buckets.hpp"
#include "cutrain/dist/env.hpp"
#include "cutrain/dist/store.hpp"

namespace cutrain_test_dist {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace std::chrono_literals;
using test::bad;
using test::contains;
using test::free_port;
using test::rank_env;
using test::run_ranks;

// ---------------------------------------------------------------------------------------- env

TEST_CASE("dist env: defaults to a world of one, reads torchrun's variables", "[dist]") {
  const auto alone = dist::Env::from_map({});
  CHECK(alone.rank == 0);
  CHECK(alone.world_size == 1);
  CHECK(alone.local_rank == 0);
  CHECK(alone.master_addr == "127.0.0.1");
  CHECK(alone.master_port == 29500);

  const auto e = dist::Env::from_map(
      {{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "1234"}});
  CHECK(e.rank == 5);
  CHECK(e.world_size == 8);
  CHECK(e.local_rank == 1);
  CHECK(e.master_addr == "node0");
  CHECK(e.master_port == 1234);

  const auto one = dist::Env::from_map({{"RANK", "0"}, {"WORLD_SIZE", "1"}});  // no master needed for one
  CHECK(one.world_size == 1);
  const auto no_local = dist::Env::from_map(
      {{"RANK", "2"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "9"}});
  CHECK(no_local.local_rank == 2);  // one node: LOCAL_RANK = RANK
}

TEST_CASE("dist env: missing, malformed and inconsistent values name the variable", "[dist][bad_input]") {
  using M = std::map<std::string, std::string>;
  const M full{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}};
  auto with = [&](std::string k, std::string v) {
    M m = full;
    m[k] = v;
    return m;
  };
  auto without = [&](std::string k) {
    M m = full;
    m.erase(k);
    return m;
  };
  auto parse = [](M m) { return [m] { (void)dist::Env::from_map(m); }; };
  test::run_cases({
      bad<InvalidArgument>("rank >= world", "dist::Env", {"RANK=2", "WORLD_SIZE=2"}, parse(with("RANK", "2"))),
      bad<InvalidArgument>("rank not a number", "dist::Env", {"RANK=\"x1\""}, parse(with("RANK", "x1"))),
      bad<InvalidArgument>("rank trailing junk", "dist::Env", {"RANK=\"1 \""}, parse(with("RANK", "1 "))),
      bad<InvalidArgument>("rank negative", "dist::Env", {"RANK=-1"}, parse(with("RANK", "-1"))),
      bad<InvalidArgument>("rank empty", "dist::Env", {"RANK=\"\""}, parse(with("RANK", ""))),
      bad<InvalidArgument>("world zero", "dist::Env", {"WORLD_SIZE=0"}, parse(with("WORLD_SIZE", "0"))),
      bad<InvalidArgument>("world overflow", "dist::Env", {"WORLD_SIZE=99999999999"},
                           parse(with("WORLD_SIZE", "99999999999"))),
      bad<InvalidArgument>("port out of range", "dist::Env", {"MASTER_PORT=70000"}, parse(with("MASTER_PORT", "70000"))),
      bad<InvalidArgument>("port zero", "dist::Env", {"MASTER_PORT=0"}, parse(with("MASTER_PORT", "0"))),
      bad<InvalidArgument>("addr empty", "dist::Env", {"MASTER_ADDR"}, parse(with("MASTER_ADDR", ""))),
      bad<InvalidArgument>("no rank", "dist::Env", {"RANK is not"}, parse(without("RANK"))),
      bad<InvalidArgument>("no world", "dist::Env", {"WORLD_SIZE is not"}, parse(without("WORLD_SIZE"))),
      bad<InvalidArgument>("no addr", "dist::Env", {"MASTER_ADDR must be set"}, parse(without("MASTER_ADDR"))),
      bad<InvalidArgument>("no port", "dist::Env", {"MASTER_PORT must be set"}, parse(without("MASTER_PORT"))),
      bad<InvalidArgument>("local > rank", "dist::Env", {"LOCAL_RANK=3", "RANK=1"}, parse(with("LOCAL_RANK", "3"))),
      bad<InvalidArgument>("local alone", "dist::Env", {"LOCAL_RANK=1"}, parse(M{{"LOCAL_RANK", "1"}})),
  });
}

// -------------------------------------------------------------------------------------- store

TEST_CASE("dist store: a world of one in this process", "[dist]") {
  auto env = dist::Env::from_map({{"MASTER_PORT", std::to_string(free_port())}});
  dist::Store store(env, {.timeout = 5s});
  store.set("k", std::string("v\0w", 3));
  CHECK(store.get("k") == std::string("v\0w", 3));
  store.set("k", "second");  // a set replaces
  CHECK(store.get("k") == "second");
  store.barrier();
  store.barrier();
}

TEST_CASE("dist store: a stranger on the port that sends no hello is dropped, the store goes on", "[dist]") {
  const int port = free_port();
  dist::Store store(dist::Env::from_map({{"MASTER_PORT", std::to_string(port)}}), {.timeout = 5s});
  for (const std::string& junk : {std::string("GET / HTTP/1.0\r\n\r\n"), std::string(8, '\xff'), std::string("\x02\0\0\0\x03x", 6)}) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    const timeval five{5, 0};  // a store that kept the stranger would make recv wait: fail instead
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &five, sizeof five);
    REQUIRE(::send(fd, junk.data(), junk.size(), 0) == static_cast<ssize_t>(junk.size()));
    char c;
    CHECK(::recv(fd, &c, 1, 0) == 0);  // closed by the store, with no reply
    ::close(fd);
  }
  store.set("k", "v");
  CHECK(store.get("k") == "v");
  store.barrier();
}

TEST_CASE("dist store: three ranks hand out a 128-byte id, meet at barriers, time out", "[dist]") {
  const int port = free_port();
  std::string id(128, '\0');
  for (std::size_t i = 0; i < id.size(); ++i) id[i] = static_cast<char>((i * 37 + 11) & 0xff);  // zeros included
  const auto codes = run_ranks(3, [&](int rank) {
    dist::Store store(rank_env(rank, 3, port), {.timeout = 10s});
    if (rank == 0) store.set("nccl_id", id);
    if (rank == 2) std::this_thread::sleep_for(100ms);  // gets before and after the set both work
    RANK_CHECK(store.get("nccl_id") == id);
    store.barrier();
    store.set("from_" + std::to_string(rank), std::to_string(rank * 10));
    store.barrier();
    for (int r = 0; r < 3; ++r) RANK_CHECK(store.get("from_" + std::to_string(r)) == std::to_string(r * 10));
    store.barrier();
    // A get nobody answers: rank 2 with 200 ms, rank 0 (which must keep the server up while
    // rank 2 waits) with 1500 ms. Each must throw a TimeoutError that says what timed out.
    store.set_timeout(rank == 0 ? 1500ms : 200ms);
    if (rank == 1) return 0;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      (void)store.get("never");
      RANK_CHECK(!"get of a key nobody sets returned");
    } catch (const dist::TimeoutError& e) {
      const std::string what = e.what();
      const auto took = std::chrono::steady_clock::now() - t0;
      RANK_CHECK(contains(what, "dist::Store::get"));
      RANK_CHECK(contains(what, "rank " + std::to_string(rank) + " of 3"));
      RANK_CHECK(contains(what, "\"never\""));
      RANK_CHECK(contains(what, rank == 0 ? "1500 ms" : "200 ms"));
      RANK_CHECK(took >= (rank == 0 ? 1500ms : 200ms) && took < 5s);
    }
    // The store is broken after a timeout: later operations throw at once.
    try {
      store.barrier();
      RANK_CHECK(!"barrier on a broken store returned");
    } catch (const dist::DistError& e) {
      RANK_CHECK(contains(e.what(), "broken"));
    }
    return 0;
  });
  CHECK(codes == std::vector<int>{0, 0, 0});
}

TEST_CASE("dist store: a rank announcing another WORLD_SIZE fails the store", "[dist]") {
  const int port = free_port();
  const auto codes = run_ranks(2, [&](int rank) {
    auto env = rank_env(rank, 2, port);
    if (rank == 1) {
      env.world_size = 3;
      std::this_thread::sleep_for(50ms);
      try {
        dist::Store store(env, {.timeout = 10s});
        RANK_CHECK(!"connecting with a mismatched WORLD_SIZE succeeded");
      } catch (const dist::DistError& e) {
        RANK_CHECK(contains(e.what(), "world-size mismatch"));
        RANK_CHECK(contains(e.what(), "WORLD_SIZE=3"));
      }
      return 0;
    }
    dist::Store store(env, {.timeout = 10s});
    try {
      store.barrier();
      RANK_CHECK(!"barrier with a mismatched world returned");
    } catch (const dist::DistError& e) {
      RANK_CHECK(contains(e.what(), "dist::Store::barrier"));
      RANK_CHECK(contains(e.what(), "world-size mismatch: rank 1 announced WORLD_SIZE=3"));
    }
    return 0;
  });
  CHECK(codes == std::vector<int>{0, 0});
}

TEST_CASE("dist store: a rank that dies fails the others' waits", "[dist]") {
  const int port = free_port();
  const auto codes = run_ranks(3, [&](int rank) {
    dist::Store store(rank_env(rank, 3, port), {.timeout = 10s});
    store.barrier();
    if (rank == 2) ::_exit(0);  // dies: no clean close of its store
    const auto t0 = std::chrono::steady_clock::now();
    try {
      store.barrier();
      RANK_CHECK(!"barrier without rank 2 returned");
    } catch (const dist::TimeoutError&) {
      RANK_CHECK(!"the death of rank 2 was only seen as a timeout");
    } catch (const dist::DistError& e) {
      RANK_CHECK(contains(e.what(), "rank 2 disconnected"));
      RANK_CHECK(std::chrono::steady_clock::now() - t0 < 5s);
    }
    if (rank == 0) std::this_thread::sleep_for(1s);  // rank 1 hears it before the server goes
    return 0;
  });
  CHECK(codes == std::vector<int>{0, 0, 0});
}

TEST_CASE("dist store: connecting to nobody times out naming the address", "[dist]") {
  const int port = free_port();
  const auto t0 = std::chrono::steady_clock::now();
  try {
    dist::Store store(rank_env(1, 2, port), {.timeout = 300ms});
    FAIL("connected to a port nobody listens on");
  } catch (const dist::TimeoutError& e) {
    const std::string what = e.what();
    CHECK(contains(what, "dist::Store::connect"));
    CHECK(contains(what, "rank 1 of 2"));
    CHECK(contains(what, "127.0.0.1:" + std::to_string(port)));
    CHECK(contains(what, "300 ms"));
  }
  CHECK(std::chrono::steady_clock::now() - t0 >= 300ms);
  CHECK_THROWS_AS(dist::Store(rank_env(0, 1, port), {.timeout = 0ms}), InvalidArgument);
}

// ------------------------------------------------------------------------------------ buckets

namespace {

// Every invariant of an assignment: a partition of the parameters, one dtype per bucket, reverse
// registration order, offsets aligned and disjoint, buckets within their cap unless alone.
void check_assignment(const std::vector<dist::ParamSpec>& ps, const std::vector<dist::Bucket>& bs,
                      const dist::BucketOptions& o) {
  std::vector<int> seen(ps.size(), 0);
  std::map<DType, std::size_t> last;  // dtype -> the smallest index placed so far
  std::map<DType, int> count;
  for (const auto& b : bs) {
    REQUIRE(!b.params.empty());
    REQUIRE(b.params.size() == b.offsets.size());
    const std::size_t cap = count[b.dtype]++ == 0 ? o.first_cap_bytes : o.cap_bytes;
    if (b.params.size() > 1) CHECK(b.bytes() <= cap);
    std::int64_t end = 0;
    for (std::size_t j = 0; j < b.params.size(); ++j) {
      const auto k = b.params[j];
      REQUIRE(k < ps.size());
      ++seen[k];
      CHECK(ps[k].dtype == b.dtype);
      CHECK(b.offsets[j] % o.align_elems == 0);
      CHECK(b.offsets[j] >= end);
      end = b.offsets[j] + ps[k].numel;
      if (last.count(b.dtype)) CHECK(k < last[b.dtype]);
      last[b.dtype] = k;
    }
    CHECK(b.numel == end);
  }
  for (auto s : seen) CHECK(s == 1);
}

}  // namespace

TEST_CASE("dist buckets: reverse order, a small first bucket, oversized parameters alone", "[dist]") {
  const dist::BucketOptions o{.cap_bytes = 100, .first_cap_bytes = 40};
  const std::vector<dist::ParamSpec> ps{{5, DType::f32}, {5, DType::f32}, {5, DType::f32},
                                        {30, DType::f32}, {5, DType::f32}, {5, DType::f32}};
  const auto bs = dist::assign_buckets(ps, o);
  REQUIRE(bs.size() == 3);
  CHECK(bs[0].params == std::vector<std::size_t>{5, 4});  // 40 bytes: the first bucket is full
  CHECK(bs[0].offsets == std::vector<std::int64_t>{0, 5});
  CHECK(bs[1].params == std::vector<std::size_t>{3});     // 120 bytes > cap: alone
  CHECK(bs[1].bytes() == 120);
  CHECK(bs[2].params == std::vector<std::size_t>{2, 1, 0});
  CHECK(bs[2].offsets == std::vector<std::int64_t>{0, 5, 10});
  CHECK(bs[2].numel == 15);
  check_assignment(ps, bs, o);

  // A parameter that would overflow the open bucket starts the next one.
  const std::vector<dist::ParamSpec> qs{{20, DType::f32}, {10, DType::f32}, {10, DType::f32}};
  const auto cs = dist::assign_buckets(qs, {.cap_bytes = 100, .first_cap_bytes = 100});
  REQUIRE(cs.size() == 2);
  CHECK(cs[0].params == std::vector<std::size_t>{2, 1});
  CHECK(cs[1].params == std::vector<std::size_t>{0});

  const dist::BucketOptions defaults;
  CHECK(defaults.cap_bytes == 25u << 20);
  CHECK(defaults.first_cap_bytes == 1u << 20);
}

TEST_CASE("dist buckets: one dtype per bucket, alignment, random models", "[dist]") {
  const std::vector<dist::ParamSpec> mixed{{8, DType::f32}, {8, DType::bf16}, {8, DType::f32}, {8, DType::bf16}};
  const auto bs = dist::assign_buckets(mixed, {.cap_bytes = 1024, .first_cap_bytes = 1024});
  REQUIRE(bs.size() == 2);
  CHECK(bs[0].dtype == DType::bf16);
  CHECK(bs[0].params == std::vector<std::size_t>{3, 1});
  CHECK(bs[1].dtype == DType::f32);
  CHECK(bs[1].params == std::vector<std::size_t>{2, 0});
  CHECK(bs[0].bytes() == 32);

  const auto al = dist::assign_buckets({{3, DType::f16}, {5, DType::f16}}, {.cap_bytes = 64, .first_cap_bytes = 64, .align_elems = 4});
  REQUIRE(al.size() == 1);
  CHECK(al[0].offsets == std::vector<std::int64_t>{0, 8});
  CHECK(al[0].numel == 11);

  Rng rng(3);
  const DType types[] = {DType::f32, DType::bf16, DType::f16};
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<dist::ParamSpec> ps(1 + rng.below(40));
    for (auto& p : ps) p = {static_cast<std::int64_t>(rng.below(rng.below(2) ? 50 : 700)), types[rng.below(3)]};
    const dist::BucketOptions o{.cap_bytes = 200 + rng.below(1000), .first_cap_bytes = 100,
                                .align_elems = static_cast<std::int64_t>(1 + rng.below(4))};
    INFO("trial " << trial);
    check_assignment(ps, dist::assign_buckets(ps, o), o);
  }
  CHECK(dist::assign_buckets({}).empty());
}

TEST_CASE("dist buckets: bad options", "[dist][bad_input]") {
  test::run_cases({
      bad<InvalidArgument>("cap 0", "dist::assign_buckets", {"cap_bytes"},
                           [] { (void)dist::assign_buckets({}, {.cap_bytes = 0}); }),
      bad<InvalidArgument>("first > cap", "dist::assign_buckets", {"first_cap_bytes", "cap_bytes=10"},
                           [] { (void)dist::assign_buckets({}, {.cap_bytes = 10, .first_cap_bytes = 20}); }),
      bad<InvalidArgument>("align 0", "dist::assign_buckets", {"align_elems"},
                           [] { (void)dist::assign_buckets({}, {.align_elems = 0}); }),
      bad<InvalidArgument>("negative numel", "dist::assign_buckets", {"parameter 0", "-1"},
                           [] { (void)dist::assign_buckets({{-1, DType::f32}}); }),
  });
}

// ----------------------------------------------------------------------------------- sharding

namespace {

// n images [1, 3, 3]; image i has pixel p = 100 i + p + 1 (crops and flips show), label i.
data::ImageDataset<float> ramp_images(std::int64_t n) {
  std::vector<float> px(static_cast<std::size_t>(n * 9));
  std::vector<std::int32_t> lbl(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    lbl[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i);
    for (std::int64_t p = 0; p < 9; ++p) px[static_cast<std::size_t>(i * 9 + p)] = static_cast<float>(100 * i + p + 1);
  }
  return {Tensor<float>::from_vector(px, Shape{n, 1, 3, 3}), Tensor<std::int32_t>::from_vector(lbl, Shape{n})};
}

// label -> its image as delivered, for every batch of one epoch (batch by batch).
std::vector<std::map<std::int32_t, std::vector<float>>> epoch_samples(data::Loader<float>& l) {
  std::vector<std::map<std::int32_t, std::vector<float>>> out;
  for (auto [x, y] : l) {
    const auto xs = x.to_vector();
    const auto ys = y.to_vector();
    auto& m = out.emplace_back();
    for (std::size_t i = 0; i < ys.size(); ++i) m[ys[i]] = std::vector<float>(xs.begin() + i * 9, xs.begin() + (i + 1) * 9);
  }
  return out;
}

}  // namespace

TEST_CASE("loader sharding: disjoint equal shards whose union is the epoch", "[dist][data]") {
  const auto ds = ramp_images(10);
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::set<std::int64_t> all;
    std::vector<std::int64_t> order;
    for (std::int64_t r = 0; r < 3; ++r) {
      data::Loader<float> l(ds, {.batch = 2, .shuffle = true, .seed = 9, .rank = r, .world_size = 3});
      CHECK(l.shard_size() == 3);
      CHECK(l.samples_per_epoch() == 3);
      CHECK(l.size() == 2);
      l.set_epoch(epoch);
      std::int64_t n = 0;
      for (const auto& b : epoch_samples(l))
        for (const auto& [label, img] : b) {
          CHECK(all.insert(label).second);  // disjoint
          ++n;
        }
      CHECK(n == 3);  // equal counts
      order = l.global_order(epoch);
    }
    // The union is the epoch's order without its last (10 mod 3 = 1) position.
    CHECK(all == std::set<std::int64_t>(order.begin(), order.begin() + 9));
  }
  // Different epochs drop different samples and shard differently.
  data::Loader<float> l(ds, {.shuffle = true, .seed = 9, .rank = 1, .world_size = 3});
  CHECK(l.order(0) != l.order(1));

  // world_size 1 is the unsharded loader.
  data::Loader<float> one(ds, {.shuffle = true, .seed = 9});
  CHECK(one.order(4) == one.global_order(4));
  CHECK(one.shard_size() == 10);
}

TEST_CASE("loader sharding: the ranks' batches together are the one-process global batch", "[dist][data]") {
  const auto ds = ramp_images(12);
  const data::LoaderOptions base{.batch = 2, .shuffle = true, .seed = 4, .random_crop_padding = 1, .hflip = true};
  auto global_opts = base;
  global_opts.batch = 6;
  data::Loader<float> global(ds, global_opts);
  global.set_epoch(3);
  const auto want = epoch_samples(global);
  std::vector<std::map<std::int32_t, std::vector<float>>> got(want.size());
  for (std::int64_t r = 0; r < 3; ++r) {
    auto o = base;
    o.rank = r;
    o.world_size = 3;
    data::Loader<float> l(ds, o);
    l.set_epoch(3);
    const auto mine = epoch_samples(l);
    REQUIRE(mine.size() == want.size());
    for (std::size_t k = 0; k < mine.size(); ++k) got[k].insert(mine[k].begin(), mine[k].end());
  }
  CHECK(got == want);  // same samples per batch, augmented alike
}

TEST_CASE("loader sharding: bad rank and world size", "[dist][data][bad_input]") {
  const auto ds = ramp_images(4);
  test::run_cases({
      bad<InvalidArgument>("rank = world", "data::Loader", {"rank 2", "world_size 2"},
                           [&] { data::Loader<float> l(ds, {.rank = 2, .world_size = 2}); }),
      bad<InvalidArgument>("negative rank", "data::Loader", {"rank -1"},
                           [&] { data::Loader<float> l(ds, {.rank = -1, .world_size = 2}); }),
      bad<InvalidArgument>("world 0", "data::Loader", {"world_size 0"},
                           [&] { data::Loader<float> l(ds, {.rank = 0, .world_size = 0}); }),
      bad<InvalidArgument>("fewer samples than ranks", "data::Loader", {"4 samples", "world_size 5"},
                           [&] { data::Loader<float> l(ds, {.rank = 0, .world_size = 5}); }),
  });
}

#undef RANK_CHECK

}  // namespace cutrain_test_dist
