// dist::Env: the process group's configuration, read from the variables torchrun sets
// (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), so that `torchrun --no-python`
// or any launcher that exports them starts cutrain programs the way it starts PyTorch ones.
//
//   auto env = dist::Env::from_environment();   // world size 1 when nothing is set
//   if (env.rank == 0) log(...);
//
// Rules: with neither RANK nor WORLD_SIZE set, the process is alone (rank 0 of 1, LOCAL_RANK 0,
// MASTER_ADDR 127.0.0.1, MASTER_PORT 29500; the variables that are set still get checked). Once
// either is set, both must be; with WORLD_SIZE > 1, MASTER_ADDR and MASTER_PORT must be set too.
// LOCAL_RANK defaults to RANK (one node). Integers must be plain decimal, nothing around them.
// Multi-node: every node exports the same MASTER_ADDR (a host of node 0 the others can reach),
// MASTER_PORT and WORLD_SIZE, a global RANK and its node-local LOCAL_RANK (the GPU to use).
#pragma once

#include "cutrain/core/abi.hpp"

#include <charconv>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "cutrain/core/error.hpp"

namespace cutrain::inline CUTRAIN_ABI::dist {

struct Env {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;

  // A variable's value, or nullopt when unset. Tests pass a map; programs use from_environment().
  using Lookup = std::function<std::optional<std::string>(std::string_view name)>;

  static Env from_environment() {
    return parse([](std::string_view name) -> std::optional<std::string> {
      const char* v = std::getenv(std::string(name).c_str());
      if (!v) return std::nullopt;
      return std::string(v);
    });
  }

  static Env from_map(const std::map<std::string, std::string>& vars) {
    return parse([&vars](std::string_view name) -> std::optional<std::string> {
      auto it = vars.find(std::string(name));
      if (it == vars.end()) return std::nullopt;
      return it->second;
    });
  }

  static Env parse(const Lookup& get) {
    static constexpr const char* op = "dist::Env";
    const auto rank = integer(get, "RANK", 0, std::numeric_limits<int>::max());
    const auto world = integer(get, "WORLD_SIZE", 1, std::numeric_limits<int>::max());
    const auto local = integer(get, "LOCAL_RANK", 0, std::numeric_limits<int>::max());
    const auto port = integer(get, "MASTER_PORT", 1, 65535);
    const auto addr = get("MASTER_ADDR");
    CUTRAIN_REQUIRE(!addr || !addr->empty(), InvalidArgument, op, "MASTER_ADDR is set but empty");
    Env env;
    if (!rank && !world) {
      CUTRAIN_REQUIRE(!local || *local == 0, InvalidArgument, op, "LOCAL_RANK=", *local,
                      " is set but RANK and WORLD_SIZE are not (a single process is LOCAL_RANK 0)");
    } else {
      CUTRAIN_REQUIRE(rank.has_value(), InvalidArgument, op, "WORLD_SIZE=", *world, " is set but RANK is not");
      CUTRAIN_REQUIRE(world.has_value(), InvalidArgument, op, "RANK=", *rank, " is set but WORLD_SIZE is not");
      CUTRAIN_REQUIRE(*rank < *world, InvalidArgument, op, "RANK=", *rank, " must be < WORLD_SIZE=", *world);
      env.rank = *rank;
      env.world_size = *world;
      env.local_rank = local.value_or(*rank);
      CUTRAIN_REQUIRE(env.local_rank <= env.rank, InvalidArgument, op, "LOCAL_RANK=", env.local_rank,
                      " must be <= RANK=", env.rank, " (ranks are numbered node by node)");
      if (env.world_size > 1) {
        CUTRAIN_REQUIRE(addr.has_value(), InvalidArgument, op, "MASTER_ADDR must be set when WORLD_SIZE=",
                        env.world_size, " > 1");
        CUTRAIN_REQUIRE(port.has_value(), InvalidArgument, op, "MASTER_PORT must be set when WORLD_SIZE=",
                        env.world_size, " > 1");
      }
    }
    if (addr) env.master_addr = *addr;
    if (port) env.master_port = *port;
    return env;
  }

 private:
  // The variable as an integer in [lo, hi], nullopt when unset; throws naming it when malformed.
  static std::optional<int> integer(const Lookup& get, std::string_view name, long long lo, long long hi) {
    const auto v = get(name);
    if (!v) return std::nullopt;
    long long x = 0;
    const char* b = v->data();
    const char* e = b + v->size();
    const auto [p, ec] = std::from_chars(b, e, x);
    CUTRAIN_REQUIRE(!v->empty() && ec == std::errc() && p == e, InvalidArgument, "dist::Env", name, "=\"", *v,
                    "\" is not a decimal integer");
    CUTRAIN_REQUIRE(x >= lo && x <= hi, InvalidArgument, "dist::Env", name, "=", x, " is out of range [", lo, ", ",
                    hi, "]");
    return static_cast<int>(x);
  }
};

}  // namespace cutrain::inline CUTRAIN_ABI::dist
