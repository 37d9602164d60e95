// dist::Store: a small TCP rendezvous store, the way the ranks of a process group meet and
// exchange the NCCL unique id (rank 0 sets it, the others get it).
//
//   dist::Store store(env, {.timeout = std::chrono::seconds(60)});
//   if (env.rank == 0) store.set("nccl_id", id_bytes);
//   auto id = store.get("nccl_id");     // waits until some rank has set it
//   store.barrier();
//
// Rank 0 runs the server (one thread with poll(), serving a key -> bytes map) on all interfaces
// at MASTER_PORT; every rank, rank 0 included, connects to MASTER_ADDR:MASTER_PORT, retrying
// until the timeout, and announces its rank and WORLD_SIZE. Messages are length-prefixed frames.
// Every operation throws dist::TimeoutError (naming the op, the rank, the key and the timeout)
// instead of waiting past its timeout; a world-size mismatch, a duplicate rank or a rank whose
// connection drops without closing its Store fails the whole store: every waiting and later
// operation of every rank throws dist::DistError with the reason.
// Limits: after an operation times out or fails, the store is broken (its connection state is
// unknown) and every later operation throws. Rank 0's Store must outlive the others' use of
// it: end with a barrier() before destroying the stores. Keys and values are at most 64 MiB.
#pragma once

#include "cutrain/core/abi.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "cutrain/core/error.hpp"
#include "cutrain/dist/env.hpp"

namespace cutrain::inline CUTRAIN_ABI::dist {

// A failure of the process group: a peer that is gone, a mismatched world, a broken store.
class DistError : public Error { using Error::Error; };
// An operation that did not complete within its timeout.
class TimeoutError : public DistError { using DistError::DistError; };

struct StoreOptions {
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};  // every operation, connect included
};

namespace detail {

using cutrain::detail::cat;

enum class Msg : std::uint8_t { hello = 1, set, get, barrier, bye, ok, value, error };
inline constexpr std::uint32_t max_frame = 64u << 20;

using Clock = std::chrono::steady_clock;

inline void put_u32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
inline void put_str(std::string& out, std::string_view s) {
  put_u32(out, static_cast<std::uint32_t>(s.size()));
  out.append(s);
}
// A frame: [u32 length of the rest][u8 type][fields].
inline std::string frame(Msg type, std::initializer_list<std::string_view> fields) {
  std::string body(1, static_cast<char>(type));
  for (auto f : fields) put_str(body, f);
  std::string out;
  put_u32(out, static_cast<std::uint32_t>(body.size()));
  return out + body;
}

// The hello a client opens with: its rank and its WORLD_SIZE.
inline std::string hello_frame(int rank, int world_size) {
  std::string body(1, static_cast<char>(Msg::hello));
  put_u32(body, static_cast<std::uint32_t>(rank));
  put_u32(body, static_cast<std::uint32_t>(world_size));
  std::string out;
  put_u32(out, static_cast<std::uint32_t>(body.size()));
  return out + body;
}

// Reads fields back out of a frame's body; ok() is false once it ran past the end.
class Reader {
 public:
  explicit Reader(std::string_view body) : rest_(body) {}
  std::uint32_t u32() {
    if (rest_.size() < 4) return fail(), 0;
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= std::uint32_t(static_cast<unsigned char>(rest_[i])) << (8 * i);
    rest_.remove_prefix(4);
    return v;
  }
  std::string str() {
    const auto n = u32();
    if (!ok_ || rest_.size() < n) return fail(), std::string();
    std::string s(rest_.substr(0, n));
    rest_.remove_prefix(n);
    return s;
  }
  bool ok() const { return ok_; }

