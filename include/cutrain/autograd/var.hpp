// Var<T>: a tensor that remembers how it was made, so that backward() can send gradients to
// the leaves (parameters and inputs) that asked for them.
//
// A Var is a shared handle (copying it copies the handle, not the tensor). The node that made a
// Var holds its inputs, never its output, so a graph is a DAG owned from the root down: dropping
// the last handle to the loss drops the whole graph.
#pragma once

#include "cutrain/core/abi.hpp"

#include <concepts>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cutrain/core/error.hpp"
#include "cutrain/core/tensor.hpp"

namespace cutrain::inline CUTRAIN_ABI::autograd {

template <class T>
class Node;

namespace detail {
// A leaf's value cast to U (autograd::cast: a parameter in a bf16 or f16 model), kept for the
// next cast while neither changes: source is the value it was cast from (held, so that its memory
// cannot come back as another tensor's), version the value's version then, copy_version the
// copy's. The GPU optimizers' many-tensor steps write the copy along with the update (optim/),
// so a mixed-precision step casts no weights.
template <class T, class U>
struct CastCopy {
  Tensor<U> copy;
  Tensor<T> source;
  std::uint64_t version = 0, copy_version = 0;

  bool current(const Tensor<T>& v) const {
    return copy.defined() && source.defined() && v.defined() && source.data() == v.data() &&
           source.shape() == v.shape() && source.strides() == v.strides() && version == v.version() &&
           copy_version == copy.version() && copy.shape() == v.shape() && copy.strides() == v.strides() &&
           copy.is_contiguous() && v.is_contiguous() && copy.device() == v.device();
  }
  void set(Tensor<U> c, const Tensor<T>& v) {
    copy = std::move(c);
    source = v.view();
    version = v.version();
    copy_version = copy.version();
  }
  // Not current until the next set(): its conversion is recorded in a CUDA graph, not run, or a
  // graph writes the value without the copy.
  void invalidate() { version = ~std::uint64_t{0}; }
  // After an in-place update of the value that wrote the copy too.
  void rewritten(const Tensor<T>& v) {
    copy.bump_version();  // autograd must not use a copy saved before the update
    version = v.version();
    copy_version = copy.version();
  }
};

template <class T>
struct VarImpl {
  Tensor<T> value;
  Tensor<T> grad;  // undefined until a backward() reaches this Var (leaves only)
  bool requires_grad = false;
  std::shared_ptr<Node<T>> node;  // null for leaves
  CastCopy<T, bfloat16> bf16_copy;  // leaves only
  CastCopy<T, half> f16_copy;
  // Called after each gradient added into this leaf's grad (dist::DataParallel's bucket readiness).
  std::function<void()> grad_hook;

  template <class U>
  CastCopy<T, U>& cast_copy() {
    if constexpr (std::same_as<U, bfloat16>) return bf16_copy;
    else return f16_copy;
  }
};

// Whether ops record graphs on this thread; see NoGradGuard.
inline bool& grad_mode_flag() {
  thread_local bool enabled = true;
  return enabled;
}
}  // namespace detail

inline bool is_grad_enabled() { return detail::grad_mode_flag(); }

// While alive, ops on this thread record no graph: their outputs need no gradient and keep
// nothing alive for backward (evaluation, optimizer updates, metrics).
class NoGradGuard {
 public:
  NoGradGuard() : previous_(detail::grad_mode_flag()) { detail::grad_mode_flag() = false; }
  ~NoGradGuard() { detail::grad_mode_flag() = previous_; }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// One recorded op. The op's function object derives from Node: its forward saves what backward
// needs; backward(dy) returns one gradient per input (undefined for inputs that need none);
// release_saved() drops the saved tensors once the graph is freed.
template <class T>
class Node {
 public:
  virtual ~Node() = default;
  virtual std::string_view name() const = 0;
  virtual std::vector<Tensor<T>> backward(const Tensor<T>& dy) = 0;
  virtual void release_saved() = 0;

  bool needs_grad(std::size_t i) const { return i < inputs.size() && inputs[i] && inputs[i]->requires_grad; }

