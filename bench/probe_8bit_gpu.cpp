// Which 8-bit convolutions cuDNN offers on this GPU, and how fast they are against bf16: the
// question the deploy engine's 8-bit mode depends on (docs/deploy.md). Per convolution shape of
// the deploy benchmarks' models (ResNet-18 for CIFAR at batch 256, the Fashion-MNIST CNN), NHWC:
//
//   bf16          conv + bias + ReLU, bf16 in and out (the engine's 16-bit step)
//   fp8->bf16     e4m3 x and w, conv, * descale_x * descale_w + bias, ReLU, bf16 out
//   fp8->fp8      the same with * scale_y and an e4m3 output (8-bit activations end to end)
//   int8->f32     int8 x and w, int32 accumulate, f32 out (cuDNN's int8 conv), + bias, ReLU
//
// For each: whether the graph validates and builds, the number of plans cuDNN's heuristics (mode
// A, then fallback) list and how many of them build, and the median of 20 calls of the fastest
// of the first 8 built plans (CUDA events around 5 calls queued back to back, after warm-up).
// Inputs are random bytes (timing only; values are not checked). Prints one JSON object.
//
//   probe_8bit_gpu
//
// Exits 77 without a GPU.
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

namespace fe = cudnn_frontend;

namespace {

struct ConvShape {
  const char* name;
  std::int64_t n, c, h, w, k, r, pad, stride;
};

struct Result {
  std::string status = "ok";
  std::int64_t listed = 0, built = 0;
  double best_ms = -1;
};

using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

TensorPtr nhwc(fe::graph::Graph& g, const char* name, std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w,
               fe::DataType_t t) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_dim({n, c, h, w})
                      .set_stride({c * h * w, 1, c * w, c})
                      .set_data_type(t));
}
TensorPtr scalar(fe::graph::Graph& g, const char* name) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_dim({1, 1, 1, 1})
                      .set_stride({1, 1, 1, 1})
                      .set_data_type(fe::DataType_t::FLOAT));
}

// Device memory filled with random bytes, freed at exit.
void* random_buffer(std::size_t bytes) {
  static std::vector<std::unique_ptr<void, void (*)(void*)>> keep;
  void* p = nullptr;
  if (cudaMalloc(&p, std::max<std::size_t>(bytes, 256)) != cudaSuccess) return nullptr;
  std::vector<unsigned char> host(bytes);
  std::mt19937 rng(static_cast<unsigned>(bytes));
  for (auto& b : host) b = static_cast<unsigned char>(rng() & 0x3f);  // small magnitudes in every 8-bit format
  cudaMemcpy(p, host.data(), bytes, cudaMemcpyHostToDevice);
  keep.emplace_back(p, [](void* q) { cudaFree(q); });
  return p;
}

std::size_t bytes_of(fe::DataType_t t) {
  switch (t) {
    case fe::DataType_t::FLOAT:
    case fe::DataType_t::INT32: return 4;
    case fe::DataType_t::BFLOAT16:
    case fe::DataType_t::HALF: return 2;
    default: return 1;
  }
}

enum class Variant { bf16, fp8_bf16, fp8_fp8, int8_f32 };
const char* name_of(Variant v) {
  constexpr const char* n[] = {"bf16", "fp8->bf16", "fp8->fp8", "int8->f32"};
  return n[static_cast<int>(v)];
}

