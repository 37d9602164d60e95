// The CPU engine's f32 steps on oneDNN (deploy/engine.hpp; a program built against
// cutrain::onednn, cpu/onednn.hpp): per step a convolution (bias, residual add and activation as
// post-ops; its tactic tuned when the engine is compiled and kept in engine files), a linear
// layer, or a max/average pool. A flatten of an NHWC activation that only a linear layer reads
// is a view of the activation's memory as it lies: that layer's weights take their columns in
// (h, w, c) order, so no NHWC-to-NCHW copy is made. Elsewhere (other builds, element types,
// devices and steps) it runs nothing and the engine runs its own path.
#pragma once

#include "cutrain/core/abi.hpp"

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cutrain/core/profile.hpp"
#include "cutrain/cpu/onednn.hpp"
#include "cutrain/deploy/engine_plan.hpp"
#include "cutrain/ops/activation.hpp"
#include "cutrain/ops/elementwise.hpp"

namespace cutrain::inline CUTRAIN_ABI::deploy::detail {

// One engine's oneDNN steps. Its layout is the same in every build (the primitives' classes are
// only declared without cutrain::onednn).
template <class E>
class OnednnSteps {
 public:
  // The steps of plan that oneDNN runs on device in the engine's layout.
  void build([[maybe_unused]] const Plan<E>& plan, [[maybe_unused]] const Device& device,
             [[maybe_unused]] Layout layout) {
    const std::size_t n = plan.steps.size();
    conv_.assign(n, nullptr);
    linear_.assign(n, nullptr);
    pool_.assign(n, nullptr);
    raw_flatten_.assign(n, 0);
#ifdef CUTRAIN_ONEDNN
    if constexpr (std::same_as<E, float>) {
      if (!device.is_cpu()) return;
      for (std::size_t i = 0; i < n; ++i) {
        const auto& s = plan.steps[i];
        if (s.kind == StepKind::conv)
          conv_[i] = std::make_shared<cpu::onednn::Conv2d>(s.w, s.b.defined() ? s.b.reshape({s.w.dim(0)}) : Tensor<E>{},
                                                           s.conv, s.act);
        else if (s.kind == StepKind::linear)
          linear_[i] = std::make_shared<const cpu::onednn::Linear>(linear_weights(plan, i, layout), s.b, s.act);
        else if (s.kind == StepKind::pool && cpu::onednn::Pool2d::takes(s.pool))
          pool_[i] = std::make_shared<const cpu::onednn::Pool2d>(s.pool);
      }
    }
#endif
  }

  // Each convolution's tactic, timed at the plan's batch in the layouts the engine runs it in.
  void tune([[maybe_unused]] const Plan<E>& plan, [[maybe_unused]] Layout layout) {
#ifdef CUTRAIN_ONEDNN
    for (std::size_t i = 0; i < conv_.size(); ++i) {
      if (!conv_[i]) continue;
      const auto& s = plan.steps[i];
      const Shape& x = plan.shapes[static_cast<std::size_t>(s.in)];
      const Shape& y = plan.shapes[static_cast<std::size_t>(s.out)];
      const bool nhwc = layout == Layout::nhwc;  // a tensor of one channel is both (onednn::Conv2d)
      conv_[i]->tune(x, nhwc || x[1] == 1, nhwc || y[1] == 1, s.in2 >= 0);
    }
#endif
  }

  // Step i's convolution tactic ("" where it has none); set_tactic: an engine file's choice.
  std::string tactic([[maybe_unused]] std::size_t i) const {
#ifdef CUTRAIN_ONEDNN
    if (i < conv_.size() && conv_[i]) return conv_[i]->tactic();
#endif
    return {};
  }
  void set_tactic([[maybe_unused]] std::size_t i, [[maybe_unused]] std::string name) {
#ifdef CUTRAIN_ONEDNN
    if (i < conv_.size() && conv_[i] && !name.empty()) conv_[i]->set_tactic(std::move(name));
#endif
  }

