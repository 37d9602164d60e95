// Every op on every device: random shapes (rank 1-5, sizes 1-7 and a few large ones, odd channel
// counts, batch 1) and random views (contiguous, every-other-element slices, transposes) for each
// op, on the GPU against the CPU backend in f64 on the same rounded data, in f32, bf16 and f16.
// The property: an input the CPU accepts runs on the GPU and agrees with it; an input the CPU
// refuses the GPU refuses too (a cutrain::Error, not a crash). Also the fallback kernels (where
// cuDNN has no engine: cuda/kernels/activation.hpp, batch_norm_train.hpp) called directly.
#include "parity.hpp"

#include "cutrain/cutrain.hpp"
#include "cutrain/ops/cast.hpp"

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "cutrain/cuda/kernels/activation.hpp"
#include "cutrain/cuda/kernels/batch_norm_train.hpp"

namespace cutrain_test_property_gpu {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;

namespace {

// A size: mostly 1-7, now and then larger (odd where it matters).
std::int64_t random_size(Rng& rng) { return rng.below(12) == 0 ? 17 + 2 * static_cast<std::int64_t>(rng.below(40)) : 1 + static_cast<std::int64_t>(rng.below(7)); }

Shape random_shape(Rng& rng, int min_rank, int max_rank) {
  const int rank = min_rank + static_cast<int>(rng.below(static_cast<std::uint64_t>(max_rank - min_rank + 1)));
  std::vector<std::int64_t> d;
  std::int64_t n = 1;
  for (int i = 0; i < rank; ++i) {
    std::int64_t s = random_size(rng);
    if (n * s > 300000) s = 1;  // keep each case small
    d.push_back(s);
    n *= s;
  }
  return Shape(d);
}

// x (on cuda:0) and ref (the same values in f64 on the host), both a view `how` of shape s.
template <class T>
struct Input {
  Tensor<T> x;
  Tensor<double> ref;
  std::string how;
};

// A random view of shape s: contiguous (row-major, or NHWC for rank 4), every other element of a
// twice-as-long axis (odd strides), or the transpose of a tensor laid out the other way round.
template <class T>
Input<T> random_input(const Shape& s, Rng& rng) {
  const int kind = static_cast<int>(rng.below(4));
  if (kind <= 1 || s.rank() == 0) {
    const Layout l = kind == 1 && s.rank() == 4 ? Layout::nhwc : Layout::row_major;
    auto [x, ref] = random_pair<T>(s, rng, l);
    return {std::move(x), std::move(ref), l == Layout::nhwc ? "nhwc" : "contiguous"};
  }
  const int a = static_cast<int>(rng.below(static_cast<std::uint64_t>(s.rank())));
  std::vector<std::int64_t> d = s.dims();
  if (kind == 2) {  // slice with step 2
    d[static_cast<std::size_t>(a)] = 2 * d[static_cast<std::size_t>(a)];
    auto [x, ref] = random_pair<T>(Shape(d), rng, Layout::row_major);
    return {cutrain::slice(x, a, 1, cutrain::slice_end, 2), cutrain::slice(ref, a, 1, cutrain::slice_end, 2),
            cutrain::detail::cat("slice(", a, ", step 2)")};
  }
  const int b = static_cast<int>(rng.below(static_cast<std::uint64_t>(s.rank())));
  std::swap(d[static_cast<std::size_t>(a)], d[static_cast<std::size_t>(b)]);
  auto [x, ref] = random_pair<T>(Shape(d), rng, Layout::row_major);
  return {cutrain::transpose(x, a, b), cutrain::transpose(ref, a, b), cutrain::detail::cat("transpose(", a, ", ", b, ")")};
}

// The pooling output shape, or [1, 1, 1, 1] where the CPU refuses p (the case then checks that
// both backends refuse it).
inline Shape pool2d_output_shape_or(const Shape& x, const Pool2dParams& p) {
  try {
    return pool2d_output_shape(x, p);
  } catch (const Error&) {
    return Shape{1, 1, 1, 1};
  }
}

// max |gpu - ref| / max(1, max |ref|), NaN counting as infinite.
template <class T>
double scaled_error(const Tensor<T>& gpu, const Tensor<double>& ref) {
  if (gpu.shape() != ref.shape()) return std::numeric_limits<double>::infinity();
  const auto g = cast<double>(gpu).to_vector();
  const auto r = ref.to_vector();
  // f16 holds nothing above 65504: a larger reference value is +-inf there (rounding from 65520).
  constexpr double inf = std::numeric_limits<double>::infinity();
  constexpr double max_finite = std::is_same_v<T, cutrain::half> ? 65519.0 : inf;
  double max_err = 0, max_ref = 1;
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(g[i]) != std::isnan(r[i])) return inf;
    if (std::isnan(r[i])) continue;
    const double ri = std::abs(r[i]) > max_finite ? std::copysign(inf, r[i]) : r[i];
    if (std::isinf(ri) || std::isinf(g[i])) {
      if (g[i] != ri) return inf;
      continue;
    }
    max_err = std::max(max_err, std::abs(g[i] - ri));
    max_ref = std::max(max_ref, std::abs(ri));
  }
  return max_err / max_ref;
}

