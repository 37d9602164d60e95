// The CUDA runtime under cutrain: status checks, per-device per-thread cuDNN and cuBLASLt
// handles bound to the thread's stream, and a workspace arena that grows and is then reused.
#pragma once

#ifndef CUTRAIN_WITH_CUDA
#error "cutrain/cuda/ needs CUTRAIN_WITH_CUDA (link cutrain::cuda)"
#endif

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <memory>
#include <string_view>
#include <unordered_map>

#include "cutrain/core/storage.hpp"

namespace cutrain::cuda {

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

// The stream cutrain's ops run on in this thread (default: the legacy default stream).
inline cudaStream_t& current_stream() {
  thread_local cudaStream_t s = nullptr;
  return s;
}

// Per-device, per-thread library handles, created at first use and bound to current_stream().
struct Handles {
  cudnnHandle_t cudnn = nullptr;
  cublasLtHandle_t cublaslt = nullptr;
  Storage workspace;  // the arena: grows to the largest request, then is reused

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
  check(cudnnSetStream(h->cudnn, current_stream()), "cuda::handles", "cudnnSetStream");
  return *h;
}

// A device pointer to at least `bytes` of scratch memory for an op on `device`. Valid until the
// next call on this thread; the arena only grows, so after warm-up nothing is allocated.
inline void* workspace(int device, std::size_t bytes) {
  Handles& h = handles(device);
  if (bytes == 0) return nullptr;
  if (h.workspace.bytes() < bytes) {
    // Work queued on the stream may still use the old arena: wait before it is freed.
    check(cudaStreamSynchronize(current_stream()), "cuda::workspace", "cudaStreamSynchronize");
    h.workspace = Storage(0, Device::cuda(device));
    h.workspace = Storage(bytes + bytes / 4, Device::cuda(device));
  }
  return h.workspace.data();
}

// Waits for this thread's stream and reports any asynchronous error.
inline void synchronize(std::string_view op = "cuda::synchronize") {
  check(cudaStreamSynchronize(current_stream()), op, "cudaStreamSynchronize");
  check(cudaGetLastError(), op, "a previous kernel");
}

}  // namespace cutrain::cuda
