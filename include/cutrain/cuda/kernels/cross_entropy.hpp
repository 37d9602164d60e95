// Softmax cross-entropy from logits [N, C] and int32 labels [N] on the GPU (NVRTC kernels), with
// the CPU's semantics (cpu/cross_entropy.hpp): label smoothing eps gives the target
// (1 - eps) onehot + eps / C; the loss is the sum over rows, divided by N for the mean. One block
// per row computes the row's loss and its gradient in one pass (f32), and one small kernel adds the
// row losses in a fixed order in f64 (deterministic).
#pragma once

#include "cutrain/core/abi.hpp"

#ifndef CUTRAIN_WITH_CUDA
#error "cutrain/cuda/ needs CUTRAIN_WITH_CUDA (link cutrain::cuda)"
#endif

#include <cstdint>

#include "cutrain/core/params/loss.hpp"
#include "cutrain/cuda/gpu_float.hpp"
#include "cutrain/cuda/kernels/nvrtc.hpp"
#include "cutrain/cuda/kernels/programs.hpp"  // programs::cross_entropy, the kernels of cross_entropy.cuh

namespace cutrain::inline CUTRAIN_ABI::cuda::kernels {

namespace detail {
template <GpuFloat T>
const Program& cross_entropy_program() {
  static const Program p = programs::cross_entropy(device_type<T>);
  return p;
}
}  // namespace detail

// The loss (shape {}) into *loss and/or dlogits = (softmax - target) * dloss (/ N for the mean)
// into *dlogits, in one pass; either pointer may be null. Labels must lie in [0, C) (ops::
// checks them on the host; here a bad one gives NaN). Outputs are contiguous; logits and labels
// are staged to row-major.
// dloss_dev (may be null): a one-element device tensor that scales the gradient too.
template <GpuFloat T>
void cross_entropy(const Tensor<T>& logits, const Tensor<std::int32_t>& labels, const CrossEntropyParams& p,
                   double dloss, Tensor<T>* loss, Tensor<T>* dlogits, const Tensor<T>* dloss_dev = nullptr) {
  constexpr std::string_view op = "cuda::kernels::cross_entropy";
  detail::require_cuda_input(op, logits, "logits");
  detail::require_cuda_input(op, labels, "labels");
  CUTRAIN_REQUIRE(logits.rank() == 2 && logits.dim(1) > 0, InvalidArgument, op, "logits must be [N, C] with C > 0, got ",
                  logits.describe());
  const long long N = logits.dim(0), C = logits.dim(1);
  CUTRAIN_REQUIRE(labels.shape() == Shape{N}, InvalidArgument, op, "labels must have shape [", N, "], got ",
                  labels.describe());
  CUTRAIN_REQUIRE(N < (1LL << 31), InvalidArgument, op, "at most 2^31 - 1 rows (one block each), got ", logits.describe());
  CUTRAIN_REQUIRE(labels.device() == logits.device(), DeviceError, op, "logits ", logits.describe(), " and labels ",
                  labels.describe(), " are on different devices");
  CUTRAIN_REQUIRE(p.reduction == Reduction::mean || p.reduction == Reduction::sum, InvalidArgument, op,
                  "unknown reduction ", static_cast<int>(p.reduction));
  CUTRAIN_REQUIRE(p.reduction == Reduction::sum || N > 0, InvalidArgument, op, "the mean over an empty batch is undefined");
  CUTRAIN_REQUIRE(p.label_smoothing >= 0.0 && p.label_smoothing < 1.0, InvalidArgument, op,
                  "label_smoothing must be in [0, 1), got ", p.label_smoothing);
  if (loss) detail::require_output(op, *loss, Shape{}, logits.device(), "loss");
  if (dlogits) detail::require_output(op, *dlogits, logits.shape(), logits.device(), "dlogits");
  if (dloss_dev) {
    detail::require_cuda_input(op, *dloss_dev, "dloss");
    CUTRAIN_REQUIRE(dloss_dev->numel() == 1 && dloss_dev->device() == logits.device(), InvalidArgument, op,
                    "dloss must be one element on the logits' device ", logits.device(), ", got ", dloss_dev->describe());
  }
  if (!loss && (!dlogits || N == 0)) return;

  const Tensor<T> xs = detail::staged(logits, Layout::row_major);
  const Tensor<std::int32_t> ls = detail::staged(labels, Layout::row_major);
  const bool mean = p.reduction == Reduction::mean;
  const float eps = static_cast<float>(p.label_smoothing);
  const float grad_scale = static_cast<float>(mean ? dloss / static_cast<double>(N) : dloss);
  const int dev = logits.device().index;
  DeviceScope scope(dev);
  float* row_loss = loss ? static_cast<float*>(workspace(dev, static_cast<std::size_t>(N) * sizeof(float))) : nullptr;
  T* grad = dlogits ? dlogits->data() : nullptr;
  const Program& prog = detail::cross_entropy_program<T>();
  if (N > 0) {
    const unsigned threads = C <= 32 ? 32 : C <= 128 ? 128 : 256;  // a multiple of 32, as the block reductions need
    launch(function(dev, prog, "cutrain_cross_entropy_rows"), static_cast<unsigned>(N), threads, op, xs.data(),
           ls.data(), C, eps, row_loss, grad, grad_scale, dloss_dev ? dloss_dev->data() : static_cast<const T*>(nullptr));
  }
  if (loss) {
    const int mean_flag = mean ? 1 : 0;
    launch(function(dev, prog, "cutrain_cross_entropy_reduce"), 1, 256, op, static_cast<const float*>(row_loss), N,
           mean_flag, loss->data());
  }
}

template <GpuFloat T>
void cross_entropy_forward(const Tensor<T>& logits, const Tensor<std::int32_t>& labels, const CrossEntropyParams& p,
                           Tensor<T>& loss) {
  cross_entropy(logits, labels, p, 1.0, &loss, static_cast<Tensor<T>*>(nullptr));
}

template <GpuFloat T>
void cross_entropy_backward(const Tensor<T>& logits, const Tensor<std::int32_t>& labels, double dloss,
                            const CrossEntropyParams& p, Tensor<T>& dlogits) {
  cross_entropy(logits, labels, p, dloss, static_cast<Tensor<T>*>(nullptr), &dlogits);
}
// The same, with the upstream gradient in device memory (one element).
template <GpuFloat T>
void cross_entropy_backward(const Tensor<T>& logits, const Tensor<std::int32_t>& labels, const Tensor<T>& dloss,
                            const CrossEntropyParams& p, Tensor<T>& dlogits) {
  cross_entropy(logits, labels, p, 1.0, static_cast<Tensor<T>*>(nullptr), &dlogits, &dloss);
}

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::kernels
