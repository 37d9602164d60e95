// Optimizer updates on the GPU (NVRTC kernels), in place on f32 master weights and f32 state,
// with f32, bf16 or f16 gradients; the same rules as PyTorch's SGD and AdamW, computed in f32.
// The optim/ layer drives them: a step per tensor, or many tensors in one launch.
#pragma once

#include "cutrain/core/abi.hpp"

#ifndef CUTRAIN_WITH_CUDA
#error "cutrain/cuda/ needs CUTRAIN_WITH_CUDA (link cutrain::cuda)"
#endif

#include <cmath>
#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cutrain/cuda/gpu_float.hpp"
#include "cutrain/cuda/kernels/nvrtc.hpp"
#include "cutrain/cuda/kernels/programs.hpp"  // programs::optim, the kernels of optim.cuh

namespace cutrain::inline CUTRAIN_ABI::cuda::kernels {

// g = grad + weight_decay * w; with momentum, buf = momentum * buf + (1 - dampening) * g (buf = g
// on the first step) and g = buf, or g + momentum * buf with nesterov; then w -= lr * g.
struct SgdParams {
  double lr = 0.01;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
  bool first_step = false;  // the momentum buffer has never been written: it is set to g
};

// w *= 1 - lr * weight_decay; m = beta1 m + (1 - beta1) g; v = beta2 v + (1 - beta2) g^2;
// w -= lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps).
struct AdamWParams {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  std::int64_t step = 1;  // this update's number, from 1
};

namespace detail {
template <GpuFloat G>
const Program& optim_program() {
  static const Program p = programs::optim(device_type<G>);
  return p;
}

// w contiguous on a CUDA device; grad of w's shape on its device (staged to w's layout when it
// differs); each state tensor w's shape, device and layout, since it is updated in place.
template <GpuFloat G>
Tensor<G> optim_check(std::string_view op, const Tensor<float>& w, const Tensor<G>& grad,
                      std::initializer_list<std::pair<const Tensor<float>*, std::string_view>> state) {
  require_cuda_input(op, w, "w");
  require_output(op, w, w.shape(), w.device(), "w");
  require_cuda_input(op, grad, "grad");
  CUTRAIN_REQUIRE(grad.shape() == w.shape() && grad.device() == w.device(), InvalidArgument, op, "grad ",
                  grad.describe(), " must have the shape and device of w ", w.describe());
  for (const auto& [t, name] : state) {
    require_output(op, *t, w.shape(), w.device(), name);
    CUTRAIN_REQUIRE(t->layout() == w.layout(), InvalidArgument, op, name, " ", t->describe(), " must be laid out like w ",
                    w.describe());
  }
  return staged(grad, w.layout());
}

inline void require_finite(std::string_view op, double v, std::string_view name, bool non_negative = true) {
  CUTRAIN_REQUIRE(std::isfinite(v) && (!non_negative || v >= 0), InvalidArgument, op, name,
                  non_negative ? " must be finite and non-negative, got " : " must be finite, got ", v);
}
}  // namespace detail

// One SGD step on w (f32, in place) with grad; momentum_buffer (f32, w's layout) is read and
// written when p.momentum != 0 and may be undefined otherwise. hyper (may be null): a device
// pointer to {lr, first_step}, read by the kernel in place of p.lr and p.first_step (for CUDA
// graphs, where values passed at capture would be frozen).
template <GpuFloat G>
void sgd_step(Tensor<float>& w, const Tensor<G>& grad, Tensor<float>& momentum_buffer, const SgdParams& p,
              const float* hyper = nullptr) {
  constexpr std::string_view op = "cuda::kernels::sgd_step";
  detail::require_finite(op, p.lr, "lr");
  detail::require_finite(op, p.momentum, "momentum");
  detail::require_finite(op, p.dampening, "dampening");
  detail::require_finite(op, p.weight_decay, "weight_decay");
  CUTRAIN_REQUIRE(!p.nesterov || (p.momentum > 0 && p.dampening == 0), InvalidArgument, op,
                  "nesterov needs momentum > 0 and dampening == 0, got momentum ", p.momentum, ", dampening ", p.dampening);
  const bool with_momentum = p.momentum != 0;
  const Tensor<G> gs = with_momentum ? detail::optim_check(op, w, grad, {{&momentum_buffer, "momentum_buffer"}})
                                     : detail::optim_check(op, w, grad, {});
  const long long n = w.numel();
  if (n == 0) return;
  float* buf = with_momentum ? momentum_buffer.data() : nullptr;
  const float lr = static_cast<float>(p.lr), momentum = static_cast<float>(p.momentum);
  const float dampening = static_cast<float>(p.dampening), weight_decay = static_cast<float>(p.weight_decay);
  const int nesterov = p.nesterov ? 1 : 0, first_step = p.first_step ? 1 : 0;
  const int dev = w.device().index;
  DeviceScope scope(dev);
  launch(function(dev, detail::optim_program<G>(), "cutrain_sgd_step"), grid_for(n), 256, op, w.data(), gs.data(), buf,
         n, lr, momentum, dampening, weight_decay, nesterov, first_step, hyper);
}

// One AdamW step on w (f32, in place) with grad; m and v (f32, w's layout) are the first and
// second moment estimates, zero before the first step. hyper (may be null): a device pointer to
// {lr, lr / (1 - beta1^t), sqrt(1 - beta2^t)}, read in place of the values from p (CUDA graphs).
template <GpuFloat G>
void adamw_step(Tensor<float>& w, const Tensor<G>& grad, Tensor<float>& m, Tensor<float>& v, const AdamWParams& p,
                const float* hyper = nullptr) {
  constexpr std::string_view op = "cuda::kernels::adamw_step";
  detail::require_finite(op, p.lr, "lr");
  detail::require_finite(op, p.eps, "eps");
  detail::require_finite(op, p.weight_decay, "weight_decay");
  CUTRAIN_REQUIRE(p.beta1 >= 0 && p.beta1 < 1 && p.beta2 >= 0 && p.beta2 < 1, InvalidArgument, op,
                  "beta1 and beta2 must be in [0, 1), got ", p.beta1, " and ", p.beta2);
  CUTRAIN_REQUIRE(p.step >= 1, InvalidArgument, op, "step counts from 1, got ", p.step);
  const Tensor<G> gs = detail::optim_check(op, w, grad, {{&m, "m"}, {&v, "v"}});
  const long long n = w.numel();
  if (n == 0) return;
  const double t = static_cast<double>(p.step);
  const float step_size = static_cast<float>(p.lr / (1.0 - std::pow(p.beta1, t)));
  const float bias_correction2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(p.beta2, t)));
  const float lr = static_cast<float>(p.lr), beta1 = static_cast<float>(p.beta1), beta2 = static_cast<float>(p.beta2);
  const float eps = static_cast<float>(p.eps), weight_decay = static_cast<float>(p.weight_decay);
  const int dev = w.device().index;
  DeviceScope scope(dev);
  launch(function(dev, detail::optim_program<G>(), "cutrain_adamw_step"), grid_for(n), 256, op, w.data(), gs.data(),
         m.data(), v.data(), n, lr, beta1, beta2, eps, weight_decay, step_size, bias_correction2_sqrt, hyper);
}

