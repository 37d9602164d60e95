// Raw memory on a device: the move-only owner of one allocation. With CUDA the bytes of a
// cuda:N storage live in device memory (not zeroed: outputs are written anyway); host memory is
// zeroed. Without CUDA, asking for cuda memory throws DeviceError.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string_view>
#include <utility>

#include "cutrain/core/device.hpp"
#include "cutrain/core/error.hpp"

#ifdef CUTRAIN_WITH_CUDA
#include <cuda_runtime_api.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>
#include <vector>
#endif

namespace cutrain {

namespace detail {
#ifdef CUTRAIN_WITH_CUDA
inline void cuda_check(cudaError_t st, std::string_view op, std::string_view what) {
  if (st != cudaSuccess)
    throw CudaError(op, detail::cat(what, " failed: ", cudaGetErrorName(st), " (", cudaGetErrorString(st), ")"));
}

// Makes a device current for a scope and restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index) {
    cuda_check(cudaGetDevice(&prev_), "DeviceGuard", "cudaGetDevice");
    if (prev_ != index) cuda_check(cudaSetDevice(index), "DeviceGuard", "cudaSetDevice");
  }
  ~DeviceGuard() { cudaSetDevice(prev_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0;
};
#endif

#ifdef CUTRAIN_WITH_CUDA
// The stream this thread's ops run on (cuda::current_stream() is the public name for it).
inline cudaStream_t& thread_stream() {
  thread_local cudaStream_t s = nullptr;
  return s;
}

// A copy between two views of one CUDA device's memory with any strides: rank <= 8, elements of
// elem_bytes bytes, strides in elements. cuda/kernels/copy.hpp installs the kernel that does it
// (every kernel header and cutrain.hpp include it); without it Tensor::copy_from goes through the
// host. dims is laid out as the kernel's cutrain_copy_args, which takes it by value.
struct StridedCopy {
  struct Dims {
    std::int64_t shape[8] = {}, dst[8] = {}, src[8] = {};
    int rank = 0;
  };
  void* dst = nullptr;
  const void* src = nullptr;
  int elem_bytes = 0, device = 0;
  Dims dims{};
};
using StridedCopyFn = void (*)(const StridedCopy&);
inline StridedCopyFn& device_copy_hook() {
  static StridedCopyFn f = nullptr;
  return f;
}

// Non-null while this thread captures a CUDA graph: the tag of the graph's private memory pool
// (cuda::CudaGraph sets it), under which the allocator files the blocks the captured work uses.
inline cudaStream_t& capture_pool() {
  thread_local cudaStream_t pool = nullptr;
  return pool;
}

// Set while an OutsideCapturePool pauses the capture pool (the stream is still being captured): the
// allocator must still allocate in relaxed capture mode then. The stream's capture status would
// not do: it is also on in a capture the user runs without CudaGraph, where no pool keeps the
// graph's blocks alive and a cudaMalloc should fail as CUDA makes it.
inline cudaStream_t& paused_capture_pool() {
  thread_local cudaStream_t pool = nullptr;
  return pool;
}

// During a capture, allocates from the ordinary cache instead of the graph's pool, for memory
// whose content the host writes before each replay (an optimizer's hyperparameters): a pool
// block may have served a temporary earlier in the captured work, which every replay rewrites.
class OutsideCapturePool {
 public:
  OutsideCapturePool() : saved_(capture_pool()) {
    paused_capture_pool() = saved_;
    capture_pool() = nullptr;
  }
  ~OutsideCapturePool() {
    capture_pool() = saved_;
    paused_capture_pool() = nullptr;
  }
  OutsideCapturePool(const OutsideCapturePool&) = delete;
  OutsideCapturePool& operator=(const OutsideCapturePool&) = delete;

 private:
  cudaStream_t saved_;
};

// A caching allocator for device memory, as in PyTorch: a freed block goes back to a free list
// keyed by (device, stream, rounded size) and the next allocation of that size on that stream
// takes it, so after warm-up the hot path makes no cudaMalloc or cudaFree (which would also
// synchronize the device). Reuse on the same stream is safe because a stream runs in order;
// blocks never move between streams. cuda::empty_cache() returns the cached blocks.
class DeviceCache {
 public:
  static DeviceCache& instance() {
    static DeviceCache* c = new DeviceCache;  // never destroyed: blocks may be freed during exit
    return *c;
  }

  static std::size_t round(std::size_t bytes) {
    const std::size_t unit = bytes < (std::size_t{1} << 20) ? 512 : (std::size_t{1} << 20);
    return (bytes + unit - 1) / unit * unit;
  }

  void* allocate(std::size_t bytes, int device, cudaStream_t stream) {
    {
      std::lock_guard lock(mutex_);
      auto& list = free_[Key{device, stream, bytes}];
      if (!list.empty()) {
        void* p = list.back();
        list.pop_back();
        cached_bytes_ -= bytes;
        return p;
      }
    }
    DeviceGuard g(device);
    // cudaMalloc is not a stream operation, so a capture would refuse it; the block belongs to
    // the graph's pool, which outlives every replay, so allocating it now is what we want.
    const bool relax = capture_pool() != nullptr || paused_capture_pool() != nullptr;
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    if (relax) cudaThreadExchangeStreamCaptureMode(&mode);
    void* p = nullptr;
    cudaError_t st = cudaMalloc(&p, bytes);
    if (st != cudaSuccess && !relax) {
      (void)cudaGetLastError();
      empty();  // out of memory: give back what is cached and try once more
      st = cudaMalloc(&p, bytes);
    }
    if (relax) cudaThreadExchangeStreamCaptureMode(&mode);
    cuda_check(st, "Storage", cat("cudaMalloc of ", bytes, " bytes on cuda:", device));
    return p;
  }

  // A fresh tag for a CUDA graph's private pool (never a real stream's handle).
  cudaStream_t new_pool() {
    std::lock_guard lock(mutex_);
    auto* tag = reinterpret_cast<cudaStream_t>(new char);
    live_pools_.push_back(tag);
    return tag;
  }
  // The graph is gone: its free blocks go back to CUDA. Blocks still held by tensors come back
  // to the pool's list later and are freed by the next empty().
  void retire_pool(cudaStream_t tag) noexcept {
    std::lock_guard lock(mutex_);
    std::erase(live_pools_, tag);
    for (auto& [key, list] : free_) {
      if (key.stream != tag) continue;
      for (void* p : list) cudaFree(p);
      cached_bytes_ -= key.bytes * list.size();
      list.clear();
    }
  }

  void release(void* p, std::size_t bytes, int device, cudaStream_t stream) noexcept {
    try {
      std::lock_guard lock(mutex_);
      free_[Key{device, stream, bytes}].push_back(p);
      cached_bytes_ += bytes;
    } catch (...) {
      cudaFree(p);
    }
  }

  // Frees every cached block, except those of live graph pools (their addresses are baked into
  // the graphs, which write them on each replay).
  void empty() {
    std::lock_guard lock(mutex_);
    for (auto& [key, list] : free_) {
      if (std::find(live_pools_.begin(), live_pools_.end(), key.stream) != live_pools_.end()) continue;
      DeviceGuard g(key.device);
      for (void* p : list) cudaFree(p);
      cached_bytes_ -= key.bytes * list.size();
      list.clear();
    }
  }

  std::size_t cached_bytes() {
    std::lock_guard lock(mutex_);
    return cached_bytes_;
  }

 private:
  struct Key {
    int device;
    cudaStream_t stream;
    std::size_t bytes;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    std::size_t operator()(const Key& k) const {
      return std::hash<std::size_t>()(k.bytes) ^ (std::hash<const void*>()(k.stream) << 1) ^
             (static_cast<std::size_t>(k.device) << 48);
    }
  };
  std::mutex mutex_;
  std::unordered_map<Key, std::vector<void*>, KeyHash> free_;
  std::vector<cudaStream_t> live_pools_;
  std::size_t cached_bytes_ = 0;
};
#endif

[[noreturn]] inline void no_cuda(std::string_view op) {
  throw DeviceError(op, "cutrain was not built with CUDA (define CUTRAIN_WITH_CUDA and link cutrain::cuda)");
}
}  // namespace detail

class Storage {
 public:
  Storage() = default;
  Storage(std::size_t bytes, Device device) : bytes_(bytes), device_(device) {
    if (bytes == 0) return;
    if (device.is_cpu()) {
      ptr_ = ::operator new(bytes, std::align_val_t{64});
      std::memset(ptr_, 0, bytes);
      return;
    }
#ifdef CUTRAIN_WITH_CUDA
    stream_ = detail::capture_pool() ? detail::capture_pool() : detail::thread_stream();
    block_ = detail::DeviceCache::round(bytes);
    ptr_ = detail::DeviceCache::instance().allocate(block_, device.index, stream_);
#else
    detail::no_cuda("Storage");
#endif
  }
  ~Storage() { release(); }
  Storage(Storage&& o) noexcept { take(o); }
  Storage& operator=(Storage&& o) noexcept {
    if (this != &o) {
      release();
      take(o);
    }
    return *this;
  }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return ptr_; }
  std::size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void take(Storage& o) noexcept {
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    device_ = o.device_;
#ifdef CUTRAIN_WITH_CUDA
    stream_ = o.stream_;
    block_ = std::exchange(o.block_, 0);
#endif
  }

