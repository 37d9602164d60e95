// The autotuner's candidate order (cuda/autotune/candidates.hpp): a pure function of cuDNN's
// lists, tested here without a GPU.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "cutrain/cuda/autotune/candidates.hpp"

namespace cutrain_test_candidates {  // one per file: the unity build compiles files together

using cutrain::cuda::autotune::CandidateOrder;
using Order = std::vector<std::int64_t>;

namespace {
// Walks the order up to `n` candidates tried (as the tuning loop does) and returns them.
Order walk(CandidateOrder& c, std::size_t n) {
  Order tried;
  for (; !c.done() && tried.size() < n; c.advance()) tried.push_back(c.current());
  return tried;
}
}  // namespace

TEST_CASE("candidate order: the baseline first, then each distinct config at its first place") {
  // Plans 0 and 1 are not candidates (first = 2); plan 4 repeats plan 2's config, 6 repeats 3's.
  CandidateOrder c({"x", "y", "e1", "e2", "e1", "e3", "e2"}, /*baseline*/ 3, /*first*/ 2);
  CHECK(c.order() == Order{3, 2, 5});
  CHECK(c.count() == 7);
  CHECK(walk(c, 10) == Order{3, 2, 5});
  CHECK(c.done());
}

TEST_CASE("candidate order: a config's places in cuDNN's lists") {
  // A lists plans [0, 3), the fallback list [3, 5): e1 is A1 and F2.
  CandidateOrder c({"e1", "e2", "e3", "e4", "e1"}, 0, 0);
  c.note_places(0, 3, 'A');
  c.note_places(3, 5, 'F');
  CHECK(c.origin(0) == "A1 F2");
  CHECK(c.origin(4) == "A1 F2");  // the same config
  CHECK(c.origin(2) == "A3");
  CHECK(c.origin(3) == "F1");
}

TEST_CASE("candidate order: moved-up configs go next, and leave their later places") {
  CandidateOrder c({"a", "b", "c", "d", "e"}, 0, 0);
  CHECK(walk(c, 2) == Order{0, 1});
  c.move_up({4, 3});
  CHECK(c.order() == Order{0, 1, 4, 3, 2});
  CHECK(walk(c, 10) == Order{4, 3, 2});
}

TEST_CASE("candidate order: the fallback list's compiled configs move up within room") {
  // A: [0, 3); fallback: [3, 7). Plans 4, 5 and 6 are runtime-compiled; plan 5 is A's config "a1"
  // again, so it is not in the order at all (its config is tried at A's place).
  CandidateOrder c({"a0", "a1", "a2", "f0", "f1", "a1", "f3"}, 0, 0);
  CHECK(c.order() == Order{0, 1, 2, 3, 4, 6});
  CHECK(walk(c, 2) == Order{0, 1});
  const auto compiled = [](std::int64_t i) { return i == 4 || i == 5 || i == 6; };
  c.move_up_within(3, 7, /*room*/ 1, compiled);
  CHECK(c.order() == Order{0, 1, 4, 2, 3, 6});
  c.move_up_within(3, 7, /*room*/ 0, compiled);  // no room: nothing moves
  CHECK(c.order() == Order{0, 1, 4, 2, 3, 6});
}

TEST_CASE("candidate order: mode B's first untried guesses go next, its other configs last") {
  // A and the fallback list: plans [0, 5). Two were tried when B is asked.
  CandidateOrder c({"a0", "a1", "a2", "a3", "a4"}, 0, 0);
  c.note_places(0, 5, 'A');
  CHECK(walk(c, 2) == Order{0, 1});
  // B lists: a1 (tried: skipped), a4 (A's, untried: moves up from A's place), b0 (new), b1 (new).
  const std::int64_t end = c.add_mode_b({"a1", "a4", "b0", "b1"}, /*room*/ 2);
  CHECK(end == 9);
  CHECK(c.count() == 9);
  // Next: B's a4 (as plan 6) and b0 (plan 7); then A's untried a2, a3; then B's b1 (plan 8).
  CHECK(c.order() == Order{0, 1, 6, 7, 2, 3, 8});
  CHECK(walk(c, 10) == Order{6, 7, 2, 3, 8});
  CHECK(c.origin(6) == "A5 B2");
  CHECK(c.origin(1) == "A2 B1");
  CHECK(c.origin(8) == "B4");
}

TEST_CASE("candidate order: mode B with no room adds its new configs last only") {
  CandidateOrder c({"a0", "a1"}, 0, 0);
  CHECK(walk(c, 1) == Order{0});
  c.add_mode_b({"b0", "a1", "b0"}, /*room*/ 0);
  CHECK(c.order() == Order{0, 1, 2});
  CHECK(walk(c, 10) == Order{1, 2});
}

}  // namespace cutrain_test_candidates