// One op's outcome per case: the outputs' worst scaled error, or the exception text.
struct Tally {
  int cases = 0, refused_by_both = 0;
  std::vector<std::string> failures;
};

// Runs cpu() and gpu() (each returning a list of outputs); records a failure where the CPU
// accepts and the GPU throws, disagrees (beyond tol) or where the CPU refuses and the GPU does not.
template <class T>
void run_case(Tally& t, const std::string& what, double tol, const std::function<std::vector<Tensor<double>>()>& cpu,
              const std::function<std::vector<Tensor<T>>()>& gpu) {
  ++t.cases;
  std::vector<Tensor<double>> want;
  std::string cpu_error;
  try {
    want = cpu();
  } catch (const Error& e) {
    cpu_error = e.what();
  }
  std::vector<Tensor<T>> got;
  try {
    got = gpu();
    cuda::synchronize();
  } catch (const Error& e) {
    if (cpu_error.empty()) t.failures.push_back(what + ": the CPU accepts it, the GPU throws: " + e.what());
    else ++t.refused_by_both;
    return;
  }
  if (!cpu_error.empty()) {
    t.failures.push_back(what + ": the CPU refuses it (" + cpu_error + "), the GPU does not");
    return;
  }
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double err = scaled_error(got[i], want[i]);
    if (!(err <= tol))
      t.failures.push_back(cutrain::detail::cat(what, ": output ", i, " scaled error ", err, " > ", tol));
  }
}

template <class T>
std::vector<Tensor<double>> refs(Tensor<double> a) {
  std::vector<Tensor<double>> v;
  v.push_back(std::move(a));
  return v;
}
template <class T>
std::vector<Tensor<T>> outs(Tensor<T> a) {
  std::vector<Tensor<T>> v;
  v.push_back(std::move(a));
  return v;
}

const Activation kinds[] = {Activation::identity, Activation::relu,     Activation::leaky_relu,
                            Activation::elu,      Activation::sigmoid,  Activation::tanh,
                            Activation::gelu_erf, Activation::gelu_tanh, Activation::silu};

