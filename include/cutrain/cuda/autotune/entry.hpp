// What the autotuner's cache stores: the key of a timing (an op signature on a given GPU and
// library version) and its choice (an engine id and knobs, never a plan index, or a cuBLASLt
// algorithm), with their JSON form and the checks an entry must pass. Plain C++ with no CUDA
// header, so that the file logic is tested on machines without a GPU.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cutrain/core/error.hpp"
#include "cutrain/core/json.hpp"

namespace cutrain::inline CUTRAIN_ABI::cuda::autotune {

// What makes a timing valid only on this machine: a choice tuned on another GPU, or with other
// cuDNN / cudnn-frontend versions, may be slow or no longer exist.
struct Environment {
  std::string gpu_name;            // cudaDeviceProp::name
  int sm_count = 0;                // multiprocessors: a cut-down part of the same name tunes differently
  std::string compute_capability;  // "9.0"
  std::int64_t cudnn_version = 0;  // cudnnGetVersion()
  std::int64_t frontend_version = 0;
  bool operator==(const Environment&) const = default;
};

struct Key {
  std::string op;         // "conv2d.fprop", "conv2d.dgrad+relu_bwd", "linear.fwd+relu"
  std::string signature;  // shapes, strides, dtypes, params, epilogue, alignment: built by the caller
  std::string library;    // "cudnn" or "cublaslt"
  std::string gpu_name;
  int sm_count = 0;
  std::string compute_capability;
  std::int64_t cudnn_version = 0;
  std::int64_t frontend_version = 0;

  static Key make(std::string op, std::string signature, std::string library, const Environment& env) {
    return {std::move(op), std::move(signature), std::move(library), env.gpu_name, env.sm_count,
            env.compute_capability, env.cudnn_version, env.frontend_version};
  }
  Environment environment() const {
    return {gpu_name, sm_count, compute_capability, cudnn_version, frontend_version};
  }

  // One line, every field, '|' between them; '\', '|' and control characters are escaped so that
  // two different keys never have the same text. The file is sorted by it.
  std::string text() const {
    std::string t;
    const auto field = [&t](std::string_view s) {
      constexpr char hex[] = "0123456789abcdef";
      for (const char ch : s) {
        const auto c = static_cast<unsigned char>(ch);
        if (c == '\\' || c == '|') {
          t += '\\';
          t += ch;
        } else if (c < 0x20 || c == 0x7f) {
          t += "\\x";
          t += hex[c >> 4];
          t += hex[c & 15];
        } else {
          t += ch;
        }
      }
      t += '|';
    };
    field(library);
    field(op);
    field(signature);
    field(gpu_name);
    t += cutrain::detail::cat(sm_count, '|');
    field(compute_capability);
    t += cutrain::detail::cat(cudnn_version, '|', frontend_version);
    return t;
  }

