// Broadcasting elementwise ops: which op (binary, unary, comparison) and NumPy broadcasting of
// shapes (aligned from the right; a dim of size 1, or one a shape lacks, takes the other's size).
// Shared by cpu/broadcast.hpp, cuda/kernels/broadcast.hpp and ops/broadcast.hpp, so that both
// backends accept exactly the same inputs. The enums' values are the kernels' op codes.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>
#include <initializer_list>
#include <string_view>
#include <vector>

#include "cutrain/core/error.hpp"
#include "cutrain/core/shape.hpp"

namespace cutrain::inline CUTRAIN_ABI {

// The highest rank a broadcasting op takes (the GPU kernels' fixed-size index arrays).
inline constexpr int max_broadcast_rank = 8;

enum class BinaryOp { add = 0, sub = 1, mul = 2, div = 3, minimum = 4, maximum = 5, pow = 6 };
enum class UnaryOp { exp = 0, log = 1, sqrt = 2, rsqrt = 3, neg = 4, abs = 5, pow = 6 };
enum class CompareOp { eq = 0, ne = 1, lt = 2, le = 3, gt = 4, ge = 5 };

inline constexpr std::string_view to_string(BinaryOp o) {
  constexpr std::string_view names[] = {"add", "sub", "mul", "div", "minimum", "maximum", "pow"};
  return names[static_cast<int>(o)];
}
inline constexpr std::string_view to_string(UnaryOp o) {
  constexpr std::string_view names[] = {"exp", "log", "sqrt", "rsqrt", "neg", "abs", "pow"};
  return names[static_cast<int>(o)];
}
inline constexpr std::string_view to_string(CompareOp o) {
  constexpr std::string_view names[] = {"eq", "ne", "lt", "le", "gt", "ge"};
  return names[static_cast<int>(o)];
}

// The shape every one of `shapes` broadcasts to, or InvalidArgument naming op and the shapes.
inline Shape broadcast_shape(std::string_view op, std::initializer_list<const Shape*> shapes) {
  int rank = 0;
  for (const Shape* s : shapes) rank = s->rank() > rank ? s->rank() : rank;
  std::vector<std::int64_t> out(static_cast<std::size_t>(rank), 1);
  for (const Shape* s : shapes) {
    const int lead = rank - s->rank();
    for (int d = 0; d < s->rank(); ++d) {
      std::int64_t& o = out[static_cast<std::size_t>(d + lead)];
      const std::int64_t v = (*s)[d];
      if (v == o || v == 1) continue;
      if (o == 1) {
        o = v;
        continue;
      }
      std::string all;
      for (const Shape* t : shapes) all += (all.empty() ? "" : " and ") + t->str();
      throw InvalidArgument(op, detail::cat("shapes ", all, " do not broadcast: dim ", d + lead,
                                            " (aligned from the right) is ", o, " in one and ", v,
                                            " in another; each must be equal or 1"));
    }
  }
  Shape r(std::move(out));
  CUTRAIN_REQUIRE(r.rank() <= max_broadcast_rank, NotImplemented, op, "the broadcast shape ", r, " has rank ", r.rank(),
                  "; broadcasting ops take rank <= ", max_broadcast_rank);
  check_shape_valid(op, r);
  return r;
}

inline Shape broadcast_shape(std::string_view op, const Shape& a, const Shape& b) { return broadcast_shape(op, {&a, &b}); }

}  // namespace cutrain::inline CUTRAIN_ABI
