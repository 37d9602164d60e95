// dist::Communicator with a world of one on cuda:0: init through the store, every collective in
// f32, bf16 and f16 (a world of one leaves values unchanged: sum = avg = broadcast = gather =
// scatter of itself), and the errors for a CPU tensor, a wrong count and a bad root.
// Not in any CMake target (it needs -lnccl). Build and run on a GPU machine, one command:
//   g++ -std=gnu++20 -O1 -DCUTRAIN_WITH_CUDA -include nlohmann/json.hpp -Itests -Iinclude
//     -isystem /usr/local/cuda/include -isystem <cudnn-frontend include> -isystem /usr/include/eigen3
//     tests/nccl/test_nccl_world1.cpp tests/gpu/gpu_main.cpp -L/usr/local/cuda/lib64
//     -lnccl -lcudart -lcudnn -lcublasLt -lcublas -lnvrtc -lcuda -o /tmp/nccl1 && /tmp/nccl1
#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <vector>

#include "cutrain/cutrain.hpp"
#include "cutrain/dist/nccl.hpp"

using namespace cutrain;

namespace {

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

template <class T>
void world_of_one(dist::Communicator& comm) {
  const std::vector<float> v{1.5f, -2.0f, 0.25f, 8.0f, 3.0f, -0.5f};
  const auto host = cast<T>(Tensor<float>::from_vector(v, Shape{2, 3}));
  const auto want = host.to_vector();
  const Device dev = Device::cuda(0);
  auto t = host.to(dev);
  comm.all_reduce(t, dist::ReduceOp::sum);
  comm.all_reduce(t, dist::ReduceOp::avg);
  comm.broadcast(t, 0);
  Tensor<T> gathered(Shape{6}, {.device = dev});
  comm.all_gather(t, gathered);
  Tensor<T> scattered(Shape{2, 3}, {.device = dev});
  comm.reduce_scatter(gathered, scattered, dist::ReduceOp::avg);
  cuda::synchronize();
  comm.check_async();
  CHECK(t.to(Device::cpu()).to_vector() == want);
  CHECK(gathered.to(Device::cpu()).to_vector() == want);
  CHECK(scattered.to(Device::cpu()).to_vector() == want);
}

}  // namespace

TEST_CASE("nccl: a world of one on cuda:0", "[dist][nccl]") {
  auto env = dist::Env::from_map({{"MASTER_PORT", std::to_string(free_port())}});
  dist::Store store(env, {.timeout = std::chrono::seconds(30)});
  dist::Communicator comm(store, 0);
  CHECK(comm.rank() == 0);
  CHECK(comm.world_size() == 1);
  world_of_one<float>(comm);
  world_of_one<cutrain::bfloat16>(comm);
  world_of_one<cutrain::half>(comm);

  Tensor<float> cpu(Shape{4});
  CHECK_THROWS_AS(comm.all_reduce(cpu), DeviceError);
  Tensor<float> a(Shape{4}, {.device = Device::cuda(0)}), b(Shape{3}, {.device = Device::cuda(0)});
  CHECK_THROWS_AS(comm.all_gather(a, b), InvalidArgument);
  CHECK_THROWS_AS(comm.broadcast(a, 1), InvalidArgument);
  comm.abort();
  CHECK_THROWS_AS(comm.all_reduce(a), dist::DistError);
}
