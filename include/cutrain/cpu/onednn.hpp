// f32 forward convolutions and linear layers on the CPU through oneDNN (Debian's libdnnl, 2.x or
// 3.x), for programs built against cutrain::onednn (CUTRAIN_ONEDNN defined).
//  - Conv2d: y = act(conv(x, w) + bias + residual) as one oneDNN primitive (bias, a sum post-op
//    for the residual, an eltwise post-op for the activation), on x in NHWC or NCHW as it is, with
//    weights in the blocked format oneDNN picks for the CPU it runs on (its brgemm/JIT kernels:
//    AVX2, AVX-512, AMX). cpu::conv2d_fused_forward and cpu::conv2d_forward use it for f32 (f64,
//    the gradient checks' and GPU tests' oracle, stays on Eigen).
//  - Linear: y = act(x w^T + bias), oneDNN's matmul with the same post-op, and
//  - Pool2d: max and average pooling (no ceil mode, no dilation), both in onednn_layers.hpp.
// The deploy engine keeps one of each per step, whose weights are reordered once per input shape
// and kept. Threads: oneDNN's OpenMP pool (cpu::set_num_threads sets it).
#pragma once

#include "cutrain/core/abi.hpp"

namespace cutrain::inline CUTRAIN_ABI::cpu::onednn {
class Conv2d;  // declared in every build, so that a class holding one has one layout
class Linear;
class Pool2d;
}

#ifdef CUTRAIN_ONEDNN

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

#include "cutrain/core/params/activation.hpp"
#include "cutrain/core/params/conv2d.hpp"
#include "cutrain/core/params/pool2d.hpp"
#include "cutrain/core/random.hpp"
#include "cutrain/core/tensor.hpp"

