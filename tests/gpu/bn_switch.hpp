// Sets the switches of the fast batch-norm kernels (cuda/kernels/batch_norm_train.hpp) for a scope
// and restores them at its end: tests of cuDNN's batch-norm graphs turn them off, the fast
// kernels' tests run ops:: both ways.
#pragma once

#include "cutrain/cuda/kernels/batch_norm_train.hpp"

namespace cutrain::test {

struct FastBatchNorm {
  bool was_forward = cuda::kernels::fast_batch_norm_forward().load();
  bool was_backward = cuda::kernels::fast_batch_norm_backward().load();
  FastBatchNorm(bool forward, bool backward) {
    cuda::kernels::fast_batch_norm_forward() = forward;
    cuda::kernels::fast_batch_norm_backward() = backward;
  }
  ~FastBatchNorm() {
    cuda::kernels::fast_batch_norm_forward() = was_forward;
    cuda::kernels::fast_batch_norm_backward() = was_backward;
  }
  FastBatchNorm(const FastBatchNorm&) = delete;
  FastBatchNorm& operator=(const FastBatchNorm&) = delete;
};

}  // namespace cutrain::test