template <class T>
void property_suite(int cases_per_op) {
  Rng rng(0x5eedull + sizeof(T) * 1000 + static_cast<std::uint64_t>(dtype_of<T>));
  std::map<std::string, Tally> tallies;
  const double tol = tolerance<T> * (std::is_same_v<T, float> ? 10 : 2);
  const auto label = [](const char* op, const Input<T>& in) {
    return cutrain::detail::cat(op, " ", dtype_of<T>, " x ", in.x.shape(), " as ", in.how);
  };
  for (int i = 0; i < cases_per_op; ++i) {
    {  // activations, forward and backward: ranks 1-5, the tiny sizes cuDNN has no engine for
      const ActivationParams a{.kind = kinds[rng.below(9)], .alpha = 0.2};
      const Shape s = random_shape(rng, 1, 5);
      const Input<T> x = random_input<T>(s, rng), dy = random_input<T>(s, rng);
      const std::string what = label("activation", x) + cutrain::detail::cat(" ", a.kind);
      run_case<T>(
          tallies["activation"], what, tol,
          [&] {
            std::vector<Tensor<double>> v;
            v.push_back(ops::activation_forward(x.ref, a));
            v.push_back(ops::activation_backward(x.ref, dy.ref, a));
            return v;
          },
          [&] {
            std::vector<Tensor<T>> v;
            v.push_back(ops::activation_forward(x.x, a));
            v.push_back(ops::activation_backward(x.x, dy.x, a));
            return v;
          });
    }
    {  // add, multiply, scale: the same shape, each input its own view
      const Shape s = random_shape(rng, 1, 5);
      const Input<T> a = random_input<T>(s, rng), b = random_input<T>(s, rng);
      run_case<T>(
          tallies["add/multiply/scale"], label("add/multiply/scale", a) + " and " + b.how, tol,
          [&] {
            std::vector<Tensor<double>> v;
            v.push_back(ops::add(a.ref, b.ref));
            v.push_back(ops::multiply(a.ref, b.ref));
            v.push_back(ops::scale(a.ref, -1.5));
            return v;
          },
          [&] {
            std::vector<Tensor<T>> v;
            v.push_back(ops::add(a.x, b.x));
            v.push_back(ops::multiply(a.x, b.x));
            v.push_back(ops::scale(a.x, -1.5));
            return v;
          });
    }
    {  // broadcasting binary ops (b: a's trailing dims, some of them 1) and unary ops
      const Shape s = random_shape(rng, 1, 5);
      std::vector<std::int64_t> bd(s.dims().begin() + static_cast<std::ptrdiff_t>(rng.below(static_cast<std::uint64_t>(s.rank()))),
                                   s.dims().end());
      for (auto& d : bd)
        if (rng.below(3) == 0) d = 1;
      const Input<T> a = random_input<T>(s, rng), b = random_input<T>(Shape(bd), rng), dy = random_input<T>(s, rng);
      // f16 leaves div out: its full-shape gradient -a dy / b^2 overflows f16 for divisors near 0
      // before sum_to reduces it (as in PyTorch), where the f64 reference stays finite.
      std::uint64_t bi = rng.below(std::is_same_v<T, cutrain::half> ? 5 : 6);
      if (std::is_same_v<T, cutrain::half> && bi >= static_cast<std::uint64_t>(BinaryOp::div)) ++bi;
      const auto bk = static_cast<BinaryOp>(bi);
      const auto uk = static_cast<UnaryOp>(rng.below(7));
      const double pw = uk == UnaryOp::pow ? std::vector<double>{2.0, 0.5, -1.0, 3.0}[rng.below(4)] : 0.0;
      const bool swap = rng.below(2) == 1;  // b first: the broadcast input on the left
      const Input<T>& l = swap ? b : a;
      const Input<T>& r = swap ? a : b;
      run_case<T>(
          tallies["broadcast binary/unary"],
          label("binary/unary", l) + cutrain::detail::cat(" ", to_string(bk), " b ", r.x.shape(), " as ", r.how, ", ",
                                                           to_string(uk), " ", pw),
          tol * 4,
          [&] {
            auto g = ops::binary_backward(bk, l.ref, r.ref, dy.ref);
            std::vector<Tensor<double>> v;
            v.push_back(ops::binary(bk, l.ref, r.ref));
            v.push_back(std::move(g.da));
            v.push_back(std::move(g.db));
            v.push_back(ops::unary(uk, a.ref, pw));
            v.push_back(ops::unary_backward(uk, a.ref, dy.ref, pw));
            return v;
          },
          [&] {
            auto g = ops::binary_backward(bk, l.x, r.x, dy.x);
            std::vector<Tensor<T>> v;
            v.push_back(ops::binary(bk, l.x, r.x));
            v.push_back(std::move(g.da));
            v.push_back(std::move(g.db));
            v.push_back(ops::unary(uk, a.x, pw));
            v.push_back(ops::unary_backward(uk, a.x, dy.x, pw));
            return v;
          });
    }
    {  // reductions over a random set of axes
      const Shape s = random_shape(rng, 1, 5);
      const Input<T> x = random_input<T>(s, rng);
      Axes axes;
      for (int d = 0; d < s.rank(); ++d)
        if (rng.below(2)) axes.push_back(d);
      const bool keepdim = rng.below(2) == 1;
      const std::string what = label("sum/mean/max/var", x) + " axes " + cutrain::detail::axes_str(axes);
      run_case<T>(
          tallies["reductions"], what, tol * 4,
          [&] {
            std::vector<Tensor<double>> v;
            v.push_back(ops::sum(x.ref, axes, keepdim));
            v.push_back(ops::mean(x.ref, axes, keepdim));
            v.push_back(ops::max(x.ref, axes, keepdim));
            v.push_back(ops::var(x.ref, axes, 0.0, keepdim));
            return v;
          },
          [&] {
            std::vector<Tensor<T>> v;
            v.push_back(ops::sum(x.x, axes, keepdim));
            v.push_back(ops::mean(x.x, axes, keepdim));
            v.push_back(ops::max(x.x, axes, keepdim));
            v.push_back(ops::var(x.x, axes, 0.0, keepdim));
            return v;
          });
    }
    {  // softmax and log-softmax along a random axis of any rank
      const Shape s = random_shape(rng, 1, 5);
      const int axis = static_cast<int>(rng.below(static_cast<std::uint64_t>(s.rank()))) - (rng.below(2) ? s.rank() : 0);
      const Input<T> x = random_input<T>(s, rng), dy = random_input<T>(s, rng);
      run_case<T>(
          tallies["softmax"], label("softmax", x) + cutrain::detail::cat(" axis ", axis), tol,
          [&] {
            std::vector<Tensor<double>> v;
            v.push_back(ops::softmax_forward(x.ref, axis));
            v.push_back(ops::log_softmax_forward(x.ref, axis));
            v.push_back(ops::softmax_backward(v.front(), dy.ref, axis));
            return v;
          },
          [&] {
            std::vector<Tensor<T>> v;
            v.push_back(ops::softmax_forward(x.x, axis));
            v.push_back(ops::log_softmax_forward(x.x, axis));
            v.push_back(ops::softmax_backward(v.front(), dy.x, axis));
            return v;
          });
    }
    {  // batch norm (training forward and backward, inference) on [N, C] or [N, C, H, W]: any C
      const Shape s = random_shape(rng, 2, 4);
      if (s.rank() == 2 || s.rank() == 4) {
        const Input<T> x = random_input<T>(s, rng), dy = random_input<T>(s, rng);
        const Shape c{s[1]};
        auto [gamma, gr] = random_pair<float>(c, rng, Layout::row_major);
        auto [beta, br] = random_pair<float>(c, rng, Layout::row_major);
        const BatchNormParams p{.momentum = 0.1, .eps = 1e-3};
        run_case<T>(
            tallies["batch_norm"], label("batch_norm", x), tol * 4,
            [&] {
              Tensor<double> rm = Tensor<double>::zeros(c), rv = Tensor<double>::full(c, 1.0);
              auto f = ops::batch_norm_forward_training(x.ref, gr, br, rm, rv, p);
              auto b = ops::batch_norm_backward(x.ref, dy.ref, gr, f.save_mean, f.save_inv_std);
              std::vector<Tensor<double>> v;
              v.push_back(std::move(f.y));
              v.push_back(std::move(b.dx));
              v.push_back(std::move(rv));
              v.push_back(ops::batch_norm_forward_inference(x.ref, gr, br, rm, v.back(), p.eps));
              return v;
            },
            [&] {
              Tensor<float> rm = Tensor<float>::zeros(c).to(Device::cuda(0)),
                            rv = Tensor<float>::full(c, 1.0f).to(Device::cuda(0));
              auto f = ops::batch_norm_forward_training(x.x, gamma, beta, rm, rv, p);
              auto b = ops::batch_norm_backward(x.x, dy.x, gamma, f.save_mean, f.save_inv_std);
              std::vector<Tensor<T>> v;
              v.push_back(std::move(f.y));
              v.push_back(std::move(b.dx));
              v.push_back(ops::cast<T>(rv));
              v.push_back(ops::batch_norm_forward_inference(x.x, gamma, beta, rm, rv, p.eps));
              return v;
            });
      }
    }
    {  // layer norm over the trailing 1 .. rank dims
      const Shape s = random_shape(rng, 1, 4);
      const Input<T> x = random_input<T>(s, rng), dy = random_input<T>(s, rng);
      const auto lead = static_cast<std::ptrdiff_t>(rng.below(static_cast<std::uint64_t>(s.rank())));
      const Shape rest(std::vector<std::int64_t>(s.dims().begin() + lead, s.dims().end()));
      auto [gamma, gr] = random_pair<float>(rest, rng, Layout::row_major);
      auto [beta, br] = random_pair<float>(rest, rng, Layout::row_major);
      run_case<T>(
          tallies["layer_norm"], label("layer_norm", x) + cutrain::detail::cat(" over ", rest), tol * 4,
          [&] {
            auto f = ops::layer_norm_forward(x.ref, gr, br, 1e-5);
            std::vector<Tensor<double>> v;
            v.push_back(ops::layer_norm_backward(x.ref, dy.ref, gr, f.mean, f.inv_std).dx);
            v.push_back(std::move(f.y));
            return v;
          },
          [&] {
            auto f = ops::layer_norm_forward(x.x, gamma, beta, 1e-5);
            std::vector<Tensor<T>> v;
            v.push_back(ops::layer_norm_backward(x.x, dy.x, gamma, f.mean, f.inv_std).dx);
            v.push_back(std::move(f.y));
            return v;
          });
    }
    {  // max and average pooling on [N, C, H, W], kernel 1-3, stride 1-2, padding up to k - 1
      const Shape s = random_shape(rng, 4, 4);
      const Input<T> x = random_input<T>(s, rng);
      const int k = 1 + static_cast<int>(rng.below(3)), st = 1 + static_cast<int>(rng.below(2));
      const int pad = static_cast<int>(rng.below(static_cast<std::uint64_t>(k)));
      Pool2dParams p = rng.below(2) ? Pool2dParams::max(k, st, pad) : Pool2dParams::average(k, st, pad);
      p.dilation_h = p.dilation_w = rng.below(3) == 0 ? 2 : 1;
      const Input<T> dy = random_input<T>(pool2d_output_shape_or(s, p), rng);
      run_case<T>(
          tallies["pool2d"], label("pool2d", x) + cutrain::detail::cat(" ", p), tol,
          [&] {
            std::vector<Tensor<double>> v;
            v.push_back(ops::pool2d_forward(x.ref, p));
            v.push_back(ops::pool2d_backward(x.ref, v.back(), dy.ref, p));
            return v;
          },
          [&] {
            std::vector<Tensor<T>> v;
            v.push_back(ops::pool2d_forward(x.x, p));
            v.push_back(ops::pool2d_backward(x.x, v.back(), dy.x, p));
            return v;
          });
    }
    {  // matmul with batch dims that broadcast, each operand its own view (transposes included)
      const Shape batch = random_shape(rng, 0, 2);
      const std::int64_t m = random_size(rng), k = random_size(rng), n = random_size(rng);
      std::vector<std::int64_t> ad = batch.dims(), bd = batch.dims();
      for (std::size_t d = 0; d < bd.size(); ++d)
        if (rng.below(3) == 0) bd[d] = 1;  // broadcast b over this batch dim
      if (rng.below(3) == 0) bd.clear();   // or over all of them
      ad.insert(ad.end(), {m, k});
      bd.insert(bd.end(), {k, n});
      const Input<T> a = random_input<T>(Shape(ad), rng), b = random_input<T>(Shape(bd), rng);
      std::vector<std::int64_t> yd = batch.dims();
      yd.insert(yd.end(), {m, n});
      const Input<T> dy = random_input<T>(Shape(yd), rng);
      const double mm_tol = tol * std::max(1.0, std::sqrt(static_cast<double>(k) / 16));
      run_case<T>(
          tallies["matmul"], label("matmul", a) + cutrain::detail::cat(" and b ", b.x.shape(), " as ", b.how), mm_tol,
          [&] {
            auto g = ops::matmul_backward(a.ref, b.ref, dy.ref);
            std::vector<Tensor<double>> v;
            v.push_back(ops::matmul(a.ref, b.ref));
            v.push_back(std::move(g.da));
            v.push_back(std::move(g.db));
            return v;
          },
          [&] {
            auto g = ops::matmul_backward(a.x, b.x, dy.x);
            std::vector<Tensor<T>> v;
            v.push_back(ops::matmul(a.x, b.x));
            v.push_back(std::move(g.da));
            v.push_back(std::move(g.db));
            return v;
          });
    }
    {  // concat of two views along a random dim, index_select along another
      const Shape s = random_shape(rng, 1, 4);
      const int d = static_cast<int>(rng.below(static_cast<std::uint64_t>(s.rank())));
      std::vector<std::int64_t> other = s.dims();
      other[static_cast<std::size_t>(d)] = random_size(rng);
      const Input<T> a = random_input<T>(s, rng), b = random_input<T>(Shape(other), rng);
      const std::int64_t len = s[d];
      std::vector<std::int32_t> idx(static_cast<std::size_t>(random_size(rng)));
      for (auto& i : idx) i = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(len)));
      Tensor<std::int32_t> index_host({static_cast<std::int64_t>(idx.size())});
      index_host.assign(idx);
      const auto index = index_host.to(Device::cuda(0));
      run_case<T>(
          tallies["concat/index_select"], label("concat/index_select", a) + cutrain::detail::cat(" dim ", d), tol,
          [&] {
            std::vector<Tensor<double>> v;
            v.push_back(ops::concat({&a.ref, &b.ref}, d));
            v.push_back(ops::index_select(a.ref, d, index_host));
            v.push_back(ops::index_select_backward(v.back(), a.ref.shape(), d, index_host));
            return v;
          },
          [&] {
            std::vector<Tensor<T>> v;
            v.push_back(ops::concat({&a.x, &b.x}, d));
            v.push_back(ops::index_select(a.x, d, index));
            v.push_back(ops::index_select_backward(v.back(), a.x.shape(), d, index));
            return v;
          });
    }
    {  // contiguous copies of the views themselves
      const Shape s = random_shape(rng, 1, 5);
      const Input<T> x = random_input<T>(s, rng);
      run_case<T>(
          tallies["contiguous"], label("contiguous", x), 0.0, [&] { return refs<T>(x.ref.contiguous()); },
          [&] { return outs<T>(x.x.contiguous()); });
    }
  }
  int total = 0, failed = 0;
  for (const auto& [op, t] : tallies) {
    std::printf("property %-5s %-20s %4d cases, %3d refused by both, %zu failed\n", std::string(to_string(dtype_of<T>)).c_str(),
                op.c_str(), t.cases, t.refused_by_both, t.failures.size());
    for (std::size_t i = 0; i < t.failures.size() && i < 5; ++i) std::printf("  FAIL %.600s\n", t.failures[i].c_str());
    total += t.cases;
    failed += static_cast<int>(t.failures.size());
  }
  INFO(failed << " of " << total << " random cases failed (listed above)");
  CHECK(failed == 0);
}

}  // namespace

