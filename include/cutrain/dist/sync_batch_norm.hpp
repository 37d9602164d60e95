// dist::SyncBatchNorm2d: batch normalization whose training statistics are those of every
// rank's batch together (PyTorch's SyncBatchNorm), for data-parallel training where each rank's
// batch is small. In training each rank sums x and x^2 per channel, one all-reduce adds them up
// over the ranks (an autograd op: its backward all-reduces the gradients of those sums), and x is
// normalized with the global mean and (biased) variance; the running statistics take the global
// mean and unbiased variance. In eval it is nn::BatchNorm2d. The same parameter and buffer names
// as nn::BatchNorm2d (weight, bias, running_mean, running_var): checkpoints move between them.
//
//   dist::GlooGroup pg(store);
//   nn::Sequential<double> net{nn::Conv2d<double>(...), dist::SyncBatchNorm2d<double>({.features = 32}, pg), ...};
//   dist::DataParallel dp(net, pg);
//
// Limits: x in the parameters' type (no mixed precision), [N, C, H, W] or [N, C]; composed from
// autograd ops (sums, broadcasts, a collective), slower than the fused batch norm; the variance is
// E[x^2] - E[x]^2 summed in the input's type. Every rank must call it in the same order (it is a
// collective), also in a forward whose result is not used.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cutrain/autograd/functions.hpp"
#include "cutrain/dist/process_group.hpp"
#include "cutrain/nn/batch_norm.hpp"
#include "cutrain/nn/module.hpp"

namespace cutrain::inline CUTRAIN_ABI::dist {

namespace detail {

// y = the sum of x over the ranks; dL/dx = the sum of dL/dy over the ranks (every rank's loss
// depends on every rank's x through y).
template <class T>
struct AllReduceSumFn final : autograd::Node<T> {
  ProcessGroup* pg = nullptr;
  std::string_view name() const override { return "dist::all_reduce"; }
  std::vector<Tensor<T>> backward(const Tensor<T>& dy) override {
    std::vector<Tensor<T>> g(1);
    g[0] = dy.clone();
    pg->all_reduce(g[0]).wait();
    return g;
  }
  void release_saved() override {}
};

}  // namespace detail

// The sum of x over the ranks of pg, differentiable (a collective, in forward and in backward).
template <class T>
autograd::Var<T> all_reduce_sum(const autograd::Var<T>& x, ProcessGroup& pg) {
  CUTRAIN_REQUIRE(x.defined(), InvalidArgument, "dist::all_reduce_sum", "x is an undefined Var");
  Tensor<T> y = x.value().clone();
  pg.all_reduce(y).wait();
  auto fn = std::make_shared<detail::AllReduceSumFn<T>>();
  fn->pg = &pg;
  return autograd::detail::finish<T>(std::move(y), fn, {&x});
}

template <class T>
class SyncBatchNorm2d : public nn::Module<SyncBatchNorm2d<T>, T> {
 public:
  SyncBatchNorm2d(const nn::BatchNormOptions& o, ProcessGroup& pg)
      : running_mean(Tensor<T>::zeros(Shape{checked(o).features})),  // checked first: the error names this module
        running_var(Tensor<T>::full(Shape{o.features}, T(1))),
        opts_(o),
        pg_(&pg) {
    weight = autograd::parameter(Tensor<T>::full(Shape{o.features}, T(1)));
    bias = autograd::parameter(Tensor<T>::zeros(Shape{o.features}));
  }

