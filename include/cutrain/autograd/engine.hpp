// backward(): runs the recorded nodes in reverse topological order, with explicit stacks (deep
// graphs cannot overflow the call stack), summing gradients where a Var feeds several ops.
#pragma once

#include "cutrain/core/abi.hpp"

#include <algorithm>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "cutrain/autograd/var.hpp"
#include "cutrain/ops/elementwise.hpp"

namespace cutrain::inline CUTRAIN_ABI::autograd {

namespace detail {

// into += g, where into may still be undefined. ops::add makes a new tensor, so a gradient never
// aliases another one that is later changed.
template <class T>
void accumulate(Tensor<T>& into, Tensor<T>&& g) {
  if (!into.defined()) into = std::move(g);
  else into = ops::add(into, g);
}

// A leaf's grad += g, then its grad hook. A g that shares its storage (a view of another
// gradient, passed along by a reshape or an add) is copied: two leaves never share one gradient
// tensor, since an optimizer or GradScaler may change a leaf's gradient in place.
template <class T>
void accumulate_leaf(VarImpl<T>& leaf, Tensor<T>&& g) {
  if (!leaf.grad.defined() && g.shares_storage()) leaf.grad = g.clone();
  else accumulate(leaf.grad, std::move(g));
  if (leaf.grad_hook) leaf.grad_hook();
}

// Nodes reachable from root through inputs that require grad, root first, each before all the
// nodes it depends on (reverse post-order of an iterative depth-first search). Owning pointers:
// freeing a node's inputs during backward must not destroy nodes still to run.
template <class T>
std::vector<std::shared_ptr<Node<T>>> topological_order(const std::shared_ptr<Node<T>>& root) {
  std::vector<std::shared_ptr<Node<T>>> post;
  std::unordered_set<Node<T>*> seen{root.get()};
  std::vector<std::pair<std::shared_ptr<Node<T>>, std::size_t>> stack{{root, 0}};
  while (!stack.empty()) {
    const std::size_t top = stack.size() - 1;
    Node<T>* n = stack[top].first.get();
    if (stack[top].second < n->inputs.size()) {
      const auto& in = n->inputs[stack[top].second++];
      if (in && in->requires_grad && in->node && seen.insert(in->node.get()).second) stack.emplace_back(in->node, 0);
    } else {
      post.push_back(std::move(stack[top].first));
      stack.pop_back();
    }
  }
  std::reverse(post.begin(), post.end());
  return post;
}

// d root / d root = 1 for a scalar root. On a GPU a ones tensor is kept per device, shape and
// thread and copied device to device: filling one from the host on each backward would be a
// host-to-device copy, which a CUDA graph capture cannot record.
template <class T>
Tensor<T> ones_seed(const Tensor<T>& root) {
  if (root.device().is_cpu()) return Tensor<T>::full(root.shape(), T(1.0f));
  thread_local std::unordered_map<std::string, Tensor<T>> ones;
  const std::string key = cutrain::detail::cat(root.device(), root.shape());
  auto it = ones.find(key);
  if (it == ones.end()) it = ones.emplace(key, Tensor<T>::full(root.shape(), T(1.0f), {.device = root.device()})).first;
  return it->second.clone();  // the copy: a gradient may be changed in place later (clipping)
}

// The retain_graph of the backward() running on this thread, for the nested backward of
// send_gradient.
inline bool& retain_graph_flag() {
  thread_local bool retain = false;
  return retain;
}

template <class T>
void run_backward(VarImpl<T>& root, Tensor<T> seed, bool retain_graph) {
  constexpr std::string_view op = "backward";
  struct RetainScope {
    bool previous = retain_graph_flag();
    explicit RetainScope(bool on) { retain_graph_flag() = on; }
    ~RetainScope() { retain_graph_flag() = previous; }
  } retain_scope(retain_graph);
  CUTRAIN_REQUIRE(root.requires_grad, InvalidArgument, op, "the root ", root.value.describe(),
                  " does not require grad: no input of the ops that made it requires grad, or it was computed "
                  "under NoGradGuard");
  if (!seed.defined()) {
    CUTRAIN_REQUIRE(root.value.numel() == 1, InvalidArgument, op, "the root ", root.value.describe(),
                    " is not a scalar: pass a seed gradient of its shape, backward(seed)");
    seed = ones_seed(root.value);
  } else {
    CUTRAIN_REQUIRE(seed.shape() == root.value.shape(), InvalidArgument, op, "seed ", seed.describe(),
                    " must have the root's shape ", root.value.shape());
  }
  if (!root.node) {  // a leaf: d root / d root
    accumulate_leaf(root, std::move(seed));
    return;
  }
  const auto order = topological_order(root.node);
  std::unordered_map<Node<T>*, Tensor<T>> pending;  // gradient of each node's output, summed
  pending.emplace(root.node.get(), std::move(seed));
  for (const auto& node : order) {
    Node<T>* n = node.get();
    CUTRAIN_REQUIRE(!n->freed, InvalidArgument, op, "the graph through ", n->name(),
                    " was freed by an earlier backward(); call backward(/*retain_graph=*/true) the first time to "
                    "run backward through it again");
    auto it = pending.find(n);
    if (it == pending.end()) continue;  // unreachable: every node in order lies on a path from root
    Tensor<T> dy = std::move(it->second);
    pending.erase(it);
    n->check_saved_versions();
    std::vector<Tensor<T>> grads = n->backward(dy);
    for (std::size_t i = 0; i < n->inputs.size() && i < grads.size(); ++i) {
      if (!n->needs_grad(i) || !grads[i].defined()) continue;
      auto& in = *n->inputs[i];
      CUTRAIN_REQUIRE(grads[i].shape() == in.value.shape(), Error, op, n->name(), " returned a gradient ",
                      grads[i].describe(), " for input ", i, " of shape ", in.value.shape());
      if (in.node) accumulate(pending[in.node.get()], std::move(grads[i]));
      else accumulate_leaf(in, std::move(grads[i]));
    }
    if (!retain_graph) {
      n->release_saved();
      n->freed = true;
      // Dropping the inputs frees the activations they hold as soon as the last root goes.
      n->inputs.clear();
    }
  }
}

// A graph holds Vars of one element type. Where an op's input has another type (a cast, or a
// batch norm's f32 parameters under a bf16 input) the op's backward sends that input's gradient
// here: added into a leaf's grad, or run on through the input's own graph by a nested backward.
// A Var with history can take one such gradient per backward (its graph is then freed unless
// retain_graph); leaves, such as parameters, take any number.
template <class S>
void send_gradient(const std::shared_ptr<VarImpl<S>>& in, Tensor<S>&& g) {
  if (!in || !in->requires_grad || !g.defined()) return;
  CUTRAIN_REQUIRE(g.shape() == in->value.shape(), Error, "backward", "a gradient ", g.describe(),
                  " was sent to a Var of shape ", in->value.shape());
  if (!in->node) accumulate_leaf(*in, std::move(g));
  else run_backward(*in, std::move(g), retain_graph_flag());
}

}  // namespace detail

template <class T>
void Var<T>::backward(bool retain_graph) const {
  detail::run_backward(*checked(), Tensor<T>{}, retain_graph);
}

template <class T>
void Var<T>::backward(const Tensor<T>& seed, bool retain_graph) const {
  CUTRAIN_REQUIRE(seed.defined(), InvalidArgument, "backward", "the seed gradient is undefined");
  // A copy: the caller keeps theirs, and gradients must not alias it.
  detail::run_backward(*checked(), seed.clone(), retain_graph);
}

}  // namespace cutrain::inline CUTRAIN_ABI::autograd