TEST_CASE("property: every op accepts on the GPU what the CPU accepts, and agrees (f32, bf16, f16)") {
  property_suite<float>(60);
  property_suite<bfloat16>(40);
  property_suite<cutrain::half>(40);
}

TEST_CASE("fallback kernels: activations and batch norm against the CPU, any size and channel count") {
  Rng rng(77);
  for (Activation k : kinds) {
    const ActivationParams a{.kind = k, .alpha = k == Activation::elu ? 1.0 : 0.1};
    for (const Shape& s : {Shape{3}, Shape{1}, Shape{2, 5, 7}, Shape{1031}, Shape{4096}}) {  // 4096: the _vec kernels
      auto [x, xr] = random_pair<float>(s, rng, Layout::row_major);
      auto [dy, dyr] = random_pair<float>(s, rng, Layout::row_major);
      auto y = poisoned<float>(s, Layout::row_major), dx = poisoned<float>(s, Layout::row_major);
      cuda::kernels::activation_forward(x, a, y);
      cuda::kernels::activation_backward(x, dy, a, dx);
      const std::string tag = cutrain::detail::cat("activation kernel ", k, " ", s);
      check_close(tag + " fwd", y, ops::activation_forward(xr, a));
      check_close(tag + " bwd", dx, ops::activation_backward(xr, dyr, a));
    }
  }
  // Through ops:: on the shape the H200's cuDNN had no engine for: runs, whichever path.
  auto [x3, x3r] = random_pair<bfloat16>(Shape{3}, rng, Layout::row_major);
  check_close("ops::activation_forward on [3]", ops::activation_forward(x3, {.kind = Activation::gelu_erf}),
              ops::activation_forward(x3r, {.kind = Activation::gelu_erf}));

  for (const Shape& s : {Shape{4, 3, 5, 7}, Shape{1, 1, 3, 3}, Shape{6, 5}, Shape{2, 64, 4, 4}}) {
    for (Layout l : {Layout::nchw, Layout::nhwc}) {
      const std::string tag = cutrain::detail::cat("batch_norm kernels ", s, " ", l);
      const Shape c{s[1]};
      auto [x, xr] = random_pair<cutrain::half>(s, rng, l);
      auto [dy, dyr] = random_pair<cutrain::half>(s, rng, l);
      auto [gamma, gr] = random_pair<float>(c, rng, l);
      auto [beta, br] = random_pair<float>(c, rng, l);
      auto [rm, rmr] = random_pair<float>(c, rng, l);
      auto rv_host = Tensor<float>::uniform(c, rng, 0.5, 2.0);
      auto rv = rv_host.to(Device::cuda(0));
      auto rvr = cast<double>(rv_host);
      const BatchNormParams p{.momentum = 0.2, .eps = 1e-3};
      const ActivationParams relu{.kind = Activation::relu};
      auto y = poisoned<cutrain::half>(s, l);
      Tensor<float> sm(c, {.device = Device::cuda(0)}), si(c, {.device = Device::cuda(0)}),
          nm(c, {.device = Device::cuda(0)}), nv(c, {.device = Device::cuda(0)});
      cuda::kernels::batch_norm_train_forward(x, gamma, beta, rm, rv, p, y, sm, si, nm, nv, relu);
      auto ref = ops::batch_norm_forward_training(xr, gr, br, rmr, rvr, p);
      check_close(tag + " y (with relu)", y, ops::activation_forward(ref.y, relu));
      check_close(tag + " save_mean", sm, ref.save_mean, 1e-5);
      check_close(tag + " save_inv_std", si, ref.save_inv_std, 1e-4);
      check_close(tag + " next_mean", nm, rmr, 1e-5);
      check_close(tag + " next_var", nv, rvr, 1e-4);
      auto dx = poisoned<cutrain::half>(s, l);
      Tensor<float> dg(c, {.device = Device::cuda(0)}), db(c, {.device = Device::cuda(0)});
      cuda::kernels::batch_norm_train_backward(x, dy, gamma, sm, si, dx, dg, db);
      auto rb = ops::batch_norm_backward(xr, dyr, gr, ref.save_mean, ref.save_inv_std);
      check_close(tag + " dx", dx, rb.dx);
      check_close(tag + " dgamma", dg, rb.dgamma, 1e-4);
      check_close(tag + " dbeta", db, rb.dbeta, 1e-4);
    }
  }
  std::printf("fallback kernels ok; %lld op calls fell back to them so far in this process\n",
              static_cast<long long>(cuda::cudnn::kernel_fallbacks()));
}

}  // namespace cutrain_test_property_gpu
