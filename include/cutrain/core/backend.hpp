// How core/ reaches device memory without including a device's headers: a table of functions
// that the CUDA backend fills in when it is part of the program (cuda/backend.hpp, which every
// cuda/ header and cutrain.hpp include). Storage, zero_bytes, copy_bytes, Tensor::copy_from and
// data::Loader call through it, so their members and code are the same whether or not a
// translation unit defines CUTRAIN_WITH_CUDA, and nothing depends on which header came first.
// Without a backend, asking for device memory throws DeviceError naming the op.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "cutrain/core/device.hpp"
#include "cutrain/core/error.hpp"

namespace cutrain::inline CUTRAIN_ABI::detail {

[[noreturn]] inline void no_cuda(std::string_view op) {
  throw DeviceError(op, "the CUDA backend is not compiled in or not included (link cutrain::cuda, which defines "
                        "CUTRAIN_WITH_CUDA, and include cutrain/cutrain.hpp or a cutrain/cuda/ header)");
}

// A block of device memory as the allocator handed it out: its rounded size and the free list it
// goes back to (a stream's, or a CUDA graph's private pool).
struct DeviceBlock {
  void* ptr = nullptr;
  std::size_t bytes = 0;
  void* pool = nullptr;
};

// A copy between two views of one device's memory with any strides: rank <= 8, elements of
// elem_bytes bytes, strides in elements. dims is laid out as the CUDA kernel's cutrain_copy_args,
// which takes it by value.
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

// Host buffers that batches for a device are assembled in (pinned, used in turn), so that the
// upload is asynchronous and the host prepares the next batch while the device computes.
class HostStaging {
 public:
  virtual ~HostStaging() = default;
  // The next buffer, at least bytes long, free to be written.
  virtual void* acquire(std::size_t bytes) = 0;
  // Queues a copy from the buffer acquire() returned to device memory on this thread's stream.
  virtual void upload(void* dst, Device dev, const void* src, std::size_t bytes) = 0;
  // The uploads out of the buffer are all queued: it may be written again once they are done.
  virtual void release() = 0;
};

// The functions a device backend provides. Every one but strided_copy is set together; a
// strided_copy that is null means copies between layouts of one device go through the host.
struct DeviceBackend {
  DeviceBlock (*allocate)(std::size_t bytes, int device) = nullptr;
  void (*release)(const DeviceBlock& block, int device) noexcept = nullptr;
  // On this thread's stream, in order with the ops queued on it.
  void (*zero)(void* dst, Device dev, std::size_t bytes) = nullptr;
  // On this thread's stream; returns once done when host memory is involved, else is queued.
  void (*copy)(void* dst, Device dst_dev, const void* src, Device src_dev, std::size_t bytes) = nullptr;
  // Whether this thread's stream is being captured into a CUDA graph.
  bool (*capturing)() = nullptr;
  std::unique_ptr<HostStaging> (*make_staging)() = nullptr;
  void (*strided_copy)(const StridedCopy&) = nullptr;
  // The profiler's clock (core/profile.hpp): an event of `device` recorded now on this thread's
  // stream (from a pool per device), the ms from one such event to a later one of the same device
  // (waits for the later), and an event given back to its device's pool.
  void* (*event_record)(int device) = nullptr;
  double (*event_elapsed_ms)(void* from, void* to) = nullptr;
  void (*event_release)(int device, void* event) noexcept = nullptr;
};

// The one registered backend; set once, during static initialization, by the backend's header.
inline DeviceBackend& device_backend_slot() {
  static DeviceBackend backend;
  return backend;
}

inline bool has_device_backend() { return device_backend_slot().allocate != nullptr; }

// The backend, or DeviceError(op) when none is registered.
inline const DeviceBackend& device_backend(std::string_view op) {
  const DeviceBackend& b = device_backend_slot();
  if (!b.allocate) no_cuda(op);
  return b;
}

// Whether this thread captures a CUDA graph now (false without a backend).
inline bool device_capturing() {
  const DeviceBackend& b = device_backend_slot();
  return b.capturing && b.capturing();
}

}  // namespace cutrain::inline CUTRAIN_ABI::detail
