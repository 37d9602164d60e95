// nn::NameMap: how the entries of a weights file written by another framework (PyTorch's
// state_dict names: "layer1.0.bn1.running_mean") correspond to a cutrain module's state_dict
// names ("3.bn1.running_mean"), and which of the file's entries cutrain has no use for
// (PyTorch's BatchNorm num_batches_tracked). nn/weights.hpp loads and saves through it; the
// maps of the ready-made models are beside them in nn/models.hpp.
#pragma once

#include "cutrain/core/abi.hpp"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "cutrain/core/error.hpp"

namespace cutrain::inline CUTRAIN_ABI::nn {

class NameMap {
 public:
  // file_name (the other framework's) is cutrain's `ours`; each side appears once.
  NameMap& add(const std::string& file_name, const std::string& ours) {
    CUTRAIN_REQUIRE(!file_name.empty() && !ours.empty(), InvalidArgument, "nn::NameMap::add", "empty name (\"",
                    file_name, "\" -> \"", ours, "\")");
    CUTRAIN_REQUIRE(!to_ours_.count(file_name), InvalidArgument, "nn::NameMap::add", "file name \"", file_name,
                    "\" is mapped twice");
    CUTRAIN_REQUIRE(!to_file_.count(ours), InvalidArgument, "nn::NameMap::add", "cutrain name \"", ours,
                    "\" is mapped twice");
    to_ours_.emplace(file_name, ours);
    to_file_.emplace(ours, file_name);
    pairs_.emplace_back(file_name, ours);
    return *this;
  }
  // File entries whose name ends in suffix are skipped when loading, and never written.
  NameMap& skip_suffix(const std::string& suffix) {
    skip_.push_back(suffix);
    return *this;
  }

  // cutrain's name for a file entry; nullptr when the map has none.
  const std::string* ours(const std::string& file_name) const {
    const auto it = to_ours_.find(file_name);
    return it == to_ours_.end() ? nullptr : &it->second;
  }
  // The file's name for a cutrain entry; nullptr when the map has none.
  const std::string* file_name(const std::string& ours) const {
    const auto it = to_file_.find(ours);
    return it == to_file_.end() ? nullptr : &it->second;
  }
  bool skipped(const std::string& file_name) const {
    for (const auto& s : skip_)
      if (file_name.size() >= s.size() && file_name.compare(file_name.size() - s.size(), s.size(), s) == 0) return true;
    return false;
  }
  // (file name, cutrain name), in the order added.
  const std::vector<std::pair<std::string, std::string>>& pairs() const { return pairs_; }
  const std::vector<std::string>& skipped_suffixes() const { return skip_; }
  std::size_t size() const { return pairs_.size(); }

 private:
  std::map<std::string, std::string> to_ours_, to_file_;
  std::vector<std::pair<std::string, std::string>> pairs_;
  std::vector<std::string> skip_;
};

}  // namespace cutrain::inline CUTRAIN_ABI::nn
