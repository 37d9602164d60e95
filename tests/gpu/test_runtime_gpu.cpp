// The CUDA runtime layer: the caching allocator, streams, stream guards and events.
#include "parity.hpp"

#include "cutrain/cuda/runtime.hpp"

namespace cutrain_test_runtime_gpu {  // one per file: the unity build compiles files together

using namespace cutrain;

TEST_CASE("gpu caching allocator reuses a freed block of the same size on the same stream") {
  void* first = nullptr;
  {
    Tensor<float> a(Shape{1000, 1000}, {.device = Device::cuda(0)});
    first = a.data();
  }
  CHECK(cuda::cached_bytes() >= 4000000);
  Tensor<float> b(Shape{1000, 1000}, {.device = Device::cuda(0)});
  CHECK(b.data() == first);  // no cudaMalloc: the cached block came back
  Tensor<float> c(Shape{1000, 1000}, {.device = Device::cuda(0)});
  CHECK(c.data() != b.data());
  cuda::empty_cache();
  CHECK(cuda::cached_bytes() == 0);
}

TEST_CASE("gpu blocks do not move between streams; Stream, StreamGuard and Event work") {
  cuda::Stream s;
  void* on_default = nullptr;
  {
    Tensor<float> a(Shape{4096}, {.device = Device::cuda(0)});
    on_default = a.data();
  }
  {
    cuda::StreamGuard guard(s.get());
    CHECK(cuda::current_stream() == s.get());
    Tensor<float> b(Shape{4096}, {.device = Device::cuda(0)});
    CHECK(b.data() != on_default);  // the default stream's block is not handed to another stream
    cuda::Event start, stop;
    start.record();
    b.fill(1.5f);
    auto z = Tensor<float>::zeros({1 << 20}, {.device = Device::cuda(0)});
    stop.record();
    stop.synchronize();
    CHECK(stop.elapsed_ms(start) >= 0.0f);
    for (float v : b.to_vector()) REQUIRE(v == 1.5f);
    for (float v : z.to_vector()) REQUIRE(v == 0.0f);
  }
  CHECK(cuda::current_stream() == nullptr);
  s.synchronize();
}

}  // namespace cutrain_test_runtime_gpu