  // Step i on the values v, or nullopt where this is not one of its steps (or oneDNN has no
  // direct kernel for the convolution's layouts): the engine runs its own path then.
  std::optional<Tensor<E>> run([[maybe_unused]] const Plan<E>& plan, [[maybe_unused]] std::size_t i,
                               [[maybe_unused]] const std::vector<Tensor<E>>& v, [[maybe_unused]] Layout layout) const {
#ifdef CUTRAIN_ONEDNN
    if constexpr (std::same_as<E, float>) {
      const auto& s = plan.steps[i];
      const Tensor<E>& x = v[static_cast<std::size_t>(s.in)];
      if (conv_[i]) {
        profile::OpScope timed("conv2d_fused_forward (oneDNN)", x.device());
        const Tensor<E> xc = x.layout() == Layout::nhwc ? x.view() : x.contiguous(Layout::row_major);
        auto y = Tensor<E>::empty(conv2d_output_shape(x.shape(), s.w.shape(), s.conv, "deploy::Engine"), {.layout = layout});
        const Tensor<E> none;
        if (!conv_[i]->forward(xc, s.in2 >= 0 ? v[static_cast<std::size_t>(s.in2)] : none, y)) return std::nullopt;
        return conv_[i]->fuses_activation() ? std::move(y) : ops::activation_forward(y, s.act);
      }
      if (linear_[i]) {
        profile::OpScope timed("linear_activation_forward (oneDNN)", x.device());
        Tensor<E> y = detail::from_rows(linear_[i]->forward(detail::as_rows(x)), x.shape());
        if (s.in2 >= 0) return ops::add(y, v[static_cast<std::size_t>(s.in2)]);  // a fused residual (no activation)
        return linear_[i]->fuses_activation() ? std::move(y) : ops::activation_forward(y, s.act);
      }
      if (pool_[i]) {
        profile::OpScope timed("pool2d_forward (oneDNN)", x.device());
        return pool_[i]->forward(x.layout() == Layout::nhwc ? x.view() : x.contiguous(Layout::row_major));
      }
      if (raw_flatten_[i]) {  // NHWC memory as it lies: its reader's weights were permuted to match
        const Tensor<E> xn = x.contiguous(Layout::nhwc);
        const std::int64_t row = xn.numel() / xn.dim(0);
        return xn.as_strided(Shape{xn.dim(0), row}, Strides{row, 1}, xn.offset());
      }
    }
#endif
    return std::nullopt;
  }

 private:
  // Linear step j's weights: as they are, or, where j's input is the flatten of an NHWC
  // activation [N, C, H, W] that nothing else reads, with their columns in (h, w, c) order (the
  // flatten then marked raw). The plan (and an engine file) keeps the model's order.
  Tensor<E> linear_weights(const Plan<E>& plan, std::size_t j, Layout layout) {
    const auto& lin = plan.steps[j];
    const int v = lin.in;
    std::size_t f = plan.steps.size();
    int readers = 0;
    for (std::size_t i = 0; i < plan.steps.size(); ++i) {
      readers += (plan.steps[i].in == v) + (plan.steps[i].in2 == v);
      if (plan.steps[i].out == v) f = i;
    }
    if (layout != Layout::nhwc || f == plan.steps.size() || plan.steps[f].kind != StepKind::flatten || readers != 1 ||
        v == plan.output)
      return lin.w.view();
    const Shape& x = plan.shapes[static_cast<std::size_t>(plan.steps[f].in)];
    if (x.rank() != 4 || x[1] == 1 || x[2] * x[3] == 1) return lin.w.view();  // (c, h, w) order is (h, w, c) order
    const std::int64_t C = x[1], HW = x[2] * x[3], out = lin.w.dim(0);
    const Tensor<E> w = lin.w.contiguous(Layout::row_major);
    Tensor<E> p(w.shape());
    for (std::int64_t o = 0; o < out; ++o)
      for (std::int64_t c = 0; c < C; ++c)
        for (std::int64_t hw = 0; hw < HW; ++hw) p.data()[(o * HW + hw) * C + c] = w.data()[(o * C + c) * HW + hw];
    raw_flatten_[f] = 1;
    return p;
  }

  std::vector<std::shared_ptr<cpu::onednn::Conv2d>> conv_;
  std::vector<std::shared_ptr<const cpu::onednn::Linear>> linear_;
  std::vector<std::shared_ptr<const cpu::onednn::Pool2d>> pool_;
  std::vector<char> raw_flatten_;  // a flatten that views its NHWC input's memory as it lies
};

}  // namespace cutrain::inline CUTRAIN_ABI::deploy::detail
