// How the autotuner times a candidate: the rounds of runs between CUDA events and when they
// stop, scratch copies of a graph's tensors (Bench), screens queued without waiting, and the
// finals timed in turns. Used for cuDNN plans and cuBLASLt algorithms alike.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cudnn_frontend.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "cutrain/core/storage.hpp"
#include "cutrain/cuda/autotune/fe_compat.hpp"
#include "cutrain/cuda/runtime.hpp"

namespace cutrain::inline CUTRAIN_ABI::cuda::autotune::detail {

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// How every candidate (cuDNN plan or cuBLASLt algorithm) is timed, after a warm-up run: one run
// alone sets how many go in a round (about round_ms of work, at most max_reps); rounds repeat, at
// least min_rounds, at most max_rounds, until the median of the rounds so far moves by less than
// `stable` over the last three. Past the deadline it stops after min_rounds, unless told to
// finish. run() returns false when a run fails; the result is the median ms per run, or nothing.
// A screen stops after two rounds and gives the faster: an estimate that decides whether a
// candidate is worth timing fully.
struct Rounds {
  static constexpr double round_ms = 1.0;
  static constexpr int max_reps = 10;
  static constexpr int min_rounds = 5;
  static constexpr int max_rounds = 30;
  static constexpr double stable = 0.02;
  // Executions per round for a plan that takes ms per execution.
  static int reps(double ms) {
    return std::clamp(static_cast<int>(std::ceil(round_ms / std::max(ms, 1e-4))), 1, max_reps);
  }
  // Whether the medians so far (one per round from min_rounds on) moved by less than `stable`
  // over the last three.
  static bool settled(const std::vector<double>& medians) {
    if (medians.size() < 3) return false;
    const auto [lo, hi] = std::minmax_element(medians.end() - 3, medians.end());
    return *hi - *lo < stable * *lo;
  }
};
template <class Run>
std::optional<double> time_rounds(Run&& run, cudaStream_t stream, Event& start, Event& stop,
                                  std::chrono::steady_clock::time_point deadline, bool finish, bool screen = false) {
  start.record(stream);
  if (!run()) return std::nullopt;
  stop.record(stream);
  stop.synchronize();
  const int reps = Rounds::reps(stop.elapsed_ms(start));
  std::vector<double> rounds, medians;
  while (static_cast<int>(rounds.size()) < Rounds::max_rounds) {
    start.record(stream);
    for (int k = 0; k < reps; ++k)
      if (!run()) return std::nullopt;
    stop.record(stream);
    stop.synchronize();
    rounds.push_back(stop.elapsed_ms(start) / reps);
    if (screen && rounds.size() == 2) return std::min(rounds[0], rounds[1]);
    if (static_cast<int>(rounds.size()) < Rounds::min_rounds) continue;
    medians.push_back(median(rounds));
    if (Rounds::settled(medians)) break;
    if (!finish && std::chrono::steady_clock::now() > deadline) break;
  }
  return median(rounds);
}

// The bytes a tensor of a graph spans in memory (its strides' reach), in its data type.
inline std::size_t element_bytes(fe::DataType_t t) {
  using D = fe::DataType_t;
  switch (t) {
    case D::HALF: case D::BFLOAT16: return 2;
    case D::FLOAT: case D::INT32: case D::INT8x4: case D::UINT8x4: return 4;
    case D::INT8: case D::UINT8: case D::BOOLEAN: case D::BYTE_BOOLEAN: case D::FP8_E4M3: case D::FP8_E5M2:
    case D::FP8_E8M0: case D::FP8_E5M3: case D::FP4_E2M1: case D::INT4: return 1;
    case D::INT8x32: return 32;
    case D::COMPLEX_FP64: return 16;
    default: return 8;  // DOUBLE, INT64, COMPLEX_FP32, and anything unknown: the widest guess
  }
}
inline std::size_t tensor_bytes(const fe::graph::Tensor_attributes& t) {
  const auto dim = t.get_dim();
  const auto stride = t.get_stride();
  std::int64_t span = 0;
  if (stride.size() != dim.size()) {
    span = t.get_volume();
  } else {
    for (std::size_t i = 0; i < dim.size(); ++i) {
      if (dim[i] <= 0) return 0;
      span += (dim[i] - 1) * stride[i];
    }
    span += 1;
  }
  return static_cast<std::size_t>(span) * element_bytes(t.get_data_type());
}

struct Timed {
  std::int64_t index = -1;
  std::int64_t engine_id = 0;
  std::vector<Knob> knobs;
  std::int64_t workspace = 0;
  double median_ms = 0;
  bool replayable = false;  // its engine id and knobs were read (engine_config_of): create_plan rebuilds it
  bool screened = false;    // median_ms is only the screen's estimate: not timed fully
  std::int64_t build_us = 0;  // building its plan (Result::build_ms)
};

// Scratch copies of a graph's tensors on its device, and the events that time its plans.
class Bench {
 public:

