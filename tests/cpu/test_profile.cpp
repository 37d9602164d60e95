// The op-level profiler (core/profile.hpp) on the CPU: ops run through dispatch are recorded
// while a session is alive and only then, an op inside another counts in the outer one, the
// optimizer step is one row, the categories, the table, the JSON and the Chrome trace (written
// and read back), CUTRAIN_PROFILE's session, and its bad input.
#include "bad_input.hpp"
#include "gradcheck.hpp"
#include "scoped_config.hpp"
#include "temp_dir.hpp"

#include <fstream>
#include <set>
#include <string>

#include "cutrain/core/profile.hpp"
#include "cutrain/ops/elementwise.hpp"
#include "cutrain/ops/matmul.hpp"
#include "cutrain/optim/adamw.hpp"

namespace cutrain_test_profile {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;

namespace {
std::multiset<std::string> ops_of(const profile::Session& s) {
  std::multiset<std::string> m;
  for (const auto& r : s.records()) m.insert(r.op);
  return m;
}
}  // namespace

TEST_CASE("profile: a session records the ops run through dispatch, and only while it lives", "[profile]") {
  Rng rng(2301);
  const auto a = random({64, 64}, rng), b = random({64, 64}, rng);
  (void)ops::add(a, b);  // before any session: not recorded anywhere
  profile::Session s;
  (void)ops::add(a, b);
  (void)ops::matmul(a, b);
  (void)ops::matmul(a, b);
  {
    const profile::OpScope outer("my_block", Device::cpu());  // a user's own scope: the ops inside count in it
    (void)ops::add(a, b);
    (void)ops::matmul(a, b);
  }
  s.stop();
  (void)ops::add(a, b);  // after stop: not recorded
  CHECK(ops_of(s) == std::multiset<std::string>{"add", "matmul", "matmul", "my_block"});
  for (const auto& r : s.records()) {
    CHECK(r.device.is_cpu());
    CHECK(r.ms >= 0);
    CHECK(r.start_ms >= 0);
    CHECK(r.start_ms + r.ms <= s.wall_ms() + 1e-9);
  }
  CHECK(s.records()[0].op == "add");  // in the order they began
  const auto by_op = s.totals(false);
  REQUIRE(!by_op.empty());
  for (std::size_t i = 1; i < by_op.size(); ++i) CHECK(by_op[i - 1].ms >= by_op[i].ms);  // largest first
  long calls = 0;
  for (const auto& t : by_op) calls += t.calls;
  CHECK(calls == 4);
  CHECK(s.recorded_ms() <= s.wall_ms() + 1e-9);
}

TEST_CASE("profile: categories", "[profile]") {
  CHECK(profile::category_of("conv2d_forward") == "conv fprop");
  CHECK(profile::category_of("conv2d_bias_activation_forward") == "conv fprop");
  CHECK(profile::category_of("conv2d_backward_data") == "conv dgrad");
  CHECK(profile::category_of("conv2d_backward_data_activation") == "conv dgrad");
  CHECK(profile::category_of("conv2d_backward_filter") == "conv wgrad");
  CHECK(profile::category_of("batch_norm_forward_training") == "norm forward");
  CHECK(profile::category_of("layer_norm_backward") == "norm backward");
  CHECK(profile::category_of("rms_norm_forward") == "norm forward");
  CHECK(profile::category_of("scaled_dot_product_attention_backward") == "attention backward");
  CHECK(profile::category_of("linear_forward") == "matmul");
  CHECK(profile::category_of("matmul_backward") == "matmul backward");
  CHECK(profile::category_of("optim::AdamW::step") == "optimizer");
  CHECK(profile::category_of("optim::clip_grad_norm") == "optimizer");
  CHECK(profile::category_of("cast") == "casts");
  CHECK(profile::category_of("index_select_backward") == "copies and indexing");
  CHECK(profile::category_of("cross_entropy_forward") == "softmax and loss");
  CHECK(profile::category_of("pool2d_backward") == "pooling");
  CHECK(profile::category_of("sum") == "reductions");
  CHECK(profile::category_of("norm_backward") == "reductions");
  CHECK(profile::category_of("sum_to") == "pointwise");
  CHECK(profile::category_of("activation_backward") == "pointwise");
  CHECK(profile::category_of("where") == "pointwise");
  CHECK(profile::category_of("something_new") == "other");
}

TEST_CASE("profile: an optimizer step is one row; the table, JSON and Chrome trace", "[profile]") {
  Rng rng(2302);
  auto w = autograd::parameter(random({8, 8}, rng)), w2 = autograd::parameter(random({8}, rng));
  w.grad() = random({8, 8}, rng);
  w2.grad() = random({8}, rng);
  optim::AdamW<double> opt({w, w2}, {.lr = 1e-3});
  TempDir dir("profile");
  profile::Session s;
  opt.step();
  opt.step();
  (void)ops::add(w.value(), w.value());
  s.stop();
  CHECK(ops_of(s) == std::multiset<std::string>{"optim::AdamW::step", "optim::AdamW::step", "add"});
  const std::string t = s.table();
  CHECK(t.find("optim::AdamW::step") != std::string::npos);
  CHECK(t.find("optimizer") != std::string::npos);
  CHECK(t.find("recorded 3 ops") != std::string::npos);
  const nlohmann::json j = s.json();
  CHECK(j["ops_recorded"] == 3);
  bool found = false;
  for (const auto& c : j["categories"])
    if (c["name"] == "optimizer") found = c["calls"] == 2;
  CHECK(found);
  s.write_json(dir / "p.json");
  s.write_chrome_trace(dir / "t.json");
  std::ifstream pj(dir / "p.json"), tj(dir / "t.json");
  CHECK(nlohmann::json::parse(pj) == j);
  const nlohmann::json trace = nlohmann::json::parse(tj);
  REQUIRE(trace["traceEvents"].size() == 3);
  for (const auto& e : trace["traceEvents"]) {
    CHECK(e["ph"] == "X");
    CHECK(e["tid"] == "cpu");
    CHECK(e["dur"].get<double>() >= 0);
  }
  CHECK(trace["traceEvents"][0]["name"] == "optim::AdamW::step");
  CHECK(trace["traceEvents"][0]["cat"] == "optimizer");
}

TEST_CASE("profile: CUTRAIN_PROFILE's session reports when it ends", "[profile]") {
  {
    ScopedConfig off("CUTRAIN_PROFILE", "0");
    CHECK(profile::Session::from_env() == nullptr);
  }
  TempDir dir("profile_env");
  ScopedConfig on("CUTRAIN_PROFILE", "1");
  ScopedConfig to("CUTRAIN_PROFILE_DIR", (dir / "out").string());
  {
    auto s = profile::Session::from_env();
    REQUIRE(s != nullptr);
    Rng rng(2303);
    (void)ops::add(random({4}, rng), random({4}, rng));
  }
  std::ifstream pj(dir / "out" / "profile.json");
  REQUIRE(pj.good());
  CHECK(nlohmann::json::parse(pj)["ops_recorded"] == 1);
  CHECK(std::filesystem::exists(dir / "out" / "trace.json"));
}

TEST_CASE("bad input: profile", "[profile][bad_input]") {
  profile::Session s;
  CUTRAIN_REQUIRE_THROWS_OP(profile::Session(), InvalidArgument, "profile::Session");
  s.stop();
  profile::Session again;  // one after another is fine
  again.stop();
  CHECK(again.records().empty());
}

}  // namespace cutrain_test_profile
