// JSON for the files cutrain writes and reads back (the autotune cache, reports): nlohmann/json,
// the copy Debian's nlohmann-json3-dev installs, with what those files need on top of it:
//   - parse() is strict: duplicate keys and nesting deeper than max_depth are errors, and every
//     error is a ParseError (a cutrain::Error), so that a damaged file is detected, not half read;
//   - dump() keeps arrays of scalars on one line ("knobs": [[1, 2], [3, 0]] stays readable and
//     diffable) and refuses NaN and infinity, which nlohmann would write as null;
//   - as_int() and friends read a value, with a cutrain::Error saying what was expected.
//
// cudnn-frontend bundles another version of nlohmann/json under the same include guard; a
// translation unit compiles whichever copy it includes first. cutrain::cuda includes the
// package's <nlohmann/json.hpp> ahead of everything (cmake/cutrain_cuda.cmake), so that the
// CPU and CUDA builds and every include order have the one version. cudnn-frontend also
// specializes nlohmann::adl_serializer<float> (a float becomes hex text): store doubles.
#pragma once

#include "cutrain/core/abi.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "cutrain/core/error.hpp"

namespace cutrain::inline CUTRAIN_ABI::json {

// Members keep the order they were written or read in, so a file reads back as it was.
using Value = nlohmann::ordered_json;

// Malformed JSON text; reason() is nlohmann's message (line and column) or ours.
class ParseError : public InvalidArgument {
 public:
  explicit ParseError(const std::string& reason) : InvalidArgument("json::parse", reason), reason_(reason) {}
  const std::string& reason() const noexcept { return reason_; }

 private:
  std::string reason_;
};

namespace detail {
// nlohmann's message without its "[json.exception.parse_error.101] " prefix.
inline std::string message(const nlohmann::json::exception& e) {
  const std::string_view m = e.what();
  const auto end = m.find("] ");
  return std::string(m.starts_with("[json.exception.") && end != m.npos ? m.substr(end + 2) : m);
}

inline const char* kind_name(const Value& v) {
  switch (v.type()) {
    case Value::value_t::null: return "null";
    case Value::value_t::boolean: return "a boolean";
    case Value::value_t::string: return "a string";
    case Value::value_t::array: return "an array";
    case Value::value_t::object: return "an object";
    case Value::value_t::binary: return "binary data";
    case Value::value_t::discarded: return "a discarded value";
    default: return "a number";
  }
}

[[noreturn]] inline void wrong_kind(const char* expected, const Value& v) {
  throw InvalidArgument("json::Value", cutrain::detail::cat("expected ", expected, ", got ", kind_name(v)));
}

inline void write(std::string& out, const Value& v, int indent, int depth) {
  const auto newline = [&](int d) {
    out += '\n';
    out.append(static_cast<std::size_t>(indent) * static_cast<std::size_t>(d), ' ');
  };
  if (v.is_object()) {
    out += '{';
    bool first = true;
    for (const auto& [key, member] : v.items()) {
      if (!first) out += ',';
      first = false;
      if (indent) newline(depth + 1);
      out += Value(key).dump();
      out += indent ? ": " : ":";
      write(out, member, indent, depth + 1);
    }
    if (indent && !v.empty()) newline(depth);
    out += '}';
  } else if (v.is_array()) {
    bool flat = indent == 0;  // arrays of scalars stay on one line: [1, 2], not a number a line
    if (!flat) {
      flat = true;
      for (const auto& e : v) flat = flat && !e.is_structured();
    }
    out += '[';
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (i) out += flat && indent ? ", " : ",";
      if (!flat) newline(depth + 1);
      write(out, v[i], indent, depth + 1);
    }
    if (!flat && !v.empty()) newline(depth);
    out += ']';
  } else {
    if (v.is_number_float() && !std::isfinite(v.get<double>()))
      throw InvalidArgument("json::dump", cutrain::detail::cat("cannot write ", v.get<double>(),
                                                               ": JSON has no NaN or infinity"));
    out += v.dump();  // escapes strings and checks that they are UTF-8; integers exact, doubles shortest
  }
}
}  // namespace detail

