// dist::GlooGroup: a ProcessGroup on Gloo (Debian's libgloo-dev; link -lgloo), the collective
// library PyTorch uses on CPUs. CPU tensors are reduced where they lie; GPU tensors are staged
// through host memory (copied out when the collective is called, back when it is waited for),
// so GPU ranks can train together without NCCL: several processes on one GPU, or machines
// without it.
//
//   auto env = dist::Env::from_environment();
//   dist::Store store(env);
//   dist::GlooGroup pg(store);          // connects every pair of ranks (a full mesh over TCP)
//   pg.all_reduce(t, dist::ReduceOp::avg).wait();
//
// The ranks meet through the Store (keys under opts.prefix); each rank listens on the local
// address that routes to MASTER_ADDR (or opts.hostname). The collectives run one at a time on
// the group's own thread, in call order; each has the group's timeout. A world of one rank
// needs no network: its collectives are local copies.
// Limits: GPU tensors are staged synchronously (the calling thread waits for the device before
// the collective starts), in pageable memory; reduce_scatter is an all-reduce of a copy, then
// this rank's part (twice the traffic of a ring reduce-scatter).
#pragma once

#include "cutrain/core/abi.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <chrono>
#include <cstddef>
#include <cstring>
#include <deque>
#include <map>
#include <thread>
#include <vector>

#include "cutrain/dist/process_group.hpp"

namespace cutrain::inline CUTRAIN_ABI::dist {

struct GlooOptions {
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};  // each collective, and the connection
  std::string hostname = "";   // the address this rank listens on; empty: the one that routes to MASTER_ADDR
  std::string prefix = "gloo";  // of the store keys: a second group on one store needs another
};

namespace detail {

// SIGPIPE blocked in this thread for the scope. Gloo writes to its sockets with writev, and a
// write to a peer that has died raises SIGPIPE, whose default action ends the process: the
// surviving rank would vanish instead of throwing DistError. Threads started within the scope
// (Gloo's device loop, the group's worker) inherit the mask, so their writes fail with EPIPE and
// Gloo reports the peer; the process's own SIGPIPE handling is left as it is.
class SigpipeBlocked {
 public:
  SigpipeBlocked() {
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGPIPE);
    blocked_ = pthread_sigmask(SIG_BLOCK, &s, &old_) == 0;
  }
  ~SigpipeBlocked() {
    if (blocked_) pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeBlocked(const SigpipeBlocked&) = delete;
  SigpipeBlocked& operator=(const SigpipeBlocked&) = delete;

 private:
  sigset_t old_{};
  bool blocked_ = false;
};

// Gloo's rendezvous store, on a dist::Store.
class GlooStore : public ::gloo::rendezvous::Store {
 public:
  GlooStore(dist::Store& s, std::string prefix) : s_(s), prefix_(std::move(prefix) + "/") {}
  void set(const std::string& key, const std::vector<char>& data) override {
    s_.set(prefix_ + key, std::string_view(data.data(), data.size()));
  }
  std::vector<char> get(const std::string& key) override {
    const std::string v = s_.get(prefix_ + key);
    return {v.begin(), v.end()};
  }
  void wait(const std::vector<std::string>& keys) override {
    for (const auto& k : keys) s_.get(prefix_ + k);
  }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds&) override { wait(keys); }

 private:
  dist::Store& s_;
  std::string prefix_;
};

