// The algorithm of each cuBLASLt matmul, and the per-thread plan cache. Each matmul's plan
// (descriptors, layouts, preference and algorithm: matmul_desc.hpp) is built once per thread and
// signature (op, dims, leading dimensions, dtype, compute type, epilogue, pointer alignments); a
// cached call sets the bias pointer and launches. The algorithm is the heuristic's first choice,
// or, in the autotuner's benchmark and cached modes, the fastest of the heuristic's candidates,
// timed once and remembered in the autotune cache (tune_plan below). warm_up builds cuBLASLt's
// heuristic tables ahead of the first matmul.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cutrain/cuda/autotune/tuner.hpp"
#include "cutrain/cuda/cublas/matmul_desc.hpp"
#include "cutrain/cuda/runtime.hpp"

namespace cutrain::inline CUTRAIN_ABI::cuda::cublas {

namespace detail {

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
          cublasLtMatmulAlgoCheck(h, p.desc, p.a, p.b, p.c_layout(), p.d, &algo, &checked) == CUBLAS_STATUS_SUCCESS &&
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
  if (cublasLtMatmulAlgoGetHeuristic(h, p.desc, p.a, p.b, p.c_layout(), p.d, p.pref, wanted, cands.data(), &count) !=
          CUBLAS_STATUS_SUCCESS ||
      count < 1)
    return;
  cands.resize(static_cast<std::size_t>(count));

  // Scratch operands of s's sizes (column-major: leading dimension times columns, plus the batch
  // strides), filled with a finite pattern; the bias scratch serves the BIAS epilogues (read) and
  // BGRADB (written); the fifth is C's, when s has a C of its own; the sixth the GELU epilogues'
  // auxiliary matrix.
  const std::size_t elem = s.type == CUDA_R_32F ? 4 : 2;
  const bool ta = s.transa == CUBLAS_OP_T, tb = s.transb == CUBLAS_OP_T;
  const auto bytes = [&](std::int64_t ld, std::uint64_t cols, std::int64_t stride) {
    const std::size_t last = static_cast<std::size_t>(s.batch - 1) * static_cast<std::size_t>(stride);
    return std::max<std::size_t>((static_cast<std::size_t>(ld) * cols + last) * elem, 16);
  };
  const cudaStream_t stream = current_stream();
  std::vector<Storage> scratch;
  try {
    for (const std::size_t b : {bytes(s.lda, ta ? s.m : s.k, s.stride_a), bytes(s.ldb, tb ? s.k : s.n, s.stride_b),
                                bytes(s.ldd, s.n, s.stride_d), std::max<std::size_t>(std::max(s.m, s.n) * elem, 16),
                                s.has_c() ? bytes(s.ldc, s.n, s.stride_c) : std::size_t{16},
                                s.ld_aux != 0 ? bytes(s.ld_aux, s.n, 0) : std::size_t{16}}) {
      scratch.emplace_back(b, Device::cuda(device));
      check(cudaMemsetAsync(scratch.back().data(), 0x3c, b, stream), op, "cudaMemsetAsync of a scratch operand");
    }
  } catch (const cutrain::Error& e) {
    at::detail::warn(cat(op, ": cuBLASLt tuning skipped (", e.what(), "); keeping the heuristic's first choice"));
    return;
  }
  const bool has_bias = epilogue_reads_bias_pointer(s.epilogue);
  if (has_bias) set_desc(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(scratch[3].data()), op, "BIAS_POINTER");
  if (epilogue_uses_aux(s.epilogue))
    set_desc(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<const void*>(scratch[5].data()), op,
             "EPILOGUE_AUX_POINTER");

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
      void* C = s.has_c() ? scratch[4].data() : scratch[2].data();
      return cublasLtMatmul(h, p.desc, &alpha, scratch[0].data(), p.a, scratch[1].data(), p.b, &beta, C, p.c_layout(),
                            scratch[2].data(), p.d, &c.algo, ws, c.workspaceSize, stream) == CUBLAS_STATUS_SUCCESS;
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

}  // namespace detail

// Forgets this thread's matmul plans: the next call of each builds, and in a tuning mode tunes
// or looks up, its algorithm again (as cudnn::clear_graph_cache does for cuDNN's graphs).
inline void clear_plan_cache() { detail::plan_cache().clear(); }

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::cublas
