// GPU-vs-CPU comparison helpers: inputs drawn fresh at random, the CPU reference computed in f64
// from the same (rounded) inputs, outputs poisoned with NaN so an unwritten element fails.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <string>

#include "cutrain/core/cast.hpp"
#include "cutrain/core/tensor.hpp"

namespace cutrain::test {

template <class T> inline constexpr double tolerance = 0;
template <> inline constexpr double tolerance<float> = 1e-5;
template <> inline constexpr double tolerance<bfloat16> = 1e-2;
template <> inline constexpr double tolerance<cutrain::half> = 1e-2;

// A device tensor of T with random values in [-1, 1), and the same values (after rounding to T)
// as a host f64 tensor.
template <class T>
std::pair<Tensor<T>, Tensor<double>> random_pair(const Shape& s, Rng& rng, Layout l) {
  auto host = Tensor<float>::uniform(s, rng, -1.0, 1.0, {.layout = s.rank() == 4 ? l : Layout::row_major});
  auto t = cast<T>(host);
  auto ref = cast<double>(t);
  return {t.to(Device::cuda(0)), std::move(ref)};
}

// A device tensor full of NaN.
template <class T>
Tensor<T> poisoned(const Shape& s, Layout l) {
  Tensor<T> t(s, {.layout = s.rank() == 4 ? l : Layout::row_major, .device = Device::cuda(0)});
  t.fill(T(std::nanf("")));
  return t;
}

// max |gpu - ref| / max(1, max |ref|) <= tolerance<T>, and no NaN anywhere.
template <class T>
double check_close(const std::string& what, const Tensor<T>& gpu, const Tensor<double>& ref, double tol = tolerance<T>) {
  REQUIRE(gpu.shape() == ref.shape());
  const auto g = cast<double>(gpu).to_vector();
  const auto r = ref.to_vector();
  double max_err = 0, max_ref = 1;
  std::size_t nans = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(g[i])) ++nans;
    max_err = std::max(max_err, std::abs(g[i] - r[i]));
    max_ref = std::max(max_ref, std::abs(r[i]));
  }
  const double rel = max_err / max_ref;
  INFO(what << ": " << nans << " NaN, max abs err " << max_err << ", scaled err " << rel << " (tol " << tol << ")");
  CHECK(nans == 0);
  CHECK(rel <= tol);
  return rel;
}

}  // namespace cutrain::test