namespace detail {
// cutrain_optim_list of optim.cuh, field for field (G* as void*).
inline constexpr std::size_t optim_list_max = 40;
inline constexpr std::int64_t optim_chunk = 8192;
struct OptimList {
  float* w[optim_list_max];
  const void* g[optim_list_max];
  float* s0[optim_list_max];
  float* s1[optim_list_max];
  const float* hyper[optim_list_max];
  void* lo[optim_list_max];
  float h[optim_list_max][4];
  long long n[optim_list_max];
  long long first[optim_list_max + 1];
  int lo_kind[optim_list_max];
  long long count;
};
static_assert(sizeof(OptimList) == (10 * optim_list_max + 2) * sizeof(long long) + optim_list_max * sizeof(int));
}  // namespace detail

// A 16-bit copy of a parameter that a many-tensor step writes with the new value (at most one of
// the two; mixed precision: the cast autograd::cast keeps, so the next forward casts nothing).
// It must have w's shape, strides and device.
struct WeightCopy {
  Tensor<bfloat16>* bf16 = nullptr;
  Tensor<half>* f16 = nullptr;
};

namespace detail {
// Appends a tensor of n elements to the last list (a new one when it is full).
inline void optim_list_add(std::vector<OptimList>& lists, float* w, const void* g, float* s0, float* s1,
                           const float* hyper, const WeightCopy& copy, const std::array<float, 4>& h, long long n) {
  if (lists.empty() || lists.back().count == static_cast<long long>(optim_list_max)) lists.push_back(OptimList{});
  OptimList& l = lists.back();
  const auto k = static_cast<std::size_t>(l.count++);
  l.w[k] = w;
  l.g[k] = g;
  l.s0[k] = s0;
  l.s1[k] = s1;
  l.hyper[k] = hyper;
  l.lo[k] = copy.bf16 ? static_cast<void*>(copy.bf16->data()) : copy.f16 ? static_cast<void*>(copy.f16->data()) : nullptr;
  l.lo_kind[k] = copy.bf16 ? 1 : copy.f16 ? 2 : 0;
  for (std::size_t j = 0; j < 4; ++j) l.h[k][j] = h[j];
  l.n[k] = n;
  l.first[k + 1] = l.first[k] + (n + optim_chunk - 1) / optim_chunk;
}

template <class U>
void check_copy(std::string_view op, const Tensor<float>& w, const Tensor<U>* c, bool other = false) {
  if (!c) return;
  CUTRAIN_REQUIRE(!other, InvalidArgument, op, "a bf16 and an f16 copy of ", w.describe(), " given: at most one");
  CUTRAIN_REQUIRE(c->defined() && c->shape() == w.shape() && c->strides() == w.strides() && c->device() == w.device(),
                  InvalidArgument, op, "the 16-bit copy ", c->describe(), " must have the shape, strides and device of w ",
                  w.describe());
}

// The items' devices, each once (a list launch runs on one device).
template <class Item>
std::vector<Device> optim_list_devices(std::string_view op, std::span<const Item> items) {
  std::vector<Device> devs;
  for (std::size_t i = 0; i < items.size(); ++i) {
    CUTRAIN_REQUIRE(items[i].w != nullptr, InvalidArgument, op, "tensor ", i, " has no w");
    if (std::find(devs.begin(), devs.end(), items[i].w->device()) == devs.end()) devs.push_back(items[i].w->device());
  }
  return devs;
}

template <GpuFloat G, class... Args>
void launch_lists(std::string_view op, Device dev, const char* kernel, const std::vector<OptimList>& lists,
                  Args... args) {
  DeviceScope scope(dev.index);
  const CUfunction f = function(dev.index, optim_program<G>(), kernel);
  for (const auto& l : lists)
    launch(f, static_cast<unsigned>(std::clamp<long long>(l.first[l.count], 1, 65536)), 256, op, l, args...);
}
}  // namespace detail

