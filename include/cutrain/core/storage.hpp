// Raw memory on a device: the move-only owner of one allocation. With CUDA the bytes of a
// cuda:N storage live in device memory (not zeroed: outputs are written anyway); host memory is
// zeroed. Without CUDA, asking for cuda memory throws DeviceError.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string_view>
#include <utility>

#include "cutrain/core/device.hpp"
#include "cutrain/core/error.hpp"

#ifdef CUTRAIN_WITH_CUDA
#include <cuda_runtime_api.h>
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
    detail::DeviceGuard g(device.index);
    detail::cuda_check(cudaMalloc(&ptr_, bytes), "Storage",
                       detail::cat("cudaMalloc of ", bytes, " bytes on ", device));
#else
    detail::no_cuda("Storage");
#endif
  }
  ~Storage() { release(); }
  Storage(Storage&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)), device_(o.device_) {}
  Storage& operator=(Storage&& o) noexcept {
    if (this != &o) {
      release();
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
      device_ = o.device_;
    }
    return *this;
  }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return ptr_; }
  std::size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void release() noexcept {
    if (!ptr_) return;
    if (device_.is_cpu()) {
      ::operator delete(ptr_, std::align_val_t{64});
    } else {
#ifdef CUTRAIN_WITH_CUDA
      cudaFree(ptr_);  // destructors never throw; a failure here has nowhere to go
#endif
    }
    ptr_ = nullptr;
  }

  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
  Device device_{};
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
  detail::cuda_check(cudaMemset(dst, 0, bytes), "zero_bytes", detail::cat("cudaMemset of ", bytes, " bytes on ", dev));
#else
  detail::no_cuda("zero_bytes");
#endif
}

// Copies bytes between any two devices (synchronously).
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
  detail::cuda_check(cudaMemcpy(dst, src, bytes, kind), "copy_bytes",
                     detail::cat("cudaMemcpy of ", bytes, " bytes from ", src_dev, " to ", dst_dev));
#else
  detail::no_cuda("copy_bytes");
#endif
}

}  // namespace cutrain
