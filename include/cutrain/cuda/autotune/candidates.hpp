// The order in which the autotuner tries a graph's candidate plans: a pure function of cuDNN's
// lists (each config named by its engine id and knobs), with no cuDNN types, so that the CPU
// suite tests it. The tuning loop (tuner.hpp) walks the order and asks it to move configs up.
//
// The order: the baseline (the heuristics' first choice that builds), then every other distinct
// config in cuDNN's order (heuristics mode A, the fallback list, mode B where already asked).
// Configs with equal names are the same plan and are tried once, at their first place.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace cutrain::inline CUTRAIN_ABI::cuda::autotune {

class CandidateOrder {
 public:
  // names[i] is plan i's name; the candidates are plans [first, names.size()).
  CandidateOrder(std::vector<std::string> names, std::int64_t baseline, std::int64_t first)
      : names_(std::move(names)), baseline_(baseline), order_{baseline}, seen_{name(baseline)} {
    append_distinct(first, count());
  }

  std::int64_t count() const { return static_cast<std::int64_t>(names_.size()); }
  const std::string& name(std::int64_t i) const { return names_.at(static_cast<std::size_t>(i)); }
  const std::vector<std::int64_t>& order() const { return order_; }

  // The walk: the candidate at position(), until done(); advance() steps past it.
  bool done() const { return next_ >= order_.size(); }
  std::int64_t current() const { return order_[next_]; }
  void advance() { ++next_; }
  std::size_t position() const { return next_; }

  // Records that plans [from, to) are list `list`'s ('A', 'B' or 'F'), 1-based from `from`.
  void note_places(std::int64_t from, std::int64_t to, char list) {
    for (std::int64_t i = from; i < to; ++i) {
      auto& o = origin_[name(i)];
      if (o.find(list) == std::string::npos) o += (o.empty() ? "" : " ") + std::string(1, list) + std::to_string(i - from + 1);
    }
  }
  // Where plan i's config stands in cuDNN's lists ("A3 B1", "F2"); empty when not noted.
  std::string origin(std::int64_t i) const {
    const auto it = origin_.find(name(i));
    return it == origin_.end() ? std::string{} : it->second;
  }

  // Moves `up` (untried plans, in this order) to the walk's position: they are tried next. An
  // untried plan with the name of one of them leaves its place.
  void move_up(const std::vector<std::int64_t>& up) {
    std::unordered_set<std::string> up_names;
    for (const std::int64_t i : up) up_names.insert(name(i));
    std::vector<std::int64_t> kept(order_.begin(), order_.begin() + static_cast<std::ptrdiff_t>(next_));
    kept.insert(kept.end(), up.begin(), up.end());
    for (std::size_t k = next_; k < order_.size(); ++k)
      if (!up_names.contains(name(order_[k]))) kept.push_back(order_[k]);
    order_ = std::move(kept);
  }

  // Moves up to `room` untried plans of [from, to) for which pred(plan) holds, in the walk's
  // order (the fallback list's runtime-compiled configs that mode A does not list).
  template <class Pred>
  void move_up_within(std::int64_t from, std::int64_t to, int room, Pred&& pred) {
    std::vector<std::int64_t> up;
    for (std::size_t k = next_; k < order_.size() && static_cast<int>(up.size()) < room; ++k)
      if (order_[k] >= from && order_[k] < to && pred(order_[k])) up.push_back(order_[k]);
    move_up(up);
  }

  // Mode B's configs, asked late: `b_names` are plans [count(), count() + b_names.size()). Its
  // first `room` configs not tried yet go next (those another list also holds move up from their
  // places there); B's configs no other list holds go last. Returns the end of B's plans.
  std::int64_t add_mode_b(const std::vector<std::string>& b_names, int room) {
    const std::int64_t from = count();
    names_.insert(names_.end(), b_names.begin(), b_names.end());
    const std::int64_t end = count();
    note_places(from, end, 'B');
    std::unordered_set<std::string> taken;  // tried, or already moved up
    for (std::size_t k = 0; k < next_; ++k) taken.insert(name(order_[k]));
    std::vector<std::int64_t> up;
    for (std::int64_t i = from; i < end && static_cast<int>(up.size()) < room; ++i) {
      if (!taken.insert(name(i)).second) continue;
      seen_.insert(name(i));
      up.push_back(i);
    }
    move_up(up);
    append_distinct(from, end);
    return end;
  }

 private:
  void append_distinct(std::int64_t from, std::int64_t to) {
    for (std::int64_t i = from; i < to; ++i)
      if (i != baseline_ && seen_.insert(name(i)).second) order_.push_back(i);
  }

  std::vector<std::string> names_;
  std::int64_t baseline_;
  std::vector<std::int64_t> order_;
  std::unordered_set<std::string> seen_;
  std::unordered_map<std::string, std::string> origin_;
  std::size_t next_ = 0;
};

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::autotune
