// dist::Communicator: an NCCL communicator over the ranks of a dist::Store, and the collectives
// on cutrain tensors (all-reduce sum/avg, broadcast, all-gather, reduce-scatter), each enqueued
// on the calling thread's stream (cuda::current_stream()) of the tensors' device.
//
//   auto env = dist::Env::from_environment();
//   dist::Store store(env);
//   dist::Communicator comm(store, env.local_rank);  // rank 0 makes the id, the store hands it out
//   comm.all_reduce(grad, dist::ReduceOp::avg);     // in place, f32 / bf16 / f16
//
// Tensors must be dense (any dense layout, the same on every rank) and on the communicator's
// device; counts must agree across ranks (NCCL cannot check that: a mismatch hangs or corrupts).
// A collective returns once enqueued; check_async() reports NCCL's asynchronous errors (a dead
// peer, a network failure) and aborts the communicator instead of hanging.
// dist::NcclGroup (below) is the same communicator behind the dist::ProcessGroup interface.
#pragma once

#include "cutrain/core/abi.hpp"

#ifndef CUTRAIN_WITH_CUDA
#error "cutrain/dist/nccl.hpp needs CUTRAIN_WITH_CUDA (link cutrain::cuda and -lnccl)"
#endif

#include <nccl.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <string_view>
#include <type_traits>
#include <utility>

#include "cutrain/core/tensor.hpp"
#include "cutrain/cuda/runtime.hpp"
#include "cutrain/dist/process_group.hpp"
#include "cutrain/dist/store.hpp"

namespace cutrain::inline CUTRAIN_ABI::dist {

// A failure reported by NCCL.
class NcclError : public DistError { using DistError::DistError; };

namespace detail {

inline void nccl_check(ncclResult_t st, std::string_view op, std::string_view what, ncclComm_t comm = nullptr) {
  if (st == ncclSuccess || st == ncclInProgress) return;
  const char* last = ncclGetLastError(comm);
  throw NcclError(op, cat(what, " failed: ", ncclGetErrorString(st), (last && *last) ? " (" : "", last ? last : "",
                          (last && *last) ? ")" : ""));
}

template <class T>
constexpr ncclDataType_t nccl_dtype() {
  if constexpr (std::is_same_v<T, float>) return ncclFloat32;
  else if constexpr (std::is_same_v<T, cutrain::half>) return ncclFloat16;
  else if constexpr (std::is_same_v<T, cutrain::bfloat16>) return ncclBfloat16;
  else static_assert(!sizeof(T), "dist collectives take f32, f16 or bf16 tensors");
}

inline ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::avg ? ncclAvg : ncclSum; }

}  // namespace detail

class Communicator {
 public:
  // Collective over the store's world: every rank calls it with its own device (LOCAL_RANK).
  // Rank 0 creates the unique id and sets it under `key`; the others get it (store's timeout).
  // The communicator is non-blocking (ncclConfig_t::blocking = 0): initialization and every
  // enqueue are polled, and one that does not settle within `timeout` aborts it (TimeoutError).
  Communicator(Store& store, int device, const std::string& key = "cutrain/nccl_id",
               std::chrono::milliseconds timeout = std::chrono::seconds(300))
      : rank_(store.env().rank), world_(store.env().world_size), device_(device), timeout_(timeout) {
    static constexpr const char* op = "dist::Communicator";
    CUTRAIN_REQUIRE(device >= 0 && device < cuda::device_count(), InvalidArgument, op, "device ", device,
                    " is not one of the ", cuda::device_count(), " CUDA devices (rank ", rank_, ")");
    ncclUniqueId id{};
    if (rank_ == 0) {
      detail::nccl_check(ncclGetUniqueId(&id), op, "ncclGetUniqueId");
      store.set(key, std::string_view(id.internal, sizeof id.internal));
    } else {
      const auto bytes = store.get(key);
      CUTRAIN_REQUIRE(bytes.size() == sizeof id.internal, DistError, op, "the id under \"", key, "\" has ",
                      bytes.size(), " bytes, want ", sizeof id.internal, " (rank ", rank_, ")");
      std::memcpy(id.internal, bytes.data(), sizeof id.internal);
    }
    cutrain::detail::DeviceGuard g(device_);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const std::string what = cutrain::detail::cat("ncclCommInitRankConfig (rank ", rank_, " of ", world_, ", device ",
                                                  device_, ")");
    detail::nccl_check(ncclCommInitRankConfig(&comm_, world_, id, rank_, &config), op, what, comm_);
    settle(op, what);
  }
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  Communicator(Communicator&& o) noexcept
      : comm_(std::exchange(o.comm_, nullptr)), rank_(o.rank_), world_(o.world_), device_(o.device_) {}
  Communicator& operator=(Communicator&& o) noexcept {
    if (this != &o) {
      release();
      comm_ = std::exchange(o.comm_, nullptr);
      rank_ = o.rank_;
      world_ = o.world_;
      device_ = o.device_;
    }
    return *this;
  }
  ~Communicator() { release(); }

