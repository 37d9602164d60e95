// The fused classifier on the GPU: loss = cross_entropy(x w^T, labels) and, when asked, dx and dw
// for an upstream gradient of 1, a chunk of rows at a time. Per chunk: the logits by cuBLASLt in
// T into rows padded to a multiple of pad_to elements (aligned for the matmuls; the pad is never
// read), one kernel that writes each row's loss and its gradient over the logits, then dx's rows
// and the chunk's dw by cuBLASLt from that gradient. No f32 copy of the logits, no second buffer of
// their size. dw is kept in f32 (chunks added up in f32), dx in T. The mean divides by the number
// of labels that are not ignore_index, counted on the device (nothing is read back: the whole of
// it can be captured in a CUDA graph).
#pragma once

#include "cutrain/core/abi.hpp"

#ifndef CUTRAIN_WITH_CUDA
#error "cutrain/cuda/ needs CUTRAIN_WITH_CUDA (link cutrain::cuda)"
#endif

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "cutrain/core/params/loss.hpp"
#include "cutrain/cpu/linear_cross_entropy.hpp"  // LinearCrossEntropyResult, classifier_chunk_rows
#include "cutrain/cuda/cublas/linear.hpp"
#include "cutrain/cuda/gpu_float.hpp"
#include "cutrain/cuda/kernels/nvrtc.hpp"
#include "cutrain/cuda/kernels/programs.hpp"  // programs::linear_cross_entropy

namespace cutrain::inline CUTRAIN_ABI::cuda::kernels {

namespace detail {
template <GpuFloat T>
const Program& linear_cross_entropy_program() {
  static const Program p = programs::linear_cross_entropy(device_type<T>);
  return p;
}
}  // namespace detail

// x [N, C] and w [V, C] in T, labels [N] on one CUDA device (checked by ops/: labels in [0, V) or
// ignore_index; here a bad one gives NaN). Launches on current_stream().
template <GpuFloat T>
LinearCrossEntropyResult<T> linear_cross_entropy(const Tensor<T>& x, const Tensor<T>& w,
                                                 const Tensor<std::int32_t>& labels, const LinearCrossEntropyParams& p,
                                                 bool grads) {
  constexpr std::string_view op = "linear_cross_entropy";
  const std::int64_t N = x.dim(0), C = x.dim(1), V = w.dim(0);
  const Device dev = x.device();
  const int d = dev.index;
  DeviceScope scope(d);
  const Program& prog = detail::linear_cross_entropy_program<T>();
  const std::int64_t pad = std::max<std::int64_t>(p.pad_to, 1);
  const std::int64_t ld = (V + pad - 1) / pad * pad;
  const std::int64_t chunk = cutrain::detail::classifier_chunk_rows(p, N, ld * static_cast<std::int64_t>(sizeof(T)));
  const bool mean = p.reduction == Reduction::mean;

  LinearCrossEntropyResult<T> r{Tensor<float>(Shape{}, {.device = dev}), {}, {}};
  const Tensor<std::int32_t> ls = detail::staged(labels, Layout::row_major);
  Tensor<std::int32_t> count(Shape{1}, {.device = dev});
  Tensor<float> row_loss(Shape{std::max<std::int64_t>(N, 1)}, {.device = dev});
  launch(function(d, prog, "cutrain_lce_count"), 1, 256, op, ls.data(), static_cast<long long>(N),
         static_cast<int>(p.ignore_index), count.data());
  if (grads) {
    r.dx = Tensor<T>(Shape{N, C}, {.device = dev});
    r.dw = Tensor<float>(Shape{V, C}, {.device = dev});
  }
  Tensor<T> buf(Shape{std::min(chunk, N), ld}, {.device = dev});
  // dw of one chunk in T where it must be added up in f32 (T is not f32, or several chunks).
  const bool dw_direct = std::is_same_v<T, float> && chunk >= N;
  Tensor<T> dw_chunk = grads && !dw_direct ? Tensor<T>(Shape{V, C}, {.device = dev}) : Tensor<T>{};
  const Tensor<T> xs = cublas::detail::readable(x), ws = cublas::detail::readable(w);
  const int vec = vec_packs<T>(ld, buf.data()) > 0 ? 1 : 0;
  const unsigned threads = V <= 32 ? 32 : V <= 256 ? 128 : 512;
  for (std::int64_t r0 = 0; r0 < N; r0 += chunk) {
    const std::int64_t n = std::min(chunk, N - r0);
    const Tensor<T> xc = xs.slice(0, r0, r0 + n);
    Tensor<T> logits = buf.slice(0, 0, n).slice(1, 0, V);  // [n, V], rows ld apart
    cublas::linear_forward(xc, ws, Tensor<T>{}, Activation::identity, logits, op);
    launch(function(d, prog, "cutrain_lce_rows"), static_cast<unsigned>(n), threads, op, buf.data(),
           static_cast<long long>(ld), ls.data() + r0, static_cast<long long>(V), static_cast<float>(p.label_smoothing),
           static_cast<int>(p.ignore_index), row_loss.data() + r0, grads ? 1 : 0, count.data(), mean ? 1 : 0, vec);
    if (!grads) continue;
    Tensor<T> dxc = r.dx.slice(0, r0, r0 + n), no_bias;
    if constexpr (std::is_same_v<T, float>) {
      if (dw_direct) {
        cublas::linear_backward(xc, ws, logits, false, dxc, r.dw, no_bias, op);
        continue;
      }
    }
    cublas::linear_backward(xc, ws, logits, false, dxc, dw_chunk, no_bias, op);
    const long long m = static_cast<long long>(V * C);
    launch(function(d, prog, "cutrain_lce_accumulate"), grid_for(m), 256, op, static_cast<const T*>(dw_chunk.data()),
           r.dw.data(), m, r0 == 0 ? 1 : 0);
  }
  launch(function(d, prog, "cutrain_lce_reduce"), 1, 256, op, static_cast<const float*>(row_loss.data()),
         static_cast<long long>(N), static_cast<const int*>(count.data()), mean ? 1 : 0, r.loss.data());
  return r;
}

// dx * s and dw * s for the one-element upstream gradient s (f32, on the device), as new tensors.
template <GpuFloat T>
void scale_classifier_grads(const Tensor<float>& s, Tensor<T>& dx, Tensor<float>& dw) {
  constexpr std::string_view op = "linear_cross_entropy_backward";
  const int d = s.device().index;
  DeviceScope scope(d);
  const Program& prog = detail::linear_cross_entropy_program<T>();
  Tensor<T> sx(dx.shape(), {.device = dx.device()});
  Tensor<float> sw(dw.shape(), {.device = dw.device()});
  if (const long long n = dx.numel(); n > 0)
    launch(function(d, prog, "cutrain_lce_scale"), grid_for(n), 256, op, static_cast<const T*>(dx.data()), sx.data(), n,
           s.data());
  if (const long long n = dw.numel(); n > 0)
    launch(function(d, prog, "cutrain_lce_scale_f32"), grid_for(n), 256, op, static_cast<const float*>(dw.data()),
           sw.data(), n, s.data());
  dx = std::move(sx);
  dw = std::move(sw);
}

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::kernels
