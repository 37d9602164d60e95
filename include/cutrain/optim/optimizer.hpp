// What SGD and AdamW share: the parameter handles, the learning rate and zero_grad().
// Updates run in place on the parameters' tensors: plain loops on the host for cpu tensors,
// the fused kernels of cuda/kernels/optim.hpp for cuda ones (f32 parameters).
#pragma once

#include "cutrain/core/abi.hpp"

#include <cmath>
#include <concepts>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cutrain/autograd/var.hpp"
#include "cutrain/core/checkpoint.hpp"
#include "cutrain/core/profile.hpp"

#ifdef CUTRAIN_WITH_CUDA
#include "cutrain/cuda/cuda_graph.hpp"
#include "cutrain/cuda/kernels/optim.hpp"
#endif

namespace cutrain::inline CUTRAIN_ABI::optim {

template <class T>
class Optimizer {
 public:
  Optimizer(std::string_view name, std::vector<autograd::Var<T>> params, double lr)
      : params_(std::move(params)), lr_(lr), name_(name) {
    CUTRAIN_REQUIRE(!params_.empty(), InvalidArgument, name,
                    "got no parameters to optimize (an empty parameter list: was the model built before parameters()?)");
    std::set<const void*> seen;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      CUTRAIN_REQUIRE(params_[i].defined() && params_[i].requires_grad() && params_[i].is_leaf(), InvalidArgument,
                      name, "parameter ", i, " must be a defined leaf Var that requires grad");
      // Twice in one list, a parameter would be updated twice a step (and raced in one launch).
      CUTRAIN_REQUIRE(seen.insert(params_[i].impl().get()).second, InvalidArgument, name, "parameter ", i, " ",
                      params_[i].value().describe(), " appears twice in the parameter list");
    }
    CUTRAIN_REQUIRE(lr >= 0 && std::isfinite(lr), InvalidArgument, name, "lr must be finite and >= 0, got ", lr);
  }

  // Drops every gradient (the next backward() writes fresh ones instead of adding).
  void zero_grad() {
    for (auto& p : params_) p.zero_grad();
  }
  double lr() const { return lr_; }
  void set_lr(double lr) {
    CUTRAIN_REQUIRE(lr >= 0 && std::isfinite(lr), InvalidArgument, cutrain::detail::cat(name_, "::set_lr"),
                    "lr must be finite and >= 0, got ", lr);
    lr_ = lr;
  }
  const std::vector<autograd::Var<T>>& params() const { return params_; }

 protected:
  // save_state / load_state of SGD and AdamW: the records every optimizer's state starts with
  // (prefix.type, prefix.lr, prefix.params) and each parameter's shape (prefix.<k>.shape).
  // Returns the key prefix of each parameter's own records.
  std::vector<std::string> save_common(Checkpoint& ckpt, const std::string& prefix, std::string_view type) const {
    const auto key = [&](const std::string& n) { return Checkpoint::key(prefix, n); };
    ckpt.put_string(key("type"), std::string(type));
    ckpt.put_double(key("lr"), lr_);
    ckpt.put_int(key("params"), static_cast<std::int64_t>(params_.size()));
    std::vector<std::string> keys;
    for (std::size_t k = 0; k < params_.size(); ++k) {
      keys.push_back(key(std::to_string(k)));
      ckpt.put_string(keys.back() + ".shape", params_[k].shape().str());
    }
    return keys;
  }
  // Checks what save_common wrote against this optimizer (type, parameter count, shapes) and
  // returns the saved lr and each parameter's key prefix. Changes nothing.
  std::pair<double, std::vector<std::string>> load_common(const Checkpoint& ckpt, const std::string& prefix,
                                                          std::string_view type, std::string_view op) const {
    const auto key = [&](const std::string& n) { return Checkpoint::key(prefix, n); };
    CUTRAIN_REQUIRE(ckpt.contains(key("type")), InvalidArgument, op, "the checkpoint has no optimizer state under \"",
                    prefix, "\"");
    const std::string saved = ckpt.get_string(key("type"));
    CUTRAIN_REQUIRE(saved == type, InvalidArgument, op, "\"", prefix, "\" holds ", saved, " state, not ", type);
    const double lr = ckpt.get_double(key("lr"));
    CUTRAIN_REQUIRE(lr >= 0 && std::isfinite(lr), InvalidArgument, op, "saved lr must be finite and >= 0, got ", lr);
    const std::int64_t n = ckpt.get_int(key("params"));
    CUTRAIN_REQUIRE(n == static_cast<std::int64_t>(params_.size()), InvalidArgument, op, "the checkpoint has state for ",
                    n, " parameters, this optimizer has ", params_.size());
    std::vector<std::string> keys;
    for (std::size_t k = 0; k < params_.size(); ++k) {
      keys.push_back(key(std::to_string(k)));
      const Tensor<T>& w = params_[k].value();
      const std::string shape = ckpt.get_string(keys.back() + ".shape");
      CUTRAIN_REQUIRE(shape == w.shape().str(), InvalidArgument, op, "parameter ", k, " is ", w.describe(),
                      " but the checkpoint's parameter ", k, " has shape ", shape);
    }
    return {lr, std::move(keys)};
  }

