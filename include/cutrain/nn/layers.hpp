// Stateless modules: activations, softmax, pooling, flatten, dropout. Not templates: their call operator
// takes a Var of any element type, so they read as nn::ReLU{} and nn::MaxPool2d({.kernel = 2}).
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>

#include "cutrain/autograd/functions.hpp"
#include "cutrain/core/random.hpp"

namespace cutrain::inline CUTRAIN_ABI::nn {

struct Activation {
  ActivationParams params;
  explicit Activation(const ActivationParams& p = {}) : params(p) {}
  template <class T>
  autograd::Var<T> operator()(const autograd::Var<T>& x) const { return autograd::activation(x, params); }
};

struct ReLU {
  template <class T>
  autograd::Var<T> operator()(const autograd::Var<T>& x) const { return autograd::relu(x); }
};

// softmax along axis (negative counts from the end): a classifier's probabilities.
struct Softmax {
  int axis = -1;
  template <class T>
  autograd::Var<T> operator()(const autograd::Var<T>& x) const { return autograd::softmax(x, axis); }
};

struct Pool2dOptions {
  int kernel = 2;
  int stride = 0;  // 0: the kernel size
  int padding = 0;
  bool count_include_pad = true;  // AvgPool2d only
  bool ceil_mode = false;
  int dilation = 1;  // spacing of a window's taps (docs/ops/pooling.md)
  // Padding 'same' (padding must be 0): the output is ceil(input / stride), the padding worked out
  // per input (pool2d_same_padding); params_for(x) gives it.
  bool same_padding = false;
  SamePadding same_mode = SamePadding::upper;
};

struct MaxPool2d {
  Pool2dParams params;
  bool same_padding = false;
  SamePadding same_mode = SamePadding::upper;
  explicit MaxPool2d(const Pool2dOptions& o = {})
      : params(Pool2dParams::max(o.kernel, o.stride, o.padding, o.dilation)), same_padding(o.same_padding),
        same_mode(o.same_mode) {
    params.ceil_mode = o.ceil_mode;
  }
  Pool2dParams params_for(const Shape& x) const {
    return same_padding ? pool2d_same_padding(x, params, same_mode, "nn::MaxPool2d") : params;
  }
  template <class T>
  autograd::Var<T> operator()(const autograd::Var<T>& x) const { return autograd::pool2d(x, params_for(x.shape())); }
};

struct AvgPool2d {
  Pool2dParams params;
  bool same_padding = false;
  SamePadding same_mode = SamePadding::upper;
  explicit AvgPool2d(const Pool2dOptions& o = {})
      : params(Pool2dParams::average(o.kernel, o.stride, o.padding, o.count_include_pad)), same_padding(o.same_padding),
        same_mode(o.same_mode) {
    params.ceil_mode = o.ceil_mode;
    params.dilation_h = params.dilation_w = o.dilation;
  }
  Pool2dParams params_for(const Shape& x) const {
    return same_padding ? pool2d_same_padding(x, params, same_mode, "nn::AvgPool2d") : params;
  }
  template <class T>
  autograd::Var<T> operator()(const autograd::Var<T>& x) const { return autograd::pool2d(x, params_for(x.shape())); }
};

// Output size 1 only: [N,C,H,W] -> [N,C,1,1].
struct AdaptiveAvgPool2d {
  explicit AdaptiveAvgPool2d(int output_size = 1) {
    CUTRAIN_REQUIRE(output_size == 1, NotImplemented, "nn::AdaptiveAvgPool2d", "only output size 1 is offered, got ",
                    output_size);
  }
  template <class T>
  autograd::Var<T> operator()(const autograd::Var<T>& x) const { return autograd::global_avg_pool(x); }
};

struct Flatten {
  template <class T>
  autograd::Var<T> operator()(const autograd::Var<T>& x) const { return autograd::flatten(x); }
};

struct DropoutOptions {
  double p = 0.5;
  std::uint64_t seed = 0;
};

// Identity in eval mode; in training a fresh mask per call, from (seed, call number).
class Dropout {
 public:
  explicit Dropout(const DropoutOptions& o = {}) : opts_(o) {}
  template <class T>
  autograd::Var<T> operator()(const autograd::Var<T>& x) {
    if (!training_ || opts_.p == 0.0) return x;
    return autograd::dropout(x, opts_.p, splitmix64(opts_.seed ^ splitmix64(calls_++)));
  }
  void set_training(bool on) { training_ = on; }
  bool is_training() const { return training_; }
  std::uint64_t calls() const { return calls_; }

 private:
  DropoutOptions opts_;
  bool training_ = true;
  std::uint64_t calls_ = 0;
};

}  // namespace cutrain::inline CUTRAIN_ABI::nn