Result probe(cudnnHandle_t handle, const ConvShape& s, Variant v) {
  Result r;
  const bool fp8 = v == Variant::fp8_bf16 || v == Variant::fp8_fp8, int8 = v == Variant::int8_f32;
  const auto in_t = fp8 ? fe::DataType_t::FP8_E4M3 : int8 ? fe::DataType_t::INT8 : fe::DataType_t::BFLOAT16;
  const auto out_t = v == Variant::fp8_fp8 ? fe::DataType_t::FP8_E4M3
                     : int8               ? fe::DataType_t::FLOAT
                                          : fe::DataType_t::BFLOAT16;
  const std::int64_t p = (s.h + 2 * s.pad - s.r) / s.stride + 1, q = (s.w + 2 * s.pad - s.r) / s.stride + 1;
  fe::graph::Graph g;
  g.set_io_data_type(int8 ? fe::DataType_t::INT8 : fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(int8 ? fe::DataType_t::INT32 : fe::DataType_t::FLOAT);
  auto x = nhwc(g, "x", s.n, s.c, s.h, s.w, in_t);
  auto w = nhwc(g, "w", s.k, s.c, s.r, s.r, in_t);
  auto y = g.conv_fprop(x, w,
                        fe::graph::Conv_fprop_attributes()
                            .set_padding({s.pad, s.pad})
                            .set_stride({s.stride, s.stride})
                            .set_dilation({1, 1}));
  std::unordered_map<TensorPtr, void*> pack;
  const auto mul = fe::graph::Pointwise_attributes().set_mode(fe::PointwiseMode_t::MUL).set_compute_data_type(fe::DataType_t::FLOAT);
  const auto add = fe::graph::Pointwise_attributes().set_mode(fe::PointwiseMode_t::ADD).set_compute_data_type(fe::DataType_t::FLOAT);
  const auto relu = fe::graph::Pointwise_attributes().set_mode(fe::PointwiseMode_t::RELU_FWD).set_compute_data_type(fe::DataType_t::FLOAT);
  if (int8) y->set_data_type(fe::DataType_t::INT32);
  if (fp8) {
    auto dx = scalar(g, "descale_x"), dw = scalar(g, "descale_w");
    y = g.pointwise(g.pointwise(y, dx, mul), dw, mul);
    pack[dx] = random_buffer(4);
    pack[dw] = random_buffer(4);
  }
  auto bias = nhwc(g, "bias", 1, s.k, 1, 1, int8 ? fe::DataType_t::FLOAT : fe::DataType_t::BFLOAT16);
  y = g.pointwise(g.pointwise(y, bias, add), relu);
  if (v == Variant::fp8_fp8) {
    auto sy = scalar(g, "scale_y");
    y = g.pointwise(y, sy, mul);
    pack[sy] = random_buffer(4);
  }
  y->set_output(true).set_data_type(out_t);
  pack[x] = random_buffer(static_cast<std::size_t>(s.n * s.c * s.h * s.w) * bytes_of(in_t));
  pack[w] = random_buffer(static_cast<std::size_t>(s.k * s.c * s.r * s.r) * bytes_of(in_t));
  pack[bias] = random_buffer(static_cast<std::size_t>(s.k) * (int8 ? 4 : 2));
  pack[y] = random_buffer(static_cast<std::size_t>(s.n * s.k * p * q) * bytes_of(out_t));

  const auto fail = [&](const char* step, fe::error_t e) {
    r.status = std::string(step) + ": " + e.get_message();
    std::replace(r.status.begin(), r.status.end(), '"', '\'');
    std::replace(r.status.begin(), r.status.end(), '\n', ' ');
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
  for (std::int64_t i = 0; i < r.listed; ++i) {
    if (!g.build_plan_at_index(handle, i).is_good()) continue;
    ++r.built;
    if (r.built > 8) continue;  // time the first 8 that build
    std::int64_t ws_bytes = 0;
    if (!g.get_workspace_size_plan_at_index(i, ws_bytes).is_good()) continue;
    void* ws = ws_bytes > 0 ? random_buffer(static_cast<std::size_t>(ws_bytes)) : nullptr;
    bool ok = true;
    for (int k = 0; k < 3 && ok; ++k) ok = g.execute_plan_at_index(handle, pack, ws, i).is_good();
    if (!ok || cudaDeviceSynchronize() != cudaSuccess) continue;
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
  return r;
}

}  // namespace

int main() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::puts("probe_8bit_gpu: SKIPPED (no CUDA device)");
    return 77;
  }
  cudnnHandle_t handle;
  if (cudnnCreate(&handle) != CUDNN_STATUS_SUCCESS) {
    std::fprintf(stderr, "probe_8bit_gpu: cudnnCreate failed\n");
    return 1;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  const ConvShape shapes[] = {
      {"resnet18 64->64 3x3 32x32 b256", 256, 64, 32, 32, 64, 3, 1, 1},
      {"resnet18 128->128 3x3 16x16 b256", 256, 128, 16, 16, 128, 3, 1, 1},
      {"resnet18 256->256 3x3 8x8 b256", 256, 256, 8, 8, 256, 3, 1, 1},
      {"resnet18 512->512 3x3 4x4 b256", 256, 512, 4, 4, 512, 3, 1, 1},
      {"fmnist 32->64 3x3 14x14 b256", 256, 32, 14, 14, 64, 3, 1, 1},
      {"fmnist 1->32 3x3 28x28 b256", 256, 1, 28, 28, 32, 3, 1, 1},
  };
  std::printf("{\"gpu\": \"%s\", \"cudnn\": %zu, \"rows\": [", prop.name, cudnnGetVersion());
  bool first = true;
  for (const auto& s : shapes)
    for (const Variant v : {Variant::bf16, Variant::fp8_bf16, Variant::fp8_fp8, Variant::int8_f32}) {
      const Result r = probe(handle, s, v);
      std::printf("%s\n {\"shape\": \"%s\", \"variant\": \"%s\", \"status\": \"%s\", \"plans_listed\": %lld, "
                  "\"plans_built\": %lld, \"best_ms\": %.4f}",
                  first ? "" : ",", s.name, name_of(v), r.status.c_str(), static_cast<long long>(r.listed),
                  static_cast<long long>(r.built), r.best_ms);
      std::fflush(stdout);
      first = false;
    }
  std::puts("\n]}");
  cudnnDestroy(handle);
  return 0;
}
