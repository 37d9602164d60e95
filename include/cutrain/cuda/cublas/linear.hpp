// Linear layers on cuBLASLt, with the CPU backend's semantics (cpu/linear.hpp):
//   forward   y  = act(x w^T + b), the bias and the activation fused into the matmul as a
//             cuBLASLt epilogue (BIAS, RELU_BIAS, GELU_BIAS, or RELU / GELU without a bias);
//   backward  dx = dy w, and dw = dy^T x with db = sum_n dy coming out of the same matmul
//             through the BGRADB epilogue.
// x [N, in], w [out, in], bias [out], y and dy [N, out], all row-major (rows may be padded: any
// row stride >= the row length works, so column slices need no copy).
//
// Each matmul's descriptors, layouts, preference and algorithm are built once per thread and
// signature (op, dims, leading dimensions, dtype, compute type, epilogue, pointer alignments); a
// cached call sets the bias pointer and launches. The algorithm is the heuristic's first choice,
// or, in the autotuner's benchmark and cached modes, the fastest of the heuristic's candidates,
// timed once and remembered in the autotune cache (tune_plan below).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <memory>
#include <numbers>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "cutrain/core/check.hpp"
#include "cutrain/core/params/activation.hpp"
#include "cutrain/core/tensor.hpp"
#include "cutrain/cuda/autotune/tuner.hpp"
#include "cutrain/cuda/gpu_float.hpp"
#include "cutrain/cuda/math_options.hpp"
#include "cutrain/cuda/runtime.hpp"

namespace cutrain::cuda::cublas {

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
         e == CUBLASLT_EPILOGUE_BGRADA || e == CUBLASLT_EPILOGUE_BGRADB;
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

// One cublasLtMatmul: D (m x n, column-major) = op(A) (m x k) op(B) (k x n), with an epilogue.
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

  std::string signature() const {
    return cat(what, " ", transa == CUBLAS_OP_T ? 'T' : 'N', transb == CUBLAS_OP_T ? 'T' : 'N', " m", m, " n", n, " k",
               k, " ld", lda, ",", ldb, ",", ldd, " ", dtype, " compute ", compute_name(compute), " ",
               epilogue_name(epilogue), " align", align_a, ",", align_b, ",", align_d, ",", align_bias);
  }
  std::string key(int device) const { return cat(device, "|", signature()); }
  std::string describe() const {
    return cat(what, " matmul (m=", m, " n=", n, " k=", k, ", op(A)=", transa == CUBLAS_OP_T ? 'T' : 'N',
               " op(B)=", transb == CUBLAS_OP_T ? 'T' : 'N', ", ld ", lda, "/", ldb, "/", ldd, ", ", dtype,
               ", compute ", compute_name(compute), ", epilogue ", epilogue_name(epilogue), ", alignments ", align_a,
               "/", align_b, "/", align_d, ")");
  }
};

// Descriptors, layouts, preference and the heuristic's algorithm for one MatmulSpec. `found` is
// false when the heuristic offered no algorithm (kept, so that asking again costs nothing).
struct MatmulPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  cublasLtMatmulHeuristicResult_t heuristic{};
  bool found = false;

  MatmulPlan() = default;
  MatmulPlan(const MatmulPlan&) = delete;
  MatmulPlan& operator=(const MatmulPlan&) = delete;
  ~MatmulPlan() {  // destructors never throw: the statuses have nowhere to go
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
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
  // Layouts describe the matrices as stored: A is m x k, or k x m when op(A) transposes it.
  const bool ta = s.transa == CUBLAS_OP_T, tb = s.transb == CUBLAS_OP_T;
  lt_check(cublasLtMatrixLayoutCreate(&p->a, s.type, ta ? s.k : s.m, ta ? s.m : s.k, s.lda), op,
           "cublasLtMatrixLayoutCreate(A) for " + ctx);
  lt_check(cublasLtMatrixLayoutCreate(&p->b, s.type, tb ? s.n : s.k, tb ? s.k : s.n, s.ldb), op,
           "cublasLtMatrixLayoutCreate(B) for " + ctx);
  lt_check(cublasLtMatrixLayoutCreate(&p->d, s.type, s.m, s.n, s.ldd), op, "cublasLtMatrixLayoutCreate(D) for " + ctx);
  lt_check(cublasLtMatmulPreferenceCreate(&p->pref), op, "cublasLtMatmulPreferenceCreate");
  set_pref(p->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, max_workspace_bytes, op, "MAX_WORKSPACE_BYTES");
  set_pref(p->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, s.align_a, op, "MIN_ALIGNMENT_A_BYTES");
  set_pref(p->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, s.align_b, op, "MIN_ALIGNMENT_B_BYTES");
  set_pref(p->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, s.align_d, op, "MIN_ALIGNMENT_C_BYTES");
  set_pref(p->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, s.align_d, op, "MIN_ALIGNMENT_D_BYTES");
  int count = 0;
  // C is D (beta = 0), so D's layout serves for both.
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(handle, p->desc, p->a, p->b, p->d, p->d, p->pref, 1, &p->heuristic, &count);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED) return p;  // no heuristic for this configuration: found stays false
  lt_check(st, op, "cublasLtMatmulAlgoGetHeuristic for " + ctx);
  p->found = count > 0 && p->heuristic.state == CUBLAS_STATUS_SUCCESS;
  return p;
}

