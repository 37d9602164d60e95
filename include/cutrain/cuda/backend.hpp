// The CUDA backend of core/backend.hpp: device memory from the caching allocator, memset and
// copies on this thread's stream, the capture status, the loader's pinned staging buffers, and
// the profiler's events.
// Registered during static initialization by every program that includes a cuda/ header
// (runtime.hpp includes this one); cuda/kernels/copy.hpp adds the strided copy kernel.
#pragma once

#include "cutrain/core/abi.hpp"

#ifndef CUTRAIN_WITH_CUDA
#error "cutrain/cuda/ needs CUTRAIN_WITH_CUDA (link cutrain::cuda)"
#endif

#include <cuda_runtime_api.h>

#include <array>
#include <map>
#include <cstddef>
#include <memory>
#include <string_view>
#include <vector>

#include "cutrain/core/backend.hpp"
#include "cutrain/cuda/allocator.hpp"

namespace cutrain::inline CUTRAIN_ABI::cuda::detail {

namespace core = cutrain::detail;

// Two pinned host buffers used in turn: the host assembles batch k + 1 (and queues its step)
// while the GPU still runs step k. A buffer is written again only after its last copy is done
// (its event).
class PinnedStaging final : public core::HostStaging {
 public:
  PinnedStaging() = default;
  PinnedStaging(const PinnedStaging&) = delete;
  PinnedStaging& operator=(const PinnedStaging&) = delete;
  ~PinnedStaging() override {
    for (auto& s : slots_) {
      if (s.done) {
        cudaEventSynchronize(s.done);
        cudaEventDestroy(s.done);
      }
      if (s.host) cudaFreeHost(s.host);
    }
  }

  void* acquire(std::size_t bytes) override {
    Slot& s = slots_[next_];
    if (s.done) core::cuda_check(cudaEventSynchronize(s.done), op, "waiting for a staging buffer's last copy");
    else core::cuda_check(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming), op, "cudaEventCreate");
    if (s.bytes < bytes) {
      if (s.host) core::cuda_check(cudaFreeHost(s.host), op, "cudaFreeHost");
      s.host = nullptr;
      s.bytes = 0;
      core::cuda_check(cudaHostAlloc(&s.host, bytes, cudaHostAllocDefault), op,
                       core::cat("cudaHostAlloc of ", bytes, " bytes (pinned staging buffer)"));
      s.bytes = bytes;
    }
    return s.host;
  }
  void upload(void* dst, Device, const void* src, std::size_t bytes) override {
    core::cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, core::thread_stream()), op,
                     core::cat("cudaMemcpyAsync of ", bytes, " bytes of a batch"));
  }
  void release() override {
    core::cuda_check(cudaEventRecord(slots_[next_].done, core::thread_stream()), op, "cudaEventRecord");
    next_ = (next_ + 1) % slots_.size();
  }

 private:
  static constexpr std::string_view op = "data::Loader";
  struct Slot {
    void* host = nullptr;
    std::size_t bytes = 0;
    cudaEvent_t done = nullptr;
  };
  std::array<Slot, 2> slots_{};
  std::size_t next_ = 0;
};

// A block of the allocator's cache for this thread's stream, or for the graph being captured.
inline core::DeviceBlock allocate(std::size_t bytes, int device) {
  const cudaStream_t pool = core::capture_pool() ? core::capture_pool() : core::thread_stream();
  const std::size_t block = core::DeviceCache::round(bytes);
  return {core::DeviceCache::instance().allocate(block, device, pool), block, static_cast<void*>(pool)};
}

inline void release(const core::DeviceBlock& b, int device) noexcept {
  core::DeviceCache::instance().release(b.ptr, b.bytes, device, static_cast<cudaStream_t>(b.pool));
}

inline void zero(void* dst, Device dev, std::size_t bytes) {
  core::DeviceGuard g(dev.index);
  core::cuda_check(cudaMemsetAsync(dst, 0, bytes, core::thread_stream()), "zero_bytes",
                   core::cat("cudaMemsetAsync of ", bytes, " bytes on ", dev));
}

inline void copy(void* dst, Device dst_dev, const void* src, Device src_dev, std::size_t bytes) {
  const auto kind = dst_dev.is_cpu() ? cudaMemcpyDeviceToHost
                    : src_dev.is_cpu() ? cudaMemcpyHostToDevice
                                       : cudaMemcpyDeviceToDevice;
  const cudaStream_t s = core::thread_stream();
  core::cuda_check(cudaMemcpyAsync(dst, src, bytes, kind, s), "copy_bytes",
                   core::cat("cudaMemcpyAsync of ", bytes, " bytes from ", src_dev, " to ", dst_dev));
  if (kind != cudaMemcpyDeviceToDevice)
    core::cuda_check(cudaStreamSynchronize(s), "copy_bytes",
                     core::cat("waiting for the copy of ", bytes, " bytes from ", src_dev, " to ", dst_dev));
}

inline bool capturing() {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  core::cuda_check(cudaStreamIsCapturing(core::thread_stream(), &st), "cuda::capturing", "cudaStreamIsCapturing");
  return st != cudaStreamCaptureStatusNone;
}

inline std::unique_ptr<core::HostStaging> make_staging() { return std::make_unique<PinnedStaging>(); }

// The profiler's events: a pool per thread and device, so that a profiled step creates none after
// its first. An event belongs to the device that was current when it was created, so each is
// created and recorded with its device current.
inline std::vector<cudaEvent_t>& event_pool(int device) {
  thread_local std::map<int, std::vector<cudaEvent_t>> pools;
  return pools[device];
}

inline void* event_record(int device) {
  constexpr std::string_view op = "profile::OpScope";
  int current = 0;
  core::cuda_check(cudaGetDevice(&current), op, "cudaGetDevice");
  if (current != device) core::cuda_check(cudaSetDevice(device), op, "cudaSetDevice");
  std::vector<cudaEvent_t>& pool = event_pool(device);
  cudaEvent_t e = nullptr;
  cudaError_t err = cudaSuccess;
  if (pool.empty()) {
    err = cudaEventCreate(&e);
  } else {
    e = pool.back();
    pool.pop_back();
  }
  if (err == cudaSuccess) err = cudaEventRecord(e, core::thread_stream());
  if (current != device) (void)cudaSetDevice(current);
  core::cuda_check(err, op, "cudaEventRecord");
  return e;
}

inline double event_elapsed_ms(void* from, void* to) {
  constexpr std::string_view op = "profile::Session::stop";
  core::cuda_check(cudaEventSynchronize(static_cast<cudaEvent_t>(to)), op, "cudaEventSynchronize");
  float ms = 0;
  core::cuda_check(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(from), static_cast<cudaEvent_t>(to)), op,
                   "cudaEventElapsedTime");
  return ms;
}

inline void event_release(int device, void* e) noexcept {
  try {
    event_pool(device).push_back(static_cast<cudaEvent_t>(e));
  } catch (...) {
    cudaEventDestroy(static_cast<cudaEvent_t>(e));
  }
}

inline bool register_backend() {
  core::DeviceBackend& b = core::device_backend_slot();
  b.allocate = &allocate;
  b.release = &release;
  b.zero = &zero;
  b.copy = &copy;
  b.capturing = &capturing;
  b.make_staging = &make_staging;
  b.event_record = &event_record;
  b.event_elapsed_ms = &event_elapsed_ms;
  b.event_release = &event_release;
  return true;
}

// Before any tensor of a translation unit that includes this header is made at namespace scope.
inline const bool backend_registered = register_backend();

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::detail