// One tensor of a many-tensor SGD step: w and momentum_buffer (null without momentum) as in
// sgd_step; its own first_step and hyper ({lr, first_step} on the device, or null); copy, a
// 16-bit copy of w to write too.
template <GpuFloat G>
struct SgdItem {
  Tensor<float>* w = nullptr;
  Tensor<G> grad;
  Tensor<float>* momentum_buffer = nullptr;
  bool first_step = false;
  const float* hyper = nullptr;
  WeightCopy copy;
};

// sgd_step on many tensors at once (PyTorch's foreach): one launch per 40 tensors of a device,
// whatever their sizes, each tensor's result as sgd_step's. p.first_step is not read (the items' are).
// Every tensor is checked before anything runs.
template <GpuFloat G>
void sgd_step(std::span<const SgdItem<G>> items, const SgdParams& p) {
  constexpr std::string_view op = "cuda::kernels::sgd_step (many tensors)";
  if (items.empty()) return;
  detail::require_finite(op, p.lr, "lr");
  detail::require_finite(op, p.momentum, "momentum");
  detail::require_finite(op, p.dampening, "dampening");
  detail::require_finite(op, p.weight_decay, "weight_decay");
  CUTRAIN_REQUIRE(!p.nesterov || (p.momentum > 0 && p.dampening == 0), InvalidArgument, op,
                  "nesterov needs momentum > 0 and dampening == 0, got momentum ", p.momentum, ", dampening ", p.dampening);
  const std::vector<Device> devs = detail::optim_list_devices(op, items);
  const bool with_momentum = p.momentum != 0;
  std::vector<Tensor<G>> grads;  // staged to w's layout where they differ; alive until launched
  for (const auto& it : items) {
    CUTRAIN_REQUIRE(!with_momentum || it.momentum_buffer != nullptr, InvalidArgument, op,
                    "momentum ", p.momentum, " needs a momentum buffer for ", it.w->describe());
    grads.push_back(with_momentum ? detail::optim_check(op, *it.w, it.grad, {{it.momentum_buffer, "momentum_buffer"}})
                                  : detail::optim_check(op, *it.w, it.grad, {}));
    detail::check_copy(op, *it.w, it.copy.bf16, it.copy.f16 != nullptr);
    detail::check_copy(op, *it.w, it.copy.f16);
  }
  for (const Device dev : devs) {
    std::vector<detail::OptimList> lists;
    for (std::size_t i = 0; i < items.size(); ++i) {
      const auto& it = items[i];
      if (it.w->device() != dev || it.w->numel() == 0) continue;
      detail::optim_list_add(
          lists, it.w->data(), grads[i].data(), with_momentum ? it.momentum_buffer->data() : nullptr, nullptr, it.hyper,
          it.copy, {static_cast<float>(p.lr), it.first_step ? 1.0f : 0.0f, 0.0f, static_cast<float>(p.weight_decay)},
          it.w->numel());
    }
    detail::launch_lists<G>(op, dev, "cutrain_sgd_list", lists, static_cast<float>(p.momentum),
                            static_cast<float>(p.dampening), p.nesterov ? 1 : 0);
  }
}