// ---- tuning ---------------------------------------------------------------------------------

// The configuration of an algorithm, as the cache's engine id (its config id) and knobs (tile,
// stages, split-k, reduction scheme, swizzle, custom option, inner and cluster shapes). The
// cache also keeps the algorithm's bytes, from which a later process runs it.
inline std::pair<std::int64_t, std::vector<autotune::Knob>> algo_config(const cublasLtMatmulAlgo_t& algo) {
  const auto get = [&](cublasLtMatmulAlgoConfigAttributes_t attr) -> std::int64_t {
    // The attributes are 16- or 32-bit integers, and cuBLASLt wants the exact size: ask for it.
    std::size_t size = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, nullptr, 0, &size) != CUBLAS_STATUS_SUCCESS || size == 0 ||
        size > sizeof(std::uint64_t))
      return -1;
    std::uint64_t v = 0;  // little-endian: the low bytes take the value
    std::size_t written = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, size, &written) != CUBLAS_STATUS_SUCCESS) return -1;
    if (attr == CUBLASLT_ALGO_CONFIG_ID && size == 4) return static_cast<std::int32_t>(static_cast<std::uint32_t>(v));
    return static_cast<std::int64_t>(v);
  };
  std::vector<autotune::Knob> knobs;
  for (const auto attr : {CUBLASLT_ALGO_CONFIG_TILE_ID, CUBLASLT_ALGO_CONFIG_STAGES_ID, CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
                          CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING,
                          CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID,
                          CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID})
    if (const std::int64_t v = get(attr); v >= 0) knobs.push_back({static_cast<std::int64_t>(attr), v});
  return {get(CUBLASLT_ALGO_CONFIG_ID), std::move(knobs)};
}

