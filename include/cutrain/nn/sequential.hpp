// nn::Sequential<T>: modules run one after another, held by value behind a small type-erased
// interface so that any mix of layers fits in one Sequential<float>{...}.
// A Conv2d, Linear or BatchNorm2d directly followed by ReLU (or a relu/identity Activation) runs as
// one fused op (conv + bias + activation in cuDNN, linear + bias + activation in cuBLASLt, batch
// norm + activation in one cuDNN graph on the GPU).
// A Sequential<float> also runs on a Var<bfloat16> or Var<half> (mixed precision, see
// nn/mixed_precision.hpp): each module takes the Var in whatever type it arrives.
#pragma once

#include "cutrain/core/abi.hpp"

#include <concepts>
#include <memory>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <variant>
#include <vector>

#include "cutrain/nn/layers.hpp"
#include "cutrain/nn/module.hpp"

namespace cutrain::inline CUTRAIN_ABI::nn {

namespace detail {
// What flows between the modules of a Sequential: a Var of any element type.
using AnyVar = std::variant<Var<float>, Var<double>, Var<bfloat16>, Var<half>>;

template <class T>
struct AnyModule {
  virtual ~AnyModule() = default;
  // index: the module's place in its Sequential, for error messages.
  virtual AnyVar forward(const AnyVar& x, std::size_t index) = 0;
  // act(this(x)) as one op; only when has_fused_form().
  virtual AnyVar forward_fused(const AnyVar& x, const ActivationParams& a, std::size_t index) = 0;
  virtual bool has_fused_form() const = 0;
  // The activation this module applies when it can be folded into the previous module.
  virtual bool fusable_activation(ActivationParams&) const { return false; }
  virtual void visit_params(const std::string&, const ParamVisitor<T>&) {}
  virtual void visit_buffers(const std::string&, const BufferVisitor<T>&) {}
  virtual void set_training(bool) {}
  virtual void set_fusion(bool) {}
  // The concrete module's type (what Sequential::get_if casts to; exporters name it in errors).
  virtual const std::type_info& type() const = 0;
};

template <class V> struct VarElement;
template <class X> struct VarElement<Var<X>> { using type = X; };

template <class V>
[[noreturn]] void wrong_input_type(std::size_t index) {
  throw InvalidArgument("nn::Sequential",
                        cutrain::detail::cat("module ", index, " does not take a Var of ", dtype_of<typename VarElement<V>::type>,
                                             " (a module with parameters in T takes T, or bf16/f16 under f32 "
                                             "parameters)"));
}

template <class T, class M>
struct ModuleHolder final : AnyModule<T> {
  M m;
  explicit ModuleHolder(M&& module) : m(std::move(module)) {}
  AnyVar forward(const AnyVar& x, std::size_t index) override {
    return std::visit(
        [&](const auto& v) -> AnyVar {
          if constexpr (requires { m(v); }) return m(v);
          else wrong_input_type<std::remove_cvref_t<decltype(v)>>(index);
        },
        x);
  }
  AnyVar forward_fused(const AnyVar& x, const ActivationParams& a, std::size_t index) override {
    return std::visit(
        [&](const auto& v) -> AnyVar {
          if constexpr (requires { m.forward_fused(v, a); }) return m.forward_fused(v, a);
          else wrong_input_type<std::remove_cvref_t<decltype(v)>>(index);
        },
        x);
  }
  bool has_fused_form() const override {
    return requires(M& mm, const Var<T>& v, const ActivationParams& a) { mm.forward_fused(v, a); };
  }
  bool fusable_activation(ActivationParams& a) const override {
    if constexpr (std::same_as<M, ReLU>) {
      a = {.kind = cutrain::Activation::relu};
      return true;
    } else if constexpr (std::same_as<M, nn::Activation>) {
      a = m.params;
      return a.kind == cutrain::Activation::relu || a.kind == cutrain::Activation::identity;
    } else {
      return false;
    }
  }
  void visit_params(const std::string& prefix, const ParamVisitor<T>& f) override {
    if constexpr (requires { m.visit_params(prefix, f); }) m.visit_params(prefix, f);
  }
  void visit_buffers(const std::string& prefix, const BufferVisitor<T>& f) override {
    if constexpr (requires { m.visit_buffers(prefix, f); }) m.visit_buffers(prefix, f);
  }
  void set_training(bool on) override {
    if constexpr (requires { m.set_training(on); }) m.set_training(on);
  }
  void set_fusion(bool on) override {
    if constexpr (requires { m.set_fusion(on); }) m.set_fusion(on);
  }
  const std::type_info& type() const override { return typeid(M); }
};
}  // namespace detail

template <class T>
class Sequential : public Module<Sequential<T>, T> {
 public:
  Sequential() = default;
  template <class... Ms>
    requires(sizeof...(Ms) > 0 && (!std::same_as<std::remove_cvref_t<Ms>, Sequential> && ...))
  Sequential(Ms&&... modules) {  // NOLINT: implicit, so that Sequential<float> net{a, b, c} reads naturally
    (push_back(std::forward<Ms>(modules)), ...);
  }
  Sequential(Sequential&&) noexcept = default;
  Sequential& operator=(Sequential&&) noexcept = default;

