// Checkpoints of training state: modules (parameters and buffers, by state_dict name) and Rngs.
// The container and the file format are cutrain::Checkpoint (core/checkpoint.hpp, below nn and
// optim so that optimizers can write into it too); optimizers have save_state / load_state.
//
//   nn::Checkpoint ckpt;
//   nn::save_module(ckpt, "model", net);
//   opt.save_state(ckpt, "opt");
//   ckpt.put_int("step", step);
//   ckpt.save(dir / "last.ckpt");
#pragma once

#include "cutrain/core/abi.hpp"

#include <bit>
#include <cstdint>
#include <string>
#include <utility>

#include "cutrain/core/checkpoint.hpp"
#include "cutrain/core/random.hpp"
#include "cutrain/nn/module.hpp"

namespace cutrain::inline CUTRAIN_ABI::nn {

using cutrain::Checkpoint;

namespace detail {
// The element type of a module's state dict.
template <class M>
using module_value_t = typename decltype(std::declval<M&>().state_dict())::mapped_type::value_type;
}  // namespace detail

// Puts every state_dict entry of module (parameters and buffers) as prefix.name. It visits the
// tensors instead of calling state_dict(), which would make a host copy only to copy it again.
template <class M>
void save_module(Checkpoint& ckpt, const std::string& prefix, M& module) {
  using T = detail::module_value_t<M>;
  module.visit_params("", [&](const std::string& n, Var<T>& v) { ckpt.put(Checkpoint::key(prefix, n), v.value()); });
  module.visit_buffers("", [&](const std::string& n, Tensor<T>& t) { ckpt.put(Checkpoint::key(prefix, n), t); });
}

// Loads every state_dict entry of module from prefix.name through load_state_dict: an entry
// missing from the checkpoint, of another dtype or of another shape throws InvalidArgument and
// leaves the module unchanged. Other records under prefix are not the module's business (a
// prefix "model" must not trip over "model.ema.*") and are ignored.
template <class M>
void load_module(const Checkpoint& ckpt, const std::string& prefix, M& module) {
  using T = detail::module_value_t<M>;
  StateDict<T> sd;
  auto take = [&](const std::string& n) {
    const std::string key = Checkpoint::key(prefix, n);
    CUTRAIN_REQUIRE(ckpt.contains(key), InvalidArgument, "nn::load_module", "the checkpoint has no record \"", key,
                    "\" for the module's entry \"", n, "\"");
    sd.emplace(n, ckpt.get<T>(key));
  };
  module.visit_params("", [&](const std::string& n, Var<T>&) { take(n); });
  module.visit_buffers("", [&](const std::string& n, Tensor<T>&) { take(n); });
  module.load_state_dict(sd, /*strict=*/true);
}

// An Rng is its seed and counter: name.seed and name.counter (the u64 bits in int records).
inline void put_rng(Checkpoint& ckpt, const std::string& name, const Rng& rng) {
  ckpt.put_int(name + ".seed", std::bit_cast<std::int64_t>(rng.seed()));
  ckpt.put_int(name + ".counter", std::bit_cast<std::int64_t>(rng.counter()));
}
// Both records are read before rng changes, so a failure leaves it as it was.
inline void get_rng(const Checkpoint& ckpt, const std::string& name, Rng& rng) {
  const auto seed = ckpt.get_int(name + ".seed");
  const auto counter = ckpt.get_int(name + ".counter");
  rng.set_state(std::bit_cast<std::uint64_t>(seed), std::bit_cast<std::uint64_t>(counter));
}

}  // namespace cutrain::inline CUTRAIN_ABI::nn
