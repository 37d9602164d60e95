// What the probes (probe_8bit_gpu, probe_bn_fusion_gpu) share: cudnn-frontend graphs asked
// directly whether cuDNN has engines for them, and timed. A graph is built through validate,
// build_operation_graph, create_execution_plans (heuristics mode A, then fallback) and
// check_support; the plans that build are counted (up to max_built, where given: runtime-fusion
// plans compile kernels as they build) and the first 8 of them timed (median of 20 calls, each
// timed over 5 calls queued back to back between CUDA events, after warm-up).
// Buffers hold random bytes: the probes time graphs and do not check values.
#pragma once

#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include <cudnn_frontend.h>

namespace cudnn_probe {

namespace fe = cudnn_frontend;
using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;
using Pack = std::unordered_map<TensorPtr, void*>;

struct Result {
  std::string status = "ok";
  std::int64_t listed = 0, built = 0;
  double best_ms = -1;
};

// An NHWC tensor [n, c, h, w] of type t.
inline TensorPtr nhwc(fe::graph::Graph& g, const char* name, std::int64_t n, std::int64_t c, std::int64_t h,
                      std::int64_t w, fe::DataType_t t) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_dim({n, c, h, w})
                      .set_stride({c * h * w, 1, c * w, c})
                      .set_data_type(t));
}
// An f32 scalar [1, 1, 1, 1].
inline TensorPtr scalar(fe::graph::Graph& g, const char* name) {
  return nhwc(g, name, 1, 1, 1, 1, fe::DataType_t::FLOAT);
}

inline fe::graph::Pointwise_attributes pointwise(fe::PointwiseMode_t mode) {
  return fe::graph::Pointwise_attributes().set_mode(mode).set_compute_data_type(fe::DataType_t::FLOAT);
}

inline std::size_t bytes_of(fe::DataType_t t) {
  switch (t) {
    case fe::DataType_t::FLOAT:
    case fe::DataType_t::INT32: return 4;
    case fe::DataType_t::BFLOAT16:
    case fe::DataType_t::HALF: return 2;
    default: return 1;
  }
}

// Device memory of random bytes (small magnitudes in every format), freed at exit.
inline void* random_buffer(std::size_t bytes) {
  static std::vector<std::unique_ptr<void, void (*)(void*)>> keep;
  void* p = nullptr;
  if (cudaMalloc(&p, std::max<std::size_t>(bytes, 256)) != cudaSuccess) return nullptr;
  std::vector<unsigned char> host(bytes);
  std::mt19937 rng(static_cast<unsigned>(bytes));
  for (auto& b : host) b = static_cast<unsigned char>(rng() & 0x3f);
  cudaMemcpy(p, host.data(), bytes, cudaMemcpyHostToDevice);
  keep.emplace_back(p, [](void* q) { cudaFree(q); });
  return p;
}
// A random buffer for t (its dims and type), added to pack.
inline void bind(Pack& pack, const TensorPtr& t) {
  std::size_t n = 1;
  for (const auto d : t->get_dim()) n *= static_cast<std::size_t>(d);
  pack[t] = random_buffer(n * bytes_of(t->get_data_type()));
}

// A cuDNN handle on device 0, the JSON object's opening ({"gpu": ..., "cudnn": ..., "rows": [)
// printed: 0; 77 without a GPU, 1 where cuDNN does not start (said on stdout / stderr).
inline int open_probe(const char* probe_name, cudnnHandle_t& handle) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("%s: SKIPPED (no CUDA device)\n", probe_name);
    return 77;
  }
  if (cudnnCreate(&handle) != CUDNN_STATUS_SUCCESS) {
    std::fprintf(stderr, "%s: cudnnCreate failed\n", probe_name);
    return 1;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("{\"gpu\": \"%s\", \"cudnn\": %zu, \"rows\": [", prop.name, cudnnGetVersion());
  return 0;
}

// One row of the JSON object: the fields before the result (`"shape": "...", ...`), then r's.
inline void print_row(bool first, const std::string& fields, const Result& r) {
  std::printf("%s\n {%s, \"status\": \"%s\", \"plans_listed\": %lld, \"plans_built\": %lld, \"best_ms\": %.4f}",
              first ? "" : ",", fields.c_str(), r.status.c_str(), static_cast<long long>(r.listed),
              static_cast<long long>(r.built), r.best_ms);
  std::fflush(stdout);
}

// g (every tensor in pack) planned, built and timed; the status names the step that failed.
inline Result plan_and_time(cudnnHandle_t handle, fe::graph::Graph& g, Pack& pack, std::int64_t max_built = -1) {
  Result r;
  const auto say = [&](std::string status) {  // as a JSON string holds it
    std::replace(status.begin(), status.end(), '"', '\'');
    std::replace(status.begin(), status.end(), '\n', ' ');
    r.status = std::move(status);
  };
  const auto fail = [&](const char* step, fe::error_t e) {
    say(std::string(step) + ": " + e.get_message());
    return r;
  };
  if (auto e = g.validate(); !e.is_good()) return fail("validate", e);
  if (auto e = g.build_operation_graph(handle); !e.is_good()) return fail("build_operation_graph", e);
  if (auto e = g.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}); !e.is_good())
    return fail("create_execution_plans", e);
  r.listed = g.get_execution_plan_count();
  if (auto e = g.check_support(handle); !e.is_good()) return fail("check_support", e);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::string untimed;  // why the last built plan that could not be timed was not
  for (std::int64_t i = 0; i < r.listed && r.built != max_built; ++i) {
    if (!g.build_plan_at_index(handle, i).is_good()) continue;
    ++r.built;
    if (r.built > 8) continue;  // time the first 8 that build
    std::int64_t ws_bytes = 0;
    if (auto e = g.get_workspace_size_plan_at_index(i, ws_bytes); !e.is_good()) {
      untimed = "workspace size: " + e.get_message();
      continue;
    }
    void* ws = ws_bytes > 0 ? random_buffer(static_cast<std::size_t>(ws_bytes)) : nullptr;
    if (ws_bytes > 0 && !ws) {
      untimed = "workspace: cudaMalloc failed";
      continue;
    }
    fe::error_t e;
    for (int k = 0; k < 3 && e.is_good(); ++k) e = g.execute_plan_at_index(handle, pack, ws, i);
    if (!e.is_good()) {
      untimed = "execute: " + e.get_message();
      continue;
    }
    if (const cudaError_t c = cudaDeviceSynchronize(); c != cudaSuccess) {
      untimed = std::string("execute: ") + cudaGetErrorString(c);
      continue;
    }
    std::vector<double> ms;
    for (int rep = 0; rep < 20; ++rep) {
      cudaEventRecord(a);
      for (int k = 0; k < 5; ++k) (void)g.execute_plan_at_index(handle, pack, ws, i);
      cudaEventRecord(b);
      cudaEventSynchronize(b);
      float t = 0;
      cudaEventElapsedTime(&t, a, b);
      ms.push_back(t / 5.0);
    }
    std::nth_element(ms.begin(), ms.begin() + 10, ms.end());
    if (r.best_ms < 0 || ms[10] < r.best_ms) r.best_ms = ms[10];
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  if (r.built == 0) r.status = "no plan builds";
  if (r.built > 0 && r.best_ms < 0 && !untimed.empty()) say("built, not timed: " + untimed);  // best_ms stays -1
  return r;
}

}  // namespace cudnn_probe