  void release() noexcept {
    if (!ptr_) return;
    if (device_.is_cpu()) {
      ::operator delete(ptr_, std::align_val_t{64});
    } else {
#ifdef CUTRAIN_WITH_CUDA
      detail::DeviceCache::instance().release(ptr_, block_, device_.index, stream_);
#endif
    }
    ptr_ = nullptr;
  }

  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
  Device device_{};
#ifdef CUTRAIN_WITH_CUDA
  cudaStream_t stream_ = nullptr;  // the stream it was allocated for: it goes back to that stream's cache
  std::size_t block_ = 0;          // the rounded size of the cached block
#endif
};

// Sets bytes to zero on any device.
inline void zero_bytes(void* dst, Device dev, std::size_t bytes) {
  if (bytes == 0) return;
  if (dev.is_cpu()) {
    std::memset(dst, 0, bytes);
    return;
  }
#ifdef CUTRAIN_WITH_CUDA
  detail::DeviceGuard g(dev.index);
  // On this thread's stream, in order with the ops (and recorded when it is being captured).
  detail::cuda_check(cudaMemsetAsync(dst, 0, bytes, detail::thread_stream()), "zero_bytes",
                     detail::cat("cudaMemsetAsync of ", bytes, " bytes on ", dev));
#else
  detail::no_cuda("zero_bytes");
#endif
}

