// Linear layers on cuBLASLt, with the CPU backend's semantics (cpu/linear.hpp):
//   forward   y  = act(x w^T + b), the bias and the activation fused into the matmul as a
//             cuBLASLt epilogue (BIAS, RELU_BIAS, GELU_BIAS, or RELU / GELU without a bias);
//   backward  dx = dy w, and dw = dy^T x with db = sum_n dy coming out of the same matmul
//             through the BGRADB epilogue.
// x [N, in], w [out, in], bias [out], y and dy [N, out], all row-major (rows may be padded: any
// row stride >= the row length works, so column slices need no copy).
//
// Each matmul's spec, plan and launch are in matmul_desc.hpp; its algorithm (the heuristic's or
// the autotuner's) and the per-thread plan cache in algo.hpp.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <numbers>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "cutrain/core/check.hpp"
#include "cutrain/core/params/activation.hpp"
#include "cutrain/core/tensor.hpp"
#include "cutrain/cuda/api.hpp"  // the declarations, with the default arguments
#include "cutrain/cuda/cublas/algo.hpp"
#include "cutrain/cuda/cublas/matmul_desc.hpp"
#include "cutrain/cuda/gpu_float.hpp"
#include "cutrain/cuda/runtime.hpp"

namespace cutrain::inline CUTRAIN_ABI::cuda::cublas {

namespace detail {

// A device vector of n ones in T for `device`, kept per thread (grows, then is reused). Only the
// bias gradient fallback needs it.
template <class T>
const T* ones(int device, std::int64_t n, std::string_view op) {
  thread_local std::unordered_map<int, Storage> per_device;
  Storage& s = per_device[device];
  const auto bytes = static_cast<std::size_t>(n) * sizeof(T);
  if (s.bytes() < bytes) {
    cuda::check(cudaStreamSynchronize(current_stream()), op, "cudaStreamSynchronize");  // the old one may be in use
    s = Storage(0, Device::cuda(device));
    s = Storage(bytes, Device::cuda(device));
    const std::vector<T> host(static_cast<std::size_t>(n), T(1.0f));
    cuda::check(cudaMemcpyAsync(s.data(), host.data(), bytes, cudaMemcpyHostToDevice, current_stream()), op,
                "cudaMemcpyAsync of ones");
    cuda::check(cudaStreamSynchronize(current_stream()), op, "cudaStreamSynchronize");  // host buffer goes away
  }
  return static_cast<const T*>(s.data());
}

// Zeroes `rows` rows of `cols` elements, `ld` elements apart, on the thread's stream.
template <class T>
void zero_rows(T* p, std::int64_t rows, std::int64_t cols, std::int64_t ld, std::string_view op) {
  if (rows <= 0 || cols <= 0) return;
  cuda::check(cudaMemset2DAsync(p, static_cast<std::size_t>(ld) * sizeof(T), 0, static_cast<std::size_t>(cols) * sizeof(T),
                                static_cast<std::size_t>(rows), current_stream()),
              op, "cudaMemset2DAsync");
}

// Counts backward passes whose bias gradient could not come from the BGRADB epilogue (and came
// from a second matmul against a vector of ones instead); the GPU tests print it.
inline std::int64_t& bgrad_fallbacks() {
  thread_local std::int64_t n = 0;
  return n;
}

inline float host_activation(float v, Activation a) {
  switch (a) {
    case Activation::relu: return v > 0.0f ? v : 0.0f;
    case Activation::gelu_tanh: {
      const float k = std::sqrt(2.0f / std::numbers::pi_v<float>);
      return 0.5f * v * (1.0f + std::tanh(k * (v + 0.044715f * v * v * v)));
    }
    default: return v;
  }
}

// db [out] = sum_n dy[n, :] as the matmul db (out x 1) = dy^T (out x N, column-major view of
// row-major dy) times ones (N x 1).
template <class T>
void bias_grad_by_matmul(const Tensor<T>& dy, std::int64_t ld_dy, Tensor<T>& db, int device, std::string_view op) {
  const std::int64_t N = dy.dim(0), out = dy.dim(1);
  const T* one = ones<T>(device, N, op);
  MatmulSpec s = spec_for<T>("bgrad", CUBLASLT_EPILOGUE_DEFAULT);
  s.transa = CUBLAS_OP_N;
  s.transb = CUBLAS_OP_N;
  s.m = static_cast<std::uint64_t>(out);
  s.n = 1;
  s.k = static_cast<std::uint64_t>(N);
  s.lda = ld_dy;
  s.ldb = N;
  s.ldd = out;
  s.align_a = alignment(dy.data());
  s.align_b = alignment(one);
  s.align_d = alignment(db.data());
  MatmulPlan& p = cached_plan(device, s, nullptr, op);
  CUTRAIN_REQUIRE(p.found, NotImplemented, op, "cuBLASLt offers no algorithm for the bias gradient ", s.describe(),
                  " of dy ", dy.describe());
  run(p, s, device, dy.data(), one, db.data(), nullptr, op);
}

// The forward matmul, y [N, out] = x w^T (+ the epilogue), for readable w, x and y. Row-major to
// column-major: cuBLASLt sees row-major y [N, out] as y^T (out x N), and y^T = w x^T. Row-major
// w [out, in] is, column-major, the in x out matrix w^T, so op(A) = T gives w (out x in);
// row-major x [N, in] is the in x N matrix x^T, taken as is (op(B) = N). So m = out, n = N,
// k = in. The bias epilogues add a vector of D's row count (m = out) to every column (every
// sample): exactly b[o] added to y[n, o].
template <class T>
MatmulSpec fprop_spec(const Tensor<T>& ws, const Tensor<T>& xs, const Tensor<T>& y, cublasLtEpilogue_t epilogue) {
  MatmulSpec s = spec_for<T>("fprop", epilogue);
  s.transa = CUBLAS_OP_T;
  s.transb = CUBLAS_OP_N;
  s.m = static_cast<std::uint64_t>(ws.dim(0));
  s.n = static_cast<std::uint64_t>(xs.dim(0));
  s.k = static_cast<std::uint64_t>(ws.dim(1));
  s.lda = row_stride(ws);
  s.ldb = row_stride(xs);
  s.ldd = row_stride(y);
  s.align_a = alignment(ws.data());
  s.align_b = alignment(xs.data());
  s.align_d = alignment(y.data());
  return s;
}

// The input-gradient matmul, dx [N, in] = dy w (+ the epilogue), for readable w and dy: row-major
// dx [N, in] is, column-major, dx^T (in x N) = w^T dy^T. Row-major w [out, in] is the in x out
// matrix w^T as stored (op(A) = N), row-major dy [N, out] the out x N matrix dy^T (op(B) = N):
// m = in, n = N, k = out.
template <class T>
MatmulSpec dgrad_spec(const Tensor<T>& ws, const Tensor<T>& dys, const Tensor<T>& dx, cublasLtEpilogue_t epilogue) {
  MatmulSpec s = spec_for<T>("dgrad", epilogue);
  s.transa = CUBLAS_OP_N;
  s.transb = CUBLAS_OP_N;
  s.m = static_cast<std::uint64_t>(ws.dim(1));
  s.n = static_cast<std::uint64_t>(dys.dim(0));
  s.k = static_cast<std::uint64_t>(ws.dim(0));
  s.lda = row_stride(ws);
  s.ldb = row_stride(dys);
  s.ldd = row_stride(dx);
  s.align_a = alignment(ws.data());
  s.align_b = alignment(dys.data());
  s.align_d = alignment(dx.data());
  return s;
}

}  // namespace detail

// y = act(x w^T + bias [+ residual]) with the bias (when defined) and act fused into the matmul's
// epilogue, and the residual (when given: [N, out] with packed rows, not y) read as cuBLASLt's C
// operand with beta 1. act: identity, relu or gelu_tanh (cuBLASLt's GELU epilogue is the tanh
// approximation); any other activation, or a combination cuBLASLt has no algorithm for, throws
// NotImplemented that names it (the epilogue is never dropped silently). y [N, out] is written on
// current_stream().
template <GpuFloat T>
void linear_forward(const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>& bias, Activation act, Tensor<T>& y,
                    std::string_view op, const Tensor<T>* residual) {
  using namespace detail;
  cutrain::check::rank(op, x, 2, "x");
  cutrain::check::rank(op, w, 2, "w");
  CUTRAIN_REQUIRE(x.dim(1) == w.dim(1), InvalidArgument, op, "x ", x.describe(), " has ", x.dim(1),
                  " features but w ", w.describe(), " expects ", w.dim(1), " (x [N, in], w [out, in], bias [out])");
  const std::int64_t N = x.dim(0), in = x.dim(1), out = w.dim(0);
  const bool has_bias = bias.defined();
  if (has_bias) cutrain::check::shape(op, bias, Shape{out}, "bias");
  cutrain::check::shape(op, y, Shape{N, out}, "y");
  const Device dev = has_bias ? cutrain::check::same_device(op, x, w, bias, y) : cutrain::check::same_device(op, x, w, y);
  if (residual) {
    cutrain::check::shape(op, *residual, Shape{N, out}, "residual");
    cutrain::check::same_device(op, *residual, y);
    CUTRAIN_REQUIRE(row_stride(*residual) > 0 && residual->data() != y.data(), InvalidArgument, op, "residual ",
                    residual->describe(), " must have packed rows and must not be y");
  }
  CUTRAIN_REQUIRE(dev.is_cuda(), DeviceError, op, "cuda::cublas needs CUDA tensors, got x ", x.describe());
  CUTRAIN_REQUIRE(row_stride(y) > 0, InvalidArgument, op, "y ", y.describe(),
                  " must have packed rows (column stride 1, row stride >= ", out, ")");

  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  switch (act) {
    case Activation::identity: epilogue = has_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT; break;
    case Activation::relu: epilogue = has_bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU; break;
    case Activation::gelu_tanh: epilogue = has_bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU; break;
    default:
      throw NotImplemented(op, cat("linear + ", has_bias ? "bias + " : "", act, " in ", dtype_of<T>,
                                   ": cuBLASLt fuses only identity, relu and gelu_tanh epilogues (run linear_forward, "
                                   "then activation_forward)"));
  }
  if (N == 0 || out == 0) return;
  cutrain::detail::DeviceGuard guard(dev.index);
  CUTRAIN_REQUIRE(!residual || in > 0, InvalidArgument, op, "a residual needs x with features, got ", x.describe());

  if (in == 0) {
    // Nothing to multiply (cuBLASLt wants k >= 1): every row is act(bias), or act(0) = 0.
    std::vector<float> row(static_cast<std::size_t>(out), 0.0f);
    if (has_bias) {
      cuda::synchronize(op);  // bias may still be being written on this stream
      const auto b = bias.to_vector();
      for (std::size_t o = 0; o < row.size(); ++o) row[o] = host_activation(static_cast<float>(b[o]), act);
    }
    std::vector<T> host(static_cast<std::size_t>(N * out));
    for (std::size_t i = 0; i < host.size(); ++i) host[i] = T(row[i % row.size()]);
    const auto width = static_cast<std::size_t>(out) * sizeof(T);
    cuda::check(cudaMemcpy2DAsync(y.data(), static_cast<std::size_t>(row_stride(y)) * sizeof(T), host.data(), width,
                                  width, static_cast<std::size_t>(N), cudaMemcpyHostToDevice, current_stream()),
                op, "cudaMemcpy2DAsync");
    cuda::synchronize(op);  // the host buffer goes away
    return;
  }

  const Tensor<T> xs = readable(x), ws = readable(w);
  const Tensor<T> bs = has_bias ? readable(bias) : Tensor<T>{};
  MatmulSpec s = fprop_spec(ws, xs, y, epilogue);
  if (has_bias) s.align_bias = alignment(bs.data());
  if (residual) {  // C: column-major out x N, as D
    s.ldc = row_stride(*residual);
    s.align_c = alignment(residual->data());
  }
  MatmulPlan& p = cached_plan(dev.index, s, has_bias ? bs.data() : nullptr, op);
  if (!p.found)
    throw NotImplemented(op, cat("cuBLASLt has no algorithm for linear + ", has_bias ? "bias + " : "",
                                 residual ? "residual + " : "", act, " (", s.describe(), ") with x ", x.describe(),
                                 ", w ", w.describe()));
  run(p, s, dev.index, ws.data(), xs.data(), y.data(), has_bias ? bs.data() : nullptr, op, 1.0f, residual ? 1.0f : 0.0f,
      residual ? residual->data() : nullptr);
}

// dx = dy w, dw = dy^T x and, when has_bias, db = sum over the batch of dy, on current_stream().
// dx [N, in], dw [out, in] and db [out] (defined when has_bias) are preallocated by the caller;
// an undefined dx skips its matmul (linear_dgrad_gelu computes it instead).
// db comes out of dw's matmul (BGRADB epilogue); where cuBLASLt has no such algorithm for the
// shapes and dtype, a second matmul (dy^T times a vector of ones) computes it.
template <GpuFloat T>
void linear_backward(const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>& dy, bool has_bias, Tensor<T>& dx,
                     Tensor<T>& dw, Tensor<T>& db, std::string_view op) {
  using namespace detail;
  cutrain::check::rank(op, x, 2, "x");
  cutrain::check::rank(op, w, 2, "w");
  CUTRAIN_REQUIRE(x.dim(1) == w.dim(1), InvalidArgument, op, "x ", x.describe(), " has ", x.dim(1),
                  " features but w ", w.describe(), " expects ", w.dim(1), " (x [N, in], w [out, in], bias [out])");
  const std::int64_t N = x.dim(0), in = x.dim(1), out = w.dim(0);
  cutrain::check::shape(op, dy, Shape{N, out}, "dy");
  const bool want_dx = dx.defined();
  if (want_dx) {
    cutrain::check::shape(op, dx, Shape{N, in}, "dx");
    cutrain::check::same_device(op, dx, dy);
    CUTRAIN_REQUIRE(row_stride(dx) > 0, InvalidArgument, op, "dx ", dx.describe(), " must have packed rows");
  }
  cutrain::check::shape(op, dw, Shape{out, in}, "dw");
  if (has_bias) cutrain::check::shape(op, db, Shape{out}, "db");
  const Device dev = has_bias ? cutrain::check::same_device(op, x, w, dy, dw, db)
                              : cutrain::check::same_device(op, x, w, dy, dw);
  CUTRAIN_REQUIRE(dev.is_cuda(), DeviceError, op, "cuda::cublas needs CUDA tensors, got x ", x.describe());
  CUTRAIN_REQUIRE(row_stride(dw) > 0, InvalidArgument, op, "dw ", dw.describe(), " must have packed rows");
  CUTRAIN_REQUIRE(!has_bias || out <= 1 || db.strides()[0] == 1, InvalidArgument, op, "db ", db.describe(),
                  " must be packed (stride 1)");
  cutrain::detail::DeviceGuard guard(dev.index);

  if (out == 0) {  // dy is empty: dx = 0; dw and db have no elements
    if (want_dx) zero_rows(dx.data(), N, in, row_stride(dx), op);
    return;
  }
  if (N == 0) {  // an empty batch: dw = 0, db = 0; dx has no elements
    zero_rows(dw.data(), out, in, row_stride(dw), op);
    if (has_bias) zero_rows(db.data(), 1, out, out, op);
    return;
  }
  const Tensor<T> dys = readable(dy);
  if (in == 0) {  // no features: dx and dw have no elements, db is still sum_n dy
    if (has_bias) bias_grad_by_matmul(dys, row_stride(dys), db, dev.index, op);
    return;
  }
  const Tensor<T> xs = readable(x), ws = readable(w);

  if (want_dx) {
    const MatmulSpec s = dgrad_spec(ws, dys, dx, CUBLASLT_EPILOGUE_DEFAULT);
    MatmulPlan& p = cached_plan(dev.index, s, nullptr, op);
    CUTRAIN_REQUIRE(p.found, NotImplemented, op, "cuBLASLt has no algorithm for ", s.describe(), " with dy ",
                    dy.describe(), ", w ", w.describe());
    run(p, s, dev.index, ws.data(), dys.data(), dx.data(), nullptr, op);
  }

  // dw: row-major dw [out, in] is, column-major, dw^T (in x out) = x^T dy. Row-major x [N, in]
  // is the in x N matrix x^T as stored (op(A) = N); row-major dy [N, out] is stored as the
  // out x N matrix dy^T, so op(B) = T gives dy (N x out): m = in, n = out, k = N.
  // The bias gradient sums dy over the batch, i.e. over k, and is indexed by out, i.e. by D's
  // columns: that is BGRADB (reduce op(B) over k, one value per column of D). BGRADA would
  // reduce op(A) = x^T over k and give sum_n x, one value per feature of the input: wrong here.
  MatmulSpec s = spec_for<T>("wgrad", has_bias ? CUBLASLT_EPILOGUE_BGRADB : CUBLASLT_EPILOGUE_DEFAULT);
  s.transa = CUBLAS_OP_N;
  s.transb = CUBLAS_OP_T;
  s.m = static_cast<std::uint64_t>(in);
  s.n = static_cast<std::uint64_t>(out);
  s.k = static_cast<std::uint64_t>(N);
  s.lda = row_stride(xs);
  s.ldb = row_stride(dys);
  s.ldd = row_stride(dw);
  s.align_a = alignment(xs.data());
  s.align_b = alignment(dys.data());
  s.align_d = alignment(dw.data());
  if (has_bias) s.align_bias = alignment(db.data());
  MatmulPlan* p = &cached_plan(dev.index, s, has_bias ? db.data() : nullptr, op);
  bool bias_done = has_bias;
  if (!p->found && has_bias) {
    // No fused BGRADB algorithm for these shapes/dtype: dw without an epilogue, db by its own matmul.
    s.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    s.align_bias = 256;
    p = &cached_plan(dev.index, s, nullptr, op);
    bias_done = false;
    ++bgrad_fallbacks();
  }
  CUTRAIN_REQUIRE(p->found, NotImplemented, op, "cuBLASLt has no algorithm for ", s.describe(), " with x ",
                  x.describe(), ", dy ", dy.describe());
  run(*p, s, dev.index, xs.data(), dys.data(), dw.data(), bias_done ? db.data() : nullptr, op);
  if (has_bias && !bias_done) bias_grad_by_matmul(dys, row_stride(dys), db, dev.index, op);
}

// GELU (tanh) with its input kept, for training: z = x w^T + bias and y = gelu_tanh(z), both
// [N, out] with packed rows, from one matmul (the GELU_AUX_BIAS epilogue writes z beside y).
// Returns false, having written nothing, where cuBLASLt has no such algorithm for the shapes and
// dtype (or z's layout does not suit it: its row stride must be a multiple of 8); the caller then
// runs linear_forward and the activation.
template <GpuFloat T>
bool linear_gelu_forward(const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>& bias, Tensor<T>& y, Tensor<T>& z,
                         std::string_view op) {
  using namespace detail;
  cutrain::check::rank(op, x, 2, "x");
  cutrain::check::rank(op, w, 2, "w");
  CUTRAIN_REQUIRE(x.dim(1) == w.dim(1), InvalidArgument, op, "x ", x.describe(), " has ", x.dim(1),
                  " features but w ", w.describe(), " expects ", w.dim(1), " (x [N, in], w [out, in], bias [out])");
  const std::int64_t N = x.dim(0), in = x.dim(1), out = w.dim(0);
  const bool has_bias = bias.defined();
  if (has_bias) cutrain::check::shape(op, bias, Shape{out}, "bias");
  cutrain::check::shape(op, y, Shape{N, out}, "y");
  cutrain::check::shape(op, z, Shape{N, out}, "z");
  const Device dev = cutrain::check::same_device(op, x, w, y, z);
  if (has_bias) cutrain::check::same_device(op, bias, y);
  CUTRAIN_REQUIRE(dev.is_cuda(), DeviceError, op, "cuda::cublas needs CUDA tensors, got x ", x.describe());
  CUTRAIN_REQUIRE(row_stride(y) > 0 && row_stride(z) > 0 && y.data() != z.data(), InvalidArgument, op, "y ",
                  y.describe(), " and z ", z.describe(), " must be two tensors with packed rows");
  if (N == 0 || out == 0 || in == 0 || row_stride(z) % 8 != 0) return N == 0 || out == 0;
  cutrain::detail::DeviceGuard guard(dev.index);
  const Tensor<T> xs = readable(x), ws = readable(w);
  const Tensor<T> bs = has_bias ? readable(bias) : Tensor<T>{};
  // z is D's shape (out x N, column-major).
  MatmulSpec s = fprop_spec(ws, xs, y, has_bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX);
  s.ld_aux = row_stride(z);
  s.align_aux = alignment(z.data());
  if (has_bias) s.align_bias = alignment(bs.data());
  MatmulPlan& p = cached_plan(dev.index, s, has_bias ? bs.data() : nullptr, op);
  if (!p.found) return false;
  run(p, s, dev.index, ws.data(), xs.data(), y.data(), has_bias ? bs.data() : nullptr, op, 1.0f, 0.0f, nullptr,
      z.data());
  return true;
}

// dz = gelu_tanh'(z) * (dy w): the input gradient of a linear layer whose input was gelu_tanh(z),
// taken through the GELU on the way (the DGELU epilogue reads z). w [out, in], dy [N, out], z and
// dz [N, in] with packed rows. Returns false, having written nothing, where cuBLASLt has no such
// algorithm (or z's row stride is not a multiple of 8); the caller then runs the matmul and the
// activation's backward.
template <GpuFloat T>
bool linear_dgrad_gelu(const Tensor<T>& w, const Tensor<T>& dy, const Tensor<T>& z, Tensor<T>& dz, std::string_view op) {
  using namespace detail;
  cutrain::check::rank(op, w, 2, "w");
  cutrain::check::rank(op, dy, 2, "dy");
  const std::int64_t N = dy.dim(0), in = w.dim(1), out = w.dim(0);
  cutrain::check::shape(op, dy, Shape{N, out}, "dy");
  cutrain::check::shape(op, z, Shape{N, in}, "z");
  cutrain::check::shape(op, dz, Shape{N, in}, "dz");
  const Device dev = cutrain::check::same_device(op, w, dy, z, dz);
  CUTRAIN_REQUIRE(dev.is_cuda(), DeviceError, op, "cuda::cublas needs CUDA tensors, got dy ", dy.describe());
  CUTRAIN_REQUIRE(row_stride(dz) > 0 && row_stride(z) > 0 && dz.data() != z.data(), InvalidArgument, op, "z ",
                  z.describe(), " and dz ", dz.describe(), " must be two tensors with packed rows");
  if (N == 0 || in == 0 || out == 0 || row_stride(z) % 8 != 0) return N == 0 || in == 0;
  cutrain::detail::DeviceGuard guard(dev.index);
  const Tensor<T> ws = readable(w), dys = readable(dy);
  // z is D's shape (in x N, column-major).
  MatmulSpec s = dgrad_spec(ws, dys, dz, CUBLASLT_EPILOGUE_DGELU);
  s.ld_aux = row_stride(z);
  s.align_aux = alignment(z.data());
  MatmulPlan& p = cached_plan(dev.index, s, nullptr, op);
  if (!p.found) return false;
  run(p, s, dev.index, ws.data(), dys.data(), dz.data(), nullptr, op, 1.0f, 0.0f, nullptr, z.data());
  return true;
}

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::cublas