// The local address of the interface that routes to host:port (a UDP connect sends nothing).
inline std::string local_address_towards(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res)
    throw DistError("dist::GlooGroup", cat("cannot resolve MASTER_ADDR \"", host, "\""));
  std::string out;
  for (auto* p = res; p && out.empty(); p = p->ai_next) {
    const int fd = ::socket(p->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof local;
    char text[INET6_ADDRSTRLEN] = {};
    if (::connect(fd, p->ai_addr, p->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      const void* a = local.ss_family == AF_INET ? static_cast<const void*>(&reinterpret_cast<sockaddr_in&>(local).sin_addr)
                                                  : static_cast<const void*>(&reinterpret_cast<sockaddr_in6&>(local).sin6_addr);
      if (::inet_ntop(local.ss_family, a, text, sizeof text)) out = text;
    }
    ::close(fd);
  }
  ::freeaddrinfo(res);
  if (out.empty()) throw DistError("dist::GlooGroup", cat("no local address routes to MASTER_ADDR \"", host, "\""));
  return out;
}

template <class T>
using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;

// c = a + b, elementwise, summed in f32 (f64 for f64).
template <class T>
void gloo_sum(void* c, const void* a, const void* b, std::size_t n) {
  auto* o = static_cast<T*>(c);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  for (std::size_t i = 0; i < n; ++i) o[i] = T(static_cast<Acc<T>>(x[i]) + static_cast<Acc<T>>(y[i]));
}
template <class T>
void scale(void* p, std::size_t n, double s) {
  auto* o = static_cast<T*>(p);
  for (std::size_t i = 0; i < n; ++i) o[i] = T(static_cast<Acc<T>>(static_cast<Acc<T>>(o[i]) * s));
}

template <class F>
decltype(auto) with_type(DType d, F&& f) {
  switch (d) {
    case DType::f64: return f(double{});
    case DType::bf16: return f(bfloat16{});
    case DType::f16: return f(half{});
    default: return f(float{});
  }
}

}  // namespace detail

class GlooGroup final : public ProcessGroup {
 public:
  explicit GlooGroup(Store& store, const GlooOptions& opts = {})
      : rank_(store.env().rank), size_(store.env().world_size), timeout_(opts.timeout) {
    CUTRAIN_REQUIRE(opts.timeout.count() > 0, InvalidArgument, "dist::GlooGroup", "timeout must be positive, got ",
                    opts.timeout.count(), " ms");
    if (size_ == 1) return;
    const detail::SigpipeBlocked no_sigpipe;  // in Gloo's threads, started below
    try {
      ::gloo::transport::tcp::attr attr(
          (opts.hostname.empty() ? detail::local_address_towards(store.env().master_addr, store.env().master_port)
                                 : opts.hostname)
              .c_str());
      device_ = ::gloo::transport::tcp::CreateDevice(attr);
      auto ctx = std::make_shared<::gloo::rendezvous::Context>(rank_, size_);
      ctx->setTimeout(opts.timeout);
      detail::GlooStore gs(store, opts.prefix);
      ctx->connectFullMesh(gs, device_);
      // Each pair's address, so that a failure Gloo reports by the peer's address names its rank.
      for (int q = 0; q < size_; ++q)
        if (q != rank_) store.set(detail::cat(opts.prefix, "/addr/", rank_, "/", q), ctx->getPair(q)->address().str());
      for (int r = 0; r < size_; ++r)
        if (r != rank_) peer_rank_[store.get(detail::cat(opts.prefix, "/addr/", r, "/", rank_))] = r;
      ctx_ = std::move(ctx);
    } catch (const DistError&) {
      throw;
    } catch (const std::exception& e) {
      throw DistError("dist::GlooGroup", detail::cat("rank ", rank_, " of ", size_, " could not connect: ", e.what()));
    }
    worker_ = std::thread([this] { run(); });
  }
  GlooGroup(const GlooGroup&) = delete;
  GlooGroup& operator=(const GlooGroup&) = delete;
  ~GlooGroup() override {
    {
      std::lock_guard lock(m_);
      stop_ = true;
    }
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "gloo"; }
  std::chrono::milliseconds timeout() const { return timeout_; }

 protected:
  Work all_reduce_impl(Buffer x, ReduceOp op, std::shared_ptr<void> keep) override {
    auto host = stage_in(x);
    return submit("all_reduce", std::move(keep), [this, x, op, host] {
      void* p = host ? host->data() : x.data;
      if (size_ > 1 && x.numel > 0)
        detail::with_type(x.dtype, [&](auto t) {
          using T = decltype(t);
          ::gloo::AllreduceOptions o(ctx_);
          o.setOutput(static_cast<T*>(p), static_cast<std::size_t>(x.numel));
          o.setReduceFunction(&detail::gloo_sum<T>);
          ::gloo::allreduce(o);
          if (op == ReduceOp::avg) detail::scale<T>(p, static_cast<std::size_t>(x.numel), 1.0 / size_);
        });
    }, stage_out(x, host));
  }

