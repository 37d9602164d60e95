// The CUDA allocator under cutrain: status checks, the device and stream a thread's ops run on,
// and a caching allocator for device memory (with the private pools of CUDA graphs). The CUDA
// backend (cuda/backend.hpp) hands its blocks to Storage through core/backend.hpp.
#pragma once

#include "cutrain/core/abi.hpp"

#ifndef CUTRAIN_WITH_CUDA
#error "cutrain/cuda/ needs CUTRAIN_WITH_CUDA (link cutrain::cuda)"
#endif

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "cutrain/core/error.hpp"

namespace cutrain::inline CUTRAIN_ABI::detail {

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

// The stream this thread's ops run on (cuda::current_stream() is the public name for it).
inline cudaStream_t& thread_stream() {
  thread_local cudaStream_t s = nullptr;
  return s;
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
        in_use_bytes_ += bytes;
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
    std::size_t freed = 0;
    if (st == cudaErrorMemoryAllocation && !relax) {
      (void)cudaGetLastError();  // not sticky: cleared, the process goes on after a failure
      freed = cached_bytes();
      empty();  // out of memory: give back what is cached and try once more
      st = cudaMalloc(&p, bytes);
    }
    if (relax) cudaThreadExchangeStreamCaptureMode(&mode);
    if (st == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      throw OutOfMemory("Storage", out_of_memory_message(bytes, device, freed, relax));
    }
    cuda_check(st, "Storage", cat("cudaMalloc of ", bytes, " bytes on cuda:", device));
    std::lock_guard lock(mutex_);
    in_use_bytes_ += bytes;
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
      in_use_bytes_ -= std::min(in_use_bytes_, bytes);
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
  // Bytes of the blocks tensors hold now (all devices).
  std::size_t in_use_bytes() {
    std::lock_guard lock(mutex_);
    return in_use_bytes_;
  }

 private:
  // What a failed allocation reports: the request, what this allocator holds, what CUDA has left.
  std::string out_of_memory_message(std::size_t bytes, int device, std::size_t freed, bool capturing) {
    std::size_t free_now = 0, total = 0;
    if (cudaMemGetInfo(&free_now, &total) != cudaSuccess) (void)cudaGetLastError();
    const auto gib = [](std::size_t b) { return static_cast<double>(b) / static_cast<double>(1u << 30); };
    const std::size_t held = in_use_bytes();
    std::string retry = capturing ? " under CUDA graph capture (no retry there)"
                        : freed > 0 ? cat(" after the caching allocator returned its ", freed, " cached bytes (", gib(freed),
                                          " GiB) to CUDA and retried")
                                    : std::string(" (the caching allocator had no cached block to return)");
    return cat("out of device memory: cudaMalloc of ", bytes, " bytes (", gib(bytes), " GiB) on cuda:", device,
               " failed", retry, "; tensors hold ", held, " bytes (", gib(held), " GiB) of the allocator's blocks; cuda:",
               device, " has ", free_now, " of ", total, " bytes free (", gib(free_now), " of ", gib(total), " GiB)");
  }
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
  std::size_t in_use_bytes_ = 0;
};

}  // namespace cutrain::inline CUTRAIN_ABI::detail
