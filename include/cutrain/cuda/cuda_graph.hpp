// cuda::CudaGraph: captures work queued on this thread's stream (one whole training step, say)
// once, then replays it with one launch, without the host cost of dispatching each op again.
//
//   cuda::Stream stream;                 // capture needs a stream other than the default one
//   cuda::StreamGuard on(stream.get());  // run warm-up, capture and replays on it
//   step();                              // one step outside capture: plans built, kernels loaded
//   cuda::CudaGraph graph;
//   graph.capture([&] { step(); });      // records; nothing runs
//   for (...) { x_static.copy_from(next_x); graph.replay(); }
//
// What a captured step may and may not do:
//  - everything an op needs must exist before capture: cuDNN plans, NVRTC kernels and the
//    workspace arena are set up by the warm-up step. An op that would build a plan, load a
//    kernel or grow the arena throws instead (tuning never happens inside a capture).
//  - no host reads of device data (item(), to_vector()): they throw (CUDA refuses them).
//  - memory the step allocates comes from a pool private to this graph, so that no tensor
//    outside the graph is ever handed an address the graph writes; tensors created during
//    capture (gradients, the loss) keep their addresses, and each replay rewrites them.
//  - host-side state that changes per step (an optimizer's learning rate and step count) is
//    refreshed by hooks registered during capture (on_replay), run before each launch.
//  - inputs are read from the addresses used at capture: copy each new batch into the tensors
//    the captured step read.
#pragma once

#include "cutrain/core/abi.hpp"

#ifndef CUTRAIN_WITH_CUDA
#error "cutrain/cuda/ needs CUTRAIN_WITH_CUDA (link cutrain::cuda)"
#endif

#include <functional>
#include <string_view>
#include <utility>
#include <vector>

#include "cutrain/cuda/runtime.hpp"

namespace cutrain::inline CUTRAIN_ABI::cuda {

class CudaGraph {
 public:
  CudaGraph() = default;
  ~CudaGraph() {
    reset();
    if (done_) cudaEventDestroy(done_);
  }
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  // The graph this thread is capturing now, or nullptr.
  static CudaGraph* capturing() { return current(); }

  // Runs fn with this thread's stream in capture mode: the work fn queues is recorded, not run.
  // A graph captured before is dropped first. On an exception the capture is abandoned and the
  // graph stays empty.
  template <class F>
  void capture(F&& fn) {
    constexpr std::string_view op = "cuda::CudaGraph::capture";
    const cudaStream_t s = current_stream();
    CUTRAIN_REQUIRE(s != nullptr && s != cudaStreamLegacy && s != cudaStreamPerThread, InvalidArgument, op,
                    "needs a stream other than the default one: run warm-up, capture and replay under a "
                    "cuda::StreamGuard with a cuda::Stream");
    CUTRAIN_REQUIRE(current() == nullptr, InvalidArgument, op, "another capture is in progress on this thread");
    reset();
    pool_ = cutrain::detail::DeviceCache::instance().new_pool();
    check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), op, "cudaStreamBeginCapture");
    current() = this;
    cutrain::detail::capture_pool() = pool_;
    cudaGraph_t g = nullptr;
    try {
      std::forward<F>(fn)();
    } catch (...) {
      end_capture_state();
      cudaStreamEndCapture(s, &g);  // abandons the capture; its error is not the interesting one
      if (g) cudaGraphDestroy(g);
      (void)cudaGetLastError();
      hooks_.clear();
      throw;
    }
    end_capture_state();
    check(cudaStreamEndCapture(s, &g), op,
          "cudaStreamEndCapture (the step did something a capture cannot record, such as a host read of device "
          "data or work on another stream)");
    graph_ = g;
    check(cudaGraphInstantiateWithFlags(&exec_, graph_, 0), op, "cudaGraphInstantiate");
  }

  // Runs the hooks, then launches the captured work on this thread's current stream.
  void replay() {
    constexpr std::string_view op = "cuda::CudaGraph::replay";
    CUTRAIN_REQUIRE(exec_ != nullptr, InvalidArgument, op, "nothing captured yet (call capture() first)");
    CUTRAIN_REQUIRE(current() == nullptr, InvalidArgument, op, "cannot replay a graph while capturing");
    for (auto& h : hooks_) h();
    check(cudaGraphLaunch(exec_, current_stream()), op, "cudaGraphLaunch");
    if (!done_) check(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), op, "cudaEventCreate");
    check(cudaEventRecord(done_, current_stream()), op, "cudaEventRecord");
  }

  bool captured() const { return exec_ != nullptr; }
  // Number of nodes (kernels, copies, ...) in the captured graph.
  std::size_t nodes() const {
    std::size_t n = 0;
    if (graph_) check(cudaGraphGetNodes(graph_, nullptr, &n), "cuda::CudaGraph::nodes", "cudaGraphGetNodes");
    return n;
  }

  // Registers fn to run on the host before each replay (for state that changes between steps).
  // Only while capturing: the ops that need it call it from inside the captured work.
  void on_replay(std::function<void()> fn) {
    CUTRAIN_REQUIRE(current() == this, InvalidArgument, "cuda::CudaGraph::on_replay", "only while capturing");
    hooks_.push_back(std::move(fn));
  }

 private:
  static CudaGraph*& current() {
    thread_local CudaGraph* g = nullptr;
    return g;
  }
  void end_capture_state() {
    current() = nullptr;
    cutrain::detail::capture_pool() = nullptr;
  }
  void reset() noexcept {
    if (exec_) {
      // The last replay may still be running, on the pool's memory. Its event, not its stream:
      // the stream may be gone already.
      if (done_) cudaEventSynchronize(done_);
      cudaGraphExecDestroy(exec_);
    }
    if (graph_) cudaGraphDestroy(graph_);
    exec_ = nullptr;
    graph_ = nullptr;
    hooks_.clear();
    if (pool_) cutrain::detail::DeviceCache::instance().retire_pool(pool_);
    pool_ = nullptr;
  }

  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  cudaEvent_t done_ = nullptr;    // recorded after each replay
  cudaStream_t pool_ = nullptr;  // the allocator's tag for this graph's private memory
  std::vector<std::function<void()>> hooks_;
};

}  // namespace cutrain::inline CUTRAIN_ABI::cuda