// In the autotuner's benchmark and cached modes: times up to options().max_candidates of the
// algorithms the heuristic offers for s (scratch buffers of s's sizes, a warm-up run, then rounds
// of back-to-back runs between CUDA events until their median is stable), keeps the fastest in p
// and records it in the autotune cache (library "cublaslt"; the signature carries the cuBLASLt
// version). In cached mode a stored algorithm that cublasLtMatmulAlgoCheck accepts is taken
// without timing. Tuning never fails the op: on any problem p keeps the heuristic's first choice.
// Not under CUDA graph capture (nothing can be timed there) and not with deterministic_only
// (the first choice is what the deterministic runs were shown to repeat with).
inline void tune_plan(MatmulPlan& p, const MatmulSpec& s, int device, std::string_view op) {
  namespace at = autotune;
  const at::Mode mode = at::mode();
  const at::Options o = at::options();
  if (mode == at::Mode::heuristic || !p.found || capturing() || o.deterministic_only) return;
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  cutrain::detail::DeviceGuard on(device);
  cublasLtHandle_t h = handles(device).cublaslt;
  const at::Environment env = at::environment(device);
  const at::Key key = at::Key::make(cat("matmul ", s.what), cat(s.signature(), " cublasLt ", cublasLtGetVersion()),
                                    "cublaslt", env);
  const auto store = at::cache();
  at::detail::use_environment(*store, env);
  if (mode == at::Mode::cached) {
    if (auto hit = store->find(key)) {
      cublasLtMatmulAlgo_t algo{};
      cublasLtMatmulHeuristicResult_t checked{};
      if (at::hex_decode(hit->algo, &algo, sizeof(algo)) &&
          cublasLtMatmulAlgoCheck(h, p.desc, p.a, p.b, p.d, p.d, &algo, &checked) == CUBLAS_STATUS_SUCCESS &&
          checked.workspaceSize <= static_cast<std::size_t>(std::min<std::int64_t>(o.max_workspace_bytes, max_workspace_bytes))) {
        p.heuristic.algo = algo;
        p.heuristic.workspaceSize = checked.workspaceSize;
        at::stats().cache_hits.fetch_add(1);
        at::detail::last() = at::Result{key, std::move(*hit), true};
        return;
      }
      // The stored algorithm does not fit here any more: tune again and replace the entry.
    }
  }

  const int wanted = std::max(1, o.max_candidates);
  std::vector<cublasLtMatmulHeuristicResult_t> cands(static_cast<std::size_t>(wanted));
  int count = 0;
  if (cublasLtMatmulAlgoGetHeuristic(h, p.desc, p.a, p.b, p.d, p.d, p.pref, wanted, cands.data(), &count) !=
          CUBLAS_STATUS_SUCCESS ||
      count < 1)
    return;
  cands.resize(static_cast<std::size_t>(count));

  // Scratch operands of s's sizes (column-major: leading dimension times columns), filled with a
  // finite pattern; the bias scratch serves the BIAS epilogues (read) and BGRADB (written).
  const std::size_t elem = s.type == CUDA_R_32F ? 4 : 2;
  const bool ta = s.transa == CUBLAS_OP_T, tb = s.transb == CUBLAS_OP_T;
  const auto bytes = [&](std::int64_t ld, std::uint64_t cols) {
    return std::max<std::size_t>(static_cast<std::size_t>(ld) * cols * elem, 16);
  };
  const cudaStream_t stream = current_stream();
  std::vector<Storage> scratch;
  try {
    for (const std::size_t b : {bytes(s.lda, ta ? s.m : s.k), bytes(s.ldb, tb ? s.k : s.n), bytes(s.ldd, s.n),
                                std::max<std::size_t>(std::max(s.m, s.n) * elem, 16)}) {
      scratch.emplace_back(b, Device::cuda(device));
      check(cudaMemsetAsync(scratch.back().data(), 0x3c, b, stream), op, "cudaMemsetAsync of a scratch operand");
    }
  } catch (const cutrain::Error& e) {
    at::detail::warn(cat(op, ": cuBLASLt tuning skipped (", e.what(), "); keeping the heuristic's first choice"));
    return;
  }
  const bool has_bias = epilogue_reads_bias_pointer(s.epilogue);
  if (has_bias) set_desc(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(scratch[3].data()), op, "BIAS_POINTER");

  Event start, stop;
  const float alpha = 1.0f, beta = 0.0f;
  struct Timed {
    std::size_t index;
    double ms;
  };
  std::vector<Timed> timed;
  int failed = 0;
  const auto deadline = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(o.max_tuning_ms));
  for (std::size_t i = 0; i < cands.size(); ++i) {
    const auto& c = cands[i];
    if (i > 0 && Clock::now() > deadline) break;
    if (c.state != CUBLAS_STATUS_SUCCESS || static_cast<std::int64_t>(c.workspaceSize) > o.max_workspace_bytes) {
      ++failed;
      continue;
    }
    void* ws = workspace(device, c.workspaceSize);
    const auto run = [&] {
      return cublasLtMatmul(h, p.desc, &alpha, scratch[0].data(), p.a, scratch[1].data(), p.b, &beta, scratch[2].data(),
                            p.d, scratch[2].data(), p.d, &c.algo, ws, c.workspaceSize, stream) == CUBLAS_STATUS_SUCCESS;
    };
    if (!run()) {  // the warm-up
      ++failed;
      continue;
    }
    const auto ms = at::detail::time_rounds(run, stream, start, stop, deadline, /*finish=*/i == 0);
    if (!ms) {
      ++failed;
      continue;
    }
    at::stats().candidates_timed.fetch_add(1);
    timed.push_back({i, *ms});
  }
  if (timed.empty()) {
    at::detail::warn(cat(op, ": no cuBLASLt algorithm could be timed for ", s.describe(),
                         "; keeping the heuristic's first choice"));
    return;
  }
  std::stable_sort(timed.begin(), timed.end(), [](const Timed& a, const Timed& b) { return a.ms < b.ms; });
  const auto& best = cands[timed.front().index];
  p.heuristic = best;

  at::Choice choice;
  std::tie(choice.engine_id, choice.knobs) = algo_config(best.algo);
  choice.median_ms = timed.front().ms;
  choice.workspace_bytes = static_cast<std::int64_t>(best.workspaceSize);
  for (const auto& t : timed)
    if (t.index == 0) choice.heuristic_ms = t.ms;
  choice.candidates_tried = static_cast<int>(timed.size()) + failed;
  choice.candidates_failed = failed;
  choice.algo = at::hex_encode(&best.algo, sizeof(best.algo));
  if (timed.size() > 1) {
    auto [id, knobs] = algo_config(cands[timed[1].index].algo);
    choice.runner_up = at::RunnerUp{id, std::move(knobs), timed[1].ms};
  }
  choice.tuning_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  at::stats().ops_tuned.fetch_add(1);
  at::detail::store_choice(key, choice, cat(op, ": the cuBLASLt choice"));
  at::detail::last() = at::Result{key, std::move(choice), false};
}

