// Batch-norm inference on the GPU (an NVRTC kernel): y = (x - mean[c]) * gamma[c] / sqrt(var[c]
// + eps) + beta[c], x and y in f32, bf16 or f16, the four [C] vectors in f32. x is [N, C] or
// [N, C, H, W] in any layout (NCHW, NHWC, row-major, or a strided view); y is contiguous in the
// layout the caller allocated. The scale of each channel is computed in f64 (as cpu/batch_norm.hpp
// does), the rest in f32, rounded once to T.
//
// Why a kernel and not cuDNN: cuDNN 9.19's graph API had no engine at all for its
// batchnorm_inference node on the H200, in any layout or dtype (2026-11-29), and the legacy
// cudnnBatchNormalizationForwardInference is deprecated (DESIGN.md, decision 1). An elementwise
// op per channel is simple enough to own.
#pragma once

#include "cutrain/core/abi.hpp"

#ifndef CUTRAIN_WITH_CUDA
#error "cutrain/cuda/ needs CUTRAIN_WITH_CUDA (link cutrain::cuda)"
#endif

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string_view>

#include "cutrain/cuda/gpu_float.hpp"
#include "cutrain/cuda/kernels/nvrtc.hpp"
#include "cutrain/cuda/kernels/programs.hpp"  // programs::batch_norm_inference, the kernels of batch_norm_inference.cuh

namespace cutrain::inline CUTRAIN_ABI::cuda::kernels {

namespace detail {
template <GpuFloat T>
const Program& batch_norm_inference_program() {
  static const Program p = programs::batch_norm_inference(device_type<T>);
  return p;
}

// A [N, C] or [N, C, H, W] tensor seen as [N, C, S] (S = H W): element (n, c, s) at
// n * n_stride + c * c_stride + s * s_stride.
struct NcsStrides {
  long long n, c, s;
};

// t's [N, C, S] strides; nothing when its h and w do not merge into one stride (a strided view).
template <class T>
std::optional<NcsStrides> ncs_strides(const Tensor<T>& t) {
  const auto& st = t.strides();
  if (t.rank() == 2) return NcsStrides{st[0], st[1], 1};
  const std::int64_t H = t.dim(2), W = t.dim(3);
  if (H == 1) return NcsStrides{st[0], st[1], st[3]};
  if (W == 1 || st[2] == W * st[3]) return NcsStrides{st[0], st[1], W == 1 ? st[2] : st[3]};
  return std::nullopt;
}

// The stride of row r = n S + s when (n, s) merge into one index; nothing otherwise.
inline std::optional<long long> bn_row_stride(long long N, long long S, const NcsStrides& v) {
  if (S == 1) return v.n;
  if (N == 1 || v.n == S * v.s) return v.s;
  return std::nullopt;
}

// Which kernel, its grid and its arguments; run(kernel, grid, block, args...) launches it. x is
// staged into y's layout when its strides fit neither kernel (a strided view whose h and w, or n
// and s, do not merge).
template <class T, class Run>
void batch_norm_inference_plan(const Tensor<T>& x, const Tensor<float>& gamma, const Tensor<float>& beta,
                               const Tensor<float>& mean, const Tensor<float>& var, double eps, Tensor<T>& y, Run&& run) {
  const long long N = x.dim(0), C = x.dim(1), S = x.numel() / std::max<long long>(N * C, 1);
  const std::optional<NcsStrides> yv = ncs_strides(y);
  CUTRAIN_REQUIRE(yv.has_value(), InvalidArgument, "cuda::kernels::batch_norm_inference",
                  "y must be contiguous, got ", y.describe());
  const std::optional<long long> y_rs = bn_row_stride(N, S, *yv);
  const bool rows = y.strides()[1] == 1 && y_rs.has_value();  // channels innermost in y: NHWC or [N, C]
  Tensor<T> xs = x.view();
  std::optional<NcsStrides> xv = ncs_strides(xs);
  if (!xv || (rows && !bn_row_stride(N, S, *xv))) {
    xs = x.contiguous(y.layout());
    xv = ncs_strides(xs);
  }
  // vec: VMAX (16 bytes of T) adjacent elements per thread when the run it walks (channels for
  // rows, the plane for planes) is dense in x and y, every other stride and the run's length are
  // multiples of VMAX and the data is 16-byte aligned; else 1.
  constexpr long long V = 16 / sizeof(T);
  const bool aligned = reinterpret_cast<std::uintptr_t>(xs.data()) % 16 == 0 &&
                       reinterpret_cast<std::uintptr_t>(y.data()) % 16 == 0;
  if (rows) {
    const long long R = N * S, x_rs = *bn_row_stride(N, S, *xv);
    const int vec = aligned && xv->c == 1 && yv->c == 1 && C % V == 0 && x_rs % V == 0 && *y_rs % V == 0 ? V : 1;
    // bx threads across channel packs (a power of two up to 32, so a warp spans whole rows when C
    // is small), 256 / bx across rows; about 4096 blocks, each thread stepping over its rows.
    const long long packs = C / vec;
    long long bx = 1;
    while (bx < 32 && bx < packs) bx *= 2;
    const long long by = 256 / bx, gx = (packs + bx - 1) / bx;
    const long long gy = std::clamp<long long>(std::min((R + by - 1) / by, 4096 / gx), 1, 65535);
    run(vec > 1 ? "cutrain_batch_norm_inference_rows_vec" : "cutrain_batch_norm_inference_rows",
        dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy)), dim3(static_cast<unsigned>(bx), static_cast<unsigned>(by)),
        xs.data(), y.data(), gamma.data(), beta.data(), mean.data(), var.data(), eps, R, C, x_rs, xv->c, *y_rs, yv->c);
  } else {
    const int vec = aligned && xv->s == 1 && yv->s == 1 && S % V == 0 && xv->n % V == 0 && xv->c % V == 0 &&
                            yv->n % V == 0 && yv->c % V == 0
                        ? V
                        : 1;
    // One block per (n, c) plane: threads cover S / vec, rounded up to a warp, at most 256.
    const unsigned threads = static_cast<unsigned>(std::clamp<long long>((S / vec + 31) / 32 * 32, 32, 256));
    const long long blocks = std::min<long long>(N * C, 16384);
    run(vec > 1 ? "cutrain_batch_norm_inference_planes_vec" : "cutrain_batch_norm_inference_planes",
        dim3(static_cast<unsigned>(blocks)), dim3(threads), xs.data(), y.data(), gamma.data(), beta.data(), mean.data(),
        var.data(), eps, N, C, S, xv->n, xv->c, xv->s, yv->n, yv->c, yv->s);
  }
}
}  // namespace detail

