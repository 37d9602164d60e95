// scaled_dot_product_attention on the GPU against the CPU backend in f64 on the same (rounded)
// random data: forward (o and the statistics) and backward, bf16 and f16 on cuDNN's fused SDPA
// (head dims 64 and 128, causal, grouped-query, padding lengths, [B, S, H, D] views) and the
// composed fallback (f32, a head dim cuDNN refuses); which path ran is checked through
// kernel_fallbacks(). Dropout: cuDNN draws its own mask (Philox), which the forward also dumps
// for the test; the CPU reference takes that mask (and the composed path shares the CPU's).
// Also autograd on the device and the autotuner's benchmark mode.
#include "parity.hpp"
#include "temp_dir.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cutrain/autograd/functions/attention.hpp"
#include "cutrain/cuda/autotune/tuner.hpp"
#include "cutrain/cuda/cuda_graph.hpp"
#include "cutrain/ops/attention.hpp"

namespace cutrain_test_attention_gpu {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;
namespace autotune = cutrain::cuda::autotune;

namespace {

struct Case {
  std::string name;
  std::int64_t B, H, Hk, Sq, Skv, D, Dv;
  AttentionParams p{};
  bool bshd = false;  // q, k, v are [B, S, H, D] in memory, seen through a permute
  std::vector<std::int32_t> q_len{}, kv_len{};
  bool fused = true;  // cuDNN's SDPA is expected to run (bf16 and f16)
};

std::vector<Case> cases() {
  return {
      {"d64", 2, 4, 4, 128, 128, 64, 64},
      {"d64 causal bshd", 2, 4, 4, 128, 128, 64, 64, {.causal = true}, true},
      {"d128 causal", 1, 4, 4, 96, 96, 128, 128, {.causal = true}},
      {"gqa d64", 2, 8, 2, 64, 80, 64, 64, {.scale = 0.2}},
      {"gqa d128 causal bshd", 1, 6, 2, 64, 64, 128, 128, {.causal = true}, true},
      {"padding", 2, 2, 2, 64, 64, 64, 64, {}, false, {64, 37}, {64, 20}},
      {"padding causal kv only", 2, 2, 2, 64, 64, 64, 64, {.causal = true}, false, {}, {50, 9}},
      {"padding q only, gqa", 2, 4, 2, 48, 64, 64, 64, {}, false, {17, 48}, {}},
      {"causal, more queries than keys", 1, 2, 2, 80, 64, 64, 64, {.causal = true}},
      {"one query", 3, 4, 4, 1, 33, 64, 64},
      {"head dim 20 (composed)", 2, 2, 1, 17, 23, 20, 20, {.causal = true}, false, {}, {}, false},
      {"dropout d64", 2, 4, 4, 128, 128, 64, 64, {.dropout = 0.2, .seed = 5}},
      {"dropout d128 causal gqa bshd", 1, 4, 2, 96, 96, 128, 128, {.causal = true, .dropout = 0.4, .seed = 6}, true},
      {"dropout padding", 2, 2, 2, 64, 64, 64, 64, {.dropout = 0.1, .seed = 7}, false, {64, 30}, {64, 41}},
      {"dropout head dim 20 (composed)", 2, 2, 1, 17, 23, 20, 20, {.dropout = 0.3, .seed = 8}, false, {}, {}, false},
  };
}

AttentionLengths lengths(const Case& c, Device dev) {
  AttentionLengths l;
  if (!c.q_len.empty()) l.q = Tensor<std::int32_t>::from_vector(c.q_len, Shape{c.B}).to(dev);
  if (!c.kv_len.empty()) l.kv = Tensor<std::int32_t>::from_vector(c.kv_len, Shape{c.B}).to(dev);
  return l;
}

// A random [B, h, s, d] input on the GPU (permuted from [B, s, h, d] memory when bshd) and its
// f64 host copy.
template <class T>
std::pair<Tensor<T>, Tensor<double>> input(std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t d, bool bshd,
                                           Rng& rng) {
  if (!bshd) return random_pair<T>(Shape{b, h, s, d}, rng, Layout::row_major);
  auto [t, ref] = random_pair<T>(Shape{b, s, h, d}, rng, Layout::row_major);
  return {permute(t, {0, 2, 1, 3}), permute(ref, {0, 2, 1, 3}).contiguous()};
}

// Zeroes the statistics of padded rows (unspecified on either side) for the comparison.
template <class S>
Tensor<double> valid_stats(const Tensor<S>& stats, const Case& c) {
  auto v = cast<double>(stats.to(Device::cpu())).contiguous().to_vector();
  for (std::int64_t b = 0; b < c.B; ++b)
    for (std::int64_t h = 0; h < c.H; ++h)
      for (std::int64_t i = c.q_len.empty() ? c.Sq : c.q_len[b]; i < c.Sq; ++i) v[(b * c.H + h) * c.Sq + i] = 0;
  return Tensor<double>::from_vector(v, Shape{c.B, c.H, c.Sq});
}

template <class T>
void check_case(const Case& c, Rng& rng) {
  const std::string name = c.name + " " + std::string(to_string(dtype_of<T>));
  INFO(name);
  const Device dev = Device::cuda(0);
  auto [q, qr] = input<T>(c.B, c.H, c.Sq, c.D, c.bshd, rng);
  auto [k, kr] = input<T>(c.B, c.Hk, c.Skv, c.D, c.bshd, rng);
  auto [v, vr] = input<T>(c.B, c.Hk, c.Skv, c.Dv, c.bshd, rng);
  auto [dout, dr] = random_pair<T>(Shape{c.B, c.H, c.Sq, c.Dv}, rng, Layout::row_major);
  const AttentionLengths lg = lengths(c, dev), lc = lengths(c, Device::cpu());

  const auto fallbacks0 = cuda::cudnn::kernel_fallbacks().load();
  const auto r = ops::scaled_dot_product_attention_forward(q, k, v, c.p, lg);
  const bool forward_fused = !std::is_same_v<T, float> && cuda::cudnn::kernel_fallbacks().load() == fallbacks0;
  const auto g = ops::scaled_dot_product_attention_backward(q, k, v, r.o, dout, r.stats, c.p, lg, r.mask);
  // f32 goes to the composed path directly (cuDNN's SDPA takes bf16 and f16 only), uncounted.
  const bool fused = !std::is_same_v<T, float> && cuda::cudnn::kernel_fallbacks().load() == fallbacks0;
  const bool want_fused = c.fused && !std::is_same_v<T, float>;
  INFO("cuDNN SDPA ran: " << fused << " (expected " << want_fused << ")");
  CHECK(fused == want_fused);
  if (c.bshd && fused) CHECK(r.o.strides()[1] < r.o.strides()[2]);  // o laid out as q is
  if (c.p.dropout > 0) CHECK(r.mask == (fused ? DropoutMask::cudnn : DropoutMask::cutrain));

  cpu::detail::AttentionGeometry geom = ops::detail::attention_geometry("test", qr, kr, vr, c.p, lc);
  if constexpr (!std::is_same_v<T, float>) {
    if (c.p.dropout > 0 && fused) {  // cuDNN's mask, dumped by the same forward graph plus the dump
      Tensor<float> dump(Shape{c.B, c.H, c.Sq, c.Skv}, {.device = dev});
      AttentionForward<T, float> rd;
      REQUIRE(ops::detail::attention_forward_cudnn(q, k, v, ops::detail::attention_geometry("test", q, k, v, c.p, lg), lg,
                                                   {}, rd, &dump));
      check_close(name + " o with the mask dumped", rd.o, cast<double>(r.o.to(Device::cpu())), tolerance<T>);
      geom.keep = dump.to(Device::cpu()).contiguous().to_vector();
      std::size_t dropped = 0;
      for (float x : geom.keep) dropped += x == 0.0f ? 1 : 0;
      const double frac = static_cast<double>(dropped) / static_cast<double>(geom.keep.size());
      INFO("dropped " << frac << " of the weights, dropout " << c.p.dropout);
      CHECK(std::abs(frac - c.p.dropout) < 0.05);
    }
  }
  const auto ref = cpu::attention_forward(qr, kr, vr, geom);
  const auto gref = cpu::attention_backward(qr, kr, vr, ref.o, dr, ref.stats, geom);
  check_close(name + " o", r.o, ref.o);
  if (c.p.dropout == 0) {  // the inference graph (no statistics) gives the same o
    const auto fallbacks1 = cuda::cudnn::kernel_fallbacks().load();
    check_close(name + " o for inference", ops::scaled_dot_product_attention_inference(q, k, v, c.p, lg), ref.o);
    if (!std::is_same_v<T, float>)  // cuDNN ran it where it ran the forward
      CHECK((cuda::cudnn::kernel_fallbacks().load() == fallbacks1) == forward_fused);
  }
  check_close(name + " stats", valid_stats(r.stats, c), valid_stats(ref.stats, c), tolerance<T>);
  const double grad_tol = 2 * tolerance<T>;
  check_close(name + " dq", g.dq, gref.dq, grad_tol);
  check_close(name + " dk", g.dk, gref.dk, grad_tol);
  check_close(name + " dv", g.dv, gref.dv, grad_tol);
}

template <class T>
void check_all() {
  Rng rng(2111);
  for (const Case& c : cases()) check_case<T>(c, rng);
}

}  // namespace

TEST_CASE("gpu attention: forward and backward against the CPU, bf16", "[gpu][attention]") { check_all<bfloat16>(); }
TEST_CASE("gpu attention: forward and backward against the CPU, f16", "[gpu][attention]") { check_all<cutrain::half>(); }
TEST_CASE("gpu attention: forward and backward against the CPU, f32 (composed)", "[gpu][attention]") {
  check_all<float>();
}

TEST_CASE("gpu attention: autograd on the device and the autotuner's benchmark mode", "[gpu][attention]") {
  TempDir dir("attention_gpu");
  autotune::set_cache(std::make_shared<autotune::Cache>(dir / "autotune.json"));
  cuda::cudnn::clear_graph_cache();
  Rng rng(2112);
  const Case c{"tuned", 2, 4, 4, 256, 256, 64, 64, {.causal = true}};
  auto [q, qr] = input<bfloat16>(c.B, c.H, c.Sq, c.D, false, rng);
  auto [k, kr] = input<bfloat16>(c.B, c.Hk, c.Skv, c.D, false, rng);
  auto [v, vr] = input<bfloat16>(c.B, c.Hk, c.Skv, c.Dv, false, rng);
  auto [dout, dr] = random_pair<bfloat16>(Shape{c.B, c.H, c.Sq, c.Dv}, rng, Layout::row_major);
  const auto tuned0 = autotune::stats().ops_tuned.load();
  {
    autotune::ModeGuard mode(autotune::Mode::benchmark);
    auto vq = autograd::parameter(q.view()), vk = autograd::parameter(k.view()), vv = autograd::parameter(v.view());
    auto o = autograd::scaled_dot_product_attention(vq, vk, vv, c.p);
    o.backward(dout);
    const auto ref = ops::scaled_dot_product_attention_forward(qr, kr, vr, c.p);
    const auto gref = ops::scaled_dot_product_attention_backward(qr, kr, vr, ref.o, dr, ref.stats, c.p);
    check_close("autograd o", o.value(), ref.o);
    check_close("autograd dq", vq.grad(), gref.dq, 2 * tolerance<bfloat16>);
    check_close("autograd dk", vk.grad(), gref.dk, 2 * tolerance<bfloat16>);
    check_close("autograd dv", vv.grad(), gref.dv, 2 * tolerance<bfloat16>);
  }
  const auto tuned = autotune::stats().ops_tuned.load() - tuned0;
  INFO("attention graphs tuned: " << tuned);
  CHECK(tuned == 2);  // the forward and the backward graph
  autotune::set_cache(nullptr);
  cuda::cudnn::clear_graph_cache();
}

// Dropout's seed is copied from the host per call: under a CUDA-graph capture the op refuses
// with a clear error (and the capture is abandoned), and the same call without dropout captures.
TEST_CASE("gpu attention: dropout inside a CUDA-graph capture is refused", "[gpu][attention][graph]") {
  cuda::Stream stream;
  cuda::StreamGuard on(stream.get());
  Rng rng(2113);
  auto q = random_pair<bfloat16>(Shape{1, 2, 64, 64}, rng, Layout::row_major).first;
  (void)ops::scaled_dot_product_attention_forward(q, q, q, {.causal = true});  // warm-up: builds the graph
  cuda::CudaGraph graph;
  bool refused = false;
  try {
    graph.capture([&] { (void)ops::scaled_dot_product_attention_forward(q, q, q, {.dropout = 0.1, .seed = 1}); });
  } catch (const InvalidArgument& e) {
    refused = true;
    INFO(e.what());
    CHECK(std::string(e.what()).find("scaled_dot_product_attention") != std::string::npos);
    CHECK(std::string(e.what()).find("CUDA graph") != std::string::npos);
  }
  CHECK(refused);
  AttentionForward<bfloat16, float> r;
  graph.capture([&] { r = ops::scaled_dot_product_attention_forward(q, q, q, {.causal = true}); });
  graph.replay();
  stream.synchronize();
  const auto ref = ops::scaled_dot_product_attention_forward(q, q, q, {.causal = true});
  check_close("captured o", r.o, cast<double>(ref.o.to(Device::cpu())), tolerance<bfloat16>);
}

}  // namespace cutrain_test_attention_gpu
