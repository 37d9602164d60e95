// The CPU engine's f32 steps on oneDNN (deploy/engine.hpp; a program built against
// cutrain::onednn, cpu/onednn.hpp): per step a convolution (bias, residual add and activation as
// post-ops; its tactic tuned when the engine is compiled and kept in engine files), a linear
// layer, or a max/average pool. A flatten of an NHWC activation that only a linear layer reads
// is a view of the activation's memory as it lies: that layer's weights take their columns in
// (h, w, c) order, so no NHWC-to-NCHW copy is made. A convolution whose output only a pool
// reads runs with that pool (onednn::Conv2d::pool_after: the pool reads the convolution's output
// in the convolution's own format, blocked or not, and only the pooled output is reordered); a
// memory-bound one does so batch chunk by batch chunk (a chunk's convolution output, about
// 1 MiB, stays in the cores' caches). The pool's step then passes the pooled output on.
// Elsewhere (other builds, element types, devices and steps) it runs nothing and the engine runs
// its own path.
#pragma once

#include "cutrain/core/abi.hpp"

#include <algorithm>
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
    chunk_.assign(n, 0);
    batch_ = plan.shapes[0][0];
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
      for (std::size_t i = 0; i + 1 < n; ++i) {  // a conv whose only reader is the pool after it
        const auto& s = plan.steps[i];
        const auto& next = plan.steps[i + 1];
        int readers = 0;
        for (const auto& t : plan.steps) readers += (t.in == s.out) + (t.in2 == s.out);
        if (!conv_[i] || !pool_[i + 1] || !conv_[i]->fuses_activation() || next.in != s.out || readers != 1 ||
            s.out == plan.output || plan.shapes[static_cast<std::size_t>(next.out)] == plan.shapes[static_cast<std::size_t>(s.out)])
          continue;
        conv_[i]->pool_after(next.pool);
        chunk_[i + 1] = -1;  // its pool runs inside step i
        // Only a memory-bound conv gains from chunks (few multiply-adds per output: a deep one runs
        // no faster on a chunk, and Winograd loses): at most memory_bound_macs per output element.
        chunk_[i] = batch_;
        if (s.w.numel() / s.w.dim(0) > memory_bound_macs) continue;
        const Shape& y = plan.shapes[static_cast<std::size_t>(s.out)];
        const std::int64_t image = y.numel() / y[0] * static_cast<std::int64_t>(sizeof(E));
        chunk_[i] = std::max<std::int64_t>(1, chunk_bytes / image);
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
      Shape xt = x;  // a convolution run in chunks is tuned at a chunk's batch
      if (chunk_[i] > 0) xt[0] = std::min(xt[0], chunk_[i]);
      conv_[i]->tune(xt, nhwc || x[1] == 1, nhwc || y[1] == 1, s.in2 >= 0);
    }
#endif
  }

  // Step i's convolution tactic ("" where it has none); set_tactic: an engine file's choice.
  // describe: the tactic and, for a convolution run with its pool, that and the chunk.
  std::string describe(std::size_t i) const {
    std::string t = tactic(i);
    if (!t.empty() && chunk_[i] > 0)
      t += chunk_[i] < batch_ ? cutrain::detail::cat(", in chunks of ", chunk_[i], " images with the pool after it")
                              : std::string(", with the pool after it");
    return t;
  }
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
      if (chunk_[i] > 0) return conv_pool(plan, i, v, layout);  // nullopt: the engine runs both steps
      if (chunk_[i] < 0) {  // x pooled already (by step i - 1's conv_pool): it has this step's output shape
        Shape pooled = plan.shapes[static_cast<std::size_t>(s.out)];
        pooled[0] = x.dim(0);
        if (x.shape() == pooled) return x.view();
      }
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
  // A convolution's batch chunk when the pool after it runs with it (0: not; the plan's batch:
  // whole batches); -1 for that pool.
  std::vector<std::int64_t> chunk_;
  std::int64_t batch_ = 0;  // the plan's (largest) batch
  static constexpr std::int64_t chunk_bytes = 1 << 20;  // a chunk's convolution output: in cache
  static constexpr std::int64_t memory_bound_macs = 32;   // C/groups x R x S of a conv that chunks

#ifdef CUTRAIN_ONEDNN
  // Convolution step i and the pool step after it (conv_[i] pools), chunk by chunk of the batch:
  // the pooled output; nullopt where oneDNN has no direct kernel for a chunk (the engine then runs
  // both steps itself).
  std::optional<Tensor<E>> conv_pool(const Plan<E>& plan, std::size_t i, const std::vector<Tensor<E>>& v,
                                     Layout l) const {
    const auto& s = plan.steps[i];
    const Tensor<E>& x = v[static_cast<std::size_t>(s.in)];
    const std::int64_t n = x.dim(0), c = chunk_[i];
    profile::OpScope timed(n > c ? "conv2d_fused_forward + pool2d_forward (oneDNN, in chunks)"
                                 : "conv2d_fused_forward + pool2d_forward (oneDNN)",
                           x.device());
    const Tensor<E> xc = x.layout() == Layout::nhwc ? x.view() : x.contiguous(Layout::row_major);
    const Shape ys = conv2d_output_shape(x.shape(), s.w.shape(), s.conv, "deploy::Engine");
    Tensor<E> y = Tensor<E>::empty(pool2d_output_shape(ys, plan.steps[i + 1].pool, "deploy::Engine"), {.layout = l});
    for (std::int64_t b = 0; b < n; b += c) {
      const std::int64_t e = std::min(n, b + c);
      Tensor<E> yb = y.slice(0, b, e);
      Tensor<E> r;
      if (s.in2 >= 0) r = v[static_cast<std::size_t>(s.in2)].slice(0, b, e);
      if (!conv_[i]->forward(xc.slice(0, b, e), r, yb)) return std::nullopt;
    }
    return y;
  }
#endif
};

}  // namespace cutrain::inline CUTRAIN_ABI::deploy::detail
