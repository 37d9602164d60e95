// Values that used to be taken silently or to fail with another library's exception: negative
// MLP widths, non-finite optimizer and schedule settings, a directory as a corpus, implausibly
// large batches, a transformer block on a 2-d input, a store Env built by hand with a port out of
// range, token ids out of range (named by the module or engine), engine memory past 2^63 bytes,
// and copies between overlapping views of one
// storage on the CPU (which must read every element before writing any).
#include "bad_input.hpp"

#include <cmath>
#include <limits>
#include <filesystem>
#include <numeric>
#include <vector>

#include "cutrain/core/view.hpp"
#include "cutrain/data/text.hpp"
#include "cutrain/deploy/engine_gpt.hpp"
#include "cutrain/dist/store.hpp"
#include "cutrain/nn/embedding.hpp"
#include "cutrain/nn/transformer.hpp"
#include "cutrain/optim/adamw.hpp"
#include "cutrain/optim/schedule.hpp"

namespace cutrain_test_bad_input_edges {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;
using autograd::Var;

TEST_CASE("bad input at the edges: modules, optimizers, schedules, corpora") {
  const auto corpus = data::CharCorpus::from_text(std::string(200, 'a') + std::string(200, 'b'));
  Rng rng(3);
  Var<double> p(Tensor<double>::zeros({2}), true);
  nn::TransformerBlock<double> block({.dim = 8, .heads = 2});
  const double nan = std::nan("");
  run_cases({
      bad<InvalidArgument>("negative hidden", "nn::TransformerBlock", {"hidden -5"},
                           [] { nn::TransformerBlock<double> b({.dim = 8, .heads = 2, .hidden = -5}); }),
      bad<InvalidArgument>("dim not a multiple of heads", "nn::TransformerBlock", {"dim 8, heads 3"},
                           [] { nn::TransformerBlock<double> b({.dim = 8, .heads = 3}); }),
      bad<InvalidArgument>("2-d input", "nn::TransformerBlock", {"[B, S, C]", "[4,8]"},
                           [&] { (void)block(Var<double>(Tensor<double>::zeros({4, 8}))); }),
      bad<InvalidArgument>("infinite weight decay", "optim::AdamW", {"weight_decay inf"},
                           [&] { optim::AdamW<double> o({p}, {.weight_decay = INFINITY}); }),
      bad<InvalidArgument>("NaN eps", "optim::AdamW", {"eps nan"}, [&] { optim::AdamW<double> o({p}, {.eps = nan}); }),
      bad<InvalidArgument>("NaN cosine lr", "optim::CosineSchedule", {"lr and min_lr", "nan"},
                           [&] { (void)optim::CosineSchedule{.lr = nan, .total_steps = 10}(0); }),
      bad<InvalidArgument>("negative one-cycle max_lr", "optim::OneCycleSchedule", {"max_lr", "-1"},
                           [] { (void)optim::OneCycleSchedule{.max_lr = -1, .total_steps = 10}(0); }),
      bad<IoError>("a directory as a corpus", "data::CharCorpus", {"is a directory"},
                   [] { data::CharCorpus c(std::filesystem::temp_directory_path().string()); }),
      bad<InvalidArgument>("a batch of 2^40 windows", "data::CharCorpus::sample", {"implausibly many"},
                           [&] { (void)corpus.sample(data::Split::train, std::int64_t{1} << 40, 8, rng); }),
      bad<InvalidArgument>("a store on port 70000", "dist::Store", {"master_port", "70000"},
                           [] { dist::Store s(dist::Env{.master_port = 70000}); }),
      bad<InvalidArgument>("a store on port 0", "dist::Store", {"master_port", "got 0"},
                           [] { dist::Store s(dist::Env{.master_port = 0}); }),
      bad<InvalidArgument>("a store with rank >= world_size", "dist::Store", {"rank 2, world_size 2"},
                           [] { dist::Store s(dist::Env{.rank = 2, .world_size = 2}); }),
  });
}

TEST_CASE("bad input at the edges: engine memory past 2^63 bytes is refused, not wrapped") {
  constexpr auto big = std::numeric_limits<std::int64_t>::max() - 100;
  Rng rng(5);
  const nn::Sequential<double> net{nn::Linear<double>({.in = 4, .out = 4}, rng)};
  run_cases({
      bad<InvalidArgument>("two values past 2^63 bytes", "deploy::plan_memory", {"more than 2^63 bytes"},
                           [&] { (void)deploy::plan_memory({big, 1000}, {{0, 1}, {0, 1}}); }),
      bad<InvalidArgument>("one value that cannot be aligned", "deploy::plan_memory", {"more than 2^63 bytes"},
                           [&] { (void)deploy::plan_memory({big}, {{0, 0}}); }),
      bad<InvalidArgument>("negative bytes", "deploy::plan_memory", {"value 0 has -1 bytes"},
                           [&] { (void)deploy::plan_memory({-1}, {{0, 0}}); }),
      bad<InvalidArgument>("an example batch of 2^61 rows", "deploy::Engine", {"too large", "overflows int64"},
                           [&] { (void)deploy::compile<double>(net, Shape{std::int64_t{1} << 61, 4}); }),
  });
}

TEST_CASE("bad input at the edges: token ids out of range name the module or engine and the vocabulary") {
  nn::Embedding<double> emb({.num = 10, .dim = 4});
  nn::GPT<double> gpt({.vocab = 10, .context = 4, .dim = 8, .heads = 2, .layers = 1});
  const auto engine = deploy::compile<double>(gpt, Shape{2, 4});
  const auto tokens = Tensor<std::int32_t>::from_vector({1, 2, 12, 3, 0, 9, 9, 9}, {2, 4});
  run_cases({
      bad<InvalidArgument>("an embedding id past the table", "nn::Embedding",
                           {"idx i32[2,4]", "table of 10 rows", "ids in [0, 10)", "index value 12"},
                           [&] { (void)emb(tokens); }),
      bad<InvalidArgument>("a GPT engine token past the vocabulary", "deploy::GptEngine",
                           {"tokens i32[2,4]", "ids in [0, 10)", "index value 12"}, [&] { (void)engine(tokens); }),
  });
}

TEST_CASE("copy_from between overlapping views of one CPU storage reads before it writes") {
  std::vector<double> v(10);
  std::iota(v.begin(), v.end(), 0.0);
  auto a = Tensor<double>::from_vector(v, Shape{10});
  a.slice(0, 1, 10).copy_from(a.slice(0, 0, 9));  // shift right by one, contiguous, overlapping
  CHECK(a.to_vector() == std::vector<double>{0, 0, 1, 2, 3, 4, 5, 6, 7, 8});
  a.slice(0, 0, 9).copy_from(a.slice(0, 1, 10));  // and back left
  CHECK(a.to_vector() == std::vector<double>{0, 1, 2, 3, 4, 5, 6, 7, 8, 8});
  // A matrix overwritten with its own transpose (a strided view of the same storage).
  auto m = Tensor<double>::from_vector({1, 2, 3, 4, 5, 6, 7, 8, 9}, Shape{3, 3});
  m.copy_from(transpose(m, 0, 1));
  CHECK(m.to_vector() == std::vector<double>{1, 4, 7, 2, 5, 8, 3, 6, 9});
}

}  // namespace cutrain_test_bad_input_edges
