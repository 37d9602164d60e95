// The op-level profiler on the GPU: ops are timed with CUDA events (positive GPU times, in the
// order they ran, on cuda:0's trace row), a bigger matmul takes longer than a small one, and
// ops queued while a CUDA graph is captured are not recorded.
#include "parity.hpp"

#include <string>

#include "cutrain/core/profile.hpp"
#include "cutrain/cuda/cuda_graph.hpp"
#include "cutrain/ops/elementwise.hpp"
#include "cutrain/ops/matmul.hpp"

namespace cutrain_test_profile_gpu {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;

TEST_CASE("gpu profile: CUDA events time the ops; captured ops are not recorded", "[gpu][profile]") {
  cuda::Stream stream;
  cuda::StreamGuard on(stream.get());
  Rng rng(2311);
  const auto small = random_pair<float>(Shape{64, 64}, rng, Layout::row_major).first;
  const auto big = random_pair<float>(Shape{2048, 2048}, rng, Layout::row_major).first;
  (void)ops::matmul(small, small);  // warm-up: plans and kernels
  (void)ops::matmul(big, big);
  (void)ops::add(small, small);
  profile::Session s;
  (void)ops::matmul(small, small);
  (void)ops::matmul(big, big);
  (void)ops::add(small, small);
  cuda::CudaGraph graph;
  Tensor<float> y;
  graph.capture([&] { y = ops::add(small, small); });
  graph.replay();
  s.stop();
  REQUIRE(s.records().size() == 3);
  CHECK(s.records()[0].op == "matmul");
  CHECK(s.records()[2].op == "add");
  for (const auto& r : s.records()) {
    CHECK(r.device == Device::cuda(0));
    CHECK(r.ms > 0);
  }
  CHECK(s.records()[0].start_ms == 0);  // the device's first op starts its clock
  CHECK(s.records()[1].start_ms >= s.records()[0].start_ms + s.records()[0].ms - 1e-3);
  INFO("matmul 64: " << s.records()[0].ms << " ms, 2048: " << s.records()[1].ms << " ms");
  CHECK(s.records()[1].ms > s.records()[0].ms);
  CHECK(s.chrome_trace()["traceEvents"][0]["tid"] == "cuda:0");
}

}  // namespace cutrain_test_profile_gpu