  autograd::Var<T> operator()(const autograd::Var<T>& x) {
    constexpr std::string_view op = "dist::SyncBatchNorm2d";
    CUTRAIN_REQUIRE(x.defined() && (x.value().rank() == 4 || x.value().rank() == 2) &&
                        x.value().dim(1) == opts_.features,
                    InvalidArgument, op, "x must be [N, ", opts_.features, ", H, W] or [N, ", opts_.features,
                    "], got ", x.defined() ? x.value().describe() : std::string("an undefined Var"));
    if (!this->is_training())
      return autograd::batch_norm(x, weight, bias, running_mean, running_var, false,
                                  {.momentum = opts_.momentum, .eps = opts_.eps});
    const bool image = x.value().rank() == 4;
    const Axes axes = image ? Axes{0, 2, 3} : Axes{0};
    const Shape per_channel = image ? Shape{1, opts_.features, 1, 1} : Shape{1, opts_.features};
    // Rows over all ranks: a plain collective (no gradient).
    auto rows = Tensor<T>::full({1}, T(static_cast<double>(x.value().numel() / opts_.features)),
                                {.device = x.device()});
    pg_->all_reduce(rows).wait();
    const double n = static_cast<double>(rows.to_vector()[0]);
    CUTRAIN_REQUIRE(n > 1, InvalidArgument, op, "needs more than one value per channel over all ranks, got ", n);
    const auto sums = all_reduce_sum(autograd::concat(std::vector<autograd::Var<T>>{
                                                          autograd::sum(x, axes, true),
                                                          autograd::sum(autograd::multiply(x, x), axes, true)},
                                                      0),
                                     *pg_);
    const auto mean = autograd::scale(autograd::slice(sums, 0, 0, 1), 1.0 / n);
    const auto ex2 = autograd::scale(autograd::slice(sums, 0, 1, 2), 1.0 / n);
    const auto var = autograd::sub(ex2, autograd::multiply(mean, mean));
    const autograd::Var<T> eps(Tensor<T>::full(per_channel, T(opts_.eps), {.device = x.device()}));
    const auto inv = autograd::rsqrt(autograd::add(var, eps));
    const auto y = autograd::multiply(autograd::multiply(autograd::sub(x, mean), inv),
                                      autograd::reshape(weight, per_channel));
    {
      autograd::NoGradGuard no_grad;  // running = (1 - momentum) running + momentum batch
      update(running_mean, mean.value().reshape({opts_.features}), 1.0);
      update(running_var, var.value().reshape({opts_.features}), n / (n - 1));
    }
    return autograd::add(y, autograd::reshape(bias, per_channel));
  }

  void visit_params(const std::string& prefix, const nn::ParamVisitor<T>& f) {
    f(nn::join_name(prefix, "weight"), weight);
    f(nn::join_name(prefix, "bias"), bias);
  }
  void visit_buffers(const std::string& prefix, const nn::BufferVisitor<T>& f) {
    f(nn::join_name(prefix, "running_mean"), running_mean);
    f(nn::join_name(prefix, "running_var"), running_var);
  }
  const nn::BatchNormOptions& options() const { return opts_; }

  autograd::Var<T> weight, bias;
  Tensor<T> running_mean, running_var;

 private:
  static const nn::BatchNormOptions& checked(const nn::BatchNormOptions& o) {
    CUTRAIN_REQUIRE(o.features > 0, InvalidArgument, "dist::SyncBatchNorm2d", "features must be > 0, got ", o.features);
    CUTRAIN_REQUIRE(o.eps > 0 && o.momentum >= 0 && o.momentum <= 1, InvalidArgument, "dist::SyncBatchNorm2d",
                    "need eps > 0 and momentum in [0, 1], got eps ", o.eps, ", momentum ", o.momentum);
    return o;
  }
  void update(Tensor<T>& running, const Tensor<T>& batch, double correction) const {
    const auto r = running.to_vector(), b = batch.to_vector();
    std::vector<T> out(r.size());
    for (std::size_t c = 0; c < r.size(); ++c)
      out[c] = T((1 - opts_.momentum) * static_cast<double>(r[c]) +
                 opts_.momentum * correction * static_cast<double>(b[c]));
    running.assign(out);
  }

  nn::BatchNormOptions opts_;
  ProcessGroup* pg_;
};

}  // namespace cutrain::inline CUTRAIN_ABI::dist
