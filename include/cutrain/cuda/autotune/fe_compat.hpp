// Every use of cudnn-frontend's internals in one place, checked against the frontend version it
// was written for: its protected members (the lowered operation graph and the engine-config
// list), plan names parsed back into knobs, the backend descriptors a stored config is rebuilt
// from, and the message text that marks a plan deselected by a filter. A new frontend version
// fails to compile here until each piece has been checked against it.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cudnn_frontend.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "cutrain/core/error.hpp"
#include "cutrain/cuda/autotune/cache.hpp"

// scripts/setup pins the same version (CUDNN_FRONTEND_VERSION there).
#define CUTRAIN_CUDNN_FRONTEND_TESTED 13200
static_assert(CUDNN_FRONTEND_VERSION == CUTRAIN_CUDNN_FRONTEND_TESTED,
              "cutrain/cuda/autotune/fe_compat.hpp reads cudnn-frontend internals checked against 1.32.0 only: "
              "check each of them against this version, then update CUTRAIN_CUDNN_FRONTEND_TESTED and scripts/setup");

namespace cutrain::inline CUTRAIN_ABI::cuda::autotune::detail {

using cutrain::detail::cat;
namespace fe = cudnn_frontend;
using TensorAttr = std::shared_ptr<fe::graph::Tensor_attributes>;

inline void fe_check(fe::error_t status, std::string_view op, const std::string& context) {
  if (status.is_bad()) throw CudnnError(op, context, status.get_message());
}

inline std::vector<Knob> sorted_knobs(const std::unordered_map<fe::KnobType_t, std::int64_t>& map) {
  std::vector<Knob> knobs;
  for (const auto& [type, value] : map) knobs.push_back({static_cast<std::int64_t>(type), value});
  std::sort(knobs.begin(), knobs.end(), [](const Knob& a, const Knob& b) { return a.type < b.type; });
  return knobs;
}
inline std::unordered_map<fe::KnobType_t, std::int64_t> knob_map(const std::vector<Knob>& knobs) {
  std::unordered_map<fe::KnobType_t, std::int64_t> map;
  for (const auto& k : knobs) map[static_cast<fe::KnobType_t>(k.type)] = k.value;
  return map;
}

// cudnn-frontend keeps a graph's lowered operation graph and its list of engine configs
// protected; create_plan() needs both. Naming the members through a derived class is how C++
// reaches a protected member of a base object.
struct GraphInternals : fe::graph::Graph {
  static std::shared_ptr<fe::OperationGraph_v8> op_graph_of(const fe::graph::Graph& g) {
    return g.*(&GraphInternals::operation_graph);
  }
  static fe::graph::Execution_plan_list& plans_of(fe::graph::Graph& g) { return g.*(&GraphInternals::plans); }
};

// The engine id and knobs of plan i of g as the cache stores them (Knob, raw_knob_type_base);
// false when they cannot be read. The frontend maps knob types it has no name for to NOT_SET;
// those configs are read from the plan's name, "eng<id>_k<backend type>=<value>..." (sorted by
// type: cudnn-frontend's get_engine_tag), which keeps the backend's types.
inline bool engine_config_of(fe::graph::Graph& g, std::int64_t i, std::int64_t& engine_id, std::vector<Knob>& knobs) {
  std::unordered_map<fe::KnobType_t, std::int64_t> named;
  if (g.get_engine_and_knobs_at_index(i, engine_id, named).is_bad()) return false;
  if (!named.contains(fe::KnobType_t::NOT_SET)) {
    knobs = sorted_knobs(named);
    return true;
  }
  std::string name;
  if (g.get_plan_name_at_index(i, name).is_bad()) return false;
  const char* at = name.data();
  const char* const end = name.data() + name.size();
  const auto number = [&](std::int64_t& v) {
    const auto [p, ec] = std::from_chars(at, end, v);
    at = p;
    return ec == std::errc();
  };
  std::int64_t id = -1;
  if (!name.starts_with("eng") || (at += 3, !number(id)) || id != engine_id) return false;
  knobs.clear();
  while (at != end) {
    std::int64_t type = 0, value = 0;
    if (end - at < 2 || at[0] != '_' || at[1] != 'k' || (at += 2, !number(type)) || at == end || *at++ != '=' ||
        !number(value) || type < 0 || type >= raw_knob_type_base)
      return false;
    const auto named_type = fe::convert_from_backend_knob_type(static_cast<cudnnBackendKnobType_t>(type));
    knobs.push_back({named_type == fe::KnobType_t::NOT_SET ? raw_knob_type_base + type : static_cast<std::int64_t>(named_type),
                     value});
  }
  std::sort(knobs.begin(), knobs.end(), [](const Knob& a, const Knob& b) { return a.type < b.type; });
  return true;
}

// Adds the engine config (engine id and knobs as the cache stores them) to g's candidates, as
// Graph::create_execution_plan does, and also where a knob type has only the backend's number.
// False when cuDNN refuses the config.
inline bool create_plan(fe::graph::Graph& g, std::int64_t engine_id, const std::vector<Knob>& knobs,
                        std::string_view op, const std::string& graph_key) {
  if (std::none_of(knobs.begin(), knobs.end(), [](const Knob& k) { return k.type >= raw_knob_type_base; }))
    return g.create_execution_plan(engine_id, knob_map(knobs)).is_good();
  const auto og = GraphInternals::op_graph_of(g);
  if (!og) return false;
  fe::detail::backend_descriptor engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  if (engine.get_status() != CUDNN_STATUS_SUCCESS || fe::detail::create_engine(engine, engine_id, og->get_raw_desc()).is_bad())
    return false;
  std::vector<fe::detail::backend_descriptor> choices;
  for (const Knob& k : knobs) {
    cudnnBackendKnobType_t type;
    if (k.type >= raw_knob_type_base) type = static_cast<cudnnBackendKnobType_t>(k.type - raw_knob_type_base);
    else if (fe::convert_to_backend_knob_type(static_cast<fe::KnobType_t>(k.type), type) != CUDNN_STATUS_SUCCESS)
      return false;
    std::int64_t value = k.value;
    auto& choice = choices.emplace_back(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR);
    if (choice.get_status() != CUDNN_STATUS_SUCCESS ||
        fe::detail::set_attribute(choice.get_ptr(), CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &type) !=
            CUDNN_STATUS_SUCCESS ||
        fe::detail::set_attribute(choice.get_ptr(), CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1, &value) !=
            CUDNN_STATUS_SUCCESS ||
        fe::detail::finalize(choice.get_ptr()) != CUDNN_STATUS_SUCCESS)
      return false;
  }
  auto config = fe::make_shared_backend_pointer(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
  if (fe::detail::create_engine_config(config, engine, choices).is_bad()) return false;
  auto& plans = GraphInternals::plans_of(g);
  plans.enqueue_engine_configs({config});
  // A config whose notes cannot be read would leave the list half described, which the filters
  // read: an error, as for a failed heuristics query.
  fe_check(plans.query_properties(), op, graph_key + ": reading a stored engine config's notes failed");
  return true;
}

// cuDNN's notes on plan i of g, by their frontend names, space-separated (Result::notes).
inline std::string notes_of(fe::graph::Graph& g, std::int64_t i) {
  const auto& plans = GraphInternals::plans_of(g);
  const auto k = static_cast<std::size_t>(i);
  std::string out;
  const auto add = [&](const auto& note) {
    const std::string name = nlohmann::json(note).template get<std::string>();
    if (name != "NOT_SET") out += cat(out.empty() ? "" : " ", name);
  };
  if (k < plans.numeric_notes.size())
    for (const auto n : plans.numeric_notes[k]) add(n);
  if (k < plans.behavior_notes.size())
    for (const auto n : plans.behavior_notes[k]) add(n);
  return out;
}

// Whether cuDNN compiles plan i's kernels when it is built (a runtime-fused engine).
inline bool runtime_compiled(fe::graph::Graph& g, std::int64_t i) {
  const auto& notes = GraphInternals::plans_of(g).behavior_notes;
  const auto k = static_cast<std::size_t>(i);
  return k < notes.size() &&
         std::find(notes[k].begin(), notes[k].end(), fe::BehaviorNote_t::RUNTIME_COMPILATION) != notes[k].end();
}

// Whether a plan failed to build only because a filter (deselect_numeric_notes, the workspace
// limit) deselected it: the frontend says so only in its message.
inline bool deselected(fe::error_t status) {
  return status.get_message().find("Deselecting execution plan") != std::string::npos;
}

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::autotune::detail