// One tensor of a many-tensor AdamW step: w, m and v as in adamw_step; its own step count,
// weight decay and hyper ({lr, lr / (1 - beta1^t), sqrt(1 - beta2^t)} on the device, or null);
// copy, a 16-bit copy of w to write too.
template <GpuFloat G>
struct AdamWItem {
  Tensor<float>* w = nullptr;
  Tensor<G> grad;
  Tensor<float>* m = nullptr;
  Tensor<float>* v = nullptr;
  std::int64_t step = 1;
  double weight_decay = 0;
  const float* hyper = nullptr;
  WeightCopy copy;
};

// adamw_step on many tensors at once: one launch per 40 tensors. p.step and p.weight_decay are
// not read (the items' are). Every tensor is checked before anything runs.
template <GpuFloat G>
void adamw_step(std::span<const AdamWItem<G>> items, const AdamWParams& p) {
  constexpr std::string_view op = "cuda::kernels::adamw_step (many tensors)";
  if (items.empty()) return;
  detail::require_finite(op, p.lr, "lr");
  detail::require_finite(op, p.eps, "eps");
  CUTRAIN_REQUIRE(p.beta1 >= 0 && p.beta1 < 1 && p.beta2 >= 0 && p.beta2 < 1, InvalidArgument, op,
                  "beta1 and beta2 must be in [0, 1), got ", p.beta1, " and ", p.beta2);
  const std::vector<Device> devs = detail::optim_list_devices(op, items);
  std::vector<Tensor<G>> grads;
  for (const auto& it : items) {
    detail::require_finite(op, it.weight_decay, "weight_decay");
    CUTRAIN_REQUIRE(it.step >= 1, InvalidArgument, op, "step counts from 1, got ", it.step);
    CUTRAIN_REQUIRE(it.m != nullptr && it.v != nullptr, InvalidArgument, op, "m and v are needed for ",
                    it.w->describe());
    grads.push_back(detail::optim_check(op, *it.w, it.grad, {{it.m, "m"}, {it.v, "v"}}));
    detail::check_copy(op, *it.w, it.copy.bf16, it.copy.f16 != nullptr);
    detail::check_copy(op, *it.w, it.copy.f16);
  }
  for (const Device dev : devs) {
    std::vector<detail::OptimList> lists;
    for (std::size_t i = 0; i < items.size(); ++i) {
      const auto& it = items[i];
      if (it.w->device() != dev || it.w->numel() == 0) continue;
      const double t = static_cast<double>(it.step);
      detail::optim_list_add(lists, it.w->data(), grads[i].data(), it.m->data(), it.v->data(), it.hyper, it.copy,
                             {static_cast<float>(p.lr), static_cast<float>(p.lr / (1.0 - std::pow(p.beta1, t))),
                              static_cast<float>(std::sqrt(1.0 - std::pow(p.beta2, t))),
                              static_cast<float>(it.weight_decay)},
                             it.w->numel());
    }
    detail::launch_lists<G>(op, dev, "cutrain_adamw_list", lists, static_cast<float>(p.beta1),
                            static_cast<float>(p.beta2), static_cast<float>(p.eps));
  }
}