  bool operator==(const Key&) const = default;
};

inline bool same_environment(const Key& key, const Environment& env) { return key.environment() == env; }

// A knob's type is a cudnn_frontend::KnobType_t where cudnn-frontend names the backend's knob
// type, else raw_knob_type_base plus the cuDNN backend type (cudnnBackendKnobType_t): engines
// that still report knobs the frontend dropped (SPLIT_K, KBLOCK, LDGC, ...) are replayed too.
inline constexpr std::int64_t raw_knob_type_base = 2000;

struct Knob {
  std::int64_t type = 0;  // see raw_knob_type_base
  std::int64_t value = 0;
  bool operator==(const Knob&) const = default;
};

struct RunnerUp {
  std::int64_t engine_id = 0;
  std::vector<Knob> knobs;
  double median_ms = 0;
  bool operator==(const RunnerUp&) const = default;
};

// What tuning found. An engine id and knobs rebuild the same plan in any later process, where a
// plan index would point at whatever the heuristics list happens to hold that day.
struct Choice {
  std::int64_t engine_id = 0;
  std::vector<Knob> knobs;
  double median_ms = 0;
  std::int64_t workspace_bytes = 0;
  double heuristic_ms = -1;  // the heuristics' first choice, timed the same way; -1: unknown
  int candidates_tried = 0;
  int candidates_failed = 0;
  double tuning_ms = 0;  // wall time the tuning took
  std::optional<RunnerUp> runner_up;
  std::string algo;  // cuBLASLt: the opaque cublasLtMatmulAlgo_t bytes as lowercase hex; empty for cuDNN
  bool operator==(const Choice&) const = default;
};

// Lowercase hex of n bytes, and back (false when s is not exactly 2n hex digits).
inline std::string hex_encode(const void* data, std::size_t n) {
  constexpr char hex[] = "0123456789abcdef";
  std::string s;
  s.reserve(2 * n);
  for (std::size_t i = 0; i < n; ++i) {
    const auto b = static_cast<const unsigned char*>(data)[i];
    s += hex[b >> 4];
    s += hex[b & 15];
  }
  return s;
}
inline bool hex_decode(std::string_view s, void* out, std::size_t n) {
  const auto digit = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; };
  if (s.size() != 2 * n) return false;
  for (std::size_t i = 0; i < n; ++i) {
    const int hi = digit(s[2 * i]), lo = digit(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    static_cast<unsigned char*>(out)[i] = static_cast<unsigned char>(hi * 16 + lo);
  }
  return true;
}

namespace detail {
using cutrain::detail::cat;

// Why a key or choice cannot be stored; empty when it can. Applied to inserts and to file entries.
inline std::string problem(const Key& k) {
  if (k.op.empty()) return "the key has an empty op";
  // Caught here, not in save(): a key the file cannot hold would make every later save fail.
  const std::pair<const char*, const std::string*> fields[] = {
      {"op", &k.op}, {"signature", &k.signature}, {"gpu_name", &k.gpu_name},
      {"compute_capability", &k.compute_capability}};
  for (const auto& [name, s] : fields)
    if (const auto why = json::utf8_problem(*s); !why.empty())
      return cat("key field ", name, " is not valid UTF-8: ", why);
  if (k.library != "cudnn" && k.library != "cublaslt")
    return cat("library \"", k.library, "\" is not cudnn or cublaslt");
  return {};
}
inline std::string problem(const Choice& c) {
  const auto time = [](double ms) { return std::isfinite(ms) && ms >= 0; };
  if (!time(c.median_ms)) return cat("median_ms ", c.median_ms, " is not a finite time >= 0");
  if (!time(c.heuristic_ms) && c.heuristic_ms != -1)
    return cat("heuristic_ms ", c.heuristic_ms, " is neither a time nor -1");
  if (!time(c.tuning_ms)) return cat("tuning_ms ", c.tuning_ms, " is not a finite time >= 0");
  if (c.runner_up && !time(c.runner_up->median_ms))
    return cat("runner-up median_ms ", c.runner_up->median_ms, " is not a time");
  if (c.workspace_bytes < 0) return cat("workspace_bytes ", c.workspace_bytes, " is negative");
  if (c.candidates_tried < 0 || c.candidates_failed < 0) return "negative candidate counts";
  if (c.algo.find_first_not_of("0123456789abcdef") != std::string::npos || c.algo.size() % 2)
    return "algo is not lowercase hex bytes";
  return {};
}

inline json::Value to_json(const std::vector<Knob>& knobs) {
  json::Value a = json::Value::array();
  for (const auto& k : knobs) a.push_back(json::Value::array({k.type, k.value}));
  return a;
}
inline json::Value to_json(const Key& k) {
  return json::Value::object({{"library", k.library},
                              {"op", k.op},
                              {"signature", k.signature},
                              {"gpu_name", k.gpu_name},
                              {"sm_count", k.sm_count},
                              {"compute_capability", k.compute_capability},
                              {"cudnn_version", k.cudnn_version},
                              {"frontend_version", k.frontend_version}});
}
inline json::Value to_json(const Choice& c) {
  json::Value v = json::Value::object({{"engine_id", c.engine_id},
                                       {"knobs", to_json(c.knobs)},
                                       {"median_ms", c.median_ms},
                                       {"workspace_bytes", c.workspace_bytes},
                                       {"heuristic_ms", c.heuristic_ms},
                                       {"candidates_tried", c.candidates_tried},
                                       {"candidates_failed", c.candidates_failed},
                                       {"tuning_ms", c.tuning_ms}});
  if (c.runner_up)
    v["runner_up"] = json::Value::object({{"engine_id", c.runner_up->engine_id},
                                          {"knobs", to_json(c.runner_up->knobs)},
                                          {"median_ms", c.runner_up->median_ms}});
  if (!c.algo.empty()) v["algo"] = c.algo;
  return v;
}

// The from_json functions throw cutrain::Error (InvalidArgument) naming the field that is wrong.
inline int to_int(const json::Value& v, const char* name) {
  const std::int64_t i = json::as_int(v);
  CUTRAIN_REQUIRE(i >= INT32_MIN && i <= INT32_MAX, InvalidArgument, "autotune::Cache", name, " out of range");
  return static_cast<int>(i);
}
inline std::vector<Knob> knobs_from_json(const json::Value& v) {
  std::vector<Knob> knobs;
  for (const auto& k : json::as_array(v)) {
    const auto& pair = json::as_array(k);
    CUTRAIN_REQUIRE(pair.size() == 2, InvalidArgument, "autotune::Cache", "a knob is not [type, value]");
    knobs.push_back({json::as_int(pair[0]), json::as_int(pair[1])});
  }
  return knobs;
}
inline Key key_from_json(const json::Value& v) {
  const auto text = [&v](const char* name) { return json::as_string(json::at(v, name)); };
  const auto integer = [&v](const char* name) { return json::as_int(json::at(v, name)); };
  Key k{text("op"),
        text("signature"),
        text("library"),
        text("gpu_name"),
        to_int(json::at(v, "sm_count"), "sm_count"),
        text("compute_capability"),
        integer("cudnn_version"),
        integer("frontend_version")};
  const std::string why = problem(k);
  CUTRAIN_REQUIRE(why.empty(), InvalidArgument, "autotune::Cache", why);
  return k;
}
inline Choice choice_from_json(const json::Value& v) {
  const auto time = [&v](const char* name) { return json::as_double(json::at(v, name)); };
  Choice c;
  c.engine_id = json::as_int(json::at(v, "engine_id"));
  c.knobs = knobs_from_json(json::at(v, "knobs"));
  c.median_ms = time("median_ms");
  c.workspace_bytes = json::as_int(json::at(v, "workspace_bytes"));
  c.heuristic_ms = time("heuristic_ms");
  c.candidates_tried = to_int(json::at(v, "candidates_tried"), "candidates_tried");
  c.candidates_failed = to_int(json::at(v, "candidates_failed"), "candidates_failed");
  c.tuning_ms = time("tuning_ms");
  if (const auto* r = json::find(v, "runner_up"); r && !r->is_null())
    c.runner_up = RunnerUp{json::as_int(json::at(*r, "engine_id")), knobs_from_json(json::at(*r, "knobs")),
                           json::as_double(json::at(*r, "median_ms"))};
  if (const auto* a = json::find(v, "algo")) c.algo = json::as_string(*a);
  const std::string why = problem(c);
  CUTRAIN_REQUIRE(why.empty(), InvalidArgument, "autotune::Cache", why);
  return c;
}
}  // namespace detail

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::autotune

template <>
struct std::hash<cutrain::cuda::autotune::Key> {
  std::size_t operator()(const cutrain::cuda::autotune::Key& k) const noexcept {
    std::uint64_t h = 0xcbf29ce484222325ull;
    const auto mix = [&h](std::size_t v) { h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
    const std::hash<std::string> s;
    const std::hash<std::int64_t> i;
    mix(s(k.op));
    mix(s(k.signature));
    mix(s(k.library));
    mix(s(k.gpu_name));
    mix(i(k.sm_count));
    mix(s(k.compute_capability));
    mix(i(k.cudnn_version));
    mix(i(k.frontend_version));
    return static_cast<std::size_t>(h);
  }
};