// Asks cuBLASLt's heuristic for two small matmuls (f32 and bf16): the first query in a process
// builds cuBLASLt's heuristic tables (75-110 ms alone on the H200, about 90 MB of heap), which a
// warm start (cuda/warm_start.hpp) does on a background thread. On a handle of its own, not
// handles(device): that would create this thread's cuDNN handle first, and the tables are the
// process's, whichever handle asks.
inline void warm_up(int device) {
  cutrain::detail::DeviceGuard on(device);
  cublasLtHandle_t handle = nullptr;
  check(cublasLtCreate(&handle), "cuda::cublas::warm_up", "cublasLtCreate");
  const struct Destroy {
    cublasLtHandle_t h;
    ~Destroy() { (void)cublasLtDestroy(h); }
  } destroy{handle};
  for (const auto& [type, dtype] : {std::pair{CUDA_R_32F, DType::f32}, std::pair{CUDA_R_16BF, DType::bf16}}) {
    MatmulSpec s{.what = "warm-up", .m = 64, .n = 64, .k = 64, .lda = 64, .ldb = 64, .ldd = 64, .type = type, .dtype = dtype};
    (void)make_plan(s, handle, nullptr, "cuda::cublas::warm_up");
  }
}

// The plan for `s` on `device`, built (and in a tuning mode tuned) at first use; later calls are
// a hash lookup.
inline std::unordered_map<std::string, std::unique_ptr<MatmulPlan>>& plan_cache() {
  thread_local std::unordered_map<std::string, std::unique_ptr<MatmulPlan>> cache;
  return cache;
}

inline MatmulPlan& cached_plan(int device, const MatmulSpec& s, const void* bias, std::string_view op) {
  auto& cache = plan_cache();
  const std::string key = s.key(device);
  auto it = cache.find(key);
  if (it == cache.end()) {
    auto plan = make_plan(s, handles(device).cublaslt, bias, op);
    tune_plan(*plan, s, device, op);
    it = cache.emplace(key, std::move(plan)).first;
  }
  return *it->second;
}