namespace cutrain::inline CUTRAIN_ABI::cpu::onednn {

namespace detail {
using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;

// oneDNN's CPU engine, one for the process (immutable once made: a primitive made on one thread
// runs on another's stream only if both come from the same engine), and a stream per thread.
inline dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}
inline dnnl::stream& stream() {
  thread_local dnnl::stream s(engine());
  return s;
}

// oneDNN's eltwise post-op for act, or nullopt (identity, or none that matches cutrain's form).
inline std::optional<std::tuple<dnnl::algorithm, float, float>> eltwise(const ActivationParams& a) {
  using A = dnnl::algorithm;
  const auto alpha = static_cast<float>(a.alpha);
  switch (a.kind) {
    case Activation::relu: return std::tuple{A::eltwise_relu, 0.0f, 0.0f};
    case Activation::leaky_relu: return std::tuple{A::eltwise_relu, alpha, 0.0f};
    case Activation::elu: return std::tuple{A::eltwise_elu, alpha, 0.0f};
    case Activation::sigmoid: return std::tuple{A::eltwise_logistic, 0.0f, 0.0f};
    case Activation::tanh: return std::tuple{A::eltwise_tanh, 0.0f, 0.0f};
    case Activation::gelu_erf: return std::tuple{A::eltwise_gelu_erf, 0.0f, 0.0f};
    case Activation::gelu_tanh: return std::tuple{A::eltwise_gelu_tanh, 0.0f, 0.0f};
    case Activation::silu: return std::tuple{A::eltwise_swish, 1.0f, 0.0f};
    default: return std::nullopt;
  }
}
// The attributes of act (+ a sum first, for a residual): post-ops oneDNN fuses into the op.
inline dnnl::primitive_attr post_ops(const std::optional<std::tuple<dnnl::algorithm, float, float>>& act, bool sum) {
  dnnl::post_ops po;
  if (sum) po.append_sum(1.0f);
  if (act) {
    const auto [alg, alpha, beta] = *act;
#if DNNL_VERSION_MAJOR >= 3
    po.append_eltwise(alg, alpha, beta);
#else
    po.append_eltwise(1.0f, alg, alpha, beta);
#endif
  }
  dnnl::primitive_attr attr;
  attr.set_post_ops(po);
  // The primitive's scratchpad comes from the caller (a thread's own buffer, scratch slot 2): a
  // library-managed one is shared by the threads running the primitive at once.
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

// A descriptor's dims, as a Shape (oneDNN 2 and 3 name the getter differently).
inline Shape dims_of(const dnnl::memory::desc& d) {
#if DNNL_VERSION_MAJOR >= 3
  const auto v = d.get_dims();
#else
  const auto v = d.dims();
#endif
  return Shape(std::vector<std::int64_t>(v.begin(), v.end()));
}

// This thread's scratch buffer slot (0: x's blocked copy, 1: y's, 2: the primitive's scratchpad,
// 3: a pool's output after a convolution), at least bytes long: grown to the largest asked for
// and kept, so that a convolution through the blocked layout allocates, page-faults and
// zero-fills nothing per call.
inline void* scratch(int slot, std::size_t bytes) {
  struct Buffer {
    void* p = nullptr;
    std::size_t n = 0;
    ~Buffer() { ::operator delete(p, std::align_val_t{64}); }
  };
  thread_local std::array<Buffer, 4> buffers;
  Buffer& b = buffers[static_cast<std::size_t>(slot)];
  if (b.n < bytes) {
    ::operator delete(b.p, std::align_val_t{64});
    b.p = nullptr;
    b.p = ::operator new(bytes, std::align_val_t{64});
    b.n = bytes;
  }
  return b.p;
}

// user reordered into a new memory of desc (weights into the format a primitive chose).
inline dnnl::memory reordered(dnnl::memory user, const dnnl::memory::desc& desc) {
  dnnl::memory m(desc, engine());
  dnnl::reorder(user, m).execute(stream(), user, m);
  stream().wait();
  return m;
}

// The inference pooling primitive of p from src to dst (dst may be format any: src's family).
inline dnnl::pooling_forward::primitive_desc pool_desc(const dnnl::memory::desc& src, const dnnl::memory::desc& dst,
                                                       const Pool2dParams& p) {
  using dnnl::memory;
  const auto alg = p.mode == PoolMode::max ? dnnl::algorithm::pooling_max
                   : p.count_include_pad  ? dnnl::algorithm::pooling_avg_include_padding
                                          : dnnl::algorithm::pooling_avg_exclude_padding;
  const memory::dims strides{p.effective_stride_h(), p.effective_stride_w()}, kernel{p.kernel_h, p.kernel_w};
  const memory::dims pad_l{p.pad_top, p.pad_left}, pad_r{p.pad_bottom, p.pad_right};
#if DNNL_VERSION_MAJOR >= 3
  return dnnl::pooling_forward::primitive_desc(engine(), dnnl::prop_kind::forward_inference, alg, src, dst, strides,
                                               kernel, memory::dims{0, 0}, pad_l, pad_r);
#else
  const dnnl::pooling_forward::desc d(dnnl::prop_kind::forward_inference, alg, src, dst, strides, kernel, pad_l, pad_r);
  return dnnl::pooling_forward::primitive_desc(d, engine());
#endif
}
}  // namespace detail

// A convolution with its weights, bias, parameters and activation fixed: forward(x, residual)
// for any x of w's channels. Per input shape (and layout, and whether a residual comes) it keeps
// a primitive and the weights reordered for it. Safe to call from several threads.
//
// Its tactics (candidate primitives): "direct nhwc" / "direct nchw" on x's own layout (oneDNN's
// brgemm/JIT kernels for NHWC); "direct blocked" on the blocked layout oneDNN prefers (nChw16c on
// AVX-512), x reordered into it and y out of it; "direct to blocked", x as it is and y blocked
// (oneDNN's kernel for a first layer of few input channels); for 3x3 stride-1 convolutions "winograd blocked",
// Winograd F(4x4, 3x3) on the blocked layout. By default it runs the first direct one oneDNN has
// a kernel for. tune(...) times every tactic at one input shape, the reorders included, and sets
// the fastest whose output agrees with the direct one's (Winograd rounds differently: within 1e-4
// of the output's largest magnitude); that tactic then runs at every shape that has it. The
// deploy engine tunes at its compiled batch and keeps the choice in its engine file
// (set_tactic), so that a loaded engine computes what the saved one did.
//
// With pool_after(p) it also runs the pool after it: its output goes from the convolution to the
// pool in the convolution's own format (blocked for the blocked tactics) and only the pooled
// output is reordered into y's layout. Tuning then times the two together.
class Conv2d {
 public:
  // w [K, C/groups, R, S] and bias [K] (or undefined) are viewed, not copied: they must not
  // change while this object is used (the deploy engine's weights do not).
  Conv2d(const Tensor<float>& w, const Tensor<float>& bias, const Conv2dParams& p, const ActivationParams& act)
      : w_(w.contiguous(Layout::row_major)), b_(bias.defined() ? bias.contiguous(Layout::row_major) : Tensor<float>{}),
        p_(p), act_(act), eltwise_(detail::eltwise(act)) {}

