// Whether cuDNN has engines for the fusions that fold batch norm into the convolutions of a
// training step (NVIDIA's MLPerf ResNet recipe), and what they cost against the plain
// convolution: the question issue 23's ResNet-18 step target depends on. Per ResNet-18 (CIFAR)
// 3x3 convolution shape at batch 256, NHWC, in bf16 and f16:
//
//   conv                 y = conv(x, w)
//   sbr+conv             y = conv(relu(x * s + b), w): the previous batch norm's apply and
//                        ReLU as the convolution's prologue (s, b per channel)
//   conv+genstats        y, sum(y), sum(y^2) per channel: the next batch norm's statistics
//                        from the convolution's epilogue
//   sbr+conv+genstats    both
//   dgrad                dx = dgrad(dy, w)
//   dgrad+drelu(sbr)     dx = dgrad(dy, w) * relu'(x * s + b): the ReLU's backward recomputed
//                        from the batch norm's input
//   wgrad                dw = wgrad(dy, x)
//   sbr+wgrad            dw = wgrad(dy, relu(x * s + b))
//
// The prologue's intermediates are f32 ("mid": "f32", what cutrain's fusion graphs use) or the
// graph's own 16-bit type ("mid": "io", as cudnn-frontend's conv_genstats sample builds it).
// Status, plans listed and built (at most 8 built), and the fastest of them (cudnn_probe.hpp).
// Prints one JSON object.
//
//   probe_bn_fusion_gpu
//
// Exits 77 without a GPU.
#include <cstdio>
#include <string>

#include "cudnn_probe.hpp"

namespace {

using namespace cudnn_probe;

struct ConvShape {
  const char* name;
  std::int64_t n, c, h, w, k;  // 3x3, stride 1, padding 1: the output is [n, k, h, w]
};

enum class Variant { conv, sbr_conv, conv_genstats, sbr_conv_genstats, dgrad, dgrad_drelu_sbr, wgrad, sbr_wgrad };
const char* name_of(Variant v) {
  constexpr const char* n[] = {"conv",  "sbr+conv",         "conv+genstats", "sbr+conv+genstats",
                               "dgrad", "dgrad+drelu(sbr)", "wgrad",         "sbr+wgrad"};
  return n[static_cast<int>(v)];
}
bool has_prologue(Variant v) {
  return v == Variant::sbr_conv || v == Variant::sbr_conv_genstats || v == Variant::dgrad_drelu_sbr ||
         v == Variant::sbr_wgrad;
}

Result probe(cudnnHandle_t handle, const ConvShape& s, fe::DataType_t io, Variant v, bool mid_io) {
  fe::graph::Graph g;
  g.set_io_data_type(io)
      .set_intermediate_data_type(mid_io ? io : fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  Pack pack;
  const auto out = [&](const TensorPtr& t, std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w,
                       fe::DataType_t type) {
    t->set_output(true).set_dim({n, c, h, w}).set_stride({c * h * w, 1, c * w, c}).set_data_type(type);
    bind(pack, t);
  };
  const auto input = [&](const char* name, std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w) {
    auto t = nhwc(g, name, n, c, h, w, io);
    bind(pack, t);
    return t;
  };
  TensorPtr x_;  // made where a variant reads it: a graph must use every tensor it has
  const auto x = [&] { return x_ ? x_ : (x_ = input("x", s.n, s.c, s.h, s.w)); };
  // The batch norm's apply and ReLU on x: x * s + b (and its ReLU where the variant wants it).
  const auto bn = [&] {
    const auto sc = input("scale", 1, s.c, 1, 1), sh = input("shift", 1, s.c, 1, 1);
    return g.pointwise(g.pointwise(x(), sc, pointwise(fe::PointwiseMode_t::MUL)), sh,
                       pointwise(fe::PointwiseMode_t::ADD));
  };
  const auto sbr = [&] { return g.pointwise(bn(), pointwise(fe::PointwiseMode_t::RELU_FWD)); };
  const auto fprop = fe::graph::Conv_fprop_attributes().set_padding({1, 1}).set_stride({1, 1}).set_dilation({1, 1});
  const auto dgrad = fe::graph::Conv_dgrad_attributes().set_padding({1, 1}).set_stride({1, 1}).set_dilation({1, 1});
  const auto wgrad = fe::graph::Conv_wgrad_attributes().set_padding({1, 1}).set_stride({1, 1}).set_dilation({1, 1});
  switch (v) {
    case Variant::conv:
    case Variant::sbr_conv:
    case Variant::conv_genstats:
    case Variant::sbr_conv_genstats: {
      const auto w = input("w", s.k, s.c, 3, 3);
      const auto y = g.conv_fprop(v == Variant::sbr_conv || v == Variant::sbr_conv_genstats ? sbr() : x(), w, fprop);
      out(y, s.n, s.k, s.h, s.w, io);
      if (v == Variant::conv_genstats || v == Variant::sbr_conv_genstats) {
        const auto [sum, sq_sum] = g.genstats(y, fe::graph::Genstats_attributes());
        out(sum, 1, s.k, 1, 1, fe::DataType_t::FLOAT);
        out(sq_sum, 1, s.k, 1, 1, fe::DataType_t::FLOAT);
      }
      break;
    }
    case Variant::dgrad:
    case Variant::dgrad_drelu_sbr: {
      const auto dy = input("dy", s.n, s.k, s.h, s.w), w = input("w", s.k, s.c, 3, 3);
      auto dx = g.conv_dgrad(dy, w, dgrad);
      if (v == Variant::dgrad_drelu_sbr) {
        dx->set_dim({s.n, s.c, s.h, s.w}).set_stride({s.c * s.h * s.w, 1, s.c * s.w, s.c});
        dx = g.pointwise(dx, bn(), pointwise(fe::PointwiseMode_t::RELU_BWD));
      }
      out(dx, s.n, s.c, s.h, s.w, io);
      break;
    }
    case Variant::wgrad:
    case Variant::sbr_wgrad: {
      const auto dy = input("dy", s.n, s.k, s.h, s.w);
      const auto dw = g.conv_wgrad(dy, v == Variant::sbr_wgrad ? sbr() : x(), wgrad);
      out(dw, s.k, s.c, 3, 3, fe::DataType_t::FLOAT);
      break;
    }
  }
  return plan_and_time(handle, g, pack, 8);
}

}  // namespace

int main() {
  cudnnHandle_t handle;
  if (const int rc = open_probe("probe_bn_fusion_gpu", handle)) return rc;
  const ConvShape shapes[] = {
      {"resnet18 64->64 3x3 32x32 b256", 256, 64, 32, 32, 64},
      {"resnet18 256->256 3x3 8x8 b256", 256, 256, 8, 8, 256},
  };
  bool first = true;
  for (const auto& s : shapes)
    for (const auto io : {fe::DataType_t::BFLOAT16, fe::DataType_t::HALF})
      for (int vi = 0; vi <= static_cast<int>(Variant::sbr_wgrad); ++vi) {
        const auto v = static_cast<Variant>(vi);
        for (const bool mid_io : {false, true}) {
          if (mid_io && !has_prologue(v)) continue;
          const std::string fields = std::string("\"shape\": \"") + s.name + "\", \"dtype\": \"" +
                                     (io == fe::DataType_t::HALF ? "f16" : "bf16") + "\", \"variant\": \"" +
                                     name_of(v) + "\", \"mid\": \"" + (mid_io ? "io" : "f32") + "\"";
          print_row(first, fields, probe(handle, s, io, v, mid_io));
          first = false;
        }
      }
  std::puts("\n]}");
  cudnnDestroy(handle);
  return 0;
}
