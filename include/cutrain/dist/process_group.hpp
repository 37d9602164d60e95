// dist::ProcessGroup: the collectives data parallelism needs, one interface over the backends
// (dist::GlooGroup on Gloo, for CPU tensors and GPU tensors staged through the host).
//
//   dist::GlooGroup pg(store);                           // every rank of store.env()
//   pg.all_reduce(grad, dist::ReduceOp::avg).wait();     // in place
//   auto work = pg.all_reduce(bucket);                   // asynchronous: returns at once
//   ...                                                  // more backward work
//   work.wait();                                         // rethrows the collective's failure
//
// Every collective takes dense contiguous tensors of f32, f64, bf16 or f16, the same shapes on
// every rank, and returns a Work handle; the collectives of one group run one at a time in the
// order they were called, which must be the same on every rank (as in every collective
// library). A failure (a peer that died, a timeout) breaks the group: that Work and every later
// call throw dist::DistError naming the op, this rank and the reason.
#pragma once

#include "cutrain/core/abi.hpp"

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>

#include "cutrain/core/error.hpp"
#include "cutrain/core/tensor.hpp"
#include "cutrain/dist/store.hpp"

namespace cutrain::inline CUTRAIN_ABI::dist {

enum class ReduceOp { sum, avg };

// What a backend sees of a tensor: its elements' bytes, wherever they live.
struct Buffer {
  void* data = nullptr;
  std::int64_t numel = 0;
  DType dtype = DType::f32;
  Device device = Device::cpu();
  std::size_t bytes() const { return static_cast<std::size_t>(numel) * dtype_size(dtype); }
};

namespace detail {

struct WorkState {
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
  std::function<void()> on_wait;  // runs once, on the waiting thread (copies staged results back)
  std::shared_ptr<void> keep;     // the tensors the collective reads and writes
};

}  // namespace detail

// The handle of one collective. wait() blocks until it finished and rethrows its failure;
// waiting again returns (or throws) at once. A Work dropped without wait() still runs.
class Work {
 public:
  Work() = default;
  explicit Work(std::shared_ptr<detail::WorkState> s) : s_(std::move(s)) {}

  bool valid() const { return s_ != nullptr; }
  bool completed() const {
    if (!s_) return true;
    std::lock_guard lock(s_->m);
    return s_->done;
  }
  void wait() {
    if (!s_) return;
    std::function<void()> then;
    {
      std::unique_lock lock(s_->m);
      s_->cv.wait(lock, [&] { return s_->done; });
      if (s_->error) std::rethrow_exception(s_->error);
      then = std::exchange(s_->on_wait, nullptr);
    }
    if (then) then();
    s_->keep.reset();
  }

  // Marks the work finished (or failed): the backend's side.
  static void finish(detail::WorkState& s, std::exception_ptr error = nullptr) {
    {
      std::lock_guard lock(s.m);
      s.done = true;
      s.error = std::move(error);
    }
    s.cv.notify_all();
  }

 private:
  std::shared_ptr<detail::WorkState> s_;
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string_view backend() const = 0;

  // x = op over the ranks' x, in place.
  template <class T>
  Work all_reduce(const Tensor<T>& x, ReduceOp op = ReduceOp::sum) {
    return all_reduce_impl(buffer_of(x, "all_reduce"), op, keep(x));
  }
  // x = root's x on every rank.
  template <class T>
  Work broadcast(const Tensor<T>& x, int root = 0) {
    check_root(root, "broadcast");
    return broadcast_impl(buffer_of(x, "broadcast"), root, keep(x));
  }
  // out = the ranks' x one after another (out has size() * x.numel() elements).
  template <class T>
  Work all_gather(const Tensor<T>& out, const Tensor<T>& x) {
    const Buffer o = buffer_of(out, "all_gather"), i = buffer_of(x, "all_gather");
    check_same_device(out, x, "all_gather");
    CUTRAIN_REQUIRE(o.numel == i.numel * size(), InvalidArgument, "dist::ProcessGroup::all_gather", "out ",
                    out.describe(), " must have ", size(), " x ", i.numel, " elements (world size x the input's)");
    return all_gather_impl(o, i, keep(out, x));
  }
  // out = this rank's part (rank() * out.numel() onwards) of op over the ranks' x.
  template <class T>
  Work reduce_scatter(const Tensor<T>& out, const Tensor<T>& x, ReduceOp op = ReduceOp::sum) {
    const Buffer o = buffer_of(out, "reduce_scatter"), i = buffer_of(x, "reduce_scatter");
    check_same_device(out, x, "reduce_scatter");
    CUTRAIN_REQUIRE(i.numel == o.numel * size(), InvalidArgument, "dist::ProcessGroup::reduce_scatter", "x ",
                    x.describe(), " must have ", size(), " x ", o.numel, " elements (world size x the output's)");
    return reduce_scatter_impl(o, i, op, keep(out, x));
  }
  // Returns once every rank has called it.
  void barrier() { barrier_impl().wait(); }

 protected:
  virtual Work all_reduce_impl(Buffer x, ReduceOp op, std::shared_ptr<void> keep) = 0;
  virtual Work broadcast_impl(Buffer x, int root, std::shared_ptr<void> keep) = 0;
  virtual Work all_gather_impl(Buffer out, Buffer x, std::shared_ptr<void> keep) = 0;
  virtual Work reduce_scatter_impl(Buffer out, Buffer x, ReduceOp op, std::shared_ptr<void> keep) = 0;
  virtual Work barrier_impl() = 0;

 private:
  template <class T>
  static Buffer buffer_of(const Tensor<T>& t, std::string_view op) {
    const std::string name = cutrain::detail::cat("dist::ProcessGroup::", op);
    CUTRAIN_REQUIRE(t.defined(), InvalidArgument, name, "the tensor is undefined");
    constexpr DType d = dtype_of<T>;
    CUTRAIN_REQUIRE(d == DType::f32 || d == DType::f64 || d == DType::bf16 || d == DType::f16, InvalidArgument, name,
                    "collectives take f32, f64, bf16 or f16 tensors, got ", t.describe());
    CUTRAIN_REQUIRE(t.is_contiguous(), InvalidArgument, name, "the tensor must be dense (contiguous), got ",
                    t.describe(), ": pass a contiguous() copy and copy the result back");
    return {.data = static_cast<void*>(t.data()), .numel = t.numel(), .dtype = d, .device = t.device()};
  }
  template <class T>
  static void check_same_device(const Tensor<T>& a, const Tensor<T>& b, std::string_view op) {
    CUTRAIN_REQUIRE(a.device() == b.device(), InvalidArgument, cutrain::detail::cat("dist::ProcessGroup::", op),
                    "out ", a.describe(), " and x ", b.describe(), " are on different devices");
  }
  void check_root(int root, std::string_view op) const {
    CUTRAIN_REQUIRE(root >= 0 && root < size(), InvalidArgument, cutrain::detail::cat("dist::ProcessGroup::", op),
                    "root ", root, " is not a rank of a group of ", size());
  }
  // Views of the tensors (Tensor has no implicit copy): they keep the storages alive.
  template <class... Ts>
  static std::shared_ptr<void> keep(const Ts&... ts) {
    return std::make_shared<std::tuple<Ts...>>(ts.view()...);
  }
};

}  // namespace cutrain::inline CUTRAIN_ABI::dist
