// Which 8-bit convolutions cuDNN offers on this GPU, and how fast they are against bf16: the
// question the deploy engine's 8-bit mode depends on (docs/deploy.md). Per convolution shape of
// the deploy benchmarks' models (ResNet-18 for CIFAR at batch 256, the Fashion-MNIST CNN), NHWC:
//
//   bf16          conv + bias + ReLU, bf16 in and out (the engine's 16-bit step)
//   fp8->bf16     e4m3 x and w, conv, * descale_x * descale_w + bias, ReLU, bf16 out
//   fp8->fp8      the same with * scale_y and an e4m3 output (8-bit activations end to end)
//   fp8->both     the bf16 output and the e4m3 one (* scale_y) from one graph: a layer whose
//                 output the next e4m3 convolution reads as it is, and a residual add in bf16
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
#include <cstdio>
#include <string>

#include "cudnn_probe.hpp"

namespace {

using namespace cudnn_probe;

struct ConvShape {
  const char* name;
  std::int64_t n, c, h, w, k, r, pad, stride;
};

enum class Variant { bf16, fp8_bf16, fp8_fp8, fp8_both, int8_f32 };
const char* name_of(Variant v) {
  constexpr const char* n[] = {"bf16", "fp8->bf16", "fp8->fp8", "fp8->both", "int8->f32"};
  return n[static_cast<int>(v)];
}

Result probe(cudnnHandle_t handle, const ConvShape& s, Variant v) {
  const bool fp8 = v == Variant::fp8_bf16 || v == Variant::fp8_fp8 || v == Variant::fp8_both;
  const bool int8 = v == Variant::int8_f32;
  const auto in_t = fp8 ? fe::DataType_t::FP8_E4M3 : int8 ? fe::DataType_t::INT8 : fe::DataType_t::BFLOAT16;
  const auto out_t = v == Variant::fp8_fp8 || v == Variant::fp8_both ? fe::DataType_t::FP8_E4M3
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
  Pack pack;
  const auto mul = pointwise(fe::PointwiseMode_t::MUL), add = pointwise(fe::PointwiseMode_t::ADD);
  const auto relu = pointwise(fe::PointwiseMode_t::RELU_FWD);
  if (int8) y->set_data_type(fe::DataType_t::INT32);
  if (fp8) {
    auto dx = scalar(g, "descale_x"), dw = scalar(g, "descale_w");
    y = g.pointwise(g.pointwise(y, dx, mul), dw, mul);
    bind(pack, dx);
    bind(pack, dw);
  }
  auto bias = nhwc(g, "bias", 1, s.k, 1, 1, int8 ? fe::DataType_t::FLOAT : fe::DataType_t::BFLOAT16);
  y = g.pointwise(g.pointwise(y, bias, add), relu);
  if (v == Variant::fp8_both) {  // y in bf16, and y * scale_y in e4m3
    y->set_output(true).set_data_type(fe::DataType_t::BFLOAT16);
    pack[y] = random_buffer(static_cast<std::size_t>(s.n * s.k * p * q) * 2);
  }
  if (v == Variant::fp8_fp8 || v == Variant::fp8_both) {
    auto sy = scalar(g, "scale_y");
    y = g.pointwise(y, sy, mul);
    bind(pack, sy);
  }
  y->set_output(true).set_data_type(out_t);
  for (const auto& t : {x, w, bias}) bind(pack, t);
  // y's dims are inferred when the graph validates: its buffer is sized here.
  pack[y] = random_buffer(static_cast<std::size_t>(s.n * s.k * p * q) * bytes_of(out_t));
  return plan_and_time(handle, g, pack);
}

}  // namespace

int main() {
  cudnnHandle_t handle;
  if (const int rc = open_probe("probe_8bit_gpu", handle)) return rc;
  const ConvShape shapes[] = {
      {"resnet18 64->64 3x3 32x32 b256", 256, 64, 32, 32, 64, 3, 1, 1},
      {"resnet18 128->128 3x3 16x16 b256", 256, 128, 16, 16, 128, 3, 1, 1},
      {"resnet18 256->256 3x3 8x8 b256", 256, 256, 8, 8, 256, 3, 1, 1},
      {"resnet18 512->512 3x3 4x4 b256", 256, 512, 4, 4, 512, 3, 1, 1},
      {"fmnist 32->64 3x3 14x14 b256", 256, 32, 14, 14, 64, 3, 1, 1},
      {"fmnist 1->32 3x3 28x28 b256", 256, 1, 28, 28, 32, 3, 1, 1},
  };
  bool first = true;
  for (const auto& s : shapes)
    for (const Variant v : {Variant::bf16, Variant::fp8_bf16, Variant::fp8_fp8, Variant::fp8_both, Variant::int8_f32}) {
      print_row(first, std::string("\"shape\": \"") + s.name + "\", \"variant\": \"" + name_of(v) + "\"", probe(handle, s, v));
      first = false;
    }
  std::puts("\n]}");
  cudnnDestroy(handle);
  return 0;
}
