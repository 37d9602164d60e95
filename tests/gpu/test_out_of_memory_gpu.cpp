// Device memory exhaustion: an allocation larger than the card throws cutrain::OutOfMemory with
// the bytes asked for, what the caching allocator holds and what the device has left; an op whose
// output does not fit names the op; the allocator returns its cached blocks to CUDA and retries
// once before failing (an allocation that fits only after that succeeds); and afterwards the
// process goes on (a smaller op runs and matches the CPU).
#include "parity.hpp"

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "cutrain/cuda/allocator.hpp"
#include "cutrain/cuda/runtime.hpp"
#include "cutrain/ops/linear.hpp"

namespace cutrain_test_out_of_memory_gpu {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;

namespace {
std::size_t device_free(std::size_t* total = nullptr) {
  std::size_t free_b = 0, total_b = 0;
  REQUIRE(cudaMemGetInfo(&free_b, &total_b) == cudaSuccess);
  if (total) *total = total_b;
  return free_b;
}
}  // namespace

TEST_CASE("gpu out of memory: a clear OutOfMemory, the cache freed and retried, and the process goes on",
          "[gpu][out_of_memory]") {
  const Device dev = Device::cuda(0);
  std::size_t total = 0;
  device_free(&total);
  auto& cache = cutrain::detail::DeviceCache::instance();

  // More than the card: the allocator's own message.
  const auto too_many = static_cast<std::int64_t>(total / sizeof(float) + (std::int64_t{1} << 28));
  try {
    Tensor<float> t(Shape{too_many}, {.device = dev});
    FAIL("an allocation of " << too_many * 4 << " bytes succeeded");
  } catch (const OutOfMemory& e) {
    const std::string m = e.what();
    INFO(m);
    CHECK(m.find("out of device memory") != std::string::npos);
    CHECK(m.find(std::to_string(too_many * 4)) != std::string::npos);
    CHECK(m.find("bytes free") != std::string::npos);
    CHECK(m.find("tensors hold") != std::string::npos);
  }

  // An op's output that does not fit: the error names the op.
  Rng rng(9401);
  auto x = random_pair<float>({1 << 20, 8}, rng, Layout::row_major).first;
  const auto rows = static_cast<std::int64_t>(total / (sizeof(float) << 20)) + 1024;
  auto w = random_pair<float>({rows, 8}, rng, Layout::row_major).first;
  try {
    (void)ops::linear_forward(x, w);
    FAIL("a linear output of " << rows << " x 2^20 floats fit");
  } catch (const OutOfMemory& e) {
    INFO(e.what());
    CHECK(e.op() == "linear_forward");
    CHECK(std::string(e.what()).find("out of device memory") != std::string::npos);
  }

  // Fill most of the card with cached blocks, then ask for one block that fits only once they
  // are returned to CUDA: the retry makes it succeed.
  {
    cuda::empty_cache();
    const std::size_t chunk = std::size_t{1} << 30;
    std::vector<Tensor<std::uint8_t>> held;
    while (device_free() > 3 * chunk)
      held.emplace_back(Shape{static_cast<std::int64_t>(chunk)}, TensorOptions{.device = dev});
    REQUIRE(held.size() >= 2);
    held.clear();  // back to the cache, not to CUDA
    const std::size_t cached = cache.cached_bytes();
    CHECK(cached >= 2 * chunk);
    const auto big = static_cast<std::int64_t>(device_free() + chunk);
    Tensor<std::uint8_t> fits(Shape{big}, {.device = dev});  // needs the cache freed first
    CHECK(fits.numel() == big);
    CHECK(cache.cached_bytes() < cached);
  }

  // The process goes on: a small op runs and matches the CPU.
  auto [a, ar] = random_pair<float>({64, 32}, rng, Layout::row_major);
  auto [b, br] = random_pair<float>({16, 32}, rng, Layout::row_major);
  check_close("linear after out of memory", ops::linear_forward(a, b), ops::linear_forward(ar, br));
}

}  // namespace cutrain_test_out_of_memory_gpu
