// One cuBLASLt matmul as cutrain describes it to cuBLASLt: the element and compute types, the
// status check, the row-major to column-major mapping of a tensor (row_stride, readable), the
// MatmulSpec that names a matmul (op, dims, leading dimensions, dtype, compute type, epilogue,
// pointer alignments; spec_for), and the MatmulPlan that holds its descriptors, layouts,
// preference and the heuristic's first algorithm (make_plan), launched by run(). Tuning and
// caching the algorithm are in algo.hpp; the linear ops on top of them in linear.hpp.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "cutrain/core/check.hpp"
#include "cutrain/core/tensor.hpp"
#include "cutrain/cuda/gpu_float.hpp"
#include "cutrain/cuda/math_options.hpp"
#include "cutrain/cuda/runtime.hpp"

namespace cutrain::inline CUTRAIN_ABI::cuda::cublas {

namespace detail {

using cutrain::detail::cat;

// The most scratch memory a matmul may ask for; the arena only hands out what the chosen
// algorithm needs.
inline constexpr std::uint64_t max_workspace_bytes = 32ull << 20;

template <class T> struct lt_type;
template <> struct lt_type<float> { static constexpr cudaDataType_t value = CUDA_R_32F; };
template <> struct lt_type<half> { static constexpr cudaDataType_t value = CUDA_R_16F; };
template <> struct lt_type<bfloat16> { static constexpr cudaDataType_t value = CUDA_R_16BF; };

inline void lt_check(cublasStatus_t st, std::string_view op, std::string_view what) {
  if (st != CUBLAS_STATUS_SUCCESS)
    throw CublasError(op, cat(what, " failed: ", cublasLtGetStatusString(st), " (status ", static_cast<int>(st), ")"));
}

inline std::string_view epilogue_name(cublasLtEpilogue_t e) {
  switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT: return "DEFAULT";
    case CUBLASLT_EPILOGUE_BIAS: return "BIAS";
    case CUBLASLT_EPILOGUE_RELU: return "RELU";
    case CUBLASLT_EPILOGUE_RELU_BIAS: return "RELU_BIAS";
    case CUBLASLT_EPILOGUE_GELU: return "GELU";
    case CUBLASLT_EPILOGUE_GELU_BIAS: return "GELU_BIAS";
    case CUBLASLT_EPILOGUE_BGRADA: return "BGRADA";
    case CUBLASLT_EPILOGUE_BGRADB: return "BGRADB";
    case CUBLASLT_EPILOGUE_GELU_AUX: return "GELU_AUX";
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: return "GELU_AUX_BIAS";
    case CUBLASLT_EPILOGUE_DGELU: return "DGELU";
    default: return "other";
  }
}

inline std::string_view compute_name(cublasComputeType_t c) {
  switch (c) {
    case CUBLAS_COMPUTE_32F: return "32F";
    case CUBLAS_COMPUTE_32F_FAST_TF32: return "32F_FAST_TF32";
    default: return "other";
  }
}

inline bool epilogue_reads_bias_pointer(cublasLtEpilogue_t e) {
  return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_RELU_BIAS || e == CUBLASLT_EPILOGUE_GELU_BIAS ||
         e == CUBLASLT_EPILOGUE_BGRADA || e == CUBLASLT_EPILOGUE_BGRADB || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}

// The GELU epilogues with an auxiliary matrix: GELU_AUX(_BIAS) writes GELU's input there, DGELU
// reads it back.
inline bool epilogue_uses_aux(cublasLtEpilogue_t e) {
  return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || e == CUBLASLT_EPILOGUE_DGELU;
}

template <class T>
cublasComputeType_t compute_type() {
  if constexpr (std::same_as<T, float>)
    return math_options().allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  else
    return CUBLAS_COMPUTE_32F;
}

// The largest power of two (up to 256) that divides the address. cuBLASLt assumes 256-byte
// aligned operands unless told otherwise; a view that starts mid-allocation (a column slice) is
// less aligned, and the heuristic must only offer algorithms that cope with it.
inline std::uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  if (a == 0) return 256;
  return static_cast<std::uint32_t>(std::min<std::uintptr_t>(a & (~a + 1), 256));
}

