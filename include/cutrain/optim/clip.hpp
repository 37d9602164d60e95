// Gradient clipping by the global L2 norm over all parameters, as torch.nn.utils.clip_grad_norm_:
// when the norm exceeds max_norm, every gradient is scaled by max_norm / (norm + 1e-6).
// Gradients are replaced by scaled copies, never changed in place.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cmath>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "cutrain/autograd/var.hpp"
#include "cutrain/core/profile.hpp"
#include "cutrain/ops/broadcast.hpp"
#include "cutrain/ops/elementwise.hpp"
#include "cutrain/ops/reduce.hpp"
#include "cutrain/ops/shape_ops.hpp"

#ifdef CUTRAIN_WITH_CUDA
#include "cutrain/cuda/gpu_float.hpp"
#include "cutrain/cuda/kernels/optim.hpp"
#endif

namespace cutrain::inline CUTRAIN_ABI::optim {

namespace detail {
inline void check_max_norm(double max_norm) {
  CUTRAIN_REQUIRE(max_norm > 0 && std::isfinite(max_norm), InvalidArgument, "optim::clip_grad_norm",
                  "max_norm must be positive and finite, got ", max_norm);
}

// The defined gradients of params, all on one device (DeviceError otherwise).
template <class T>
std::vector<const Tensor<T>*> grads_of(const std::vector<autograd::Var<T>>& params) {
  std::vector<const Tensor<T>*> g;
  for (const auto& p : params) {
    if (!p.defined() || !p.grad().defined()) continue;
    CUTRAIN_REQUIRE(g.empty() || g.front()->device() == p.grad().device(), DeviceError, "optim::clip_grad_norm",
                    "gradients on different devices: ", g.front()->device(), " and ", p.grad().device());
    g.push_back(&p.grad());
  }
  return g;
}

// Device constants [1] of this thread (1e-6 and 1), made at the first call on a device: a CUDA
// graph capture cannot copy them from the host.
template <class T>
const std::pair<Tensor<T>, Tensor<T>>& clip_constants(Device dev) {
  thread_local std::map<int, std::pair<Tensor<T>, Tensor<T>>> constants;
  auto it = constants.find(dev.index);
  if (it == constants.end()) {
    CUTRAIN_REQUIRE(!cutrain::detail::device_capturing(), InvalidArgument, "optim::clip_grad_norm_device",
                    "first call during CUDA graph capture; clip once outside capture (a warm-up step) first");
    it = constants
             .emplace(dev.index, std::pair{Tensor<T>::full(Shape{1}, T(1e-6), {.device = dev}),
                                           Tensor<T>::full(Shape{1}, T(1.0), {.device = dev})})
             .first;
  }
  return it->second;
}
}  // namespace detail

// Clips device gradients on the device without reading anything back, so that it can be
// captured in a CUDA graph: returns the global norm before clipping as a [1] tensor on their
// device (undefined when no parameter has a gradient), and scales every gradient by
// min(1, max_norm / (norm + 1e-6)).
template <class T>
Tensor<T> clip_grad_norm_device(const std::vector<autograd::Var<T>>& params, double max_norm) {
  detail::check_max_norm(max_norm);
  const std::vector<const Tensor<T>*> grads = detail::grads_of(params);
  if (grads.empty()) return {};
  const Device dev = grads.front()->device();
  CUTRAIN_REQUIRE(!dev.is_cpu(), InvalidArgument, "optim::clip_grad_norm_device",
                  "the gradients are on the CPU: use clip_grad_norm");
  const profile::OpScope timed("optim::clip_grad_norm", dev);  // one row in a profile
#ifdef CUTRAIN_WITH_CUDA
  if constexpr (cuda::GpuFloat<T>) {
    // Three kernels for every 64 gradients (cuda/kernels/optim.hpp): the per-tensor path below
    // launched about five per gradient, 0.8 ms of a GPT step's 8.3 in a CUDA graph.
    std::vector<Tensor<T>> staged;  // copies of gradients that are not dense
    staged.reserve(grads.size());   // dense points into it
    std::vector<const Tensor<T>*> dense;
    for (const Tensor<T>* g : grads) {
      if (g->is_contiguous()) {
        dense.push_back(g);
      } else {
        staged.push_back(g->contiguous());
        dense.push_back(&staged.back());
      }
    }
    std::vector<Tensor<T>> scaled;
    Tensor<T> norm = cuda::kernels::clip_grad_norm(dense, scaled, max_norm);
    std::size_t k = 0;
    for (const auto& p : params)
      if (p.defined() && p.grad().defined()) p.grad() = std::move(scaled[k++]);
    return norm;
  }
#endif
  const auto& [eps, one] = detail::clip_constants<T>(dev);
  // Each gradient's norm in two stages, over its last dim and then over the rest: the reduction
  // kernels spread a reduction over the outputs, so a whole tensor reduced at once runs in one
  // block (0.45 ms for a 384x1536 gradient on the H200, 35 ms a step for a 10M-parameter GPT).
  std::vector<Tensor<T>> norms;
  for (const Tensor<T>* g : grads)
    norms.push_back((g->rank() >= 2 ? ops::norm(ops::norm(*g, 2.0, {-1})) : ops::norm(*g)).reshape(Shape{1}));
  Tensor<T> norm = ops::norm(ops::concat(norms, 0)).reshape(Shape{1});
  const Tensor<T> coef = ops::minimum(ops::scale(ops::pow(ops::add(norm, eps), -1.0), max_norm), one);
  for (const auto& p : params)
    if (p.defined() && p.grad().defined()) p.grad() = ops::mul(p.grad(), coef);
  return norm;
}

// Returns the global norm before clipping. Host gradients are summed on the host; device ones
// on the device (clip_grad_norm_device), with one 4-byte read of the norm.
template <class T>
double clip_grad_norm(const std::vector<autograd::Var<T>>& params, double max_norm) {
  detail::check_max_norm(max_norm);
  const std::vector<const Tensor<T>*> grads = detail::grads_of(params);
  if (!grads.empty() && !grads.front()->device().is_cpu())
    return static_cast<double>(clip_grad_norm_device(params, max_norm).to_vector()[0]);
  double sum = 0;
  for (const Tensor<T>* g : grads)
    for (T v : g->to_vector()) sum += static_cast<double>(v) * static_cast<double>(v);
  const double norm = std::sqrt(sum);
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0)
    for (const auto& p : params)
      if (p.defined() && p.grad().defined()) p.grad() = ops::scale(p.grad(), coef);
  return norm;
}

}  // namespace cutrain::inline CUTRAIN_ABI::optim
