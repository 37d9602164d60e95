// The shapes of a fusion graph's values (core/fusion.hpp) from its inputs' shapes, and the rank
// and strides its GPU graph describes them at.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "cutrain/core/fusion.hpp"

namespace cutrain::inline CUTRAIN_ABI::fusion {

// s without its leading dims of 1: shapes equal under broadcasting's alignment ([C, 1, 1] and
// [1, C, 1, 1]) are equal so.
inline Shape drop_leading_ones(const Shape& s) {
  int k = 0;
  while (k < s.rank() && s[k] == 1) ++k;
  return Shape(std::vector<std::int64_t>(s.dims().begin() + k, s.dims().end()));
}
inline bool same_aligned(const Shape& a, const Shape& b) { return drop_leading_ones(a) == drop_leading_ones(b); }

// A norm's x (or dy) must be 4-d; its parameter `name` (operand shape p) must be `want`.
inline void check_norm_operand(const char* what, const Shape& x, const char* name, const Shape& p, const Shape& want) {
  CUTRAIN_REQUIRE(x.rank() == 4, InvalidArgument, what, "x ", x,
                  " must be 4-d [N, C, H, W] (view [rows, D] as [rows, D, 1, 1])");
  CUTRAIN_REQUIRE(same_aligned(p, want), InvalidArgument, what, name, " ", p, " must be ", want, " (x ", x, ")");
}

// The rank a GPU graph describes every tensor at: 4, or 3 with a matmul (cuDNN's batched
// [B, M, K] x [B, K, N]). No value may have a higher rank.
inline int described_rank(const Graph& g) { return g.has(NodeKind::matmul) ? 3 : 4; }

// The shape of every value (indexed like g.nodes()) when the inputs have `inputs`' shapes, in
// g.inputs() order; InvalidArgument names the pattern, the node and the shapes.
inline std::vector<Shape> infer_shapes(const Graph& g, const std::vector<Shape>& inputs, std::string_view op) {
  CUTRAIN_REQUIRE(inputs.size() == g.inputs().size(), InvalidArgument, op, g.describe(), ": takes ",
                  g.inputs().size(), " inputs, got ", inputs.size());
  std::vector<Shape> s(g.nodes().size());
  for (std::size_t i = 0; i < inputs.size(); ++i) s[static_cast<std::size_t>(g.inputs()[i])] = inputs[i];
  const auto at = [&](int id) -> const Shape& { return s[static_cast<std::size_t>(id)]; };
  for (std::size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    try {
      switch (n.kind) {
        case NodeKind::input: break;
        case NodeKind::conv2d: s[i] = conv2d_output_shape(at(n.a), at(n.b), n.conv, "conv2d"); break;
        case NodeKind::matmul: {
          const Shape &a = at(n.a), &b = at(n.b);
          CUTRAIN_REQUIRE((a.rank() == 2 || a.rank() == 3) && (b.rank() == 2 || b.rank() == 3), InvalidArgument,
                          "matmul", "takes operands of rank 2 or 3, got ", a, " and ", b);
          const std::int64_t m = a[a.rank() - 2], k = a[a.rank() - 1], kb = b[b.rank() - 2], nn = b[b.rank() - 1];
          CUTRAIN_REQUIRE(k == kb, InvalidArgument, "matmul", a, " x ", b, ": inner dims ", k, " and ", kb, " differ");
          const std::int64_t ba = a.rank() == 3 ? a[0] : 1, bb = b.rank() == 3 ? b[0] : 1;
          CUTRAIN_REQUIRE(ba == bb || ba == 1 || bb == 1, InvalidArgument, "matmul", a, " x ", b, ": batches ", ba,
                          " and ", bb, " differ");
          s[i] = (a.rank() == 3 || b.rank() == 3) ? Shape{ba > bb ? ba : bb, m, nn} : Shape{m, nn};
          break;
        }
        case NodeKind::binary: s[i] = broadcast_shape(to_string(n.binary), at(n.a), at(n.b)); break;
        case NodeKind::scale:
        case NodeKind::activation: s[i] = at(n.a); break;
        case NodeKind::conv2d_dgrad: {
          const Shape y = conv2d_output_shape(n.shape, at(n.b), n.conv, "conv2d_dgrad");
          CUTRAIN_REQUIRE(at(n.a) == y, InvalidArgument, "conv2d_dgrad", "dy ", at(n.a), " is not the output shape ", y,
                          " of x ", n.shape, " and w ", at(n.b));
          s[i] = n.shape;
          break;
        }
        case NodeKind::conv2d_wgrad: {
          const Shape y = conv2d_output_shape(at(n.b), n.shape, n.conv, "conv2d_wgrad");
          CUTRAIN_REQUIRE(at(n.a) == y, InvalidArgument, "conv2d_wgrad", "dy ", at(n.a), " is not the output shape ", y,
                          " of x ", at(n.b), " and w ", n.shape);
          s[i] = n.shape;
          break;
        }
        case NodeKind::activation_backward:
          CUTRAIN_REQUIRE(at(n.a) == at(n.b), InvalidArgument, "activation_backward", "dy ", at(n.a), " and x ", at(n.b),
                          " differ in shape");
          s[i] = at(n.a);
          break;
        case NodeKind::sum_to:
          detail::sum_to_dims("sum_to", at(n.a), n.shape);
          s[i] = n.shape;
          break;
        case NodeKind::layer_norm:
        case NodeKind::rms_norm:
        case NodeKind::layer_norm_train:
        case NodeKind::rms_norm_train:
        case NodeKind::batch_norm: {
          const Shape& x = at(n.a);
          const Shape x4 = x.rank() == 4 ? x : Shape{1, 1, 1, 1};
          // Layer and RMS norm: over C, H, W per sample; batch norm: per channel.
          const Shape p = n.kind == NodeKind::batch_norm ? Shape{x4[1], 1, 1} : Shape{x4[1], x4[2], x4[3]};
          const auto ops = n.operands();
          static constexpr std::array<const char*, 5> names{"x", "gamma", "beta", "running_mean", "running_var"};
          for (int k = 1; k < 5; ++k)
            if (ops[static_cast<std::size_t>(k)] >= 0)
              check_norm_operand(kind_name(n.kind), x, names[static_cast<std::size_t>(k)],
                                         at(ops[static_cast<std::size_t>(k)]), p);
          s[i] = x;
          break;
        }
        case NodeKind::batch_norm_backward:
        case NodeKind::layer_norm_backward:
        case NodeKind::rms_norm_backward: {
          const Shape& x = at(n.b);
          const Shape x4 = x.rank() == 4 ? x : Shape{1, 1, 1, 1};
          const bool bn = n.kind == NodeKind::batch_norm_backward;
          const Shape p = bn ? Shape{x4[1], 1, 1} : Shape{x4[1], x4[2], x4[3]};
          const Shape stat = bn ? p : Shape{x4[0], 1, 1, 1};
          const char* what = kind_name(n.kind);
          check_norm_operand(what, x, "gamma", at(n.c), p);
          CUTRAIN_REQUIRE(at(n.a) == x, InvalidArgument, what, "dy ", at(n.a), " and x ", x, " differ in shape");
          check_norm_operand(what, x, n.kind == NodeKind::rms_norm_backward ? "inv_rms" : "mean", at(n.d), stat);
          if (n.e >= 0) check_norm_operand(what, x, "inv_std", at(n.e), stat);
          s[i] = x;
          break;
        }
        case NodeKind::part: {
          // A statistic: gamma's shape for batch norm, [N, 1, 1, 1] for layer and RMS norm; a
          // parameter's gradient: gamma's shape.
          const Node& m = g.nodes()[static_cast<std::size_t>(n.a)];
          if (m.kind >= NodeKind::batch_norm_backward) s[i] = at(m.c);
          else if (m.kind == NodeKind::batch_norm) s[i] = at(m.b);
          else s[i] = Shape{at(m.a)[0], 1, 1, 1};
          break;
        }
      }
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(op, detail::cat(g.describe(), ": node ", i, ": ", e.what()));
    }
    CUTRAIN_REQUIRE(s[i].rank() <= described_rank(g), NotImplemented, op, g.describe(), ": node ", i, " has shape ",
                    s[i], "; fusion graphs take tensors of rank <= 4 (<= 3 with a matmul)");
  }
  return s;
}

// s and st with leading dims of 1 up to rank r (the broadcasting alignment, from the right).
inline std::pair<Shape, Strides> at_rank(const Shape& s, const Strides& st, int r) {
  CUTRAIN_REQUIRE(s.rank() <= r, NotImplemented, "fusion", "shape ", s, " has rank above ", r);
  std::vector<std::int64_t> d(static_cast<std::size_t>(r), 1), t(static_cast<std::size_t>(r), 1);
  const int lead = r - s.rank();
  const std::int64_t outer = s.rank() == 0 ? 1 : s[0] * st[0];
  for (int i = 0; i < r; ++i) {
    t[static_cast<std::size_t>(i)] = i < lead ? outer : st[i - lead];
    d[static_cast<std::size_t>(i)] = i < lead ? 1 : s[i - lead];
  }
  return {Shape(std::move(d)), std::move(t)};
}

// Packed strides of s: NHWC order for a 4-d s when nhwc, else row-major.
inline Strides packed_strides(const Shape& s, bool nhwc) {
  if (nhwc && s.rank() == 4) return Strides{s[1] * s[2] * s[3], 1, s[3] * s[1], s[1]};
  std::vector<std::int64_t> st(static_cast<std::size_t>(s.rank()), 1);
  for (int i = s.rank() - 2; i >= 0; --i)
    st[static_cast<std::size_t>(i)] = st[static_cast<std::size_t>(i) + 1] * s[i + 1];
  return st;
}

}  // namespace cutrain::inline CUTRAIN_ABI::fusion