  // Times the tactics on random data of x's shape and layouts (x_nhwc, y_nhwc: NHWC, else NCHW),
  // with a residual or not, and sets the winner; returns "winograd blocked (direct nhwc 7.2 ms;
  // ...)", or "" where oneDNN has no direct kernel at all. Call it before forward runs elsewhere.
  std::string tune(const Shape& x, bool x_nhwc, bool y_nhwc, bool residual) {
    Prepared pr = prepare(x, x_nhwc, y_nhwc, residual, /*all=*/true);
    std::lock_guard lock(m_);
    by_shape_.clear();  // prepared for the old tactic
    tactic_ = pr.chosen ? pr.chosen->name : std::string();
    return pr.chosen ? cutrain::detail::cat(tactic_, " (", pr.report, ")") : std::string();
  }
  // The tactic to run (as tune sets it; a name this oneDNN does not offer at a shape runs the default).
  void set_tactic(std::string name) {
    std::lock_guard lock(m_);
    by_shape_.clear();
    tactic_ = std::move(name);
  }
  std::string tactic() const {
    std::lock_guard lock(m_);
    return tactic_;
  }

  // Whether forward applies act itself (as a post-op); else the caller applies it after.
  bool fuses_activation() const { return act_.kind == Activation::identity || eltwise_.has_value(); }

  // From now on forward pools its output with p (a pool Pool2d takes; set before any forward or
  // tune, and only where fuses_activation()).
  void pool_after(const Pool2dParams& p) {
    std::lock_guard lock(m_);
    by_shape_.clear();
    pool_ = p;
  }

  // act(conv(x, w) + bias + residual) into y [N, K, Ho, Wo] (pooled: pool_after's output of
  // that), NHWC or NCHW, contiguous, from x contiguous NHWC or NCHW; residual undefined or the
  // convolution's output shape, any layout. The activation is applied only where
  // fuses_activation(). False, having run nothing, where oneDNN has no direct kernel (only its
  // im2col + GEMM or reference code): cutrain's own im2col is no slower, and the caller runs it.
  [[nodiscard]] bool forward(const Tensor<float>& x, const Tensor<float>& residual, Tensor<float>& y) const {
    const Prepared& pr = prepared(x.shape(), nhwc(x), nhwc(y), residual.defined());
    if (!pr.chosen) return false;
    run(*pr.chosen, pr, x, residual, y);
    return true;
  }

 private:
  struct Candidate {
    std::string name;
    dnnl::convolution_forward conv;
    dnnl::memory weights;                   // in the primitive's format
    dnnl::memory::desc conv_src, conv_dst;  // the primitive's formats (the user's, or blocked)
    dnnl::memory::desc scratchpad;          // what it needs of the thread's scratchpad
    std::optional<dnnl::pooling_forward> pool;  // pool_after's, from conv_dst
    dnnl::memory::desc pool_dst;                // its output format (conv_dst's family)
    bool x_own = false;  // it takes x as it lies (conv_src is the user's, or the same memory)
  };
  struct Prepared {
    std::optional<Candidate> chosen;  // nullopt: no direct kernel
    dnnl::memory::desc src, dst, bias;  // the user's formats (dst: y's, pooled with pool_after)
    dnnl::memory::desc conv;            // the convolution's output in y's layout (a residual's)
    std::string report;
  };
  using Key = std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, bool, bool, bool>;

  // A tensor of one channel is NCHW and NHWC at once: described as NHWC, which has direct kernels.
  static bool nhwc(const Tensor<float>& t) { return t.layout() == Layout::nhwc || t.dim(1) == 1; }
  // Whether a and b are the same memory: one channel, each NCHW or NHWC.
  static bool one_channel_plain(const dnnl::memory::desc& a, const dnnl::memory::desc& b) {
    const Shape d = detail::dims_of(a);
    if (d.rank() != 4 || d[1] != 1 || detail::dims_of(b) != d) return false;
    const dnnl::memory::dims v{d[0], d[1], d[2], d[3]};
    const auto plain = [&](const dnnl::memory::desc& m) {
      return m == dnnl::memory::desc(v, detail::dt::f32, detail::tag::nchw) ||
             m == dnnl::memory::desc(v, detail::dt::f32, detail::tag::nhwc);
    };
    return plain(a) && plain(b);
  }