 private:
  void fail() { ok_ = false; }
  std::string_view rest_;
  bool ok_ = true;
};

inline std::string errno_text() { return std::strerror(errno); }

inline void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// Sends all of data; false when the peer is gone.
inline bool send_all(int fd, std::string_view data) {
  while (!data.empty()) {
    const auto n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

// Takes one whole frame's body off the front of buf, if buf holds one. Throws on a bad length.
inline bool take_frame(std::string& buf, std::string& body) {
  if (buf.size() < 4) return false;
  std::uint32_t n = Reader(std::string_view(buf).substr(0, 4)).u32();
  if (n == 0 || n > max_frame) throw DistError("dist::Store", cat("malformed frame of length ", n));
  if (buf.size() < 4 + std::size_t{n}) return false;
  body = buf.substr(4, n);
  buf.erase(0, 4 + std::size_t{n});
  return true;
}

// The server on rank 0: one thread, poll() over the listening socket, a wake pipe and the clients.
class StoreServer {
 public:
  StoreServer(int port, int world_size) : world_(world_size) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CUTRAIN_REQUIRE(listen_fd_ >= 0, DistError, "dist::Store", "socket(): ", errno_text());
    int one = 1;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(listen_fd_, 128) != 0) {
      const auto why = errno_text();
      close_fd(listen_fd_);
      throw DistError("dist::Store", cat("rank 0 cannot listen on port ", port, " (MASTER_PORT): ", why));
    }
    if (::pipe2(wake_, O_CLOEXEC) != 0) {
      close_fd(listen_fd_);
      throw DistError("dist::Store", cat("pipe(): ", errno_text()));
    }
    thread_ = std::thread([this] { serve(); });
  }
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;
  ~StoreServer() {
    (void)!::write(wake_[1], "x", 1);
    if (thread_.joinable()) thread_.join();
    for (auto& c : clients_) close_fd(c.fd);
    close_fd(listen_fd_);
    close_fd(wake_[0]);
    close_fd(wake_[1]);
  }

 private:
  struct Client {
    int fd = -1;
    int rank = -1;  // -1 until its hello
    bool said_bye = false;
    std::string in;
  };

  void serve() {
    while (true) {
      std::vector<pollfd> fds{{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
      for (auto& c : clients_) fds.push_back({c.fd, POLLIN, 0});
      if (::poll(fds.data(), fds.size(), -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (fds[1].revents) return;
      if (fds[0].revents & POLLIN) {
        const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd >= 0) {
          int one = 1;
          ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          clients_.push_back({fd, -1, false, {}});
        }
      }
      // Clients accepted this round were not polled: only the first fds.size() - 2 are.
      for (std::size_t i = 0; i + 2 < fds.size(); ++i)
        if (fds[i + 2].revents) read_from(i);
      std::erase_if(clients_, [](const Client& c) { return c.fd < 0; });
    }
  }

  void read_from(std::size_t i) {
    char buf[65536];
    const auto n = ::recv(clients_[i].fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) return drop(i);
    clients_[i].in.append(buf, static_cast<std::size_t>(n));
    std::string body;
    try {
      while (clients_[i].fd >= 0 && take_frame(clients_[i].in, body)) handle(i, body);
    } catch (const DistError& e) {
      // A connection that has not said hello is no rank (a port scanner, another program): it
      // is closed, and the store goes on.
      if (clients_[i].rank < 0) {
        remove_waiter(clients_[i].fd);
        close_fd(clients_[i].fd);
        return;
      }
      fail(cat("rank ", clients_[i].rank, " sent ", e.what()));
      if (clients_[i].fd >= 0) reply(clients_[i].fd, Msg::error, {failure_});  // it may be waiting
    }
  }

  // A connection that ended: fine after a bye, else the rank died and the store fails.
  void drop(std::size_t i) {
    auto& c = clients_[i];
    if (!c.said_bye && c.rank >= 0)
      fail(cat("rank ", c.rank, " disconnected without closing its store (the process died or its network failed)"));
    // A connection that dropped before its hello is harmless (a port probe).
    remove_waiter(c.fd);
    close_fd(c.fd);
  }

  void remove_waiter(int fd) {
    std::erase(barrier_waiters_, fd);
    for (auto& [k, v] : get_waiters_) std::erase(v, fd);
  }

  // The store failed: every waiter gets the reason, and so does every later request.
  void fail(const std::string& why) {
    if (!failure_.empty()) return;
    failure_ = why;
    const auto msg = frame(Msg::error, {failure_});
    for (int fd : barrier_waiters_) send_all(fd, msg);
    for (auto& [k, v] : get_waiters_)
      for (int fd : v) send_all(fd, msg);
    barrier_waiters_.clear();
    get_waiters_.clear();
  }

  void reply(int fd, Msg type, std::initializer_list<std::string_view> fields) { send_all(fd, frame(type, fields)); }

  void handle(std::size_t i, const std::string& body) {
    auto& c = clients_[i];
    const auto type = static_cast<Msg>(body[0]);
    Reader r(std::string_view(body).substr(1));
    if (type == Msg::bye) {
      c.said_bye = true;
      return;
    }
    if (!failure_.empty()) return reply(c.fd, Msg::error, {failure_});
    if (type == Msg::hello) {
      const auto rank = static_cast<int>(r.u32()), world = static_cast<int>(r.u32());
      if (!r.ok()) throw DistError("dist::Store", "a malformed hello");
      c.rank = rank;
      if (world != world_) {
        fail(cat("world-size mismatch: rank ", rank, " announced WORLD_SIZE=", world, " but rank 0 has WORLD_SIZE=", world_));
        return reply(c.fd, Msg::error, {failure_});
      }
      if (rank < 0 || rank >= world_) {
        fail(cat("rank ", rank, " is out of range for WORLD_SIZE=", world_));
        return reply(c.fd, Msg::error, {failure_});
      }
      for (std::size_t j = 0; j < clients_.size(); ++j)
        if (j != i && clients_[j].rank == rank && clients_[j].fd >= 0) {
          fail(cat("two processes announced RANK=", rank));
          return reply(c.fd, Msg::error, {failure_});
        }
      return reply(c.fd, Msg::ok, {});
    }
    if (c.rank < 0) throw DistError("dist::Store", "a request before its hello");
    if (type == Msg::set) {
      auto key = r.str(), value = r.str();
      if (!r.ok()) throw DistError("dist::Store", "a malformed set");
      reply(c.fd, Msg::ok, {});
      if (auto it = get_waiters_.find(key); it != get_waiters_.end()) {
        for (int fd : it->second) reply(fd, Msg::value, {value});
        get_waiters_.erase(it);
      }
      data_[std::move(key)] = std::move(value);
    } else if (type == Msg::get) {
      auto key = r.str();
      if (!r.ok()) throw DistError("dist::Store", "a malformed get");
      if (auto it = data_.find(key); it != data_.end()) return reply(c.fd, Msg::value, {it->second});
      get_waiters_[std::move(key)].push_back(c.fd);
    } else if (type == Msg::barrier) {
      barrier_waiters_.push_back(c.fd);
      if (static_cast<int>(barrier_waiters_.size()) == world_) {
        for (int fd : barrier_waiters_) reply(fd, Msg::ok, {});
        barrier_waiters_.clear();
      }
    } else {
      throw DistError("dist::Store", cat("an unknown message type ", static_cast<int>(type)));
    }
  }

  int world_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  std::vector<Client> clients_;
  std::map<std::string, std::string> data_;
  std::map<std::string, std::vector<int>> get_waiters_;
  std::vector<int> barrier_waiters_;
  std::string failure_;
  std::thread thread_;  // last: starts after everything it uses exists
};

}  // namespace detail

class Store {
 public:
  // Rank 0 starts the server; every rank connects and announces itself (throws on a mismatch).
  explicit Store(const Env& env, const StoreOptions& opts = {}) : env_(env), opts_(opts) {
    CUTRAIN_REQUIRE(opts.timeout.count() > 0, InvalidArgument, "dist::Store", "timeout must be positive, got ",
                    opts.timeout.count(), " ms");
    // An Env built by hand is checked as Env::parse checks the variables.
    CUTRAIN_REQUIRE(env.master_port >= 1 && env.master_port <= 65535, InvalidArgument, "dist::Store",
                    "master_port must be in [1, 65535], got ", env.master_port);
    CUTRAIN_REQUIRE(env.world_size >= 1 && env.rank >= 0 && env.rank < env.world_size && !env.master_addr.empty(),
                    InvalidArgument, "dist::Store", "need 0 <= rank < world_size and a master_addr, got rank ", env.rank,
                    ", world_size ", env.world_size, ", master_addr \"", env.master_addr, "\"");
    if (env.rank == 0) server_ = std::make_unique<detail::StoreServer>(env.master_port, env.world_size);
    try {
      connect();
      request("connect", "", detail::hello_frame(env.rank, env.world_size), detail::Msg::ok);
    } catch (...) {
      detail::close_fd(fd_);  // no destructor runs for a store that did not construct
      throw;
    }
  }
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;
  ~Store() {
    // A clean close, also after a failed operation: only a connection that drops without it
    // (a process that died) fails the store for the other ranks.
    if (fd_ >= 0) detail::send_all(fd_, detail::frame(detail::Msg::bye, {}));
    detail::close_fd(fd_);
  }

  const Env& env() const { return env_; }

  void set(const std::string& key, std::string_view value) {
    CUTRAIN_REQUIRE(value.size() <= detail::max_frame / 2 && key.size() <= detail::max_frame / 2, InvalidArgument,
                    "dist::Store::set", "key and value must be at most ", detail::max_frame / 2, " bytes, got ",
                    value.size());
    request("set", key, detail::frame(detail::Msg::set, {key, value}), detail::Msg::ok);
  }
  // The key's value; waits until some rank has set it (or the timeout).
  std::string get(const std::string& key) {
    return request("get", key, detail::frame(detail::Msg::get, {key}), detail::Msg::value);
  }
  // Returns once every rank of the world has called barrier().
  void barrier() { request("barrier", "", detail::frame(detail::Msg::barrier, {}), detail::Msg::ok); }

  std::chrono::milliseconds timeout() const { return opts_.timeout; }
  void set_timeout(std::chrono::milliseconds t) {
    CUTRAIN_REQUIRE(t.count() > 0, InvalidArgument, "dist::Store::set_timeout", "timeout must be positive, got ",
                    t.count(), " ms");
    opts_.timeout = t;
  }

 private:
  std::string where(std::string_view key) const {
    return detail::cat("rank ", env_.rank, " of ", env_.world_size, ", store ", env_.master_addr, ":",
                       env_.master_port, key.empty() ? "" : ", key \"", key, key.empty() ? "" : "\"");
  }

  [[noreturn]] void timeout_error(std::string_view op, std::string_view key, std::string_view what) {
    broken_ = true;
    throw TimeoutError(detail::cat("dist::Store::", op),
                       detail::cat(what, " after ", opts_.timeout.count(), " ms (", where(key), ")"));
  }

  // Connects to MASTER_ADDR:MASTER_PORT, retrying until the timeout (the server may start late).
  void connect() {
    const auto deadline = detail::Clock::now() + opts_.timeout;
    std::string last = "no attempt";
    while (true) {
      addrinfo hints{};
      hints.ai_family = AF_UNSPEC;
      hints.ai_socktype = SOCK_STREAM;
      addrinfo* res = nullptr;
      const auto port = std::to_string(env_.master_port);
      if (const int rc = ::getaddrinfo(env_.master_addr.c_str(), port.c_str(), &hints, &res); rc != 0) {
        last = detail::cat("cannot resolve MASTER_ADDR: ", ::gai_strerror(rc));
      } else {
        for (auto* p = res; p && fd_ < 0; p = p->ai_next) {
          int fd = ::socket(p->ai_family, p->ai_socktype | SOCK_CLOEXEC, p->ai_protocol);
          if (fd < 0) continue;
          if (::connect(fd, p->ai_addr, p->ai_addrlen) == 0) {
            int one = 1;
            ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            fd_ = fd;
          } else {
            last = detail::errno_text();
            ::close(fd);
          }
        }
        ::freeaddrinfo(res);
      }
      if (fd_ >= 0) return;
      if (detail::Clock::now() >= deadline) timeout_error("connect", "", detail::cat("could not connect (", last, ")"));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  // Sends one request and waits for its reply; throws on a timeout, an error reply or a lost server.
  std::string request(std::string_view op, std::string_view key, const std::string& msg, detail::Msg expect) {
    const auto qop = detail::cat("dist::Store::", op);
    CUTRAIN_REQUIRE(!broken_, DistError, qop, "the store is broken by an earlier failure (", where(key), ")");
    if (!detail::send_all(fd_, msg)) {
      broken_ = true;
      throw DistError(qop, detail::cat("lost the connection to the store on rank 0 (", where(key), ")"));
    }
    const auto deadline = detail::Clock::now() + opts_.timeout;
    std::string body;
    while (!detail::take_frame(in_, body)) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - detail::Clock::now());
      if (left.count() <= 0) timeout_error(op, key, "timed out");
      pollfd p{fd_, POLLIN, 0};
      const int rc = ::poll(&p, 1, static_cast<int>(std::min<std::int64_t>(left.count() + 1, 1 << 30)));
      if (rc < 0 && errno == EINTR) continue;
      if (rc == 0) continue;
      char buf[65536];
      const auto n = rc < 0 ? -1 : ::recv(fd_, buf, sizeof buf, 0);
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n <= 0) {
        broken_ = true;
        throw DistError(qop, detail::cat("the store on rank 0 closed the connection (rank 0 exited or failed; ",
                                         where(key), ")"));
      }
      in_.append(buf, static_cast<std::size_t>(n));
    }
    const auto type = static_cast<detail::Msg>(body[0]);
    detail::Reader r(std::string_view(body).substr(1));
    if (type == detail::Msg::error) {
      broken_ = true;
      throw DistError(qop, detail::cat(r.str(), " (", where(key), ")"));
    }
    if (type != expect) {
      broken_ = true;
      throw DistError(qop, detail::cat("unexpected reply type ", static_cast<int>(type), " (", where(key), ")"));
    }
    return type == detail::Msg::value ? r.str() : std::string();
  }

  Env env_;
  StoreOptions opts_;
  std::unique_ptr<detail::StoreServer> server_;
  int fd_ = -1;
  bool broken_ = false;
  std::string in_;
};

}  // namespace cutrain::inline CUTRAIN_ABI::dist
