// Batched matrix products on cuBLASLt: y[i] = alpha a[i] b[i] + beta c[i] over the batch dims,
// with the CPU backend's semantics (cpu/matmul.hpp); the shapes and their broadcasting are
// settled by ops/matmul.hpp. Each matrix is read in place when cuBLASLt can address it: packed
// rows as op N, a transposed view (packed columns) as op T, with the strides of the view as
// leading dimensions; any other matrix (an inner stride that is not 1 either way, or rows that
// overlap) is staged contiguous on the device first, its broadcast batch dims kept at stride 0.
// The batch dims fold into as few strided batches as the strides allow (stride 0 for a broadcast
// operand included): one cublasLtMatmul when they fold into one, else one call per index of the
// outer dims that do not fold. The spec, plan and launch are matmul_desc.hpp's, the algorithm and
// plan cache algo.hpp's, shared with the linear layers.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <optional>
#include <string_view>
#include <vector>

#include "cutrain/core/check.hpp"
#include "cutrain/core/tensor.hpp"
#include "cutrain/core/view.hpp"
#include "cutrain/cuda/api.hpp"  // the declarations, with the default arguments
#include "cutrain/cuda/cublas/algo.hpp"
#include "cutrain/cuda/cublas/matmul_desc.hpp"
#include "cutrain/cuda/gpu_float.hpp"
#include "cutrain/cuda/runtime.hpp"

