// nn::Embedding: a table of `num` vectors of `dim`, looked up by int32 or int64 indices of any shape
// (ops::index_select along dim 0; its backward is a deterministic scatter-add). Under mixed
// precision the table is cast to the compute type on each call and its gradient comes back in T.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>
#include <vector>

#include "cutrain/autograd/functions.hpp"
#include "cutrain/nn/init.hpp"
#include "cutrain/nn/module.hpp"

namespace cutrain::inline CUTRAIN_ABI::nn {

struct EmbeddingOptions {
  std::int64_t num = 0, dim = 0;
  double std = 0.02;  // weights drawn from normal(0, std), as GPT-2's
  std::uint64_t seed = 0;
};

template <class T>
class Embedding : public Module<Embedding<T>, T> {
 public:
  explicit Embedding(const EmbeddingOptions& o) : opts_(o) {
    CUTRAIN_REQUIRE(o.num > 0 && o.dim > 0, InvalidArgument, "nn::Embedding", "need num and dim > 0, got num ", o.num,
                    ", dim ", o.dim);
    CUTRAIN_REQUIRE(shape_fits(Shape{o.num, o.dim}, sizeof(T)), InvalidArgument, "nn::Embedding", "weight [num, dim] = ",
                    Shape{o.num, o.dim}, " is too large: its byte count overflows int64");
    CUTRAIN_REQUIRE(o.std > 0 && std::isfinite(o.std), InvalidArgument, "nn::Embedding", "std must be positive, got ",
                    o.std);
    Rng rng = init::rng_for(o.seed, static_cast<std::uint64_t>(o.num) * 104729 + static_cast<std::uint64_t>(o.dim));
    weight = autograd::parameter(Tensor<T>::randn(Shape{o.num, o.dim}, rng, o.std));
  }

  // idx [...] (values in [0, num), on weight's device) -> [..., dim] in X.
  template <RunsIn<T> X = T, ops::IndexInt I = std::int32_t>
  Var<X> operator()(const Tensor<I>& idx) const {
    CUTRAIN_REQUIRE(idx.defined(), InvalidArgument, "nn::Embedding", "idx is an empty (undefined) tensor");
    std::vector<std::int64_t> out = idx.shape().dims();
    out.push_back(opts_.dim);
    const Tensor<I> flat = idx.contiguous(Layout::row_major).reshape(Shape{idx.numel()});
    try {
      return autograd::reshape(autograd::index_select(autograd::cast<X>(weight), 0, flat), Shape(out));
    } catch (const InvalidArgument& e) {  // the lookup's message names index_select: say whose tokens
      throw InvalidArgument("nn::Embedding", cutrain::detail::cat("idx ", idx.describe(), " into a table of ", opts_.num,
                                                                  " rows (ids in [0, ", opts_.num, ")): ", e.what()));
    }
  }

  void visit_params(const std::string& prefix, const ParamVisitor<T>& f) { f(join_name(prefix, "weight"), weight); }
  const EmbeddingOptions& options() const { return opts_; }

  Var<T> weight;

 private:
  EmbeddingOptions opts_;
};

}  // namespace cutrain::inline CUTRAIN_ABI::nn
