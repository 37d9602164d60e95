// dist::Communicator with a world of one on cuda:0: init through the store, every collective in
// f32, bf16 and f16 (a world of one leaves values unchanged: sum = avg = broadcast = gather =
// scatter of itself), and the errors for a CPU tensor, a wrong count and a bad root; NcclGroup
// and DataParallel (a world of one: the plain gradients).
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
#include "cutrain/dist/data_parallel.hpp"
#include "cutrain/dist/nccl.hpp"
#include "cutrain/nn.hpp"

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

TEST_CASE("nccl: NcclGroup and DataParallel with a world of one on cuda:0", "[dist][nccl]") {
  auto env = dist::Env::from_map({{"MASTER_PORT", std::to_string(free_port())}});
  dist::Store store(env, {.timeout = std::chrono::seconds(30)});
  dist::NcclGroup pg(store, 0);
  CHECK(pg.backend() == "nccl");
  CHECK(pg.size() == 1);
  Rng rng(3);
  const auto host = Tensor<float>::randn({5, 7}, rng);
  auto t = host.to(Device::cuda(0));
  pg.all_reduce(t, dist::ReduceOp::avg).wait();
  pg.broadcast(t, 0).wait();
  pg.barrier();
  CHECK(t.to(Device::cpu()).to_vector() == host.to_vector());
  CHECK_THROWS_AS(pg.all_reduce(Tensor<float>::zeros({2})), DeviceError);  // a CPU tensor

  // A world of one: DataParallel's gradients are the plain ones (averaged over one rank).
  nn::Linear<float> lin({.in = 7, .out = 3, .seed = 4}), ref({.in = 7, .out = 3, .seed = 4});
  lin.to(Device::cuda(0));
  ref.to(Device::cuda(0));
  dist::DataParallel dp(lin, pg, {.bucket_cap_bytes = 64, .first_bucket_cap_bytes = 64});
  const autograd::Var<float> x(host.to(Device::cuda(0)));
  for (int step = 0; step < 2; ++step) {
    dp.backward(autograd::sum(lin(x)));
    autograd::sum(ref(x)).backward();
    CHECK(lin.weight.grad().to(Device::cpu()).to_vector() == ref.weight.grad().to(Device::cpu()).to_vector());
    CHECK(lin.bias.grad().to(Device::cpu()).to_vector() == ref.bias.grad().to(Device::cpu()).to_vector());
    lin.weight.zero_grad();
    lin.bias.zero_grad();
    ref.weight.zero_grad();
    ref.bias.zero_grad();
  }
  CHECK(dp.started_early() == dp.bucket_count());  // after the first backward every bucket starts early
}
