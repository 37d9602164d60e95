// deploy::detail::GraphReplays<In, Out>: one CUDA graph per batch size of a forward function of
// one input tensor, as the engines replay them (CompileOptions::cuda_graph). At a batch size's
// first call the function runs once (plans built, kernels loaded, workspaces grown: none of that
// may be captured) and is then captured; later calls copy x into the graph's input and replay.
// The replay runs on a stream of its own, ordered after the caller's current stream by an event,
// and the caller's stream waits for it; the output is copied out on the caller's stream. Each
// captured batch size keeps its activations in its graph's memory pool. Calls are serialized.
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
#include <string_view>
#include <utility>
#include <vector>

#include "cutrain/core/tensor.hpp"
#include "cutrain/cuda/cuda_graph.hpp"

namespace cutrain::inline CUTRAIN_ABI::deploy::detail {

template <class In, class Out>
class GraphReplays {
 public:
  explicit GraphReplays(int device) : stream_(device) {}

  // forward(static x) for x (its device's tensors; the graph's input takes `layout`), captured at
  // x.dim(0)'s first call and replayed: a copy of the output on the caller's stream.
  template <class F>
  Tensor<Out> replay(const Tensor<In>& x, Layout layout, const F& forward) {
    constexpr std::string_view op = "deploy::Engine";
    std::lock_guard lock(m_);
    const cudaStream_t caller = cuda::current_stream(), own = stream_.get();
    auto& slot = by_batch_[x.dim(0)];
    const bool fresh = !slot;
    if (fresh) {
      slot = std::make_unique<Replay>();
      slot->x = Tensor<In>(x.shape(), {.layout = layout, .device = x.device()});
    }
    slot->x.copy_from(x);
    ready_.record(caller);
    {
      cuda::StreamGuard on(own);
      cuda::check(cudaStreamWaitEvent(own, ready_.get(), 0), op, "cudaStreamWaitEvent");
      if (fresh) {
        try {
          (void)forward(std::as_const(slot->x));
          slot->graph.capture([&] { slot->y = forward(std::as_const(slot->x)); });
        } catch (...) {
          by_batch_.erase(x.dim(0));
          throw;
        }
      }
      slot->graph.replay();
      done_.record(own);
    }
    cuda::check(cudaStreamWaitEvent(caller, done_.get(), 0), op, "cudaStreamWaitEvent");
    return slot->y.clone(slot->y.layout());
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
  cuda::Stream stream_;
  cuda::Event ready_, done_;  // the caller's stream up to the call; ours up to its replay
  std::map<std::int64_t, std::unique_ptr<Replay>> by_batch_;
  mutable std::mutex m_;
};

}  // namespace cutrain::inline CUTRAIN_ABI::deploy::detail