  const Prepared& prepared(const Shape& x, bool x_nhwc, bool y_nhwc, bool residual) const {
    const Key key{x[0], x[1], x[2], x[3], x_nhwc, y_nhwc, residual};
    std::lock_guard lock(m_);
    if (auto it = by_shape_.find(key); it != by_shape_.end()) return *it->second;
    return *by_shape_.emplace(key, std::make_unique<Prepared>(prepare(x, x_nhwc, y_nhwc, residual, false)))
                .first->second;
  }

  // The candidate primitive of these formats and algorithm, its weights reordered; nullopt where
  // oneDNN has none, or only im2col + GEMM ("gemm:...") or reference ("ref:...") code.
  std::optional<Candidate> candidate(std::string name, const dnnl::memory::desc& src, const dnnl::memory::desc& dst,
                                     dnnl::algorithm alg, bool residual) const {
    using dnnl::memory;
    const std::int64_t K = w_.dim(0), C = detail::dims_of(src)[1], R = w_.dim(2), S = w_.dim(3), G = p_.groups;
    const memory::dims wdims = G == 1 ? memory::dims{K, C, R, S} : memory::dims{G, K / G, C / G, R, S};
    const memory::desc user_w(wdims, detail::dt::f32, G == 1 ? detail::tag::oihw : detail::tag::goihw);
    const memory::desc any_w(wdims, detail::dt::f32, detail::tag::any);
    const memory::desc bias = b_.defined() ? memory::desc({K}, detail::dt::f32, detail::tag::a) : memory::desc();
    const dnnl::primitive_attr attr = detail::post_ops(eltwise_, residual);
    const memory::dims strides{p_.stride_h, p_.stride_w}, dilation{p_.dilation_h - 1, p_.dilation_w - 1};
    const memory::dims pad_l{p_.pad_top, p_.pad_left}, pad_r{p_.pad_bottom, p_.pad_right};
    auto& eng = detail::engine();
    try {
#if DNNL_VERSION_MAJOR >= 3
      const dnnl::convolution_forward::primitive_desc pd(eng, dnnl::prop_kind::forward_inference, alg, src, any_w, bias,
                                                         dst, strides, dilation, pad_l, pad_r, attr);
#else
      const dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_inference, alg, src, any_w, bias, dst, strides,
                                              dilation, pad_l, pad_r);
      const dnnl::convolution_forward::primitive_desc pd(d, attr, eng);
#endif
      // Its direct kernels are "jit..." and "brg..."; "gemm:..." (im2col) and "ref:..." are not.
      const std::string_view impl = pd.impl_info_str();
      if (!impl.starts_with("jit") && !impl.starts_with("brg")) return std::nullopt;
      Candidate c{std::move(name), dnnl::convolution_forward(pd),
                  detail::reordered(dnnl::memory(user_w, eng, w_.data()), pd.weights_desc()), pd.src_desc(),
                  pd.dst_desc(), pd.scratchpad_desc(), std::nullopt, {}, false};
      if (pool_) {  // on the convolution's output format; its own output in that format's family
        const Shape ps = pool2d_output_shape(detail::dims_of(c.conv_dst), *pool_, "onednn::Conv2d");
        const auto pp = detail::pool_desc(c.conv_dst, memory::desc({ps[0], ps[1], ps[2], ps[3]}, detail::dt::f32,
                                                                   detail::tag::any), *pool_);
        c.pool = dnnl::pooling_forward(pp);
        c.pool_dst = pp.dst_desc();
      }
      return c;
    } catch (const dnnl::error&) {  // no implementation of this algorithm for the shape
      return std::nullopt;
    }
  }

