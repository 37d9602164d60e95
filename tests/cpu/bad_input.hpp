// The bad-input suite's table: each case runs one call that must throw, names the exception type
// it must throw and the substrings its message must hold (the op, and the offending shapes or
// values). run_cases checks every case of a table and reports each failure with its name.
#pragma once

#include <catch2/catch.hpp>

#include <exception>
#include <functional>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

#include "cutrain/core/error.hpp"

namespace cutrain::test {

struct BadCase {
  std::string name;
  std::function<void()> run;
  std::function<bool(const std::exception&)> has_type;
  std::string type;
  std::vector<std::string> needles;
};

// A case whose call must throw E (or a subclass) naming op ("cutrain::<op>: ...") and needles.
template <class E>
BadCase bad(std::string name, std::string op, std::vector<std::string> needles, std::function<void()> run) {
  needles.insert(needles.begin(), "cutrain::" + op + ": ");
  return {std::move(name), std::move(run),
          [](const std::exception& e) { return dynamic_cast<const E*>(&e) != nullptr; }, typeid(E).name(),
          std::move(needles)};
}

inline void run_cases(const std::vector<BadCase>& cases) {
  for (const auto& c : cases) {
    INFO("case: " << c.name);
    std::string what;
    bool thrown = false, right_type = false;
    try {
      c.run();
    } catch (const std::exception& e) {
      thrown = true;
      right_type = c.has_type(e);
      what = e.what();
    } catch (...) {
      thrown = true;
      what = "(not a std::exception)";
    }
    INFO("what(): " << what);
    CHECK(thrown);
    if (!thrown) continue;
    INFO("want type " << c.type);
    CHECK(right_type);
    for (const auto& n : c.needles) {
      INFO("want in message: " << n);
      CHECK(what.find(n) != std::string::npos);
    }
  }
}

}  // namespace cutrain::test
