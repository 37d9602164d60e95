// Ranks as fork()ed processes for the dist tests: a free loopback port, a rank's Env, and
// run_ranks, which runs fn(rank) in n children (each with an alarm) and kills what is left at
// the deadline, so that no case can hang. A child reports through its exit status (RANK_CHECK).
#pragma once

#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "cutrain/dist/env.hpp"

namespace cutrain::test {

using namespace std::chrono_literals;

// A port nothing listens on right now: bind port 0, read it back, close.
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

inline dist::Env rank_env(int rank, int world, int port) {
  return dist::Env::from_map({{"RANK", std::to_string(rank)},
                              {"WORLD_SIZE", std::to_string(world)},
                              {"MASTER_ADDR", "127.0.0.1"},
                              {"MASTER_PORT", std::to_string(port)}});
}

// A child's check: prints what failed and makes the rank's exit status nonzero.
#define RANK_CHECK(cond)                                                                \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      std::fprintf(stderr, "rank check failed at line %d: %s\n", __LINE__, #cond);      \
      std::fflush(stderr);                                                              \
      return 1;                                                                         \
    }                                                                                   \
  } while (0)

inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Runs fn(rank) in n forked processes; returns their exit statuses (-1 when killed at the deadline).
inline std::vector<int> run_ranks(int n, const std::function<int(int)>& fn, std::chrono::seconds deadline = 20s) {
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::alarm(static_cast<unsigned>(deadline.count()) + 5);
      int code = 1;
      try {
        code = fn(r);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d threw: %s\n", r, e.what());
      } catch (...) {
        std::fprintf(stderr, "rank %d threw something else\n", r);
      }
      std::fflush(stderr);
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  std::vector<int> codes(static_cast<std::size_t>(n), -2);
  const auto end = std::chrono::steady_clock::now() + deadline;
  for (std::size_t left = pids.size(); left > 0;) {
    for (std::size_t i = 0; i < pids.size(); ++i) {
      if (codes[i] != -2) continue;
      int status = 0;
      if (::waitpid(pids[i], &status, WNOHANG) == pids[i]) {
        codes[i] = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        --left;
      }
    }
    if (left == 0) break;
    if (std::chrono::steady_clock::now() > end) {
      for (std::size_t i = 0; i < pids.size(); ++i)
        if (codes[i] == -2) {
          ::kill(pids[i], SIGKILL);
          ::waitpid(pids[i], nullptr, 0);
          codes[i] = -1;
        }
      break;
    }
    std::this_thread::sleep_for(5ms);
  }
  return codes;
}

}  // namespace cutrain::test
