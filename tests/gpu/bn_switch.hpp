// Sets the switches of the fast batch-norm kernels (cuda/kernels/batch_norm_train.hpp) for a scope
// and restores them at its end: tests of cuDNN's batch-norm graphs turn them off, the fast
// kernels' tests run ops:: both ways. same_bits: two tensors' values, bit for bit.
#pragma once

#include <cstring>

#include "cutrain/core/tensor.hpp"
#include "cutrain/cuda/kernels/batch_norm_train.hpp"

namespace cutrain::test {

// The channels-last forward switch is kept as it was unless given.
struct FastBatchNorm {
  bool was_forward = cuda::kernels::fast_batch_norm_forward().load();
  bool was_backward = cuda::kernels::fast_batch_norm_backward().load();
  bool was_channels_last = cuda::kernels::fast_batch_norm_forward_channels_last().load();
  FastBatchNorm(bool forward, bool backward) {
    cuda::kernels::fast_batch_norm_forward() = forward;
    cuda::kernels::fast_batch_norm_backward() = backward;
  }
  FastBatchNorm(bool forward, bool backward, bool channels_last) : FastBatchNorm(forward, backward) {
    cuda::kernels::fast_batch_norm_forward_channels_last() = channels_last;
  }
  ~FastBatchNorm() {
    cuda::kernels::fast_batch_norm_forward() = was_forward;
    cuda::kernels::fast_batch_norm_backward() = was_backward;
    cuda::kernels::fast_batch_norm_forward_channels_last() = was_channels_last;
  }
  FastBatchNorm(const FastBatchNorm&) = delete;
  FastBatchNorm& operator=(const FastBatchNorm&) = delete;
};

template <class T>
bool same_bits(const Tensor<T>& a, const Tensor<T>& b) {
  const auto va = a.to(Device::cpu()).contiguous(a.layout()), vb = b.to(Device::cpu()).contiguous(a.layout());
  return va.shape() == vb.shape() &&
         std::memcmp(va.data(), vb.data(), static_cast<std::size_t>(va.numel()) * sizeof(T)) == 0;
}

}  // namespace cutrain::test
