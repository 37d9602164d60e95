// Raw memory on a device: the move-only owner of one allocation. The bytes of a cuda:N storage
// come from the registered device backend (core/backend.hpp; not zeroed: outputs are written
// anyway); host memory is zeroed. Without a backend, asking for cuda memory throws DeviceError.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string_view>
#include <utility>

#include "cutrain/core/backend.hpp"
#include "cutrain/core/device.hpp"
#include "cutrain/core/error.hpp"

namespace cutrain::inline CUTRAIN_ABI {

class Storage {
 public:
  Storage() = default;
  // Host memory is zero-filled unless zero_host is false; device memory is left as it comes.
  Storage(std::size_t bytes, Device device, bool zero_host = true) : bytes_(bytes), device_(device) {
    if (bytes == 0) return;
    if (device.is_cpu()) {
      try {
        ptr_ = ::operator new(bytes, std::align_val_t{64});
      } catch (const std::bad_alloc&) {
        throw OutOfMemory("Storage", detail::cat("cannot allocate ", bytes, " bytes of host memory"));
      }
      if (zero_host) std::memset(ptr_, 0, bytes);
      return;
    }
    block_ = detail::device_backend("Storage").allocate(bytes, device.index);
    ptr_ = block_.ptr;
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
  // How many in-place writes the tensors over this storage have had (Tensor::version).
  std::uint64_t version() const { return version_; }
  void bump_version() { ++version_; }

 private:
  void take(Storage& o) noexcept {
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    device_ = o.device_;
    block_ = std::exchange(o.block_, {});
    version_ = std::exchange(o.version_, 0);
  }

  void release() noexcept {
    if (!ptr_) return;
    if (device_.is_cpu()) {
      ::operator delete(ptr_, std::align_val_t{64});
    } else {
      // A device storage exists only where a backend allocated it.
      detail::device_backend_slot().release(block_, device_.index);
    }
    ptr_ = nullptr;
  }

  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
  Device device_{};
  detail::DeviceBlock block_{};
  std::uint64_t version_ = 0;  // a device storage's block: it goes back to the free list it came from
};

// Sets bytes to zero on any device.
inline void zero_bytes(void* dst, Device dev, std::size_t bytes) {
  if (bytes == 0) return;
  if (dev.is_cpu()) {
    std::memset(dst, 0, bytes);
    return;
  }
  // On this thread's stream, in order with the ops (and recorded when it is being captured).
  detail::device_backend("zero_bytes").zero(dst, dev, bytes);
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
  detail::device_backend("copy_bytes").copy(dst, dst_dev, src, src_dev, bytes);
}

}  // namespace cutrain::inline CUTRAIN_ABI