  // Waits until NCCL has finished the last call's enqueue (a non-blocking communicator's calls
  // may return ncclInProgress); past the timeout it aborts the communicator.
  void settle(std::string_view op, std::string_view what) {
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    for (;;) {
      CUTRAIN_REQUIRE(comm_, DistError, op, "the communicator was aborted (rank ", rank_, ")");
      ncclResult_t st = ncclSuccess;
      detail::nccl_check(ncclCommGetAsyncError(comm_, &st), op, "ncclCommGetAsyncError", comm_);
      if (st != ncclInProgress) {
        if (st != ncclSuccess) {
          const std::string last = ncclGetLastError(comm_);
          abort();
          throw NcclError(op, cutrain::detail::cat("rank ", rank_, ": ", what, " failed: ", ncclGetErrorString(st),
                                                   last.empty() ? "" : " (", last, last.empty() ? "" : ")"));
        }
        return;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        abort();
        throw TimeoutError(op, cutrain::detail::cat("rank ", rank_, ": ", what, " did not complete within ",
                                                    timeout_.count(), " ms; the communicator was aborted"));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  std::chrono::milliseconds timeout() const { return timeout_; }

  int rank() const { return rank_; }
  int world_size() const { return world_; }
  int device() const { return device_; }
  ncclComm_t get() const { return comm_; }

  // In place: t = sum (or mean) of t over the ranks.
  template <class T>
  void all_reduce(Tensor<T>& t, ReduceOp op = ReduceOp::sum) {
    check_tensor(t, "dist::all_reduce");
    detail::nccl_check(ncclAllReduce(t.data(), t.data(), count(t), detail::nccl_dtype<T>(), detail::nccl_op(op), comm_,
                                     cuda::current_stream()),
                       "dist::all_reduce", "ncclAllReduce", comm_);
    settle("dist::all_reduce", "ncclAllReduce");
  }

  // In place: t = root's t on every rank.
  template <class T>
  void broadcast(Tensor<T>& t, int root = 0) {
    CUTRAIN_REQUIRE(root >= 0 && root < world_, InvalidArgument, "dist::broadcast", "root ", root,
                    " is not a rank of ", world_);
    check_tensor(t, "dist::broadcast");
    detail::nccl_check(ncclBroadcast(t.data(), t.data(), count(t), detail::nccl_dtype<T>(), root, comm_,
                                     cuda::current_stream()),
                       "dist::broadcast", "ncclBroadcast", comm_);
    settle("dist::broadcast", "ncclBroadcast");
  }

  // out (world_size * in.numel() elements) = every rank's in, in rank order.
  template <class T>
  void all_gather(const Tensor<T>& in, Tensor<T>& out) {
    check_tensor(in, "dist::all_gather");
    check_tensor(out, "dist::all_gather");
    CUTRAIN_REQUIRE(out.numel() == in.numel() * world_, InvalidArgument, "dist::all_gather", "out must hold ",
                    world_, " x ", in.numel(), " elements, got ", out.describe(), " for in ", in.describe());
    detail::nccl_check(ncclAllGather(in.data(), out.data(), count(in), detail::nccl_dtype<T>(), comm_,
                                     cuda::current_stream()),
                       "dist::all_gather", "ncclAllGather", comm_);
    settle("dist::all_gather", "ncclAllGather");
  }

  // out = this rank's block (out.numel() elements) of the sum (or mean) of every rank's in.
  template <class T>
  void reduce_scatter(const Tensor<T>& in, Tensor<T>& out, ReduceOp op = ReduceOp::sum) {
    check_tensor(in, "dist::reduce_scatter");
    check_tensor(out, "dist::reduce_scatter");
    CUTRAIN_REQUIRE(in.numel() == out.numel() * world_, InvalidArgument, "dist::reduce_scatter", "in must hold ",
                    world_, " x ", out.numel(), " elements, got ", in.describe(), " for out ", out.describe());
    detail::nccl_check(ncclReduceScatter(in.data(), out.data(), count(out), detail::nccl_dtype<T>(),
                                         detail::nccl_op(op), comm_, cuda::current_stream()),
                       "dist::reduce_scatter", "ncclReduceScatter", comm_);
    settle("dist::reduce_scatter", "ncclReduceScatter");
  }

  // Throws NcclError (and aborts the communicator) when NCCL has failed asynchronously.
  void check_async() {
    CUTRAIN_REQUIRE(comm_, DistError, "dist::Communicator::check_async", "the communicator was aborted");
    ncclResult_t st = ncclSuccess;
    detail::nccl_check(ncclCommGetAsyncError(comm_, &st), "dist::Communicator::check_async", "ncclCommGetAsyncError",
                       comm_);
    if (st == ncclSuccess || st == ncclInProgress) return;
    const std::string last = ncclGetLastError(comm_);
    abort();
    throw NcclError("dist::Communicator::check_async",
                    cutrain::detail::cat("rank ", rank_, ": NCCL failed asynchronously: ", ncclGetErrorString(st),
                                         last.empty() ? "" : " (", last, last.empty() ? "" : ")"));
  }

  // Ends the communicator at once, leaving pending collectives unfinished (after a peer died).
  void abort() noexcept {
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
  }

 private:
  template <class T>
  void check_tensor(const Tensor<T>& t, const char* op) const {
    CUTRAIN_REQUIRE(comm_, DistError, op, "the communicator was aborted (rank ", rank_, ")");
    CUTRAIN_REQUIRE(!t.device().is_cpu() && t.device().index == device_, DeviceError, op, "tensor ", t.describe(),
                    " must be on cuda:", device_, ", the communicator's device (rank ", rank_, ")");
    CUTRAIN_REQUIRE(t.is_contiguous(), InvalidArgument, op, "tensor ", t.describe(),
                    " must be dense (call contiguous())");
  }
  template <class T>
  static std::size_t count(const Tensor<T>& t) { return static_cast<std::size_t>(t.numel()); }

  void release() noexcept {
    if (!comm_) return;
    int prev = device_;  // no DeviceGuard: it throws, and this runs in destructors
    cudaGetDevice(&prev);
    cudaSetDevice(device_);
    ncclCommDestroy(comm_);
    cudaSetDevice(prev);
    comm_ = nullptr;
  }

  ncclComm_t comm_ = nullptr;
  int rank_ = 0;
  int world_ = 1;
  int device_ = 0;
  std::chrono::milliseconds timeout_{std::chrono::seconds(300)};
};

// dist::NcclGroup: a ProcessGroup on NCCL for GPU tensors on one device per rank. Collectives are
// enqueued on the calling thread's stream: a Work is complete once enqueued (later work on that
// stream sees the result) and its wait() only checks NCCL's asynchronous errors. What DataParallel
// runs on GPUs with NCCL; a CUDA graph can capture its collectives.
class NcclGroup final : public ProcessGroup {
 public:
  NcclGroup(Store& store, int device, const std::string& key = "cutrain/nccl_id",
            std::chrono::milliseconds timeout = std::chrono::seconds(300))
      : comm_(store, device, key, timeout) {}

  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.world_size(); }
  std::string_view backend() const override { return "nccl"; }
  Communicator& communicator() { return comm_; }

 protected:
  Work all_reduce_impl(Buffer x, ReduceOp op, std::shared_ptr<void>) override {
    check(x, "all_reduce");
    detail::nccl_check(ncclAllReduce(x.data, x.data, count(x), dtype(x), detail::nccl_op(op), comm_.get(),
                                     cuda::current_stream()),
                       "dist::NcclGroup::all_reduce", "ncclAllReduce", comm_.get());
    return enqueued("all_reduce");
  }
  Work broadcast_impl(Buffer x, int root, std::shared_ptr<void>) override {
    check(x, "broadcast");
    detail::nccl_check(ncclBroadcast(x.data, x.data, count(x), dtype(x), root, comm_.get(), cuda::current_stream()),
                       "dist::NcclGroup::broadcast", "ncclBroadcast", comm_.get());
    return enqueued("broadcast");
  }
  Work all_gather_impl(Buffer out, Buffer x, std::shared_ptr<void>) override {
    check(out, "all_gather");
    check(x, "all_gather");
    detail::nccl_check(ncclAllGather(x.data, out.data, count(x), dtype(x), comm_.get(), cuda::current_stream()),
                       "dist::NcclGroup::all_gather", "ncclAllGather", comm_.get());
    return enqueued("all_gather");
  }
  Work reduce_scatter_impl(Buffer out, Buffer x, ReduceOp op, std::shared_ptr<void>) override {
    check(out, "reduce_scatter");
    check(x, "reduce_scatter");
    detail::nccl_check(ncclReduceScatter(x.data, out.data, count(out), dtype(x), detail::nccl_op(op), comm_.get(),
                                         cuda::current_stream()),
                       "dist::NcclGroup::reduce_scatter", "ncclReduceScatter", comm_.get());
    return enqueued("reduce_scatter");
  }
  Work barrier_impl() override {  // an all-reduce of one float, waited for on the host
    CUTRAIN_REQUIRE(comm_.get(), DistError, "dist::NcclGroup::barrier", "the communicator was aborted");
    auto one = Tensor<float>::zeros({1}, {.device = Device::cuda(comm_.device())});
    all_reduce_impl({.data = one.data(), .numel = 1, .dtype = DType::f32, .device = one.device()}, ReduceOp::sum, nullptr)
        .wait();
    return Work();
  }

 private:
  void check(const Buffer& b, std::string_view op) {
    const std::string name = cutrain::detail::cat("dist::NcclGroup::", op);
    CUTRAIN_REQUIRE(comm_.get(), DistError, name, "the communicator was aborted (rank ", rank(), ")");
    CUTRAIN_REQUIRE(b.device.is_cuda() && b.device.index == comm_.device(), DeviceError, name, "a tensor on ",
                    b.device, " must be on cuda:", comm_.device(), ", the group's device (rank ", rank(),
                    "): NCCL reduces GPU tensors; use dist::GlooGroup for CPU ones");
  }
  static std::size_t count(const Buffer& b) { return static_cast<std::size_t>(b.numel); }
  static ncclDataType_t dtype(const Buffer& b) {
    switch (b.dtype) {
      case DType::f64: return ncclFloat64;
      case DType::bf16: return ncclBfloat16;
      case DType::f16: return ncclFloat16;
      default: return ncclFloat32;
    }
  }
  // The Work of the collective just enqueued: its wait() polls an event recorded after it on the
  // stream, and NCCL's errors, and aborts the communicator past the timeout (a peer that hangs
  // or died). Under CUDA graph capture there is nothing to wait for: wait() checks errors only.
  Work enqueued(std::string_view op) {
    comm_.settle(cutrain::detail::cat("dist::NcclGroup::", op), "the enqueue");
    auto st = std::make_shared<detail::WorkState>();
    cudaEvent_t ev = nullptr;
    if (!cutrain::detail::device_capturing()) {
      cuda::check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "dist::NcclGroup", "cudaEventCreate");
      cuda::check(cudaEventRecord(ev, cuda::current_stream()), "dist::NcclGroup", "cudaEventRecord");
    }
    st->on_wait = [this, ev, name = std::string(op)] {
      struct Destroy {
        cudaEvent_t e;
        ~Destroy() {
          if (e) cudaEventDestroy(e);
        }
      } destroy{ev};
      const auto deadline = std::chrono::steady_clock::now() + comm_.timeout();
      while (ev) {
        const cudaError_t q = cudaEventQuery(ev);
        if (q == cudaSuccess) break;
        cuda::check(q == cudaErrorNotReady ? cudaSuccess : q, "dist::NcclGroup", "cudaEventQuery");
        comm_.check_async();
        if (std::chrono::steady_clock::now() > deadline) {
          comm_.abort();
          throw TimeoutError(cutrain::detail::cat("dist::NcclGroup::", name),
                             cutrain::detail::cat("rank ", rank(), " of ", size(), ": timed out after ",
                                                  comm_.timeout().count(), " ms; the communicator was aborted"));
        }
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
      comm_.check_async();
    };
    Work::finish(*st);
    return Work(st);
  }

  Communicator comm_;
};

}  // namespace cutrain::inline CUTRAIN_ABI::dist
