// Sets one of the variables cutrain::Config reads (core/config.hpp), by its environment name, for a
// scope, as the environment would at process start; puts back what was there afterwards. The
// process environment itself is never touched (no setenv).
#pragma once

#include <catch2/catch.hpp>

#include <string>

#include "cutrain/core/config.hpp"

namespace cutrain::test {

class ScopedConfig {
 public:
  ScopedConfig(const char* name, const std::string& value)
      : override_([&](Config& c) { REQUIRE(Config::set(c, name, value)); }) {}

 private:
  ConfigOverride override_;
};

}  // namespace cutrain::test
