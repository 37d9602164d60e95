// A small strict JSON value, parser and writer for the files cutrain writes and reads back (the
// autotune cache). Strict, so that a damaged file is detected rather than half read; the writer's
// output parses back to an equal value: integers exactly, doubles bit for bit.
#pragma once

#include <charconv>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cutrain/core/error.hpp"

namespace cutrain::json {

// Malformed JSON text. offset() is the byte where the parser stopped, reason() says why.
class ParseError : public InvalidArgument {
 public:
  ParseError(std::size_t offset, const std::string& reason)
      : InvalidArgument("json::parse", cutrain::detail::cat("at byte ", offset, ": ", reason)),
        offset_(offset), reason_(reason) {}
  std::size_t offset() const noexcept { return offset_; }
  const std::string& reason() const noexcept { return reason_; }

 private:
  std::size_t offset_;
  std::string reason_;
};

class Value {
 public:
  enum class Kind { null, boolean, number, string, array, object };
  using Array = std::vector<Value>;
  using Object = std::vector<std::pair<std::string, Value>>;  // insertion order, unique keys

  Value() = default;
  Value(std::nullptr_t) {}
  Value(bool b) : kind_(Kind::boolean), bool_(b) {}
  template <std::integral I>
    requires(!std::same_as<I, bool>)
  Value(I i) : kind_(Kind::number), exact_(true) {
    // An integer JSON cannot hold exactly as int64 would silently change on the way back.
    if constexpr (std::unsigned_integral<I> && sizeof(I) >= sizeof(std::int64_t))
      CUTRAIN_REQUIRE(i <= static_cast<std::uint64_t>(INT64_MAX), InvalidArgument, "json::Value", i,
                      " does not fit in int64");
    int_ = static_cast<std::int64_t>(i);
    number_ = static_cast<double>(int_);
  }
  template <std::floating_point F>
  Value(F d) : kind_(Kind::number), number_(static_cast<double>(d)) {}
  Value(const char* s) : Value(std::string(s)) {}
  Value(std::string_view s) : Value(std::string(s)) {}
  Value(std::string s) : kind_(Kind::string), string_(std::move(s)) {}
  Value(Array a) : kind_(Kind::array), array_(std::move(a)) {}
  Value(Object o) : kind_(Kind::object), object_(std::move(o)) {
    std::set<std::string_view> seen;
    for (const auto& [k, v] : object_)
      CUTRAIN_REQUIRE(seen.insert(k).second, InvalidArgument, "json::Value", "duplicate key \"", k, "\"");
  }

  Kind kind() const noexcept { return kind_; }
  bool is_null() const noexcept { return kind_ == Kind::null; }
  bool is_bool() const noexcept { return kind_ == Kind::boolean; }
  bool is_number() const noexcept { return kind_ == Kind::number; }
  bool is_int() const noexcept { return kind_ == Kind::number && exact_; }  // held as exact int64
  bool is_string() const noexcept { return kind_ == Kind::string; }
  bool is_array() const noexcept { return kind_ == Kind::array; }
  bool is_object() const noexcept { return kind_ == Kind::object; }

  bool as_bool() const { return checked(Kind::boolean, bool_); }
  double as_double() const { return checked(Kind::number, number_); }
  // The exact integer; a double is accepted only when its value is an int64 exactly.
  std::int64_t as_int() const {
    checked(Kind::number, number_);
    if (exact_) return int_;
    CUTRAIN_REQUIRE(std::trunc(number_) == number_ && number_ >= -0x1p63 && number_ < 0x1p63, InvalidArgument,
                    "json::Value", "expected an integer, got ", number_);
    return static_cast<std::int64_t>(number_);
  }
  const std::string& as_string() const { return checked(Kind::string, string_); }
  const Array& as_array() const { return checked(Kind::array, array_); }
  Array& as_array() { return checked(Kind::array, array_); }
  const Object& as_object() const { return checked(Kind::object, object_); }

  // Object members: find gives nullptr when absent, at throws naming the key.
  const Value* find(std::string_view key) const {
    for (const auto& [k, v] : as_object())
      if (k == key) return &v;
    return nullptr;
  }
  const Value& at(std::string_view key) const {
    const Value* v = find(key);
    CUTRAIN_REQUIRE(v != nullptr, InvalidArgument, "json::Value", "missing key \"", key, "\"");
    return *v;
  }
  void set(std::string key, Value v) {
    checked(Kind::object, object_);
    for (auto& [k, old] : object_)
      if (k == key) {
        old = std::move(v);
        return;
      }
    object_.emplace_back(std::move(key), std::move(v));
  }
  void push_back(Value v) { as_array().push_back(std::move(v)); }

