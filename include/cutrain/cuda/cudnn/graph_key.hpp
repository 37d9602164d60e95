// The identity of a cuDNN graph: which op (a typed field, which also says whether the autotuner
// tunes it), the device, and the op's parameters and tensors' dims and strides as numbers,
// hashed as they are added. Looking a built graph up costs no string: the graph's text (its
// signature, as plan files, the tuning cache and reports show it) is made only when it is built.
#pragma once

#include "cutrain/core/abi.hpp"

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "cutrain/core/dtype.hpp"
#include "cutrain/core/error.hpp"
#include "cutrain/core/shape.hpp"
#include "cutrain/cuda/autotune/options.hpp"

namespace cutrain::inline CUTRAIN_ABI::cuda::cudnn {

enum class GraphOp : std::uint8_t {
  conv_fprop,
  conv_dgrad,
  conv_wgrad,
  batch_norm_forward_training,
  batch_norm_backward,
  layer_norm_forward,  // unused: the forward is an NVRTC kernel (cuda/kernels/layer_norm.hpp)
  layer_norm_backward,
  activation_forward,
  activation_backward,
  conv_dgrad_bias,  // conv_transpose2d with a bias: dgrad + a fused bias add
  // New values go last: the others keep theirs.
  attention_forward,  // fused scaled dot-product attention
  attention_backward,
  rms_norm_forward,
  rms_norm_backward,
  fusion,  // a user's fusion graph (core/fusion.hpp)
  conv_fprop_fp8,  // the deploy engine's e4m3 convolution (conv_fp8.hpp)
  batch_norm_act_backward,  // an activation's backward and batch norm's in one graph (norm.hpp)
};

// What the autotuner needs to know of an op: convolutions are tuned by default.
constexpr autotune::GraphFamily family(GraphOp op) {
  switch (op) {
    case GraphOp::conv_fprop: case GraphOp::conv_dgrad: case GraphOp::conv_wgrad: case GraphOp::conv_dgrad_bias:
    case GraphOp::conv_fprop_fp8:
      return autotune::GraphFamily::convolution;
    case GraphOp::activation_forward: case GraphOp::activation_backward:
      return autotune::GraphFamily::pointwise;
    case GraphOp::attention_forward: case GraphOp::attention_backward:
      return autotune::GraphFamily::attention;
    default:
      return autotune::GraphFamily::normalization;
  }
}

class GraphKey {
 public:
  // numbers; the largest key is a fusion graph's: 5 + 9 per tensor, 16 tensors of rank <= 4
  static constexpr std::size_t capacity = 160;

  GraphKey(GraphOp op, int device) : op_(op), device_(device) {
    mix(static_cast<std::uint64_t>(op));
    mix(static_cast<std::uint64_t>(device));
  }

  GraphKey& add(std::int64_t v) {
    CUTRAIN_REQUIRE(size_ < capacity, Error, "cuda::cudnn::GraphKey", "more than ", capacity, " numbers");
    words_[size_++] = v;
    mix(static_cast<std::uint64_t>(v));
    return *this;
  }
  GraphKey& add(bool v) { return add(std::int64_t{v}); }
  GraphKey& add(int v) { return add(std::int64_t{v}); }
  GraphKey& add(double v) { return add(std::bit_cast<std::int64_t>(v)); }
  GraphKey& add(DType t) { return add(static_cast<std::int64_t>(t)); }
  // A tensor's rank, dims and strides.
  GraphKey& add(const Shape& s, const Strides& st) {
    add(static_cast<std::int64_t>(s.rank()));
    for (const auto d : s) add(d);
    for (const auto d : st) add(d);
    return *this;
  }

  GraphOp op() const { return op_; }
  int device() const { return device_; }
  std::size_t hash() const { return static_cast<std::size_t>(hash_); }

  friend bool operator==(const GraphKey& a, const GraphKey& b) {
    if (a.hash_ != b.hash_ || a.op_ != b.op_ || a.device_ != b.device_ || a.size_ != b.size_) return false;
    for (std::size_t i = 0; i < a.size_; ++i)
      if (a.words_[i] != b.words_[i]) return false;
    return true;
  }

 private:
  void mix(std::uint64_t v) {  // FNV-1a over the number's 8 bytes, one step per number
    hash_ = (hash_ ^ v) * 0x100000001b3ull;
    hash_ ^= hash_ >> 29;
  }

  GraphOp op_;
  int device_;
  std::size_t size_ = 0;
  std::uint64_t hash_ = 0xcbf29ce484222325ull;
  std::array<std::int64_t, capacity> words_{};
};

struct GraphKeyHash {
  std::size_t operator()(const GraphKey& k) const { return k.hash(); }
};

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::cudnn