  Work broadcast_impl(Buffer x, int root, std::shared_ptr<void> keep) override {
    auto host = stage_in(x);
    return submit("broadcast", std::move(keep), [this, x, root, host] {
      void* p = host ? host->data() : x.data;
      if (size_ > 1 && x.numel > 0)
        detail::with_type(x.dtype, [&](auto t) {
          using T = decltype(t);
          ::gloo::BroadcastOptions o(ctx_);
          o.setOutput(static_cast<T*>(p), static_cast<std::size_t>(x.numel));
          o.setRoot(root);
          ::gloo::broadcast(o);
        });
    }, stage_out(x, host));
  }

  Work all_gather_impl(Buffer out, Buffer x, std::shared_ptr<void> keep) override {
    auto in = stage_in(x);
    auto host = out.device.is_cpu() ? nullptr : std::make_shared<std::vector<std::byte>>(out.bytes());
    return submit("all_gather", std::move(keep), [this, out, x, in, host] {
      void* o = host ? host->data() : out.data;
      const void* i = in ? in->data() : x.data;
      if (x.numel == 0) return;
      if (size_ == 1) {
        std::memmove(o, i, x.bytes());
        return;
      }
      detail::with_type(x.dtype, [&](auto t) {
        using T = decltype(t);
        ::gloo::AllgatherOptions g(ctx_);
        g.setInput(const_cast<T*>(static_cast<const T*>(i)), static_cast<std::size_t>(x.numel));
        g.setOutput(static_cast<T*>(o), static_cast<std::size_t>(out.numel));
        ::gloo::allgather(g);
      });
    }, stage_out(out, host));
  }

  Work reduce_scatter_impl(Buffer out, Buffer x, ReduceOp op, std::shared_ptr<void> keep) override {
    check_not_captured(x);
    auto all = std::make_shared<std::vector<std::byte>>(x.bytes());  // x itself is left as it is
    if (x.numel) copy_bytes(all->data(), Device::cpu(), x.data, x.device, x.bytes());
    auto host = out.device.is_cpu() ? nullptr : std::make_shared<std::vector<std::byte>>(out.bytes());
    return submit("reduce_scatter", std::move(keep), [this, out, x, op, all, host] {
      if (out.numel == 0) return;
      detail::with_type(x.dtype, [&](auto t) {
        using T = decltype(t);
        auto* p = reinterpret_cast<T*>(all->data());
        if (size_ > 1) {
          ::gloo::AllreduceOptions o(ctx_);
          o.setOutput(p, static_cast<std::size_t>(x.numel));
          o.setReduceFunction(&detail::gloo_sum<T>);
          ::gloo::allreduce(o);
        }
        T* mine = p + static_cast<std::size_t>(rank_) * static_cast<std::size_t>(out.numel);
        if (op == ReduceOp::avg && size_ > 1) detail::scale<T>(mine, static_cast<std::size_t>(out.numel), 1.0 / size_);
        std::memcpy(host ? static_cast<void*>(host->data()) : out.data, mine, out.bytes());
      });
    }, stage_out(out, host));
  }

  Work barrier_impl() override {
    return submit("barrier", nullptr, [this] {
      if (size_ == 1) return;
      ::gloo::BarrierOptions o(ctx_);
      ::gloo::barrier(o);
    }, nullptr);
  }

 private:
  using Host = std::shared_ptr<std::vector<std::byte>>;