// Row-major to column-major: a row-major [r, c] matrix whose rows are packed (column stride 1)
// and start `s` elements apart is, for cuBLASLt, the column-major c x r matrix (its transpose)
// with leading dimension s. Returns that s, or 0 when the tensor is not laid out that way.
template <class T>
std::int64_t row_stride(const Tensor<T>& t) {
  const std::int64_t r = t.dim(0), c = t.dim(1);
  const auto& s = t.strides();
  const std::int64_t packed = std::max<std::int64_t>(c, 1);
  if (t.numel() == 0) return packed;  // nothing is read or written
  if (c > 1 && s[1] != 1) return 0;
  if (r <= 1) return packed;
  return s[0] >= packed ? s[0] : 0;
}

// An input as cuBLASLt can read it: a view when its rows are packed, else a row-major copy.
template <class T>
Tensor<T> readable(const Tensor<T>& t) {
  if (t.rank() == 2 ? row_stride(t) > 0 : (t.dim(0) <= 1 || t.strides()[0] == 1)) return t.view();
  return t.contiguous(Layout::row_major);
}

// One cublasLtMatmul: D (m x n, column-major) = alpha op(A) (m x k) op(B) (k x n) + beta C, with
// an epilogue; `batch` such products at once when batch > 1 (strided batched: matrix i of A
// starts stride_a elements after matrix i - 1, a stride of 0 reuses one matrix for every i).
// ldc == 0: no C operand of its own (beta is 0 and C is D's layout); else C is read with
// leading dimension ldc and batch stride stride_c (the GEMM form, ops/matmul.hpp).
struct MatmulSpec {
  std::string_view what;  // fprop, dgrad, wgrad, bgrad: for the key and the messages
  cublasOperation_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N;
  std::uint64_t m = 0, n = 0, k = 0;
  std::int64_t lda = 0, ldb = 0, ldd = 0;
  cudaDataType_t type = CUDA_R_32F;
  DType dtype = DType::f32;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  std::uint32_t align_a = 256, align_b = 256, align_d = 256, align_bias = 256;
  std::int32_t batch = 1;
  std::int64_t stride_a = 0, stride_b = 0, stride_d = 0;
  std::int64_t ldc = 0, stride_c = 0;
  std::uint32_t align_c = 256;
  std::int64_t ld_aux = 0;  // the GELU epilogues' auxiliary matrix (m x n, column-major), else 0
  std::uint32_t align_aux = 256;

  bool has_c() const { return ldc != 0; }
  // The batch and C fields appear only when used, so that a single matmul without C (linear's)
  // keeps the signature, and the autotune cache key, it had before they existed.
  std::string signature() const {
    return cat(what, " ", transa == CUBLAS_OP_T ? 'T' : 'N', transb == CUBLAS_OP_T ? 'T' : 'N', " m", m, " n", n, " k",
               k, " ld", lda, ",", ldb, ",", ldd, " ", dtype, " compute ", compute_name(compute), " ",
               epilogue_name(epilogue), " align", align_a, ",", align_b, ",", align_d, ",", align_bias, extras());
  }
  std::string extras() const {
    std::string e;
    if (batch != 1) e += cat(" batch", batch, " stride", stride_a, ",", stride_b, ",", stride_d);
    if (has_c()) e += cat(" C ld", ldc, " stride", stride_c, " align", align_c);
    if (ld_aux != 0) e += cat(" aux ld", ld_aux, " align", align_aux);
    return e;
  }
  std::string key(int device) const { return cat(device, "|", signature()); }
  std::string describe() const {
    return cat(what, " matmul (m=", m, " n=", n, " k=", k, ", op(A)=", transa == CUBLAS_OP_T ? 'T' : 'N',
               " op(B)=", transb == CUBLAS_OP_T ? 'T' : 'N', ", ld ", lda, "/", ldb, "/", ldd, ", ", dtype,
               ", compute ", compute_name(compute), ", epilogue ", epilogue_name(epilogue), ", alignments ", align_a,
               "/", align_b, "/", align_d, extras(), ")");
  }
};