  template <class M>
  Sequential& push_back(M&& module) {
    using D = std::remove_cvref_t<M>;
    static_assert(std::is_invocable_r_v<Var<T>, D&, const Var<T>&>, "a module must be callable on a Var<T>");
    modules_.push_back(std::make_unique<detail::ModuleHolder<T, D>>(D(std::forward<M>(module))));
    return *this;
  }

  // Runs the modules in X: T, or bf16/f16 under f32 parameters (mixed precision).
  template <class X>
  Var<X> operator()(const Var<X>& input) {
    detail::AnyVar x = input;
    for (std::size_t i = 0; i < modules_.size(); ++i) {
      ActivationParams act;
      if (fuse_ && i + 1 < modules_.size() && modules_[i]->has_fused_form() &&
          modules_[i + 1]->fusable_activation(act)) {
        x = modules_[i]->forward_fused(x, act, i);
        ++i;
        continue;
      }
      x = modules_[i]->forward(x, i);
    }
    CUTRAIN_REQUIRE(std::holds_alternative<Var<X>>(x), InvalidArgument, "nn::Sequential",
                    "the modules changed the element type of a Var of ", dtype_of<X>);
    return std::get<Var<X>>(std::move(x));
  }
  // A batch straight from a loader: a leaf that needs no gradient, sharing x's storage.
  template <class X>
  Var<X> operator()(const Tensor<X>& x) {
    return (*this)(Var<X>(x.view()));
  }

  // Whether Conv2d/Linear/BatchNorm2d + ReLU run as one fused op (on by default), here and in the
  // modules that fuse their own parts (ResidualBlock, nested Sequentials).
  void set_fusion(bool on) {
    fuse_ = on;
    for (auto& m : modules_) m->set_fusion(on);
  }

  void visit_params(const std::string& prefix, const ParamVisitor<T>& f) {
    for (std::size_t i = 0; i < modules_.size(); ++i) modules_[i]->visit_params(join_name(prefix, std::to_string(i)), f);
  }
  void visit_buffers(const std::string& prefix, const BufferVisitor<T>& f) {
    for (std::size_t i = 0; i < modules_.size(); ++i) modules_[i]->visit_buffers(join_name(prefix, std::to_string(i)), f);
  }
  void set_training(bool on) {
    this->training_ = on;
    for (auto& m : modules_) m->set_training(on);
  }

  std::size_t size() const { return modules_.size(); }
  // The i-th module as an M (throws when it is not one).
  template <class M>
  M& at(std::size_t i) {
    CUTRAIN_REQUIRE(i < modules_.size(), InvalidArgument, "Sequential::at", "index ", i, " out of range for ",
                    modules_.size(), " modules");
    auto* h = dynamic_cast<detail::ModuleHolder<T, M>*>(modules_[i].get());
    CUTRAIN_REQUIRE(h != nullptr, InvalidArgument, "Sequential::at", "module ", i, " is not of the requested type");
    return h->m;
  }
  // The i-th module as an M, or nullptr when it is another type (i must be < size()).
  template <class M>
  const M* get_if(std::size_t i) const {
    CUTRAIN_REQUIRE(i < modules_.size(), InvalidArgument, "Sequential::get_if", "index ", i, " out of range for ",
                    modules_.size(), " modules");
    const auto* h = dynamic_cast<const detail::ModuleHolder<T, M>*>(modules_[i].get());
    return h ? &h->m : nullptr;
  }
  // The type of the i-th module.
  const std::type_info& module_type(std::size_t i) const {
    CUTRAIN_REQUIRE(i < modules_.size(), InvalidArgument, "Sequential::module_type", "index ", i, " out of range for ",
                    modules_.size(), " modules");
    return modules_[i]->type();
  }

 private:
  std::vector<std::unique_ptr<detail::AnyModule<T>>> modules_;
  bool fuse_ = true;
};

}  // namespace cutrain::inline CUTRAIN_ABI::nn
