// Finite-difference gradient checks in f64, shared by the CPU tests.
//
// For an op y = f(x) and a random projection r, L(x) = <r, f(x)>. The analytic gradient the op's
// backward returns for dy = r must match (L(x + h e_i) - L(x - h e_i)) / 2h at every element
// (or at `max_points` elements spread over the tensor for large inputs).
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "cutrain/core/tensor.hpp"

namespace cutrain::test {

inline double dot(const Tensor<double>& a, const Tensor<double>& b) {
  const auto va = a.to_vector(), vb = b.to_vector();
  REQUIRE(va.size() == vb.size());
  double s = 0;
  for (std::size_t i = 0; i < va.size(); ++i) s += va[i] * vb[i];
  return s;
}

// max |a - b| over the elements in logical order (any layouts; the shapes must agree).
inline double max_diff(const Tensor<double>& a, const Tensor<double>& b) {
  REQUIRE(a.shape() == b.shape());
  const auto x = a.contiguous(Layout::row_major), y = b.contiguous(Layout::row_major);
  double m = 0;
  for (std::int64_t i = 0; i < x.numel(); ++i) m = std::max(m, std::abs(x.flat(i) - y.flat(i)));
  return m;
}

struct GradcheckResult {
  double max_abs_err = 0;
  double max_rel_err = 0;
  int points = 0;
};

// x is perturbed in place (and restored); f recomputes the output from the current x.
inline GradcheckResult gradcheck(const std::string& name, Tensor<double>& x, const std::function<Tensor<double>()>& f,
                                 const Tensor<double>& analytic, const Tensor<double>& r, double tol = 1e-6,
                                 int max_points = 400, double h = 1e-6) {
  REQUIRE(analytic.shape() == x.shape());
  const auto grad = analytic.to_vector();
  const std::int64_t n = x.numel();
  const std::int64_t step = std::max<std::int64_t>(1, n / max_points);
  GradcheckResult res;
  for (std::int64_t i = 0; i < n; i += step) {
    double& xi = x.flat(i);
    const double saved = xi;
    xi = saved + h;
    const double lp = dot(f(), r);
    xi = saved - h;
    const double lm = dot(f(), r);
    xi = saved;
    const double numeric = (lp - lm) / (2 * h);
    const double a = grad[static_cast<std::size_t>(i)];
    const double abs_err = std::abs(numeric - a);
    const double rel_err = abs_err / std::max(1.0, std::max(std::abs(numeric), std::abs(a)));
    res.max_abs_err = std::max(res.max_abs_err, abs_err);
    res.max_rel_err = std::max(res.max_rel_err, rel_err);
    ++res.points;
    if (rel_err > tol) {
      INFO(name << ": element " << i << " of " << x.describe() << ": numeric " << numeric << ", analytic " << a);
      CHECK(rel_err <= tol);
    }
  }
  std::cout << "gradcheck " << name << ": " << res.points << " points, max rel err " << res.max_rel_err << "\n";
  CHECK(res.max_rel_err <= tol);
  return res;
}

// Fresh random data in [-1, 1) (never zeros or constants) with the given layout.
inline Tensor<double> random(const Shape& s, Rng& rng, Layout l = Layout::row_major) {
  return Tensor<double>::uniform(s, rng, -1.0, 1.0, {.layout = s.rank() == 4 ? l : Layout::row_major});
}

// A batch of n 8x8 single-channel images in two classes, a bright top half (0) or a bright
// bottom half (1), plus noise, drawn from rng: data a small CNN learns in a few steps.
inline void make_batch(Rng& rng, int n, Tensor<float>& x, Tensor<std::int32_t>& y) {
  std::vector<float> xs(static_cast<std::size_t>(n) * 64);
  std::vector<std::int32_t> ys(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    const int label = static_cast<int>(rng.below(2));
    ys[static_cast<std::size_t>(i)] = label;
    for (int p = 0; p < 64; ++p)
      xs[static_cast<std::size_t>(i * 64 + p)] = ((p < 32) == (label == 0) ? 0.5f : 0.0f) + static_cast<float>(rng.normal());
  }
  x = Tensor<float>::from_vector(xs, Shape{n, 1, 8, 8});
  y = Tensor<std::int32_t>::from_vector(ys, Shape{n});
}

// Checks that `a` and `b` hold the same values (logical order) within tol.
template <class T>
void require_close(const Tensor<T>& a, const std::vector<double>& want, double tol = 1e-9) {
  const auto got = a.to_vector();
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << " of " << a.describe());
    REQUIRE(static_cast<double>(got[i]) == Approx(want[i]).margin(tol).epsilon(tol));
  }
}

// Asserts that expr throws Exc and that the message names the op.
#define CUTRAIN_REQUIRE_THROWS_OP(expr, Exc, opname)                                        \
  do {                                                                                      \
    bool thrown_ = false;                                                                   \
    try {                                                                                   \
      (void)(expr);                                                                         \
    } catch (const Exc& e_) {                                                               \
      thrown_ = true;                                                                       \
      INFO("message: " << e_.what());                                                       \
      CHECK(std::string(e_.what()).find(opname) != std::string::npos);                      \
    }                                                                                       \
    CHECK(thrown_);                                                                         \
  } while (0)

// A vector of tensors (Tensor is move-only: no initializer lists of them).
template <class... A>
std::vector<Tensor<double>> tensors(A&&... a) {
  std::vector<Tensor<double>> v;
  (v.push_back(std::move(a)), ...);
  return v;
}

}  // namespace cutrain::test