  // Unused members stay at their defaults. An exact integer and the equal double differ: 1 != 1.0.
  bool operator==(const Value&) const = default;

  static const char* kind_name(Kind k) {
    constexpr const char* names[] = {"null", "a boolean", "a number", "a string", "an array", "an object"};
    return names[static_cast<int>(k)];
  }

 private:
  template <class T>
  T& checked(Kind k, T& member) const {
    CUTRAIN_REQUIRE(kind_ == k, InvalidArgument, "json::Value", "expected ", kind_name(k), ", got ", kind_name(kind_));
    return member;
  }

  Kind kind_ = Kind::null;
  bool bool_ = false;
  bool exact_ = false;
  std::int64_t int_ = 0;
  double number_ = 0;
  std::string string_;
  Array array_;
  Object object_;
};

namespace detail {
// Length of the UTF-8 sequence at s[i], or 0 when it is invalid (overlong, truncated, a surrogate,
// beyond U+10FFFF): text that is not UTF-8 would not survive a round trip through other tools.
inline std::size_t utf8_length(std::string_view s, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned c = byte(i);
  if (c < 0x80) return 1;
  std::size_t n = 0;
  std::uint32_t cp = 0;
  if (c >= 0xc2 && c <= 0xdf) n = 2, cp = c & 0x1f;
  else if (c >= 0xe0 && c <= 0xef) n = 3, cp = c & 0x0f;
  else if (c >= 0xf0 && c <= 0xf4) n = 4, cp = c & 0x07;
  else return 0;
  if (i + n > s.size()) return 0;
  for (std::size_t k = 1; k < n; ++k) {
    if ((byte(i + k) & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (byte(i + k) & 0x3f);
  }
  if (n == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) return 0;
  if (n == 4 && (cp < 0x10000 || cp > 0x10ffff)) return 0;
  return n;
}

inline void append_utf8(std::string& out, std::uint32_t cp) {
  const int n = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
  constexpr std::uint32_t lead[] = {0, 0, 0xc0, 0xe0, 0xf0};
  out += static_cast<char>(n == 1 ? cp : lead[n] | (cp >> (6 * (n - 1))));
  for (int k = n - 2; k >= 0; --k) out += static_cast<char>(0x80 | ((cp >> (6 * k)) & 0x3f));
}

// Recursive descent, with the depth bounded so that hostile input cannot exhaust the stack.
class Parser {
 public:
  Parser(std::string_view text, int max_depth) : s_(text), max_depth_(max_depth) {}

  Value run() {
    skip_ws();
    if (i_ == s_.size()) fail(s_.empty() ? "empty input, expected a value" : "only whitespace, expected a value");
    Value v = value(0);
    skip_ws();
    if (i_ != s_.size()) fail(cutrain::detail::cat("trailing characters after the value: ", here()));
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const { throw ParseError(i_, why); }
  // The character at the current offset, readable in a message.
  std::string here() const {
    if (i_ >= s_.size()) return "end of input";
    const auto c = static_cast<unsigned char>(s_[i_]);
    if (c > 0x20 && c < 0x7f) return cutrain::detail::cat("'", s_[i_], "'");
    constexpr char hex[] = "0123456789abcdef";
    return cutrain::detail::cat("byte 0x", hex[c >> 4], hex[c & 15]);
  }
  bool at(char c) const { return i_ < s_.size() && s_[i_] == c; }
  bool at_digit() const { return i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9'; }
  void skip_ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  bool word(std::string_view w) {
    if (s_.substr(i_, w.size()) != w) return false;
    i_ += w.size();
    return true;
  }

  Value value(int depth) {
    if (i_ < s_.size()) {
      const char c = s_[i_];
      if (c == '{') return object(depth + 1);
      if (c == '[') return array(depth + 1);
      if (c == '"') return string_text();
      if (c == '-' || at_digit()) return number();
      if (word("true")) return true;
      if (word("false")) return false;
      if (word("null")) return nullptr;
    }
    fail(cutrain::detail::cat("unexpected ", here(), ", expected a value"));
  }

  void enter(int depth) {
    if (depth > max_depth_) fail(cutrain::detail::cat("nesting deeper than ", max_depth_, " levels"));
    ++i_;
    skip_ws();
  }

  // At the closing character: consumes it. Otherwise, after the first element, expects a ','.
  bool closed(char close, bool first, const char* what) {
    if (at(close)) {
      ++i_;
      return true;
    }
    if (!first) {
      if (!at(',')) fail(cutrain::detail::cat("unexpected ", here(), " in ", what, ", expected ',' or '", close, "'"));
      ++i_;
      skip_ws();
    }
    return false;
  }

  Value array(int depth) {
    enter(depth);
    Value::Array a;
    while (!closed(']', a.empty(), "an array")) {
      a.push_back(value(depth));
      skip_ws();
    }
    return Value(std::move(a));
  }

  Value object(int depth) {
    enter(depth);
    Value::Object o;
    std::set<std::string> keys;  // not a scan of o: 10^5 keys must not take 10^10 steps
    while (!closed('}', o.empty(), "an object")) {
      if (!at('"')) fail(cutrain::detail::cat("unexpected ", here(), ", expected a string key"));
      const std::size_t key_at = i_;
      std::string key = string_text();
      if (!keys.insert(key).second) {
        i_ = key_at;
        fail(cutrain::detail::cat("duplicate key \"", key, "\""));
      }
      skip_ws();
      if (!at(':')) fail(cutrain::detail::cat("unexpected ", here(), " after a key, expected ':'"));
      ++i_;
      skip_ws();
      o.emplace_back(std::move(key), value(depth));
      skip_ws();
    }
    return Value(std::move(o));
  }

  Value number() {
    const std::size_t start = i_;
    bool integral = true;
    if (at('-')) ++i_;
    if (at('0')) {
      ++i_;
      if (at_digit()) fail("leading zero in a number");
    } else if (at_digit()) {
      while (at_digit()) ++i_;
    } else {
      fail(cutrain::detail::cat("unexpected ", here(), ", expected a digit"));
    }
    if (at('.')) {
      integral = false;
      ++i_;
      if (!at_digit()) fail(cutrain::detail::cat("unexpected ", here(), " after '.', expected a digit"));
      while (at_digit()) ++i_;
    }
    if (at('e') || at('E')) {
      integral = false;
      ++i_;
      if (at('+') || at('-')) ++i_;
      if (!at_digit()) fail(cutrain::detail::cat("unexpected ", here(), " in an exponent, expected a digit"));
      while (at_digit()) ++i_;
    }
    const char* first = s_.data() + start;
    const char* last = s_.data() + i_;
    if (integral) {
      std::int64_t n = 0;
      if (std::from_chars(first, last, n).ec == std::errc()) return n;
    }  // integers beyond int64 are kept as the nearest double
    double d = 0;
    if (std::from_chars(first, last, d).ec != std::errc() || !std::isfinite(d)) {
      i_ = start;
      fail("number out of the range of a double");
    }
    return d;
  }

  std::string string_text() {
    ++i_;  // the opening quote
    std::string out;
    for (;;) {
      if (i_ >= s_.size()) fail("unterminated string");
      const auto c = static_cast<unsigned char>(s_[i_]);
      if (c == '"') {
        ++i_;
        return out;
      }
      if (c < 0x20) fail(cutrain::detail::cat("unescaped control character ", here(), " in a string"));
      if (c == '\\') {
        escape(out);
        continue;
      }
      const std::size_t n = utf8_length(s_, i_);
      if (n == 0) fail(cutrain::detail::cat("invalid UTF-8 ", here(), " in a string"));
      out.append(s_.substr(i_, n));
      i_ += n;
    }
  }

  void escape(std::string& out) {
    ++i_;  // the backslash
    if (i_ >= s_.size()) fail("unterminated string");
    const char c = s_[i_];
    constexpr std::string_view from = "\"\\/bfnrt", to = "\"\\/\b\f\n\r\t";
    if (const auto k = from.find(c); k != std::string_view::npos) {
      out += to[k];
      ++i_;
      return;
    }
    if (c != 'u') fail(cutrain::detail::cat("invalid escape \\", here()));
    ++i_;
    std::uint32_t cp = hex4();
    if (cp >= 0xdc00 && cp <= 0xdfff) fail("\\u escape is a lone low surrogate");
    if (cp >= 0xd800 && cp <= 0xdbff) {
      if (!word("\\u")) fail("high surrogate not followed by a \\u low surrogate");
      const std::uint32_t low = hex4();
      if (low < 0xdc00 || low > 0xdfff) fail("high surrogate not followed by a low surrogate");
      cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
    }
    append_utf8(out, cp);
  }

  std::uint32_t hex4() {
    std::uint32_t v = 0;
    for (int k = 0; k < 4; ++k, ++i_) {
      const char c = i_ < s_.size() ? s_[i_] : '\0';
      const int d = c >= '0' && c <= '9'   ? c - '0'
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                           : -1;
      if (d < 0) fail(cutrain::detail::cat("unexpected ", here(), " in a \\u escape, expected a hex digit"));
      v = v * 16 + static_cast<std::uint32_t>(d);
    }
    return v;
  }

  std::string_view s_;
  std::size_t i_ = 0;
  int max_depth_;
};

class Writer {
 public:
  explicit Writer(int indent) : indent_(indent < 0 ? 0 : indent) {}
  std::string take() { return std::move(out_); }

  void write(const Value& v, int depth) {
    switch (v.kind()) {
      case Value::Kind::null: out_ += "null"; break;
      case Value::Kind::boolean: out_ += v.as_bool() ? "true" : "false"; break;
      case Value::Kind::number: number(v); break;
      case Value::Kind::string: string(v.as_string()); break;
      case Value::Kind::array: {
        const auto& a = v.as_array();
        // Arrays of scalars stay on one line: a knob list reads as [1, 2], not one number a line.
        bool flat = true;
        for (const auto& e : a) flat = flat && !(e.is_array() || e.is_object());
        flat = flat || indent_ == 0;
        out_ += '[';
        for (std::size_t i = 0; i < a.size(); ++i) {
          if (i) out_ += flat && indent_ ? ", " : ",";
          if (!flat) newline(depth + 1);
          write(a[i], depth + 1);
        }
        if (!flat && !a.empty()) newline(depth);
        out_ += ']';
        break;
      }
      case Value::Kind::object: {
        const auto& o = v.as_object();
        out_ += '{';
        for (std::size_t i = 0; i < o.size(); ++i) {
          if (i) out_ += ',';
          if (indent_) newline(depth + 1);
          string(o[i].first);
          out_ += indent_ ? ": " : ":";
          write(o[i].second, depth + 1);
        }
        if (indent_ && !o.empty()) newline(depth);
        out_ += '}';
        break;
      }
    }
  }

 private:
  void newline(int depth) {
    out_ += '\n';
    out_.append(static_cast<std::size_t>(indent_) * static_cast<std::size_t>(depth), ' ');
  }

  void number(const Value& v) {
    char buf[32];
    if (v.is_int()) {
      out_.append(buf, std::to_chars(buf, buf + sizeof buf, v.as_int()).ptr);
      return;
    }
    const double d = v.as_double();
    CUTRAIN_REQUIRE(std::isfinite(d), InvalidArgument, "json::dump", "cannot write ", d,
                    ": JSON has no NaN or infinity");
    // The shortest form that reads back to the same bits (at most max_digits10 digits); a '.0'
    // keeps an integral double a double when it is read back.
    const std::string_view s(buf, static_cast<std::size_t>(std::to_chars(buf, buf + sizeof buf, d).ptr - buf));
    out_ += s;
    if (s.find_first_of(".e") == std::string_view::npos) out_ += ".0";
  }

  void string(const std::string& s) {
    constexpr char hex[] = "0123456789abcdef";
    out_ += '"';
    for (std::size_t i = 0; i < s.size();) {
      const auto c = static_cast<unsigned char>(s[i]);
      constexpr std::string_view special = "\"\\\b\f\n\r\t", letter = "\"\\bfnrt";
      if (const auto k = special.find(static_cast<char>(c)); k != std::string_view::npos) {
        out_ += '\\';
        out_ += letter[k];
      } else if (c < 0x20) {
        out_ += "\\u00";
        out_ += hex[c >> 4];
        out_ += hex[c & 15];
      } else {
        const std::size_t n = utf8_length(s, i);
        CUTRAIN_REQUIRE(n != 0, InvalidArgument, "json::dump", "string is not valid UTF-8 at byte ", i);
        out_.append(s, i, n);
        i += n;
        continue;
      }
      ++i;
    }
    out_ += '"';
  }

  int indent_;
  std::string out_;
};
}  // namespace detail

// Parses one JSON value spanning all of text; throws ParseError with the byte offset and reason.
inline Value parse(std::string_view text, int max_depth = 64) { return detail::Parser(text, max_depth).run(); }

// indent > 0: one member or element a line (arrays of scalars on one line); 0: compact, one line.
// Throws InvalidArgument for NaN, infinity or strings that are not UTF-8.
inline std::string dump(const Value& v, int indent = 2) {
  detail::Writer w(indent);
  w.write(v, 0);
  return w.take();
}

}  // namespace cutrain::json