// Launches a found plan on the thread's stream: D = op(A) op(B) (+ epilogue), alpha 1, beta 0.
inline void run(const MatmulPlan& p, const MatmulSpec& s, int device, const void* A, const void* B, void* D,
                const void* bias, std::string_view op) {
  if (epilogue_reads_bias_pointer(s.epilogue))
    set_desc(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias, op, "BIAS_POINTER");
  const float alpha = 1.0f, beta = 0.0f;  // scale type is f32 for every dtype
  cublasLtHandle_t h = handles(device).cublaslt;
  void* ws = workspace(device, p.heuristic.workspaceSize);
  lt_check(cublasLtMatmul(h, p.desc, &alpha, A, p.a, B, p.b, &beta, D, p.d, D, p.d, &p.heuristic.algo, ws,
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

}  // namespace detail

// Forgets this thread's matmul plans: the next call of each builds, and in a tuning mode tunes
// or looks up, its algorithm again (as cudnn::clear_graph_cache does for cuDNN's graphs).
inline void clear_plan_cache() { detail::plan_cache().clear(); }

// y = act(x w^T + bias) with the bias (when defined) and act fused into the matmul's epilogue.
// act: identity, relu or gelu_tanh (cuBLASLt's GELU epilogue is the tanh approximation); any
// other activation, or a combination cuBLASLt has no algorithm for, throws NotImplemented that
// names it (the epilogue is never dropped silently). y [N, out] is written on current_stream().
template <GpuFloat T>
void linear_forward(const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>& bias, Activation act, Tensor<T>& y,
                    std::string_view op = "linear_forward") {
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
  // Row-major to column-major: cuBLASLt sees row-major y [N, out] as y^T (out x N), and
  // y^T = w x^T. Row-major w [out, in] is, column-major, the in x out matrix w^T, so op(A) = T
  // gives w (out x in); row-major x [N, in] is the in x N matrix x^T, taken as is (op(B) = N).
  // So m = out, n = N, k = in. The bias epilogues add a vector of D's row count (m = out) to
  // every column (every sample): exactly b[o] added to y[n, o].
  MatmulSpec s = spec_for<T>("fprop", epilogue);
  s.transa = CUBLAS_OP_T;
  s.transb = CUBLAS_OP_N;
  s.m = static_cast<std::uint64_t>(out);
  s.n = static_cast<std::uint64_t>(N);
  s.k = static_cast<std::uint64_t>(in);
  s.lda = row_stride(ws);
  s.ldb = row_stride(xs);
  s.ldd = row_stride(y);
  s.align_a = alignment(ws.data());
  s.align_b = alignment(xs.data());
  s.align_d = alignment(y.data());
  if (has_bias) s.align_bias = alignment(bs.data());
  MatmulPlan& p = cached_plan(dev.index, s, has_bias ? bs.data() : nullptr, op);
  if (!p.found)
    throw NotImplemented(op, cat("cuBLASLt has no algorithm for linear + ", has_bias ? "bias + " : "", act, " (",
                                 s.describe(), ") with x ", x.describe(), ", w ", w.describe()));
  run(p, s, dev.index, ws.data(), xs.data(), y.data(), has_bias ? bs.data() : nullptr, op);
}

// dx = dy w, dw = dy^T x and, when has_bias, db = sum over the batch of dy, on current_stream().
// dx [N, in], dw [out, in] and db [out] (defined when has_bias) are preallocated by the caller.
// db comes out of dw's matmul (BGRADB epilogue); where cuBLASLt has no such algorithm for the
// shapes and dtype, a second matmul (dy^T times a vector of ones) computes it.
template <GpuFloat T>
void linear_backward(const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>& dy, bool has_bias, Tensor<T>& dx,
                     Tensor<T>& dw, Tensor<T>& db, std::string_view op = "linear_backward") {
  using namespace detail;
  cutrain::check::rank(op, x, 2, "x");
  cutrain::check::rank(op, w, 2, "w");
  CUTRAIN_REQUIRE(x.dim(1) == w.dim(1), InvalidArgument, op, "x ", x.describe(), " has ", x.dim(1),
                  " features but w ", w.describe(), " expects ", w.dim(1), " (x [N, in], w [out, in], bias [out])");
  const std::int64_t N = x.dim(0), in = x.dim(1), out = w.dim(0);
  cutrain::check::shape(op, dy, Shape{N, out}, "dy");
  cutrain::check::shape(op, dx, Shape{N, in}, "dx");
  cutrain::check::shape(op, dw, Shape{out, in}, "dw");
  if (has_bias) cutrain::check::shape(op, db, Shape{out}, "db");
  const Device dev = has_bias ? cutrain::check::same_device(op, x, w, dy, dx, dw, db)
                              : cutrain::check::same_device(op, x, w, dy, dx, dw);
  CUTRAIN_REQUIRE(dev.is_cuda(), DeviceError, op, "cuda::cublas needs CUDA tensors, got x ", x.describe());
  CUTRAIN_REQUIRE(row_stride(dx) > 0, InvalidArgument, op, "dx ", dx.describe(), " must have packed rows");
  CUTRAIN_REQUIRE(row_stride(dw) > 0, InvalidArgument, op, "dw ", dw.describe(), " must have packed rows");
  CUTRAIN_REQUIRE(!has_bias || out <= 1 || db.strides()[0] == 1, InvalidArgument, op, "db ", db.describe(),
                  " must be packed (stride 1)");
  cutrain::detail::DeviceGuard guard(dev.index);

  if (out == 0) {  // dy is empty: dx = 0; dw and db have no elements
    zero_rows(dx.data(), N, in, row_stride(dx), op);
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

  // dx: row-major dx [N, in] is, column-major, dx^T (in x N) = w^T dy^T. Row-major w [out, in]
  // is the in x out matrix w^T as stored (op(A) = N), row-major dy [N, out] the out x N matrix
  // dy^T (op(B) = N): m = in, n = N, k = out.
  {
    MatmulSpec s = spec_for<T>("dgrad", CUBLASLT_EPILOGUE_DEFAULT);
    s.transa = CUBLAS_OP_N;
    s.transb = CUBLAS_OP_N;
    s.m = static_cast<std::uint64_t>(in);
    s.n = static_cast<std::uint64_t>(N);
    s.k = static_cast<std::uint64_t>(out);
    s.lda = row_stride(ws);
    s.ldb = row_stride(dys);
    s.ldd = row_stride(dx);
    s.align_a = alignment(ws.data());
    s.align_b = alignment(dys.data());
    s.align_d = alignment(dx.data());
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

}  // namespace cutrain::cuda::cublas