// shadow = decay * shadow + (1 - decay) * w, in place (optim::EMA): both f32 on one CUDA device,
// w of shadow's shape (staged to shadow's layout when it differs); shadow contiguous.
inline void ema_update(Tensor<float>& shadow, const Tensor<float>& w, double decay) {
  constexpr std::string_view op = "cuda::kernels::ema_update";
  CUTRAIN_REQUIRE(decay >= 0 && decay <= 1, InvalidArgument, op, "decay must be in [0, 1], got ", decay);
  detail::require_cuda_input(op, w, "w");
  detail::require_output(op, shadow, w.shape(), w.device(), "shadow");
  const long long n = shadow.numel();
  if (n == 0) return;
  const Tensor<float> ws = detail::staged(w, shadow.layout());
  const int dev = shadow.device().index;
  DeviceScope scope(dev);
  launch(function(dev, detail::optim_program<float>(), "cutrain_ema_update"), grid_for(n), 256, op, shadow.data(),
         ws.data(), n, static_cast<float>(decay));
}

// One tensor of a many-tensor EMA update: its average and the value it follows.
struct EmaItem {
  Tensor<float>* shadow = nullptr;
  const Tensor<float>* w = nullptr;
};

// ema_update on many tensors at once: one launch per 40 tensors of a device. Every tensor is
// checked before anything runs.
inline void ema_update(std::span<const EmaItem> items, double decay) {
  constexpr std::string_view op = "cuda::kernels::ema_update (many tensors)";
  CUTRAIN_REQUIRE(decay >= 0 && decay <= 1, InvalidArgument, op, "decay must be in [0, 1], got ", decay);
  std::vector<Device> devs;
  std::vector<Tensor<float>> ws;  // staged to the averages' layouts; alive until launched
  for (std::size_t i = 0; i < items.size(); ++i) {
    CUTRAIN_REQUIRE(items[i].shadow != nullptr && items[i].w != nullptr, InvalidArgument, op, "tensor ", i,
                    " has no average or no value");
    detail::require_cuda_input(op, *items[i].w, "w");
    detail::require_output(op, *items[i].shadow, items[i].w->shape(), items[i].w->device(), "shadow");
    ws.push_back(detail::staged(*items[i].w, items[i].shadow->layout()));
    if (std::find(devs.begin(), devs.end(), items[i].w->device()) == devs.end()) devs.push_back(items[i].w->device());
  }
  for (const Device dev : devs) {
    std::vector<detail::OptimList> lists;
    for (std::size_t i = 0; i < items.size(); ++i)
      if (items[i].w->device() == dev && items[i].w->numel() > 0)
        detail::optim_list_add(lists, items[i].shadow->data(), ws[i].data(), nullptr, nullptr, nullptr, {}, {},
                               items[i].w->numel());
    detail::launch_lists<float>(op, dev, "cutrain_ema_list", lists, static_cast<float>(decay));
  }
}

// Dynamic loss scaling: g *= inv_scale in place (g contiguous, f32, bf16 or f16), and
// *found_inf (a device int) set to 1 when any result is inf or NaN; it is never cleared here.
template <GpuFloat G>
void unscale_check(Tensor<G>& g, double inv_scale, int* found_inf) {
  constexpr std::string_view op = "cuda::kernels::unscale_check";
  detail::require_finite(op, inv_scale, "inv_scale");
  detail::require_cuda_input(op, g, "g");
  detail::require_output(op, g, g.shape(), g.device(), "g");
  CUTRAIN_REQUIRE(found_inf != nullptr, InvalidArgument, op, "found_inf is null");
  const long long n = g.numel();
  if (n == 0) return;
  const int dev = g.device().index;
  DeviceScope scope(dev);
  launch(function(dev, detail::optim_program<G>(), "cutrain_unscale_check"), grid_for(n), 256, op, g.data(), n,
         static_cast<float>(inv_scale), found_inf);
}