// Parses one JSON value spanning all of text. Throws ParseError for malformed text, a key that
// appears twice in one object, or nesting deeper than max_depth levels.
inline Value parse(std::string_view text, int max_depth = 64) {
  std::vector<std::set<std::string>> keys;  // of each object open now
  const Value::parser_callback_t check = [&](int depth, Value::parse_event_t event, Value& parsed) {
    using E = Value::parse_event_t;
    if ((event == E::object_start || event == E::array_start) && depth >= max_depth)
      throw ParseError(cutrain::detail::cat("nesting deeper than ", max_depth, " levels"));
    if (event == E::object_start) keys.emplace_back();
    if (event == E::object_end) keys.pop_back();
    if (event == E::key && !keys.back().insert(parsed.get_ref<const std::string&>()).second)
      throw ParseError(cutrain::detail::cat("duplicate key \"", parsed.get_ref<const std::string&>(), "\""));
    return true;
  };
  try {
    return Value::parse(text.begin(), text.end(), check);
  } catch (const nlohmann::json::exception& e) {  // a parse_error, or out_of_range for 1e999
    throw ParseError(detail::message(e));
  }
}

// indent > 0: one member or element a line (arrays of scalars on one line); 0: compact, one line.
// Throws InvalidArgument for NaN, infinity or strings that are not UTF-8.
inline std::string dump(const Value& v, int indent = 2) {
  std::string out;
  try {
    detail::write(out, v, indent < 0 ? 0 : indent, 0);
  } catch (const nlohmann::json::type_error& e) {
    throw InvalidArgument("json::dump", detail::message(e));
  }
  return out;
}

// Why s cannot be written as a JSON string (it is not UTF-8); empty when it can.
inline std::string utf8_problem(const std::string& s) {
  try {
    (void)Value(s).dump();
    return {};
  } catch (const nlohmann::json::type_error& e) {
    return detail::message(e);
  }
}

// Reading a value as one type: a cutrain::Error (InvalidArgument) saying what was expected.
inline const Value* find(const Value& v, const std::string& key) {
  if (!v.is_object()) detail::wrong_kind("an object", v);
  const auto it = v.find(key);
  return it == v.end() ? nullptr : &*it;
}
inline const Value& at(const Value& v, const std::string& key) {
  const Value* m = find(v, key);
  CUTRAIN_REQUIRE(m != nullptr, InvalidArgument, "json::Value", "missing key \"", key, "\"");
  return *m;
}
inline bool as_bool(const Value& v) {
  if (!v.is_boolean()) detail::wrong_kind("a boolean", v);
  return v.get<bool>();
}
inline double as_double(const Value& v) {
  if (!v.is_number()) detail::wrong_kind("a number", v);
  return v.get<double>();
}
// The exact integer; a double is accepted only when its value is an int64 exactly.
inline std::int64_t as_int(const Value& v) {
  if (v.is_number_integer() && !v.is_number_unsigned()) return v.get<std::int64_t>();
  if (v.is_number_unsigned() && v.get<std::uint64_t>() <= static_cast<std::uint64_t>(INT64_MAX))
    return static_cast<std::int64_t>(v.get<std::uint64_t>());
  const double d = as_double(v);
  CUTRAIN_REQUIRE(std::trunc(d) == d && d >= -0x1p63 && d < 0x1p63, InvalidArgument, "json::Value",
                  "expected an integer, got ", v.dump());
  return static_cast<std::int64_t>(d);
}
inline const std::string& as_string(const Value& v) {
  if (!v.is_string()) detail::wrong_kind("a string", v);
  return v.get_ref<const std::string&>();
}
inline const Value::array_t& as_array(const Value& v) {
  if (!v.is_array()) detail::wrong_kind("an array", v);
  return v.get_ref<const Value::array_t&>();
}

}  // namespace cutrain::inline CUTRAIN_ABI::json
