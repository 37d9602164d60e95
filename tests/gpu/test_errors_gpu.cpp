// How a cuDNN graph with no engine fails through the plan store: one short message naming the op,
// the graph's signature (dtype, dims, strides) and cuDNN's first reason; cuDNN's whole message in
// CudnnError::log() (or in what() with CUTRAIN_CUDNN_FULL_ERRORS=1); and the failure remembered,
// so that asking again throws at once without building.
#include <catch2/catch.hpp>

#include <cstdio>
#include <memory>
#include <string>

#include "cutrain/cuda/cudnn/plan_store.hpp"
#include "scoped_config.hpp"

namespace cutrain_test_errors_gpu {  // one per file: the unity build compiles files together

using namespace cutrain;
namespace cd = cutrain::cuda::cudnn;
namespace fe = cudnn_frontend;

namespace {
// A batchnorm_inference node: cuDNN 9.19 has no engine for it on the H200 in any layout or dtype
// (which is why batch-norm inference is an NVRTC kernel, cuda/kernels/batch_norm_inference.hpp).
cd::BuiltGraph& build_without_engine(const cd::GraphKey& key, const std::string& text) {
  const Shape xs{8, 3, 5, 5};
  const Strides xst{75, 1, 15, 3};
  const Shape cs{1, 3, 1, 1};
  const Strides cst{3, 1, 3, 3};
  return cd::plan_store().build(key, text, cuda::autotune::Planner::heuristic(), [&](cuda::autotune::Planner& planner) {
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(fe::DataType_t::FLOAT)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    auto X = cd::tensor(*g, "x", xs, xst, fe::DataType_t::FLOAT);
    auto M = cd::tensor(*g, "mean", cs, cst, fe::DataType_t::FLOAT);
    auto V = cd::tensor(*g, "inv_variance", cs, cst, fe::DataType_t::FLOAT);
    auto S = cd::tensor(*g, "scale", cs, cst, fe::DataType_t::FLOAT);
    auto B = cd::tensor(*g, "bias", cs, cst, fe::DataType_t::FLOAT);
    auto Y = g->batchnorm_inference(X, M, V, S, B, fe::graph::Batchnorm_inference_attributes());
    Y->set_output(true).set_dim(xs.dims()).set_stride(xst).set_data_type(fe::DataType_t::FLOAT);
    cd::build(*g, cuda::handles(0).cudnn, "batch_norm_inference", text, false, planner);
    return cd::BuiltGraph{g, {X, M, V, S, B, Y}, 0};
  });
}
}  // namespace

TEST_CASE("a graph cuDNN has no engine for: a short message, the whole log on request, remembered") {
  cd::GraphKey key(cd::GraphOp::batch_norm_forward_training, 0);
  key.add(std::int64_t{-19});  // no op of cutrain's makes this key
  const std::string text = "bn inference f32 x[8,3,5,5][75,1,15,3]";
  cd::clear_graph_cache();

  std::string first;
  std::size_t log_bytes = 0;
  try {
    build_without_engine(key, text);
    FAIL("cuDNN built a batchnorm_inference graph: this test needs a graph with no engine");
  } catch (const CudnnError& e) {
    first = e.what();
    log_bytes = e.log().size();
    std::printf("no-engine error: what() %zu bytes, log() %zu bytes: %s\n", first.size(), log_bytes, first.c_str());
    CHECK(first.size() < 700);
    CHECK(first.find("batch_norm_inference") != std::string::npos);
    CHECK(first.find(text) != std::string::npos);
    CHECK(log_bytes > 0);
  }

  // Asked again: the same error from the store's memory, nothing built.
  const auto graphs = cd::build_stats().graphs.load();
  try {
    cd::plan_store().find(key);
    FAIL("the plan store forgot the failed graph");
  } catch (const CudnnError& e) {
    CHECK(std::string(e.what()) == first);
  }
  CHECK(cd::build_stats().graphs.load() == graphs);

  // The whole message in what() when asked for.
  cd::clear_graph_cache();
  {
    test::ScopedConfig full("CUTRAIN_CUDNN_FULL_ERRORS", "1");
    try {
      build_without_engine(key, text);
      FAIL("cuDNN built a batchnorm_inference graph");
    } catch (const CudnnError& e) {
      CHECK(std::string_view(e.what()).find(e.log()) != std::string_view::npos);
      CHECK(e.log().size() == log_bytes);
    }
  }
  cd::clear_graph_cache();
}

}  // namespace cutrain_test_errors_gpu