  // A GPU buffer's host copy, made now on the calling thread (which waits for its stream).
  static void check_not_captured(const Buffer& x) {
    CUTRAIN_REQUIRE(x.device.is_cpu() || !cutrain::detail::device_capturing(), DistError, "dist::GlooGroup",
                    "a collective on a GPU tensor cannot be captured in a CUDA graph: Gloo stages it through the "
                    "host. Run the step eagerly, or use dist::NcclGroup");
  }
  static Host stage_in(const Buffer& x) {
    check_not_captured(x);
    if (x.device.is_cpu()) return nullptr;
    auto h = std::make_shared<std::vector<std::byte>>(x.bytes());
    if (x.numel) copy_bytes(h->data(), Device::cpu(), x.data, x.device, x.bytes());
    return h;
  }
  // What wait() does after the collective: the host copy back into the GPU buffer.
  static std::function<void()> stage_out(const Buffer& x, Host h) {
    if (!h) return nullptr;
    return [x, h] {
      if (x.numel) copy_bytes(x.data, x.device, h->data(), Device::cpu(), x.bytes());
    };
  }

  struct Task {
    std::string_view op;
    std::function<void()> run;
    std::shared_ptr<detail::WorkState> state;
  };

  Work submit(std::string_view op, std::shared_ptr<void> keep, std::function<void()> run, std::function<void()> then) {
    auto st = std::make_shared<detail::WorkState>();
    st->keep = std::move(keep);
    st->on_wait = std::move(then);
    if (size_ == 1) {  // no network: run it here
      try {
        run();
        Work::finish(*st);
      } catch (...) {
        Work::finish(*st, std::current_exception());
      }
      return Work(st);
    }
    {
      std::lock_guard lock(m_);
      if (!broken_.empty())
        throw DistError(detail::cat("dist::GlooGroup::", op),
                        detail::cat("rank ", rank_, " of ", size_, ": the group failed earlier: ", broken_));
      queue_.push_back({op, std::move(run), st});
    }
    cv_.notify_all();
    return Work(st);
  }

  // The group's thread: the collectives in call order. After a failure every later one fails.
  void run() {
    for (;;) {
      Task t;
      std::string broken;
      {
        std::unique_lock lock(m_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        t = std::move(queue_.front());
        queue_.pop_front();
        broken = broken_;
        if (stop_) broken = "the group was destroyed before this collective ran";
      }
      const std::string op = detail::cat("dist::GlooGroup::", t.op);
      if (!broken.empty()) {
        Work::finish(*t.state, std::make_exception_ptr(DistError(
                                   op, detail::cat("rank ", rank_, " of ", size_, ": ", broken))));
        continue;
      }
      try {
        t.run();
        Work::finish(*t.state);
      } catch (const std::exception& e) {
        const std::string why = e.what();
        const bool timed_out = why.find("imed out") != std::string::npos;
        std::string peer = "a peer";
        for (const auto& [addr, r] : peer_rank_)
          if (why.find(addr) != std::string::npos) peer = detail::cat("rank ", r, " (", addr, ")");
        const std::string reason =
            detail::cat(timed_out ? "timed out after " : "", timed_out ? std::to_string(timeout_.count()) : "",
                        timed_out ? " ms: " : "", peer, " failed or left (", why, ")");
        {
          std::lock_guard lock(m_);
          broken_ = detail::cat(t.op, ": ", reason);
        }
        const std::string msg = detail::cat("rank ", rank_, " of ", size_, ": ", reason);
        Work::finish(*t.state, timed_out ? std::make_exception_ptr(TimeoutError(op, msg))
                                         : std::make_exception_ptr(DistError(op, msg)));
      }
    }
  }

  int rank_, size_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<::gloo::transport::Device> device_;
  std::shared_ptr<::gloo::Context> ctx_;
  std::map<std::string, int> peer_rank_;  // a peer pair's address -> its rank
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool stop_ = false;
  std::string broken_;
  std::thread worker_;
};

// The usual pairing: a Store rendezvous from the torchrun variables and a GlooGroup over it (the
// store outlives the group). What the examples build when WORLD_SIZE > 1:
//   std::unique_ptr<dist::GlooWorld> world;
//   if (env.world_size > 1) world = std::make_unique<dist::GlooWorld>(env);
struct GlooWorld {
  explicit GlooWorld(const Env& env, const GlooOptions& opts = {}) : store(env), group(store, opts) {}
  Store store;
  GlooGroup group;
};

}  // namespace cutrain::inline CUTRAIN_ABI::dist