// Descriptors, layouts, preference and the heuristic's algorithm for one MatmulSpec. `found` is
// false when the heuristic offered no algorithm (kept, so that asking again costs nothing).
struct MatmulPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatrixLayout_t c = nullptr;  // only when the spec has a C of its own; else C is d
  cublasLtMatmulPreference_t pref = nullptr;
  cublasLtMatmulHeuristicResult_t heuristic{};
  bool found = false;

  MatmulPlan() = default;
  MatmulPlan(const MatmulPlan&) = delete;
  MatmulPlan& operator=(const MatmulPlan&) = delete;
  ~MatmulPlan() {  // destructors never throw: the statuses have nowhere to go
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
  cublasLtMatrixLayout_t c_layout() const { return c ? c : d; }
};

template <class V>
void set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const V& v, std::string_view op,
              const char* name) {
  lt_check(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof(v)), op, cat("cublasLtMatmulDescSetAttribute(", name, ")"));
}

template <class V>
void set_pref(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr, const V& v, std::string_view op,
              const char* name) {
  lt_check(cublasLtMatmulPreferenceSetAttribute(p, attr, &v, sizeof(v)), op,
           cat("cublasLtMatmulPreferenceSetAttribute(", name, ")"));
}

// A strided batch on one layout: the matrix count and the distance between matrices.
inline void set_batch(cublasLtMatrixLayout_t l, std::int32_t count, std::int64_t stride, std::string_view op,
                      const char* name) {
  lt_check(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)), op,
           cat("cublasLtMatrixLayoutSetAttribute(", name, " BATCH_COUNT)"));
  lt_check(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)), op,
           cat("cublasLtMatrixLayoutSetAttribute(", name, " STRIDED_BATCH_OFFSET)"));
}

