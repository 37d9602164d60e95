// deploy::detail::GraphReplays<In, Out>: one CUDA graph per batch size of a forward function of
// one input tensor, as the engines replay them (CompileOptions::cuda_graph). At a batch size's
// first call the function runs once (plans built, kernels loaded, workspaces grown: none of that
// may be captured) and is then captured; later calls copy x into the graph's input and replay.
// The replay runs on a stream of its own, ordered after the caller's current stream by an event,
// and the caller's stream waits for it; the output is copied out on the caller's stream. Each
// captured batch size keeps its activations in its graph's memory pool. Calls are serialized, on
// the host and on the GPU (a call from another stream waits for the previous one's copies).
#pragma once

#include "cutrain/core/abi.hpp"

#ifndef CUTRAIN_WITH_CUDA
#error "cutrain/deploy/graph_replay.hpp needs CUTRAIN_WITH_CUDA (link cutrain::cuda)"
#endif

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "cutrain/core/tensor.hpp"
#include "cutrain/cuda/cuda_graph.hpp"

namespace cutrain::inline CUTRAIN_ABI::deploy::detail {

template <class In, class Out>
class GraphReplays {
 public:
  // The stream and events are made at the first replay: an engine never replayed (a GPT engine's
  // body, run inside its owner's graph) makes none.
  explicit GraphReplays(int device) : device_(device) {}

  // forward(static x) for x (its device's tensors; the graph's input takes `layout`), captured at
  // x.dim(0)'s first call and replayed: a copy of the output on the caller's stream. op names the
  // engine in errors. Nothing is kept of a first call that throws.
  template <class F>
  Tensor<Out> replay(std::string_view op, const Tensor<In>& x, Layout layout, const F& forward) {
    std::lock_guard lock(m_);
    if (!sync_) {
      cutrain::detail::DeviceGuard on(device_);
      sync_ = std::make_unique<Sync>(device_);
    }
    auto& [stream, ready, done, copied] = *sync_;
    const cudaStream_t caller = cuda::current_stream(), own = stream.get();
    std::unique_ptr<Replay> fresh;
    Replay* slot = nullptr;
    if (auto it = by_batch_.find(x.dim(0)); it != by_batch_.end()) {
      slot = it->second.get();
    } else {
      fresh = std::make_unique<Replay>();
      fresh->x = Tensor<In>(x.shape(), {.layout = layout, .device = x.device()});
      slot = fresh.get();
    }
    // A previous call from another stream: its replay must have read x, its copy-out read y (on
    // one stream, the stream's order and ready see to both).
    const bool other = last_caller_.has_value() && *last_caller_ != caller;
    if (other) cuda::check(cudaStreamWaitEvent(caller, done.get(), 0), op, "cudaStreamWaitEvent");
    slot->x.copy_from(x);
    ready.record(caller);
    {
      cuda::StreamGuard on(own);
      cuda::check(cudaStreamWaitEvent(own, ready.get(), 0), op, "cudaStreamWaitEvent");
      if (other) cuda::check(cudaStreamWaitEvent(own, copied.get(), 0), op, "cudaStreamWaitEvent");
      if (fresh) {
        (void)forward(std::as_const(slot->x));  // plans built, kernels loaded: none of it may be captured
        slot->graph.capture([&] { slot->y = forward(std::as_const(slot->x)); });
      }
      slot->graph.replay();
      done.record(own);
    }
    cuda::check(cudaStreamWaitEvent(caller, done.get(), 0), op, "cudaStreamWaitEvent");
    Tensor<Out> y = slot->y.clone(slot->y.layout());
    copied.record(caller);
    last_caller_ = caller;
    if (fresh) by_batch_.emplace(x.dim(0), std::move(fresh));
    return y;
  }

  // Drops every captured graph (their forward changed): the next call at each batch captures anew.
  void clear() {
    std::lock_guard lock(m_);
    by_batch_.clear();
  }

  // The batch sizes captured so far, with each graph's node count.
  std::vector<std::pair<std::int64_t, std::size_t>> captured() const {
    std::lock_guard lock(m_);
    std::vector<std::pair<std::int64_t, std::size_t>> r;
    for (const auto& [batch, c] : by_batch_) r.emplace_back(batch, c->graph.nodes());
    return r;
  }

 private:
  struct Replay {
    cuda::CudaGraph graph;  // first: destroyed last, after the tensors of its pool
    Tensor<In> x;
    Tensor<Out> y;
  };
  struct Sync {
    explicit Sync(int device) : stream(device) {}
    cuda::Stream stream;
    // The caller's stream up to the call; ours up to its replay; the caller's up to the copy-out.
    cuda::Event ready, done, copied;
  };
  int device_;
  std::unique_ptr<Sync> sync_;
  std::optional<cudaStream_t> last_caller_;  // the stream of the last call that completed
  std::map<std::int64_t, std::unique_ptr<Replay>> by_batch_;
  mutable std::mutex m_;
};

}  // namespace cutrain::inline CUTRAIN_ABI::deploy::detail