  // c on x (and the residual) into y, through c's formats.
  void run(const Candidate& c, const Prepared& pr, const Tensor<float>& x, const Tensor<float>& residual,
           Tensor<float>& y) const {
    auto& eng = detail::engine();
    auto& s = detail::stream();
    const bool x_own = c.x_own;
    dnnl::memory xu(x_own ? c.conv_src : pr.src, eng, const_cast<float*>(x.data())), yu(pr.dst, eng, y.data());
    // The convolution writes y itself where it is in y's format and no pool follows.
    const bool y_own = c.conv_dst == pr.dst && !c.pool;
    dnnl::memory xs = x_own ? xu : dnnl::memory(c.conv_src, eng, detail::scratch(0, c.conv_src.get_size()));
    dnnl::memory ys = y_own ? yu : dnnl::memory(c.conv_dst, eng, detail::scratch(1, c.conv_dst.get_size()));
    if (!x_own) dnnl::reorder(xu, xs).execute(s, xu, xs);
    if (residual.defined()) {  // the sum post-op adds to what the convolution's output holds
      if (y_own) {
        y.copy_from(residual);
      } else {
        const Tensor<float> r = residual.contiguous(nhwc(y) ? Layout::nhwc : Layout::row_major);
        dnnl::memory ru(pr.conv, eng, const_cast<float*>(r.data()));
        dnnl::reorder(ru, ys).execute(s, ru, ys);
      }
    }
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, xs}, {DNNL_ARG_WEIGHTS, c.weights}, {DNNL_ARG_DST, ys}};
    args.emplace(DNNL_ARG_SCRATCHPAD,
                 dnnl::memory(c.scratchpad, eng, detail::scratch(2, std::max<std::size_t>(c.scratchpad.get_size(), 1))));
    if (b_.defined()) args.emplace(DNNL_ARG_BIAS, dnnl::memory(pr.bias, eng, b_.data()));
    c.conv.execute(s, args);
    if (c.pool) {
      const bool p_own = c.pool_dst == pr.dst;
      dnnl::memory ps = p_own ? yu : dnnl::memory(c.pool_dst, eng, detail::scratch(3, c.pool_dst.get_size()));
      c.pool->execute(s, {{DNNL_ARG_SRC, ys}, {DNNL_ARG_DST, ps}});
      if (!p_own) dnnl::reorder(ps, yu).execute(s, ps, yu);
    } else if (!y_own) {
      dnnl::reorder(ys, yu).execute(s, ys, yu);
    }
    s.wait();
  }

  // The tactics at x's shape: all of them, timed, the fastest that agrees chosen (all); else the
  // one set (tactic_, read under m_ by the caller) where oneDNN has it, or the first direct one.
  Prepared prepare(const Shape& x, bool x_nhwc, bool y_nhwc, bool residual, bool all) const {
    using dnnl::memory;
    const std::int64_t N = x[0], C = x[1], H = x[2], W = x[3], K = w_.dim(0), R = w_.dim(2), S = w_.dim(3);
    const std::int64_t Ho = (H + p_.pad_top + p_.pad_bottom - p_.dilation_h * (R - 1) - 1) / p_.stride_h + 1;
    const std::int64_t Wo = (W + p_.pad_left + p_.pad_right - p_.dilation_w * (S - 1) - 1) / p_.stride_w + 1;
    Prepared pr;
    const auto y_tag = y_nhwc ? detail::tag::nhwc : detail::tag::nchw;
    pr.src = memory::desc({N, C, H, W}, detail::dt::f32, x_nhwc ? detail::tag::nhwc : detail::tag::nchw);
    pr.conv = memory::desc({N, K, Ho, Wo}, detail::dt::f32, y_tag);
    pr.dst = pr.conv;
    if (pool_) {
      const Shape ps = pool2d_output_shape(Shape{N, K, Ho, Wo}, *pool_, "onednn::Conv2d");
      pr.dst = memory::desc({ps[0], ps[1], ps[2], ps[3]}, detail::dt::f32, y_tag);
    }
    if (b_.defined()) pr.bias = memory::desc({K}, detail::dt::f32, detail::tag::a);
    const memory::desc any_src({N, C, H, W}, detail::dt::f32, detail::tag::any);
    const memory::desc any_dst({N, K, Ho, Wo}, detail::dt::f32, detail::tag::any);
    const auto direct = dnnl::algorithm::convolution_direct;
    const bool wino = R == 3 && S == 3 && p_.stride_h == 1 && p_.stride_w == 1 && p_.dilation_h == 1 &&
                      p_.dilation_w == 1 && p_.groups == 1;
    const std::string own = x_nhwc ? "direct nhwc" : "direct nchw";
    const auto build = [&](const std::string& name) -> std::optional<Candidate> {
      if (name == "direct nhwc" || name == "direct nchw")
        return name == own ? candidate(name, pr.src, pr.conv, direct, residual) : std::nullopt;
      if (name == "direct blocked") return candidate(name, any_src, any_dst, direct, residual);
      if (name == "direct to blocked") {  // x as it is (one channel: as NCHW), y blocked
        const bool avx512 = dnnl::get_effective_cpu_isa() >= dnnl::cpu_isa::avx512_core;
        const memory::desc src = C == 1 ? memory::desc({N, C, H, W}, detail::dt::f32, detail::tag::nchw) : pr.src;
        return candidate(name, src, memory::desc({N, K, Ho, Wo}, detail::dt::f32,
                                                 avx512 ? detail::tag::aBcd16b : detail::tag::aBcd8b),
                         direct, residual);
      }
      if (name == "winograd blocked" && wino)
        return candidate(name, any_src, any_dst, dnnl::algorithm::convolution_winograd, residual);
      return std::nullopt;
    };
    const auto make = [&](const std::string& name) {
      auto c = build(name);  // x as it lies where c takes it so (one channel: NCHW and NHWC alike)
      if (c) c->x_own = c->conv_src == pr.src || one_channel_plain(c->conv_src, pr.src);
      return c;
    };
    if (!all) {
      if (!tactic_.empty()) pr.chosen = make(tactic_);
      if (!pr.chosen) pr.chosen = make(own);
      if (!pr.chosen) pr.chosen = make("direct blocked");
      return pr;
    }
    std::vector<Candidate> cands;
    for (const std::string& name :
         {own, std::string("direct blocked"), std::string("direct to blocked"), std::string("winograd blocked")})
      if (auto c = make(name)) cands.push_back(std::move(*c));
    if (!cands.empty()) pr.chosen = std::move(choose(cands, pr, x, x_nhwc, y_nhwc, residual, pr.report));
    return pr;
  }

  // The fastest candidate on random data of x's shape whose output agrees with the first's (a
  // direct one); how each did goes into report.
  Candidate& choose(std::vector<Candidate>& cands, const Prepared& pr, const Shape& x, bool x_nhwc, bool y_nhwc,
                    bool residual, std::string& report) const {
    const Layout xl = x_nhwc ? Layout::nhwc : Layout::row_major, yl = y_nhwc ? Layout::nhwc : Layout::row_major;
    Rng rng(x.numel());
    const Shape ys = detail::dims_of(pr.dst);
    const auto xt = Tensor<float>::uniform(x, rng, -1, 1, {.layout = xl});
    const auto rt = residual ? Tensor<float>::uniform(detail::dims_of(pr.conv), rng, -1, 1, {.layout = yl}) : Tensor<float>{};
    std::vector<float> ref;
    double best_ms = 0;
    std::size_t best = 0;
    for (std::size_t i = 0; i < cands.size(); ++i) {
      Tensor<float> y(ys, {.layout = yl});
      run(cands[i], pr, xt, rt, y);  // warm-up: pages touched, caches filled
      double ms = 0;
      for (int k = 0; k < 3; ++k) {
        const auto t0 = std::chrono::steady_clock::now();
        run(cands[i], pr, xt, rt, y);
        const double t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        ms = k == 0 ? t : std::min(ms, t);
      }
      const auto out = y.to_vector();
      bool agrees = true;
      if (i == 0) {
        ref = out;
      } else {
        double err = 0, peak = 1;
        for (std::size_t e = 0; e < out.size(); ++e) {
          err = std::max(err, static_cast<double>(std::abs(out[e] - ref[e])));
          peak = std::max(peak, static_cast<double>(std::abs(ref[e])));
        }
        agrees = err <= 1e-4 * peak;
      }
      report += cutrain::detail::cat(i ? "; " : "", cands[i].name, " ", ms, " ms", agrees ? "" : " (disagrees)");
      if (agrees && (i == 0 || ms < best_ms)) best = i, best_ms = ms;
    }
    return cands[best];
  }

  Tensor<float> w_, b_;
  Conv2dParams p_;
  ActivationParams act_;
  std::optional<std::tuple<dnnl::algorithm, float, float>> eltwise_;
  std::optional<Pool2dParams> pool_;  // pool_after's
  mutable std::mutex m_;
  std::string tactic_;  // under m_
  mutable std::map<Key, std::unique_ptr<Prepared>> by_shape_;
};

}  // namespace cutrain::inline CUTRAIN_ABI::cpu::onednn

#include "cutrain/cpu/onednn_layers.hpp"  // Linear, Pool2d

#endif  // CUTRAIN_ONEDNN