inline std::unique_ptr<MatmulPlan> make_plan(const MatmulSpec& s, cublasLtHandle_t handle, const void* bias,
                                             std::string_view op) {
  auto p = std::make_unique<MatmulPlan>();
  const std::string ctx = s.describe();
  lt_check(cublasLtMatmulDescCreate(&p->desc, s.compute, CUDA_R_32F), op, "cublasLtMatmulDescCreate for " + ctx);
  set_desc(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, static_cast<std::int32_t>(s.transa), op, "TRANSA");
  set_desc(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, static_cast<std::int32_t>(s.transb), op, "TRANSB");
  set_desc(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, static_cast<std::uint32_t>(s.epilogue), op, "EPILOGUE");
  if (epilogue_reads_bias_pointer(s.epilogue)) {
    // The heuristic does not read the bias, but takes the alignment it may assume from the pointer.
    set_desc(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias, op, "BIAS_POINTER");
    set_desc(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<std::int32_t>(s.type), op, "BIAS_DATA_TYPE");
  }
  if (epilogue_uses_aux(s.epilogue)) {
    // As with the bias: the heuristic reads the pointer's alignment only (an address aligned to
    // exactly align_aux stands in for the real one).
    set_desc(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, s.ld_aux, op, "EPILOGUE_AUX_LD");
    set_desc(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
             reinterpret_cast<const void*>(static_cast<std::uintptr_t>(s.align_aux)), op, "EPILOGUE_AUX_POINTER");
  }
  // Layouts describe the matrices as stored: A is m x k, or k x m when op(A) transposes it.
  const bool ta = s.transa == CUBLAS_OP_T, tb = s.transb == CUBLAS_OP_T;
  lt_check(cublasLtMatrixLayoutCreate(&p->a, s.type, ta ? s.k : s.m, ta ? s.m : s.k, s.lda), op,
           "cublasLtMatrixLayoutCreate(A) for " + ctx);
  lt_check(cublasLtMatrixLayoutCreate(&p->b, s.type, tb ? s.n : s.k, tb ? s.k : s.n, s.ldb), op,
           "cublasLtMatrixLayoutCreate(B) for " + ctx);
  lt_check(cublasLtMatrixLayoutCreate(&p->d, s.type, s.m, s.n, s.ldd), op, "cublasLtMatrixLayoutCreate(D) for " + ctx);
  if (s.has_c())
    lt_check(cublasLtMatrixLayoutCreate(&p->c, s.type, s.m, s.n, s.ldc), op, "cublasLtMatrixLayoutCreate(C) for " + ctx);
  if (s.batch != 1) {
    set_batch(p->a, s.batch, s.stride_a, op, "A");
    set_batch(p->b, s.batch, s.stride_b, op, "B");
    set_batch(p->d, s.batch, s.stride_d, op, "D");
    if (p->c) set_batch(p->c, s.batch, s.stride_c, op, "C");
  }
  lt_check(cublasLtMatmulPreferenceCreate(&p->pref), op, "cublasLtMatmulPreferenceCreate");
  set_pref(p->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, max_workspace_bytes, op, "MAX_WORKSPACE_BYTES");
  set_pref(p->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, s.align_a, op, "MIN_ALIGNMENT_A_BYTES");
  set_pref(p->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, s.align_b, op, "MIN_ALIGNMENT_B_BYTES");
  set_pref(p->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, s.has_c() ? s.align_c : s.align_d, op,
           "MIN_ALIGNMENT_C_BYTES");
  set_pref(p->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, s.align_d, op, "MIN_ALIGNMENT_D_BYTES");
  int count = 0;
  // Without a C of its own, C is D (beta = 0), and D's layout serves for both.
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle, p->desc, p->a, p->b, p->c_layout(), p->d, p->pref, 1,
                                                           &p->heuristic, &count);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED) return p;  // no heuristic for this configuration: found stays false
  lt_check(st, op, "cublasLtMatmulAlgoGetHeuristic for " + ctx);
  p->found = count > 0 && p->heuristic.state == CUBLAS_STATUS_SUCCESS;
  return p;
}

// Launches a found plan on the thread's stream: D = alpha op(A) op(B) + beta C (+ epilogue).
// Without C (the default) beta must be 0 and C is D. The scale type is f32 for every dtype.
inline void run(const MatmulPlan& p, const MatmulSpec& s, int device, const void* A, const void* B, void* D,
                const void* bias, std::string_view op, float alpha = 1.0f, float beta = 0.0f,
                const void* C = nullptr, const void* aux = nullptr) {
  if (epilogue_reads_bias_pointer(s.epilogue))
    set_desc(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias, op, "BIAS_POINTER");
  if (epilogue_uses_aux(s.epilogue)) set_desc(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux, op, "EPILOGUE_AUX_POINTER");
  if (!s.has_c()) C = D;
  cublasLtHandle_t h = handles(device).cublaslt;
  void* ws = workspace(device, p.heuristic.workspaceSize);
  lt_check(cublasLtMatmul(h, p.desc, &alpha, A, p.a, B, p.b, &beta, C, p.c_layout(), D, p.d, &p.heuristic.algo, ws,
                          p.heuristic.workspaceSize, current_stream()),
           op, "cublasLtMatmul for " + s.describe());
}

template <class T>
MatmulSpec spec_for(std::string_view what, cublasLtEpilogue_t epilogue) {
  MatmulSpec s;
  s.what = what;
  s.type = lt_type<T>::value;
  s.dtype = dtype_of<T>;
  s.compute = compute_type<T>();
  s.epilogue = epilogue;
  return s;
}

}  // namespace detail

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::cublas
