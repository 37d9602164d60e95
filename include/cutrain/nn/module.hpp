// What every module with state shares: parameters and buffers by name, train/eval, moving to a
// device, and state_dict export/load. A module derives from Module<Self, T> (CRTP) and provides
//   void visit_params(const std::string& prefix, const ParamVisitor<T>&);
//   void visit_buffers(const std::string& prefix, const BufferVisitor<T>&);   (optional)
//   void set_training(bool);                                                  (optional)
// Stateless modules (ReLU, MaxPool2d, Flatten, ...) are plain structs with a call operator.
// Modules with parameters take a Var<X> of any X that RunsIn<X, T> (mixed precision).
#pragma once

#include "cutrain/core/abi.hpp"

#include <concepts>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cutrain/autograd/var.hpp"

namespace cutrain::inline CUTRAIN_ABI::nn {

template <class T> using Var = autograd::Var<T>;

// The element types a module with parameters in T runs in: T, or for mixed precision a
// narrower one (bf16 or f16 under f32 parameters, f32 under f64 ones). In a narrower type the
// parameters are cast on each call, and their gradients come back in T.
template <class X, class T>
concept RunsIn = std::same_as<X, T> ||
                 (std::same_as<T, float> && (std::same_as<X, bfloat16> || std::same_as<X, half>)) ||
                 (std::same_as<T, double> && std::same_as<X, float>);
template <class T> using ParamVisitor = std::function<void(const std::string&, Var<T>&)>;
template <class T> using BufferVisitor = std::function<void(const std::string&, Tensor<T>&)>;
// Name -> host copy, for checkpoints and tests.
template <class T> using StateDict = std::map<std::string, Tensor<T>>;

inline std::string join_name(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

template <class Self, class T>
class Module {
 public:
  void visit_buffers(const std::string&, const BufferVisitor<T>&) {}
  void set_training(bool on) { training_ = on; }
  bool is_training() const { return training_; }

  Self& train(bool on = true) {
    self().set_training(on);
    return self();
  }
  Self& eval() { return train(false); }

  std::vector<std::pair<std::string, Var<T>>> named_parameters(const std::string& prefix = "") {
    std::vector<std::pair<std::string, Var<T>>> out;
    self().visit_params(prefix, [&](const std::string& n, Var<T>& v) { out.emplace_back(n, v); });
    return out;
  }
  // Handles that share the module's parameters: what optimizers take.
  std::vector<Var<T>> parameters() {
    std::vector<Var<T>> out;
    self().visit_params("", [&](const std::string&, Var<T>& v) { out.push_back(v); });
    return out;
  }

  // Moves parameters (dropping their gradients) and buffers to dev. Build optimizers after this.
  Self& to(Device dev) {
    self().visit_params("", [&](const std::string&, Var<T>& v) {
      if (v.device() != dev) {
        v.value() = v.value().to(dev);
        v.zero_grad();
      }
    });
    self().visit_buffers("", [&](const std::string&, Tensor<T>& t) {
      if (t.device() != dev) t = t.to(dev);
    });
    return self();
  }

  // Lays out every 4-d parameter and buffer in l (Layout::nhwc: channels-last, which cuDNN's
  // fastest bf16/f16 convolutions want; Layout::nchw back), dropping the gradients of those that
  // change; others stay as they are. Build optimizers after this.
  Self& to(Layout l) {
    CUTRAIN_REQUIRE(l == Layout::nchw || l == Layout::nhwc, InvalidArgument, "Module::to",
                    "4-d tensors are laid out nchw or nhwc, got ", l);
    // is_channels_last, not layout(): a one-channel [K, 1, R, S] weight is nchw to layout() either way
    const auto differs = [&](const Tensor<T>& t) {
      return t.rank() == 4 && is_channels_last(t.shape(), t.strides()) != (l == Layout::nhwc);
    };
    self().visit_params("", [&](const std::string&, Var<T>& v) {
      if (differs(v.value())) {
        v.value() = v.value().contiguous(l);
        v.zero_grad();
      }
    });
    self().visit_buffers("", [&](const std::string&, Tensor<T>& t) {
      if (differs(t)) t = t.contiguous(l);
    });
    return self();
  }

  // Parameters and buffers by name, copied to the host.
  StateDict<T> state_dict() {
    StateDict<T> out;
    self().visit_params("", [&](const std::string& n, Var<T>& v) { out.emplace(n, v.value().to(Device::cpu())); });
    self().visit_buffers("", [&](const std::string& n, Tensor<T>& t) { out.emplace(n, t.to(Device::cpu())); });
    return out;
  }

  // Copies every entry into the tensor of that name, on whatever device it lives. Checks all
  // names and shapes before changing anything; strict also refuses missing and unknown names.
  void load_state_dict(const StateDict<T>& sd, bool strict = true) {
    constexpr std::string_view op = "load_state_dict";
    std::vector<std::pair<const Tensor<T>*, Tensor<T>*>> copies;
    std::set<std::string> used;
    auto take = [&](const std::string& n, Tensor<T>& dst) {
      auto it = sd.find(n);
      if (it == sd.end()) {
        CUTRAIN_REQUIRE(!strict, InvalidArgument, op, "the state dict has no entry \"", n, "\" (", dst.describe(), ")");
        return;
      }
      CUTRAIN_REQUIRE(it->second.shape() == dst.shape(), InvalidArgument, op, "entry \"", n, "\" has shape ",
                      it->second.shape(), " but the module's tensor is ", dst.describe());
      used.insert(n);
      copies.emplace_back(&it->second, &dst);
    };
    self().visit_params("", [&](const std::string& n, Var<T>& v) { take(n, v.value()); });
    self().visit_buffers("", [&](const std::string& n, Tensor<T>& t) { take(n, t); });
    if (strict)
      for (const auto& [n, t] : sd)
        CUTRAIN_REQUIRE(used.count(n) != 0, InvalidArgument, op, "the state dict has an unknown entry \"", n, "\" (",
                        t.describe(), ")");
    for (auto [src, dst] : copies) dst->copy_from(*src);
  }

 protected:
  bool training_ = true;

 private:
  Self& self() { return static_cast<Self&>(*this); }
};

}  // namespace cutrain::inline CUTRAIN_ABI::nn
