// The deploy engine's other f32 CPU steps on oneDNN (cutrain/cpu/onednn.hpp has its
// convolutions, the shared engine, stream and scratch buffers, and includes this file):
//  - Linear: y = act(x w^T + bias), oneDNN's matmul with an eltwise post-op;
//  - Pool2d: max and average pooling (no ceil mode, no dilation), on all of oneDNN's threads.
#pragma once

#include "cutrain/cpu/onednn.hpp"

#ifdef CUTRAIN_ONEDNN

namespace cutrain::inline CUTRAIN_ABI::cpu::onednn {

// A linear layer with its weights, bias and activation fixed: y = act(x w^T + bias) for x [N, in],
// as oneDNN's matmul (its brgemm kernels, whatever BLAS the program links; its inner product
// primitive ran a batch of 1 on one thread, where the weights' reading bounds it).
// Per batch size it keeps a primitive and the weights reordered for it. Safe to call from several
// threads.
class Linear {
 public:
  // w [out, in] and bias [out] (or undefined) are viewed: they must not change while in use.
  Linear(const Tensor<float>& w, const Tensor<float>& bias, const ActivationParams& act)
      : w_(w.contiguous(Layout::row_major)), b_(bias.defined() ? bias.contiguous(Layout::row_major) : Tensor<float>{}),
        act_(act), eltwise_(detail::eltwise(act)) {}

  bool fuses_activation() const { return act_.kind == Activation::identity || eltwise_.has_value(); }

  // act(x w^T + bias) for x [N, in] row-major (the activation only where fuses_activation()).
  Tensor<float> forward(const Tensor<float>& x) const {
    const Tensor<float> xs = x.contiguous(Layout::row_major);
    const Prepared& pr = prepared(x.dim(0));
    Tensor<float> y = Tensor<float>::empty(Shape{x.dim(0), w_.dim(0)});
    dnnl::memory src(pr.src, detail::engine(), xs.data()), dst(pr.dst, detail::engine(), y.data());
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, pr.weights}, {DNNL_ARG_DST, dst}};
    if (b_.defined()) args.emplace(DNNL_ARG_BIAS, dnnl::memory(pr.bias, detail::engine(), b_.data()));
    args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(pr.scratchpad, detail::engine(),
                                                   detail::scratch(2, std::max<std::size_t>(pr.scratchpad.get_size(), 1))));
    pr.mm.execute(detail::stream(), args);
    detail::stream().wait();
    return y;
  }

 private:
  struct Prepared {
    dnnl::matmul mm;
    dnnl::memory weights;
    dnnl::memory::desc src, dst, bias, scratchpad;
  };

  const Prepared& prepared(std::int64_t n) const {
    std::lock_guard lock(m_);
    if (auto it = by_batch_.find(n); it != by_batch_.end()) return *it->second;
    return *by_batch_.emplace(n, std::make_unique<Prepared>(prepare(n))).first->second;
  }

  Prepared prepare(std::int64_t n) const {
    using dnnl::memory;
    const std::int64_t out = w_.dim(0), in = w_.dim(1);
    const memory::desc src({n, in}, detail::dt::f32, detail::tag::ab), dst({n, out}, detail::dt::f32, detail::tag::ab);
    // w [out, in] row-major is the [in, out] weights matrix in column-major order ("ba").
    const memory::desc user_w({in, out}, detail::dt::f32, detail::tag::ba), any_w({in, out}, detail::dt::f32, detail::tag::any);
    const memory::desc bias = b_.defined() ? memory::desc({1, out}, detail::dt::f32, detail::tag::ab) : memory::desc();
    const dnnl::primitive_attr attr = detail::post_ops(eltwise_, false);
    auto& eng = detail::engine();
#if DNNL_VERSION_MAJOR >= 3
    const dnnl::matmul::primitive_desc pd(eng, src, any_w, bias, dst, attr);
#else
    const dnnl::matmul::desc d(src, any_w, bias, dst);
    const dnnl::matmul::primitive_desc pd(d, attr, eng);
#endif
    return {dnnl::matmul(pd), detail::reordered(dnnl::memory(user_w, eng, w_.data()), pd.weights_desc()), src, dst, bias,
            pd.scratchpad_desc()};
  }

  Tensor<float> w_, b_;
  ActivationParams act_;
  std::optional<std::tuple<dnnl::algorithm, float, float>> eltwise_;
  mutable std::mutex m_;
  mutable std::map<std::int64_t, std::unique_ptr<Prepared>> by_batch_;
};

// A 2-d max or average pool as oneDNN's pooling primitive, for the deploy engine's f32 CPU steps:
// x contiguous NHWC or NCHW, y in x's layout. Per input shape it keeps a primitive. Safe to call
// from several threads.
class Pool2d {
 public:
  explicit Pool2d(const Pool2dParams& p) : p_(p) {}

  // Whether p is a pool this class runs: no ceil mode and no dilation (the caller runs the others).
  static bool takes(const Pool2dParams& p) { return !p.ceil_mode && p.dilation_h == 1 && p.dilation_w == 1; }

  Tensor<float> forward(const Tensor<float>& x) const {
    const bool nhwc = x.layout() == Layout::nhwc || x.dim(1) == 1;
    Tensor<float> y = Tensor<float>::empty(pool2d_output_shape(x.shape(), p_, "onednn::Pool2d"),
                                           {.layout = nhwc ? Layout::nhwc : Layout::row_major});
    const Prepared& pr = prepared(x.shape(), nhwc);
    auto& eng = detail::engine();
    dnnl::memory src(pr.src, eng, const_cast<float*>(x.data())), dst(pr.dst, eng, y.data());
    pr.pool.execute(detail::stream(), {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, dst}});
    detail::stream().wait();
    return y;
  }

 private:
  struct Prepared {
    dnnl::pooling_forward pool;
    dnnl::memory::desc src, dst;
  };

  const Prepared& prepared(const Shape& x, bool nhwc) const {
    const auto key = std::tuple{x[0], x[1], x[2], x[3], nhwc};
    std::lock_guard lock(m_);
    if (auto it = by_shape_.find(key); it != by_shape_.end()) return *it->second;
    return *by_shape_.emplace(key, std::make_unique<Prepared>(prepare(x, nhwc))).first->second;
  }

  Prepared prepare(const Shape& x, bool nhwc) const {
    using dnnl::memory;
    const Shape y = pool2d_output_shape(x, p_, "onednn::Pool2d");
    const auto t = nhwc ? detail::tag::nhwc : detail::tag::nchw;
    const memory::desc src({x[0], x[1], x[2], x[3]}, detail::dt::f32, t), dst({y[0], y[1], y[2], y[3]}, detail::dt::f32, t);
    return {dnnl::pooling_forward(detail::pool_desc(src, dst, p_)), src, dst};
  }

  Pool2dParams p_;
  mutable std::mutex m_;
  mutable std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, bool>, std::unique_ptr<Prepared>>
      by_shape_;
};

}  // namespace cutrain::inline CUTRAIN_ABI::cpu::onednn

#endif  // CUTRAIN_ONEDNN