  // slot = t, a view sharing t's storage, for backward; the storage's version now is
  // remembered, so that backward can tell when the tensor was written in place since
  // (check_saved_versions), as PyTorch's version counters do. what names it in that error.
  template <class U>
  void save(Tensor<U>& slot, const Tensor<U>& t, std::string_view what) {
    slot = t.view();
    if (!slot.defined()) return;
    saved_.push_back({&slot, [](const void* p) {
                        const auto& t = *static_cast<const Tensor<U>*>(p);
                        return t.defined() ? t.version() : released;
                      },
                      
                      [](const void* p) { return static_cast<const Tensor<U>*>(p)->describe(); }, slot.version(), what});
  }
  // Throws when a tensor saved by save() was modified in place after the op saved it: its
  // gradient would be computed from the new values, silently wrong.
  void check_saved_versions() const {
    for (const Saved& s : saved_) {
      const std::uint64_t now = s.version(s.slot);
      if (now == s.at_save || now == released) continue;
      throw InvalidArgument("backward",
                            cutrain::detail::cat("the tensor ", s.what, " (", s.describe(s.slot), ") that ", name(),
                                                 " saved for backward was modified in place after it was saved (its "
                                                 "version is ", now, ", it was ", s.at_save,
                                                 "): its gradient would be wrong. Modify a clone() instead, or "
                                                 "modify it after backward()"));
    }
  }

  // Null entries stand for optional inputs that were not given (a conv without bias).
  std::vector<std::shared_ptr<detail::VarImpl<T>>> inputs;
  bool freed = false;

 private:
  static constexpr std::uint64_t released = ~std::uint64_t{0};  // release_saved() emptied the slot
  struct Saved {
    const void* slot;  // a Tensor<U> member of the node, so its address is stable
    std::uint64_t (*version)(const void*);
    std::string (*describe)(const void*);
    std::uint64_t at_save;
    std::string_view what;
  };
  std::vector<Saved> saved_;
};

template <class T>
class Var {
 public:
  Var() = default;
  explicit Var(Tensor<T> value, bool requires_grad = false) : impl_(std::make_shared<detail::VarImpl<T>>()) {
    impl_->value = std::move(value);
    impl_->requires_grad = requires_grad;
  }
  // The output of a recorded op.
  static Var from_node(Tensor<T> value, std::shared_ptr<Node<T>> node) {
    Var v(std::move(value), true);
    v.impl_->node = std::move(node);
    return v;
  }

  bool defined() const { return impl_ != nullptr; }
  Tensor<T>& value() const { return checked()->value; }
  Tensor<T>& grad() const { return checked()->grad; }
  bool requires_grad() const { return impl_ && impl_->requires_grad; }
  void set_requires_grad(bool on) const {
    CUTRAIN_REQUIRE(is_leaf(), InvalidArgument, "Var::set_requires_grad",
                    "only leaves (Vars no op made) can change requires_grad; use detach()");
    impl_->requires_grad = on;
  }
  bool is_leaf() const { return checked()->node == nullptr; }
  const std::shared_ptr<Node<T>>& node() const { return checked()->node; }
  const std::shared_ptr<detail::VarImpl<T>>& impl() const { return impl_; }

  const Shape& shape() const { return value().shape(); }
  std::int64_t numel() const { return value().numel(); }
  Device device() const { return value().device(); }
  // The single element of a one-element Var (copied to the host).
  T item() const {
    CUTRAIN_REQUIRE(value().defined() && value().numel() == 1, InvalidArgument, "Var::item", "needs one element, got ",
                    value().describe());
    return value().to_vector()[0];
  }

  void zero_grad() const { checked()->grad = Tensor<T>{}; }
  // f runs after every gradient a backward() adds into this leaf's grad() (once per use of the
  // leaf in the graph, so a tied weight gets one call per use); an empty f removes it. One hook
  // per leaf, shared by every handle of it: dist::DataParallel sets it to start a bucket's
  // all-reduce as soon as its last gradient arrives.
  void set_grad_hook(std::function<void()> f) const {
    CUTRAIN_REQUIRE(is_leaf(), InvalidArgument, "Var::set_grad_hook", "only leaves (Vars no op made) take a gradient hook");
    checked()->grad_hook = std::move(f);
  }
  // A leaf sharing this Var's storage, with no history.
  Var detach() const { return Var(value().view(), false); }

  // Gradients of this Var with respect to every leaf that requires grad, added into their grad().
  // The root must have one element unless a seed (dL/d this, this Var's shape) is given.
  // The graph's saved tensors are freed afterwards unless retain_graph.
  void backward(bool retain_graph = false) const;
  void backward(const Tensor<T>& seed, bool retain_graph = false) const;

  friend bool operator==(const Var& a, const Var& b) { return a.impl_ == b.impl_; }

 private:
  detail::VarImpl<T>* checked() const {
    CUTRAIN_REQUIRE(impl_ != nullptr, InvalidArgument, "Var", "use of an undefined (default-constructed) Var");
    return impl_.get();
  }
  std::shared_ptr<detail::VarImpl<T>> impl_;
};

// A leaf that requires grad: a parameter, or an input to differentiate against.
template <class T>
Var<T> parameter(Tensor<T> value) {
  return Var<T>(std::move(value), true);
}

}  // namespace cutrain::inline CUTRAIN_ABI::autograd

#include "cutrain/autograd/engine.hpp"