// y = (x - mean) * gamma / sqrt(var + eps) + beta per channel (dim 1). y: x's shape, contiguous
// (NCHW, NHWC or row-major), on x's device, allocated by the caller.
template <GpuFloat T>
void batch_norm_inference(const Tensor<T>& x, const Tensor<float>& gamma, const Tensor<float>& beta,
                          const Tensor<float>& mean, const Tensor<float>& var, double eps, Tensor<T>& y) {
  constexpr std::string_view op = "cuda::kernels::batch_norm_inference";
  detail::require_cuda_input(op, x, "x");
  CUTRAIN_REQUIRE((x.rank() == 2 || x.rank() == 4) && x.numel() > 0, InvalidArgument, op,
                  "x must be a non-empty [N,C] or [N,C,H,W], got ", x.describe());
  const Shape c{x.dim(1)};
  const Tensor<float>* vectors[] = {&gamma, &beta, &mean, &var};
  const char* names[] = {"gamma", "beta", "mean", "var"};
  for (int i = 0; i < 4; ++i) {
    detail::require_cuda_input(op, *vectors[i], names[i]);
    CUTRAIN_REQUIRE(vectors[i]->shape() == c, InvalidArgument, op, names[i], " must have shape ", c, ", got ",
                    vectors[i]->describe());
    CUTRAIN_REQUIRE(vectors[i]->device() == x.device(), DeviceError, op, names[i], " ", vectors[i]->describe(),
                    " and x ", x.describe(), " are on different devices");
  }
  detail::require_output(op, y, x.shape(), x.device(), "y");
  // The kernels index the [C] vectors densely: stage any strided one (C values, cheap).
  const Tensor<float> g = detail::staged(gamma, Layout::row_major), b = detail::staged(beta, Layout::row_major),
                      m = detail::staged(mean, Layout::row_major), v = detail::staged(var, Layout::row_major);
  const int dev = x.device().index;
  DeviceScope scope(dev);
  detail::batch_norm_inference_plan(x, g, b, m, v, eps, y, [dev, op](const char* kernel, dim3 grid, dim3 block,
                                                                     const auto&... args) {
    launch(function(dev, detail::batch_norm_inference_program<T>(), kernel), grid, block, op, args...);
  });
}

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::kernels
