// nn::ResidualBlock: relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)), the ResNet basic block.
// The shortcut is the identity, or a 1x1 conv + batch norm when the stride or width changes.
// Each batch norm runs with what follows it as one op (BatchNorm2d::forward_fused): bn1 with its
// ReLU, bn2 with the residual add and the last ReLU; set_fusion(false) runs them apart.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>
#include <optional>

#include "cutrain/nn/batch_norm.hpp"
#include "cutrain/nn/conv2d.hpp"

namespace cutrain::inline CUTRAIN_ABI::nn {

struct ResidualBlockOptions {
  std::int64_t in = 0;
  std::int64_t out = 0;  // 0: same as in
  int stride = 1;
  std::uint64_t seed = 0;
};

template <class T>
class ResidualBlock : public Module<ResidualBlock<T>, T> {
 public:
  explicit ResidualBlock(const ResidualBlockOptions& o)
      : out_(o.out > 0 ? o.out : o.in),
        conv1({.in = o.in, .out = out_, .kernel = 3, .stride = o.stride, .padding = 1, .bias = false, .seed = o.seed}),
        bn1({.features = out_}),
        conv2({.in = out_, .out = out_, .kernel = 3, .padding = 1, .bias = false, .seed = o.seed + 1}),
        bn2({.features = out_}) {
    if (o.stride != 1 || out_ != o.in) {
      shortcut_conv.emplace(Conv2dOptions{.in = o.in, .out = out_, .kernel = 1, .stride = o.stride, .bias = false,
                                          .init = Init::xavier_uniform, .seed = o.seed + 2});
      shortcut_bn.emplace(BatchNormOptions{.features = out_});
    }
  }

  template <RunsIn<T> X>
  Var<X> operator()(const Var<X>& x) {
    if (fuse_) {
      const ActivationParams relu{.kind = cutrain::Activation::relu};
      Var<X> h = bn1.forward_fused(conv1(x), relu);
      h = conv2(h);
      Var<X> s = shortcut_conv ? (*shortcut_bn)((*shortcut_conv)(x)) : x;
      return bn2.forward_fused(h, relu, s);
    }
    Var<X> h = autograd::relu(bn1(conv1(x)));
    h = bn2(conv2(h));
    Var<X> s = shortcut_conv ? (*shortcut_bn)((*shortcut_conv)(x)) : x;
    return autograd::relu(autograd::add(h, s));
  }

  void visit_params(const std::string& prefix, const ParamVisitor<T>& f) {
    conv1.visit_params(join_name(prefix, "conv1"), f);
    bn1.visit_params(join_name(prefix, "bn1"), f);
    conv2.visit_params(join_name(prefix, "conv2"), f);
    bn2.visit_params(join_name(prefix, "bn2"), f);
    if (shortcut_conv) {
      shortcut_conv->visit_params(join_name(prefix, "shortcut.conv"), f);
      shortcut_bn->visit_params(join_name(prefix, "shortcut.bn"), f);
    }
  }
  void visit_buffers(const std::string& prefix, const BufferVisitor<T>& f) {
    bn1.visit_buffers(join_name(prefix, "bn1"), f);
    bn2.visit_buffers(join_name(prefix, "bn2"), f);
    if (shortcut_bn) shortcut_bn->visit_buffers(join_name(prefix, "shortcut.bn"), f);
  }
  void set_fusion(bool on) { fuse_ = on; }
  void set_training(bool on) {
    this->training_ = on;
    bn1.set_training(on);
    bn2.set_training(on);
    if (shortcut_bn) shortcut_bn->set_training(on);
  }

 private:
  std::int64_t out_;
  bool fuse_ = true;

 public:
  Conv2d<T> conv1;
  BatchNorm2d<T> bn1;
  Conv2d<T> conv2;
  BatchNorm2d<T> bn2;
  std::optional<Conv2d<T>> shortcut_conv;
  std::optional<BatchNorm2d<T>> shortcut_bn;
};

}  // namespace cutrain::inline CUTRAIN_ABI::nn