  Bench(fe::graph::Graph& g, const std::vector<TensorAttr>& tensors, int device)
      : g_(g), device_(device), stream_(current_stream()), handle_(handles(device).cudnn) {
    for (const auto& t : tensors) {
      if (t->get_is_pass_by_value()) {  // a host scalar: a zeroed host value
        host_.push_back(std::make_unique<std::int64_t[]>(4));
        uids_[t->get_uid()] = host_.back().get();
        continue;
      }
      const std::size_t bytes = tensor_bytes(*t);
      buffers_.emplace_back(std::max<std::size_t>(bytes, 16), Device::cuda(device));
      // A finite pattern (0x3c3c: about 1.06 in f16, 0.0115 in bf16 and f32), zero for integers.
      check(cudaMemsetAsync(buffers_.back().data(), is_float(t->get_data_type()) ? 0x3c : 0, bytes, stream_),
            "autotune", "cudaMemsetAsync of a scratch tensor");
      uids_[t->get_uid()] = buffers_.back().data();
    }
  }

  // The plan's median time in ms per execution, or nullopt (with why) when it does not run.
  // Past the deadline it stops after min_rounds, unless told to finish.
  // A screen (see time_rounds) runs it only for an estimate.
  std::optional<double> time(std::int64_t index, std::int64_t workspace_bytes,
                             std::chrono::steady_clock::time_point deadline, bool finish, std::string& why,
                             bool screen = false) {
    void* ws = workspace(workspace_bytes);
    const auto run = [&] { return ok(g_.execute_plan_at_index(handle_, uids_, ws, index), why); };
    if (!run() || !synced(why)) return std::nullopt;
    return time_rounds(run, stream_, start_, stop_, deadline, finish, screen);
  }

  // A screen queued without waiting (see tune()): the warm-up run, then two rounds of `reps` runs
  // between three events. Its estimate (the faster round) is read once the stream has finished:
  // estimate() after synchronize().
  struct Queued {
    Event e0, e1, e2;
    int reps = 1;
    double estimate() const { return std::min(e1.elapsed_ms(e0), e2.elapsed_ms(e1)) / reps; }
  };
  // False (with why) when a run fails to launch; runs queued before it still execute.
  bool queue_screen(std::int64_t index, std::int64_t workspace_bytes, int reps, Queued& q, std::string& why) {
    // A larger workspace replaces the old one, which goes back to the device cache for this
    // stream: the queued runs still using it finish before the stream can hand it out again.
    void* ws = workspace(workspace_bytes);
    const auto run = [&] { return ok(g_.execute_plan_at_index(handle_, uids_, ws, index), why); };
    if (!run()) return false;  // the warm-up: its first launch loads the plan's kernels
    q.reps = reps;
    q.e0.record(stream_);
    for (int k = 0; k < reps; ++k)
      if (!run()) return false;
    q.e1.record(stream_);
    for (int k = 0; k < reps; ++k)
      if (!run()) return false;
    q.e2.record(stream_);
    return true;
  }
  // Waits for everything queued on the stream; false (with why) when a run failed on the GPU.
  bool synced(std::string& why) {
    if (const cudaError_t e = cudaStreamSynchronize(stream_); e != cudaSuccess) {
      (void)cudaGetLastError();
      why = cat("the warm-up run failed: ", cudaGetErrorString(e));
      return false;
    }
    return true;
  }