  // The parameter's tensor, checked to be contiguous, and its gradient in the same layout.
  static std::pair<Tensor<T>*, Tensor<T>> prepare(std::string_view op, autograd::Var<T>& p) {
    Tensor<T>& w = p.value();
    CUTRAIN_REQUIRE(w.is_contiguous(), InvalidArgument, op, "parameter ", w.describe(), " must be contiguous");
    const Tensor<T>& g = p.grad();
    CUTRAIN_REQUIRE(g.shape() == w.shape() && g.device() == w.device(), InvalidArgument, op, "gradient ",
                    g.describe(), " does not match its parameter ", w.describe());
    return {&w, g.device().is_cpu() ? g.contiguous(w.layout()) : g.view()};
  }
  static Tensor<T> zeros_like(const Tensor<T>& w) {
    return Tensor<T>::zeros(w.shape(), {.layout = w.layout(), .device = w.device()});
  }
  [[noreturn]] static void no_gpu_path(std::string_view op, const Tensor<T>& w) {
    throw NotImplemented(op, cutrain::detail::cat("parameters on the GPU must be f32, got ", w.describe()));
  }

  // CUDA graph support. A step captured in a graph must not freeze what changes from step to
  // step (the learning rate, Adam's bias corrections): under capture the kernels read those from
  // a small device array, hyper(k) for parameter k, which a hook of the graph rewrites from the
  // host before each replay. The optimizer must outlive the graph and stay where it is.
  static constexpr std::size_t hyper_width = 4;
#ifdef CUTRAIN_WITH_CUDA
  // The parameter's 16-bit cast that autograd::cast keeps, when it is current: a many-tensor GPU
  // step writes it along with the update (asked before the step bumps the version), and
  // copy_rewritten marks it current again after the launch.
  static cuda::kernels::WeightCopy current_copy(const autograd::Var<T>& p) {
    if constexpr (std::same_as<T, float>) {
      auto& impl = *p.impl();
      if (impl.bf16_copy.current(impl.value)) return {.bf16 = &impl.bf16_copy.copy};  // current: same strides too
      if (impl.f16_copy.current(impl.value)) return {.f16 = &impl.f16_copy.copy};
    }
    return {};
  }
  static void copy_rewritten(const autograd::Var<T>& p, const cuda::kernels::WeightCopy& c) {
    auto& impl = *p.impl();
    if (c.bf16) impl.bf16_copy.rewritten(impl.value);
    if (c.f16) impl.f16_copy.rewritten(impl.value);
  }
#endif
  // Whether a step runs under CUDA graph capture, asked of the backend once per step (at its
  // first GPU parameter), not per parameter: `CaptureCheck capturing_on;` at the top of step().
  class CaptureCheck {
   public:
    bool operator()(const Tensor<T>& w) {
      if (w.device().is_cpu()) return false;
      if (!known_) known_ = cutrain::detail::device_capturing();
      return *known_;
    }

   private:
    std::optional<bool> known_;
  };
  // Optimizer state made inside a capture would be zeroed by every replay: it must exist first.
  static void require_state(std::string_view op, bool defined) {
    CUTRAIN_REQUIRE(defined, InvalidArgument, op,
                    "optimizer state is created by a parameter's first step; run one step outside capture (a "
                    "warm-up step) before capturing it");
  }
#ifdef CUTRAIN_WITH_CUDA
  const float* hyper(std::size_t k, Device dev) {
    if (!hyper_dev_.defined()) {
      hyper_host_.assign(params_.size() * hyper_width, 0.0f);
      // Not from the graph's pool: the host writes it before each replay, and a pool block may
      // have served a temporary earlier in the captured work, which the replay rewrites.
      cutrain::detail::OutsideCapturePool outside;
      hyper_dev_ = Tensor<float>(Shape{static_cast<std::int64_t>(hyper_host_.size())}, {.device = dev});
    }
    return hyper_dev_.data() + k * hyper_width;
  }
  // Registers refresh (which fills hyper_host_) to run, then upload, before each replay.
  template <class F>
  void on_replay(std::string_view op, F refresh) {
    cuda::CudaGraph* g = cuda::CudaGraph::capturing();
    CUTRAIN_REQUIRE(g != nullptr, InvalidArgument, op,
                    "the stream is being captured, but not by cuda::CudaGraph::capture: the learning rate and step "
                    "count would be frozen in the graph");
    g->on_replay([this, refresh]() mutable {
      refresh();
      // From pageable memory: the call returns once the bytes are staged, so the next refresh
      // may overwrite hyper_host_ at once; the copy runs in stream order before the graph.
      cuda::check(cudaMemcpyAsync(hyper_dev_.data(), hyper_host_.data(), hyper_host_.size() * sizeof(float),
                                  cudaMemcpyHostToDevice, cuda::current_stream()),
                  "optim::Optimizer", "uploading the hyperparameters of a replayed step");
    });
  }
#else
  // Without CUDA no parameter is captured: step() never calls it.
  template <class F>
  void on_replay(std::string_view op, F) {
    cutrain::detail::no_cuda(op);
  }
#endif
  // The same members with and without CUDA: a class's layout must not depend on the build.
  Tensor<float> hyper_dev_;
  std::vector<float> hyper_host_;

  std::vector<autograd::Var<T>> params_;
  double lr_;
  std::string_view name_;  // the optimizer's name, a string literal: "optim::SGD"
};

}  // namespace cutrain::inline CUTRAIN_ABI::optim

#include "cutrain/optim/adamw.hpp"
#include "cutrain/optim/sgd.hpp"