// Copies bytes between any two devices, on this thread's stream, in order with the ops queued on
// it. A copy that involves host memory returns once it is done; a device-to-device copy is
// queued (and so can be recorded in a CUDA graph).
inline void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, std::size_t bytes) {
  if (bytes == 0) return;
  if (dst_dev.is_cpu() && src_dev.is_cpu()) {
    std::memcpy(dst, src, bytes);
    return;
  }
#ifdef CUTRAIN_WITH_CUDA
  const auto kind = dst_dev.is_cpu() ? cudaMemcpyDeviceToHost
                    : src_dev.is_cpu() ? cudaMemcpyHostToDevice
                                       : cudaMemcpyDeviceToDevice;
  const cudaStream_t s = detail::thread_stream();
  detail::cuda_check(cudaMemcpyAsync(dst, src, bytes, kind, s), "copy_bytes",
                     detail::cat("cudaMemcpyAsync of ", bytes, " bytes from ", src_dev, " to ", dst_dev));
  if (kind != cudaMemcpyDeviceToDevice)
    detail::cuda_check(cudaStreamSynchronize(s), "copy_bytes",
                       detail::cat("waiting for the copy of ", bytes, " bytes from ", src_dev, " to ", dst_dev));
#else
  detail::no_cuda("copy_bytes");
#endif
}

}  // namespace cutrain