  // The finals: plans timed in turns, one round each per turn, so that a slow spell of the GPU
  // (clocks still settling, say) falls on all of them alike, not on whichever was timed during it.
  // Each plan's screen estimate (its median_ms) sets its executions per round; the rounds repeat
  // until every plan's median is settled (at least min_rounds, at most max_rounds; past the
  // deadline, after min_rounds). A plan that ran gets its median and is no longer `screened`; one
  // that fails leaves the turns and keeps its estimate.
  void time_in_turns(const std::vector<Timed*>& finals, std::chrono::steady_clock::time_point deadline) {
    const std::size_t n = finals.size();
    std::int64_t ws_bytes = 0;
    std::vector<int> reps(n);
    for (std::size_t i = 0; i < n; ++i) {
      ws_bytes = std::max(ws_bytes, finals[i]->workspace);
      reps[i] = Rounds::reps(finals[i]->median_ms);
    }
    void* ws = workspace(ws_bytes);
    std::vector<bool> alive(n, true);
    std::vector<std::vector<double>> rounds(n), medians(n);
    std::string why;
    for (int round = 0; round < Rounds::max_rounds; ++round) {
      bool all_settled = true;
      for (std::size_t i = 0; i < n; ++i) {
        if (!alive[i]) continue;
        start_.record(stream_);
        for (int k = 0; k < reps[i] && alive[i]; ++k)
          alive[i] = ok(g_.execute_plan_at_index(handle_, uids_, ws, finals[i]->index), why);
        if (!alive[i]) continue;
        stop_.record(stream_);
        stop_.synchronize();
        rounds[i].push_back(stop_.elapsed_ms(start_) / reps[i]);
        if (round + 1 < Rounds::min_rounds) continue;
        medians[i].push_back(median(rounds[i]));
        all_settled = all_settled && Rounds::settled(medians[i]);
      }
      if (round + 1 >= Rounds::min_rounds && (all_settled || std::chrono::steady_clock::now() > deadline)) break;
    }
    for (std::size_t i = 0; i < n; ++i) {
      if (!alive[i] || rounds[i].empty()) continue;
      finals[i]->median_ms = median(rounds[i]);
      finals[i]->screened = false;
    }
  }

  // Runs a plan for about ms of GPU time, so that the clocks are up before the baseline is timed.
  void spin_up(std::int64_t index, std::int64_t workspace_bytes, double ms) {
    void* ws = workspace(workspace_bytes);
    std::string why;
    double spent = 0;
    for (int batch = 0; batch < 20 && spent < ms; ++batch) {
      start_.record(stream_);
      for (int k = 0; k < Rounds::max_reps; ++k)
        if (!ok(g_.execute_plan_at_index(handle_, uids_, ws, index), why)) return;
      stop_.record(stream_);
      stop_.synchronize();
      spent += stop_.elapsed_ms(start_);
    }
  }

 private:
  static bool is_float(fe::DataType_t t) {
    using D = fe::DataType_t;
    return t == D::FLOAT || t == D::HALF || t == D::BFLOAT16 || t == D::DOUBLE || t == D::FP8_E4M3 ||
           t == D::FP8_E5M2;
  }
  static bool ok(fe::error_t st, std::string& why) {
    if (st.is_good()) return true;
    why = st.get_message();
    return false;
  }
  void* workspace(std::int64_t bytes) {
    if (bytes <= 0) return nullptr;
    if (static_cast<std::int64_t>(ws_.bytes()) < bytes) ws_ = Storage(static_cast<std::size_t>(bytes), Device::cuda(device_));
    return ws_.data();
  }

  fe::graph::Graph& g_;
  int device_;
  cudaStream_t stream_;
  cudnnHandle_t handle_;
  std::vector<Storage> buffers_;
  std::vector<std::unique_ptr<std::int64_t[]>> host_;
  std::unordered_map<std::int64_t, void*> uids_;
  Storage ws_;
  Event start_, stop_;
};

// The baseline is timed after Bench::spin_up (about 3 ms of its runs) so that the GPU's clocks
// are up, unless this thread finished tuning a graph on the same device less than
// clocks_stay_up_ms ago: the GPU ran that graph's candidates then, and a model's first step tunes
// its graphs one after the other.
inline constexpr int clocks_stay_up_ms = 100;
struct LastTuned {
  int device = -1;
  std::chrono::steady_clock::time_point when{};
};
inline LastTuned& last_tuned() {
  thread_local LastTuned t;
  return t;
}

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::autotune::detail
