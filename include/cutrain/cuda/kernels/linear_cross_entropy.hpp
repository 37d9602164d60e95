// The fused classifier on the GPU: loss = cross_entropy(x w^T, labels) and, when asked, dx and dw
// for an upstream gradient of 1, a chunk of rows at a time. Per chunk: the logits by cuBLASLt in
// T against the weight padded to a multiple of pad_to rows (every matmul dimension aligned; the
// pad's logits are never read), one kernel that writes each row's loss and its gradient over the
// logits, then dx's rows and the chunk's dw by cuBLASLt from that gradient. No f32 copy of the logits, no second buffer of
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
#include "cutrain/core/storage.hpp"
#include "cutrain/cpu/linear_cross_entropy.hpp"  // LinearCrossEntropyResult, classifier_chunk_rows
#include "cutrain/cuda/api.hpp"  // the declarations, with the default arguments
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

// One chunk's loss and gradient: logits rows [n] of ld elements (the first V are classes) at
// logits; labels and row_loss for the same rows. grads: write the gradient over the logits.
template <GpuFloat T>
void classifier_rows(T* logits, std::int64_t n, std::int64_t ld, std::int64_t V, const std::int32_t* labels,
                     const LinearCrossEntropyParams& p, float* row_loss, bool grads, const std::int32_t* count, int device) {
  const unsigned threads = V <= 32 ? 32 : V <= 256 ? 128 : 512;
  const int vec = vec_packs<T>(ld, logits) > 0 ? 1 : 0;
  launch(function(device, detail::linear_cross_entropy_program<T>(), "cutrain_lce_rows"), static_cast<unsigned>(n),
         threads, "linear_cross_entropy", logits, static_cast<long long>(ld), labels, static_cast<long long>(V),
         static_cast<float>(p.label_smoothing), static_cast<int>(p.ignore_index), row_loss, grads ? 1 : 0, count,
         p.reduction == Reduction::mean ? 1 : 0, vec);
}

// x [N, C] and w [V, C] in T, labels [N] on one CUDA device (checked by ops/: labels in [0, V) or
// ignore_index; here a bad one gives NaN). Launches on current_stream(). Where V is not a
// multiple of pad_to, the matmuls run on a copy of w padded with zero rows to ld (a multiple of
// pad_to): every dimension aligned, as the fastest kernels want. The pad's logits are 0 and never
// read; their gradient stays 0, so dx is exact, and dw is the padded result's first V rows.
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

  LinearCrossEntropyResult<T> r{Tensor<float>(Shape{}, {.device = dev}), {}, {}};
  const Tensor<std::int32_t> ls = detail::staged(labels, Layout::row_major);
  Tensor<std::int32_t> count(Shape{1}, {.device = dev});
  Tensor<float> row_loss(Shape{std::max<std::int64_t>(N, 1)}, {.device = dev});
  launch(function(d, prog, "cutrain_lce_count"), 1, 256, op, ls.data(), static_cast<long long>(N),
         static_cast<int>(p.ignore_index), count.data());
  const Tensor<T> xs = cublas::detail::readable(x);
  Tensor<T> wp;  // w, or w in the first V of ld zero-padded rows
  if (ld == V) {
    wp = cublas::detail::readable(w);
  } else {
    wp = Tensor<T>(Shape{ld, C}, {.device = dev});
    wp.slice(0, 0, V).copy_from(w);
    zero_bytes(wp.data() + V * C, dev, static_cast<std::size_t>((ld - V) * C) * sizeof(T));
  }
  // dw over the padded rows: straight into the result when it is f32 and there is one chunk, else
  // per chunk in T, added up in f32.
  const bool dw_direct = std::is_same_v<T, float> && chunk >= N;
  Tensor<T> dw_chunk;
  if (grads) {
    r.dx = Tensor<T>(Shape{N, C}, {.device = dev});
    if (dw_direct) {
      if constexpr (std::is_same_v<T, float>) {
        dw_chunk = Tensor<float>(Shape{ld, C}, {.device = dev});
        r.dw = dw_chunk.slice(0, 0, V);
      }
    } else {
      dw_chunk = Tensor<T>(Shape{ld, C}, {.device = dev});
      r.dw = Tensor<float>(Shape{V, C}, {.device = dev});
    }
  }
  Tensor<T> buf(Shape{std::min(chunk, N), ld}, {.device = dev}), no_bias;
  for (std::int64_t r0 = 0; r0 < N; r0 += chunk) {
    const std::int64_t n = std::min(chunk, N - r0);
    const Tensor<T> xc = xs.slice(0, r0, r0 + n);
    Tensor<T> logits = buf.slice(0, 0, n);  // [n, ld]
    cublas::linear_forward(xc, wp, no_bias, Activation::identity, logits, op);
    classifier_rows(buf.data(), n, ld, V, ls.data() + r0, p, row_loss.data() + r0, grads, count.data(), d);
    if (!grads) continue;
    Tensor<T> dxc = r.dx.slice(0, r0, r0 + n);
    cublas::linear_backward(xc, wp, logits, false, dxc, dw_chunk, no_bias, op);
    if (dw_direct) continue;
    const long long m = static_cast<long long>(V * C);
    launch(function(d, prog, "cutrain_lce_accumulate"), grid_for(m), 256, op, static_cast<const T*>(dw_chunk.data()),
           r.dw.data(), m, r0 == 0 ? 1 : 0);
  }
  launch(function(d, prog, "cutrain_lce_reduce"), 1, 256, op, static_cast<const float*>(row_loss.data()),
         static_cast<long long>(N), static_cast<const int*>(count.data()), p.reduction == Reduction::mean ? 1 : 0,
         r.loss.data());
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