namespace cutrain::inline CUTRAIN_ABI::cuda::cublas {

namespace detail {

// How cuBLASLt reads a row-major matrix X [r, c] with strides (sr, sc) as the column-major
// c x r matrix X^T it needs: as stored (op N, ld = sr) when its rows are packed, or as the
// column-major r x c matrix X transposed (op T, ld = sc) when its columns are (a view from
// transpose(x, -1, -2)). None: it must be staged.
struct MatrixAccess {
  cublasOperation_t op = CUBLAS_OP_N;
  std::int64_t ld = 1;
};

inline std::optional<MatrixAccess> matrix_access(std::int64_t r, std::int64_t c, std::int64_t sr, std::int64_t sc) {
  const std::int64_t pr = std::max<std::int64_t>(r, 1), pc = std::max<std::int64_t>(c, 1);
  if (c <= 1 || sc == 1) {
    const std::int64_t ld = r <= 1 ? pc : sr;
    if (ld >= pc) return MatrixAccess{CUBLAS_OP_N, ld};
  }
  if (r <= 1 || sr == 1) {
    const std::int64_t ld = c <= 1 ? pr : sc;
    if (ld >= pr) return MatrixAccess{CUBLAS_OP_T, ld};
  }
  return std::nullopt;
}

template <class T>
std::optional<MatrixAccess> matrix_access(const Tensor<T>& t) {
  const int r = t.rank();
  const auto& s = t.strides();
  return matrix_access(t.dim(r - 2), t.dim(r - 1), s[static_cast<std::size_t>(r - 2)], s[static_cast<std::size_t>(r - 1)]);
}

// t [B..., r, c] with its matrices packed row-major, on t's device: the batch dims t broadcasts
// (stride 0) stay broadcast, so only the distinct matrices are copied.
template <class T>
Tensor<T> staged(const Tensor<T>& t) {
  std::vector<std::int64_t> core = t.shape().dims();
  for (int d = 0; d + 2 < t.rank(); ++d)
    if (t.strides()[static_cast<std::size_t>(d)] == 0) core[static_cast<std::size_t>(d)] = 1;
  const Tensor<T> distinct = t.as_strided(Shape(core), t.strides(), t.offset()).contiguous(Layout::row_major);
  return cutrain::expand(distinct, t.shape());
}

// One batch dim after folding: its size and the strides of a, b, c and y along it.
struct BatchDim {
  std::int64_t size = 1;
  std::array<std::int64_t, 4> stride{};
};

// The batch dims of the four operands folded: a dim merges into the one outside it when every
// operand steps through both as through one (outer stride = inner stride * inner size).
inline std::vector<BatchDim> fold_batch(const Shape& y, const std::array<const Strides*, 4>& strides) {
  std::vector<BatchDim> dims;
  for (int d = 0; d + 2 < y.rank(); ++d) {
    if (y[d] == 1) continue;
    BatchDim cur{y[d], {}};
    for (std::size_t j = 0; j < 4; ++j) cur.stride[j] = (*strides[j])[static_cast<std::size_t>(d)];
    if (!dims.empty()) {
      BatchDim& last = dims.back();
      bool merges = true;
      for (std::size_t j = 0; j < 4; ++j) merges = merges && last.stride[j] == cur.stride[j] * cur.size;
      if (merges) {
        last.size *= cur.size;
        last.stride = cur.stride;
        continue;
      }
    }
    dims.push_back(cur);
  }
  return dims;
}

// The alignment every matrix of an operand keeps: its start's, and that of each step between
// matrices, so that one plan serves every batch and every call of the outer loop.
inline std::uint32_t batch_alignment(const void* p, std::size_t elem, const std::vector<BatchDim>& dims, std::size_t j) {
  std::uint32_t a = alignment(p);
  for (const BatchDim& d : dims)
    if (d.stride[j] != 0)
      a = std::min(a, alignment(reinterpret_cast<const void*>(static_cast<std::uintptr_t>(d.stride[j]) * elem)));
  return a;
}

}  // namespace detail

// y [B..., m, n] (row-major, preallocated) = alpha a b + beta c, for a [B..., m, k], b [B..., k, n]
// and c [B..., m, n] (undefined: no C term; beta is then ignored) with the same batch dims B
// (broadcast ones at stride 0), all on one CUDA device, on current_stream(). f32 runs in TF32
// when cuda::math_options().allow_tf32 is set; bf16 and f16 accumulate in f32.
template <GpuFloat T>
void matmul_into(const Tensor<T>& a_in, const Tensor<T>& b_in, const Tensor<T>& c_in, float alpha, float beta,
                 Tensor<T>& y, std::string_view op) {
  using namespace detail;
  const int r = y.rank();
  CUTRAIN_REQUIRE(r >= 2 && a_in.rank() == r && b_in.rank() == r && (!c_in.defined() || c_in.rank() == r),
                  InvalidArgument, op, "cuda::cublas::matmul_into wants a, b, c and y of one rank >= 2, got a ",
                  a_in.describe(), ", b ", b_in.describe(), ", y ", y.describe());
  const std::int64_t m = y.dim(r - 2), n = y.dim(r - 1), k = a_in.dim(r - 1);
  {
    std::vector<std::int64_t> sa = y.shape().dims(), sb = y.shape().dims();
    sa.back() = k;
    sb[static_cast<std::size_t>(r - 2)] = k;
    cutrain::check::shape(op, a_in, Shape(sa), "a");
    cutrain::check::shape(op, b_in, Shape(sb), "b");
    if (c_in.defined()) cutrain::check::shape(op, c_in, y.shape(), "c");
  }
  const Device dev = c_in.defined() ? cutrain::check::same_device(op, a_in, b_in, c_in, y)
                                    : cutrain::check::same_device(op, a_in, b_in, y);
  CUTRAIN_REQUIRE(dev.is_cuda(), DeviceError, op, "cuda::cublas needs CUDA tensors, got a ", a_in.describe());
  CUTRAIN_REQUIRE(y.layout() == Layout::row_major || y.layout() == Layout::nchw, InvalidArgument, op, "y ",
                  y.describe(), " must be row-major contiguous");
  if (y.numel() == 0) return;
  cutrain::detail::DeviceGuard guard(dev.index);

  Tensor<T> a = a_in.view(), b = b_in.view();
  const Shape batch_of_y = y.shape();
  if (k == 0) {
    // cuBLASLt wants k >= 1: multiply zeros with k = 1 instead, so that y is still beta c (or 0).
    std::vector<std::int64_t> sa = batch_of_y.dims(), sb = batch_of_y.dims();
    sa.back() = 1;
    sb[static_cast<std::size_t>(r - 2)] = 1;
    a = cutrain::expand(Tensor<T>::zeros(Shape{m, 1}, {.device = dev}), Shape(sa));
    b = cutrain::expand(Tensor<T>::zeros(Shape{1, n}, {.device = dev}), Shape(sb));
  }
  bool use_c = c_in.defined() && beta != 0.0f;
  Tensor<T> c = use_c ? c_in.view() : Tensor<T>{};

  std::optional<MatrixAccess> acc_a = matrix_access(a), acc_b = matrix_access(b), acc_c;
  if (!acc_a) a = staged(a), acc_a = matrix_access(a);
  if (!acc_b) b = staged(b), acc_b = matrix_access(b);
  if (use_c) {
    acc_c = matrix_access(c);
    if (!acc_c || acc_c->op != CUBLAS_OP_N) c = staged(c), acc_c = matrix_access(c);  // C has no op: rows packed
  }

  const Strides none(static_cast<std::size_t>(r), 0);
  std::vector<BatchDim> dims =
      fold_batch(y.shape(), {&a.strides(), &b.strides(), use_c ? &c.strides() : &none, &y.strides()});

  // Row-major y [m, n] is, column-major, y^T (n x m) = b^T a^T: cuBLASLt's A is b (n x k after
  // its op), its B is a (k x m after its op), so M = n, N = m, K = k. The innermost folded batch
  // dim is cuBLASLt's strided batch (split into chunks past int32); `per_matrix` makes every
  // batch dim an outer one (one matrix per call), the fallback when cuBLASLt offers no
  // algorithm for the strided batch.
  constexpr std::int64_t max_batch = std::numeric_limits<std::int32_t>::max();
  const auto spec = [&](bool per_matrix, bool with_c) {
    const BatchDim inner = dims.empty() || per_matrix ? BatchDim{} : dims.back();
    const std::int64_t chunk = std::min(inner.size, max_batch);
    MatmulSpec s = spec_for<T>("matmul", CUBLASLT_EPILOGUE_DEFAULT);
    s.transa = acc_b->op;
    s.transb = acc_a->op;
    s.m = static_cast<std::uint64_t>(n);
    s.n = static_cast<std::uint64_t>(m);
    s.k = static_cast<std::uint64_t>(std::max<std::int64_t>(k, 1));
    s.lda = acc_b->ld;
    s.ldb = acc_a->ld;
    s.ldd = std::max<std::int64_t>(n, 1);
    s.batch = static_cast<std::int32_t>(chunk);
    if (chunk > 1) {
      s.stride_a = inner.stride[1];
      s.stride_b = inner.stride[0];
      s.stride_d = inner.stride[3];
    }
    s.align_a = batch_alignment(b.data(), sizeof(T), dims, 1);
    s.align_b = batch_alignment(a.data(), sizeof(T), dims, 0);
    s.align_d = batch_alignment(y.data(), sizeof(T), dims, 3);
    if (with_c) {
      s.ldc = acc_c->ld;
      s.stride_c = chunk > 1 ? inner.stride[2] : 0;
      s.align_c = batch_alignment(c.data(), sizeof(T), dims, 2);
    }
    return s;
  };
  bool per_matrix = false;
  MatmulSpec s = spec(per_matrix, use_c);
  MatmulPlan* p = &cached_plan(dev.index, s, nullptr, op);
  if (!p->found && use_c) {
    // No algorithm reads this C beside D: copy c into y and run in place (C = D), beta kept.
    y.copy_from(c);
    use_c = false;
    s = spec(per_matrix, false);
    p = &cached_plan(dev.index, s, nullptr, op);
  }
  if (!p->found && s.batch > 1) {
    per_matrix = true;
    s = spec(per_matrix, use_c);
    p = &cached_plan(dev.index, s, nullptr, op);
  }
  CUTRAIN_REQUIRE(p->found, NotImplemented, op, "cuBLASLt has no algorithm for ", s.describe(), " with a ",
                  a_in.describe(), ", b ", b_in.describe());
  if (per_matrix) dims.push_back(BatchDim{});  // every real batch dim is now an outer one
  const BatchDim inner = dims.empty() ? BatchDim{} : dims.back();
  const std::int64_t chunk = s.batch;
  std::int64_t outer_count = 1;
  for (std::size_t i = 0; i + 1 < dims.size(); ++i) outer_count *= dims[i].size;
  const T* const pa = a.data();
  const T* const pb = b.data();
  const T* const pc = use_c ? c.data() : nullptr;
  T* const py = y.data();
  const float beta_used = c_in.defined() && beta != 0.0f ? beta : 0.0f;  // C or, in place, D

  // The outer dims, one call per index (and per chunk of an inner batch past int32).
  std::vector<std::int64_t> idx(dims.empty() ? 0 : dims.size() - 1, 0);
  for (std::int64_t o = 0; o < outer_count; ++o) {
    std::array<std::int64_t, 4> off{};
    for (std::size_t i = 0; i < idx.size(); ++i)
      for (std::size_t j = 0; j < 4; ++j) off[j] += idx[i] * dims[i].stride[j];
    for (std::int64_t start = 0; start < inner.size; start += chunk) {
      const MatmulSpec* sp = &s;
      const MatmulPlan* pp = p;
      MatmulSpec tail;
      if (inner.size - start < chunk) {  // the last, shorter chunk of a batch past int32
        tail = s;
        tail.batch = static_cast<std::int32_t>(inner.size - start);
        pp = &cached_plan(dev.index, tail, nullptr, op);
        CUTRAIN_REQUIRE(pp->found, NotImplemented, op, "cuBLASLt has no algorithm for ", tail.describe());
        sp = &tail;
      }
      run(*pp, *sp, dev.index, pb + off[1] + start * inner.stride[1], pa + off[0] + start * inner.stride[0],
          py + off[3] + start * inner.stride[3], nullptr, op, alpha, beta_used,
          pc ? pc + off[2] + start * inner.stride[2] : nullptr);
    }
    for (std::size_t i = idx.size(); i-- > 0;) {
      if (++idx[i] < dims[i].size) break;
      idx[i] = 0;
    }
  }
}

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::cublas