namespace detail {
// cutrain_clip_list of optim.cuh, field for field (G* as void*).
inline constexpr std::size_t clip_list_max = 64;
inline constexpr std::int64_t clip_chunk = 8192;
struct ClipList {
  const void* in[clip_list_max];
  void* out[clip_list_max];
  long long n[clip_list_max];
  long long first[clip_list_max + 1];
  long long count, partial_offset;
};
static_assert(sizeof(ClipList) == (4 * clip_list_max + 3) * sizeof(long long));
}  // namespace detail

// Clipping by the global L2 norm of the tensors `in` (dense: contiguous in some layout, all on
// one CUDA device): out[i] (allocated here, in[i]'s shape and layout) = in[i] * min(1, max_norm /
// (norm + 1e-6)), with norm = sqrt(the sum of squares) in f32, in a fixed order (deterministic).
// Returns norm as a [1] tensor on the device; nothing is read back, so it can be captured in a
// CUDA graph. Three kernels per 64 tensors, whatever their sizes.
template <GpuFloat G>
Tensor<G> clip_grad_norm(const std::vector<const Tensor<G>*>& in, std::vector<Tensor<G>>& out, double max_norm) {
  constexpr std::string_view op = "cuda::kernels::clip_grad_norm";
  detail::require_finite(op, max_norm, "max_norm");
  CUTRAIN_REQUIRE(!in.empty(), InvalidArgument, op, "no tensors");
  const Device dev = in.front()->device();
  std::vector<detail::ClipList> lists;
  std::int64_t chunks = 0;
  out.clear();
  for (std::size_t i = 0; i < in.size(); ++i) {
    const Tensor<G>& t = *in[i];
    detail::require_cuda_input(op, t, "tensor " + std::to_string(i));
    CUTRAIN_REQUIRE(t.device() == dev && t.is_contiguous(), InvalidArgument, op, "tensor ", i, " ", t.describe(),
                    " must be dense and on ", dev, " as tensor 0");
    out.emplace_back(t.shape(), TensorOptions{.layout = t.layout(), .device = dev});
    if (i % detail::clip_list_max == 0) {
      lists.push_back(detail::ClipList{});
      lists.back().partial_offset = chunks;
    }
    detail::ClipList& l = lists.back();
    const auto k = static_cast<std::size_t>(l.count++);
    l.in[k] = t.data();
    l.out[k] = out.back().data();
    l.n[k] = t.numel();
    l.first[k + 1] = l.first[k] + (t.numel() + detail::clip_chunk - 1) / detail::clip_chunk;
    chunks += l.first[k + 1] - l.first[k];
  }
  Tensor<G> norm(Shape{1}, {.device = dev});
  Tensor<float> partial(Shape{std::max<std::int64_t>(chunks, 1)}, {.device = dev});
  Tensor<float> coef(Shape{1}, {.device = dev});
  DeviceScope scope(dev.index);
  const Program& p = detail::optim_program<G>();
  float* pd = partial.data();
  float* cd = coef.data();
  const auto blocks = [](long long n) { return static_cast<unsigned>(std::clamp<long long>(n, 1, 65536)); };
  for (const auto& l : lists)
    launch(function(dev.index, p, "cutrain_clip_sum_squares"), blocks(l.first[l.count]), 256, op, l, pd);
  launch(function(dev.index, p, "cutrain_clip_coef"), 1, 1024, op, static_cast<const float*>(pd),
         static_cast<long long>(chunks), static_cast<float>(max_norm), norm.data(), cd);
  for (const auto& l : lists)
    launch(function(dev.index, p, "cutrain_clip_scale"), blocks(l.first[l.count]), 256, op, l,
           static_cast<const float*>(cd));
  return norm;
}

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::kernels
