// The CUDA runtime under cutrain: status checks, per-device per-thread cuDNN and cuBLASLt
// handles bound to the thread's stream, and a workspace arena that grows and is then reused.
// Including it (every cuda/ header does) registers the CUDA backend that core/ allocates through.
#pragma once

#include "cutrain/core/abi.hpp"

#ifndef CUTRAIN_WITH_CUDA
#error "cutrain/cuda/ needs CUTRAIN_WITH_CUDA (link cutrain::cuda)"
#endif

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string_view>
#include <unordered_map>

#include "cutrain/core/storage.hpp"
#include "cutrain/cuda/allocator.hpp"
#include "cutrain/cuda/backend.hpp"

namespace cutrain::inline CUTRAIN_ABI::cuda {

namespace detail {
// Microseconds since t0 on the steady clock: the counters of time spent (build, load, tuning stats).
inline std::int64_t micros_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace detail

inline void check(cudaError_t st, std::string_view op, std::string_view what) { cutrain::detail::cuda_check(st, op, what); }

inline void check(cudnnStatus_t st, std::string_view op, std::string_view what) {
  if (st != CUDNN_STATUS_SUCCESS)
    throw CudnnError(op, cutrain::detail::cat(what, " failed: ", cudnnGetErrorString(st)));
}

inline void check(cublasStatus_t st, std::string_view op, std::string_view what) {
  if (st != CUBLAS_STATUS_SUCCESS)
    throw CublasError(op, cutrain::detail::cat(what, " failed: cublas status ", static_cast<int>(st)));
}

// Number of CUDA devices; 0 when there is no driver or no GPU (never throws).
inline int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}
inline bool available() { return device_count() > 0; }

// The stream cutrain's ops run on in this thread (default: the legacy default stream). Set it
// with a StreamGuard.
inline cudaStream_t& current_stream() { return cutrain::detail::thread_stream(); }

// Whether this thread's stream is being captured into a CUDA graph.
inline bool capturing() {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(current_stream(), &st), "cuda::capturing", "cudaStreamIsCapturing");
  return st != cudaStreamCaptureStatusNone;
}

// Throws when this thread is capturing: for the code paths that would build a plan, load a
// kernel or allocate scratch memory, which must all happen in a warm-up step before capture.
inline void require_not_capturing(std::string_view op, std::string_view what) {
  if (capturing())
    throw InvalidArgument(op, cutrain::detail::cat(what, " during CUDA graph capture; run one step outside capture "
                                                         "(a warm-up step) before capturing it"));
}

// Returns the device memory cached by cutrain's allocator to CUDA.
inline void empty_cache() { cutrain::detail::DeviceCache::instance().empty(); }
inline std::size_t cached_bytes() { return cutrain::detail::DeviceCache::instance().cached_bytes(); }

// A CUDA stream, owned (created non-blocking, destroyed with it).
class Stream {
 public:
  explicit Stream(int device = 0) {
    cutrain::detail::DeviceGuard g(device);
    check(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), "cuda::Stream", "cudaStreamCreateWithFlags");
  }
  ~Stream() {
    if (s_) cudaStreamDestroy(s_);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }
  void synchronize() const { check(cudaStreamSynchronize(s_), "cuda::Stream", "cudaStreamSynchronize"); }

 private:
  cudaStream_t s_ = nullptr;
};

// Makes `s` this thread's current stream for a scope (and restores the previous one).
class StreamGuard {
 public:
  explicit StreamGuard(cudaStream_t s) : prev_(current_stream()) { current_stream() = s; }
  ~StreamGuard() { current_stream() = prev_; }
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  cudaStream_t prev_;
};

// A CUDA event with timing, recorded on a stream.
class Event {
 public:
  Event() { check(cudaEventCreate(&e_), "cuda::Event", "cudaEventCreate"); }
  ~Event() {
    if (e_) cudaEventDestroy(e_);
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(cudaStream_t s = current_stream()) { check(cudaEventRecord(e_, s), "cuda::Event", "cudaEventRecord"); }
  void synchronize() const { check(cudaEventSynchronize(e_), "cuda::Event", "cudaEventSynchronize"); }
  // Milliseconds from `start` to this event (both recorded, this one completed).
  float elapsed_ms(const Event& start) const {
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start.e_, e_), "cuda::Event", "cudaEventElapsedTime");
    return ms;
  }
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

// Per-device, per-thread library handles, created at first use and bound to current_stream().
struct Handles {
  cudnnHandle_t cudnn = nullptr;
  cublasLtHandle_t cublaslt = nullptr;
  Storage workspace;  // the arena: grows to the largest request, then is reused
  cudaStream_t cudnn_stream = nullptr;  // the stream cudnn is bound to (cudnnCreate binds the default one)

  Handles() = default;
  Handles(const Handles&) = delete;
  Handles& operator=(const Handles&) = delete;
  ~Handles() {
    if (cudnn) cudnnDestroy(cudnn);
    if (cublaslt) cublasLtDestroy(cublaslt);
  }
};

inline Handles& handles(int device) {
  thread_local std::unordered_map<int, std::unique_ptr<Handles>> per_device;
  auto& h = per_device[device];
  if (!h) {
    cutrain::detail::DeviceGuard g(device);
    auto fresh = std::make_unique<Handles>();
    check(cudnnCreate(&fresh->cudnn), "cuda::handles", "cudnnCreate");
    check(cublasLtCreate(&fresh->cublaslt), "cuda::handles", "cublasLtCreate");
    h = std::move(fresh);
  }
  // Rebound only when this thread's stream changed: this runs on every op call.
  const cudaStream_t s = current_stream();
  if (h->cudnn_stream != s) {
    check(cudnnSetStream(h->cudnn, s), "cuda::handles", "cudnnSetStream");
    h->cudnn_stream = s;
  }
  return *h;
}

// A device pointer to at least `bytes` of scratch memory for an op on `device`. Valid until the
// next call on this thread; the arena only grows, so after warm-up nothing is allocated.
inline void* workspace(int device, std::size_t bytes) {
  Handles& h = handles(device);
  if (bytes == 0) return nullptr;
  if (h.workspace.bytes() < bytes) {
    require_not_capturing("cuda::workspace", cutrain::detail::cat("growing the workspace arena to ", bytes, " bytes"));
    // Work queued on this thread's stream may still use the old arena: wait before it goes back
    // to the allocator's cache, from where another stream could take it.
    check(cudaStreamSynchronize(current_stream()), "cuda::workspace", "cudaStreamSynchronize");
    h.workspace = Storage(bytes + bytes / 4, Device::cuda(device));
  }
  return h.workspace.data();
}

// Waits for this thread's stream and reports any asynchronous error.
inline void synchronize(std::string_view op = "cuda::synchronize") {
  check(cudaStreamSynchronize(current_stream()), op, "cudaStreamSynchronize");
  check(cudaGetLastError(), op, "a previous kernel");
}

}  // namespace cutrain::inline CUTRAIN_ABI::cuda
