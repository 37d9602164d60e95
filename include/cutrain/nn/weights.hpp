// A module's weights in and out of .safetensors files, in cutrain's names or, through an
// nn::NameMap, in another framework's (PyTorch's state_dict names):
//
//   net.load_state_dict(nn::load_safetensors_state<float>("resnet18.safetensors",
//                                                         nn::resnet18_cifar_torch_names()));
//   nn::save_safetensors_state("out.safetensors", net.state_dict(), nn::resnet18_cifar_torch_names());
//
// Loading converts each entry to the module's element type T: a BF16, F16 or F64 file into a
// Module<float> is cast on the host (to bf16/f16 rounds to nearest even, f64 to f32 rounds).
// Integer entries are refused for a floating-point T. The file format is core/safetensors.hpp;
// docs/weights.md has the rules.
#pragma once

#include "cutrain/core/abi.hpp"

#include <filesystem>
#include <set>
#include <string>
#include <string_view>

#include "cutrain/core/safetensors.hpp"
#include "cutrain/nn/module.hpp"
#include "cutrain/nn/name_map.hpp"

namespace cutrain::inline CUTRAIN_ABI::nn {

namespace detail {
template <class T>
Tensor<T> entry_as(const AnyTensor& t, std::string_view op, const std::string& where, const std::string& name) {
  if constexpr (dtype_traits<T>::floating) {
    const DType d = t.dtype();
    CUTRAIN_REQUIRE(d == DType::f64 || d == DType::f32 || d == DType::f16 || d == DType::bf16, InvalidArgument, op,
                    where, "entry \"", name, "\" is ", t.describe(), ": a module in ", dtype_of<T>,
                    " takes floating-point entries only");
  }
  return t.as<T>();
}

template <class T>
StateDict<T> convert(const TensorMap& tensors, const NameMap* map, std::string_view op, const std::string& where) {
  StateDict<T> out;
  for (const auto& [name, t] : tensors) {
    if (!map) {
      out.emplace(name, entry_as<T>(t, op, where, name));
      continue;
    }
    if (map->skipped(name)) continue;
    const std::string* ours = map->ours(name);
    CUTRAIN_REQUIRE(ours != nullptr, InvalidArgument, op, where, "entry \"", name, "\" (", t.describe(),
                    ") is not in the name map");
    out.emplace(*ours, entry_as<T>(t, op, where, name));
  }
  if (map)
    for (const auto& [file, ours] : map->pairs())
      CUTRAIN_REQUIRE(tensors.count(file) != 0, InvalidArgument, op, where, "no entry \"", file, "\" (cutrain's \"",
                      ours, "\")");
  return out;
}
}  // namespace detail

// A state dict of T from tensors of any dtype with cutrain's names (each cast to T; a view
// where it already is T).
template <class T>
StateDict<T> state_dict_from(const TensorMap& tensors) {
  return detail::convert<T>(tensors, nullptr, "nn::state_dict_from", "");
}
// The same from tensors in the map's file names: every file entry must be mapped or skipped,
// and every mapped name present (InvalidArgument naming the entry otherwise).
template <class T>
StateDict<T> state_dict_from(const TensorMap& tensors, const NameMap& map) {
  return detail::convert<T>(tensors, &map, "nn::state_dict_from", "");
}

// The entries of sd (views) under the map's file names; every entry must be mapped.
template <class T>
TensorMap tensors_from(const StateDict<T>& sd, const NameMap& map) {
  TensorMap out;
  for (const auto& [name, t] : sd) {
    const std::string* file = map.file_name(name);
    CUTRAIN_REQUIRE(file != nullptr, InvalidArgument, "nn::tensors_from", "entry \"", name, "\" (", t.describe(),
                    ") is not in the name map");
    out.emplace(*file, t.view());
  }
  return out;
}

template <class T>
StateDict<T> load_safetensors_state(const std::filesystem::path& path) {
  return detail::convert<T>(load_safetensors(path), nullptr, "nn::load_safetensors_state", path.string() + ": ");
}
template <class T>
StateDict<T> load_safetensors_state(const std::filesystem::path& path, const NameMap& map) {
  return detail::convert<T>(load_safetensors(path), &map, "nn::load_safetensors_state", path.string() + ": ");
}

template <class T>
void save_safetensors_state(const std::filesystem::path& path, const StateDict<T>& sd,
                            const SafetensorsMetadata& metadata = {}) {
  save_safetensors(path, sd, metadata);
}
// In the map's file names. Entries the map skips on load (num_batches_tracked) are not written:
// cutrain has none, and PyTorch's load_state_dict fills a missing num_batches_tracked with 0.
template <class T>
void save_safetensors_state(const std::filesystem::path& path, const StateDict<T>& sd, const NameMap& map,
                            const SafetensorsMetadata& metadata = {}) {
  save_safetensors(path, tensors_from(sd, map), metadata);
}

}  // namespace cutrain::inline CUTRAIN_ABI::nn
