// The fused classifier's parts at GPT-2's size on the GPU, each timed alone: the logits matmul,
// the loss-and-gradient kernel, the dx and dw matmuls, against the same matmuls on a weight whose
// rows are padded to the aligned vocabulary (every dimension a multiple of 64), and the whole
// ops::linear_cross_entropy. It says where the classifier's time goes (docs/performance.md).
//
//   bench_classifier_gpu [--rows N] [--vocab V] [--dim C] [--reps R] [--json FILE]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "cutrain/core/cast.hpp"
#include "cutrain/cuda/backend.hpp"
#include "cutrain/cuda/cublas/linear.hpp"
#include "cutrain/cuda/kernels/linear_cross_entropy.hpp"
#include "cutrain/cuda/runtime.hpp"
#include "cutrain/ops/linear_cross_entropy.hpp"

using namespace cutrain;

namespace {

// Median ms of reps back-to-back calls timed between two events, over 5 rounds.
double time_ms(const std::function<void()>& f, int reps) {
  f();  // warm-up: plans, kernels
  cuda::synchronize("bench_classifier_gpu");
  std::vector<double> ms;
  for (int round = 0; round < 5; ++round) {
    cuda::Event a, b;
    a.record();
    for (int i = 0; i < reps; ++i) f();
    b.record();
    b.synchronize();
    ms.push_back(b.elapsed_ms(a) / reps);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t N = 16 * 1024, V = 50257, C = 768;
  int reps = 5;
  std::string json;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string f = argv[i], v = argv[i + 1];
    if (f == "--rows") N = std::stoll(v);
    else if (f == "--vocab") V = std::stoll(v);
    else if (f == "--dim") C = std::stoll(v);
    else if (f == "--reps") reps = std::stoi(v);
    else if (f == "--json") json = v;
  }
  try {
    const Device dev = Device::cuda(0);
    const std::int64_t Vp = (V + 63) / 64 * 64;
    Rng rng(1);
    const auto x = cast<bfloat16>(Tensor<float>::uniform({N, C}, rng, -1, 1)).to(dev);
    const auto w = cast<bfloat16>(Tensor<float>::uniform({V, C}, rng, -0.05, 0.05)).to(dev);
    auto w_pad = Tensor<bfloat16>::zeros({Vp, C}).to(dev);
    w_pad.slice(0, 0, V).copy_from(w);
    std::vector<std::int32_t> lab(static_cast<std::size_t>(N));
    for (auto& l : lab) l = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(V)));
    const auto labels = Tensor<std::int32_t>::from_vector(lab, Shape{N}).to(dev);
    Tensor<bfloat16> buf(Shape{N, Vp}, {.device = dev});
    Tensor<bfloat16> logits = buf.slice(1, 0, V);
    Tensor<bfloat16> dx(Shape{N, C}, {.device = dev}), dw(Shape{V, C}, {.device = dev}), dw_pad(Shape{Vp, C}, {.device = dev}), none;
    Tensor<bfloat16> unpadded(Shape{N, V}, {.device = dev});
    const char* op = "bench_classifier_gpu";
    struct Row { std::string name; double ms; };
    std::vector<Row> rows;
    const auto add = [&](std::string name, const std::function<void()>& f) {
      rows.push_back({std::move(name), time_ms(f, reps)});
      std::printf("%-58s %8.3f ms\n", rows.back().name.c_str(), rows.back().ms);
      std::fflush(stdout);
    };
    add("logits matmul, m = V, rows ld Vp", [&] { cuda::cublas::linear_forward(x, w, none, Activation::identity, logits, op); });
    add("logits matmul, padded weight (m = Vp)", [&] { cuda::cublas::linear_forward(x, w_pad, none, Activation::identity, buf, op); });
    add("logits matmul, unpadded rows (ld V)", [&] { cuda::cublas::linear_forward(x, w, none, Activation::identity, unpadded, op); });
    add("dx + dw matmuls, k/n = V, rows ld Vp", [&] { cuda::cublas::linear_backward(x, w, logits, false, dx, dw, none, op); });
    add("dx + dw matmuls, padded weight", [&] { cuda::cublas::linear_backward(x, w_pad, buf, false, dx, dw_pad, none, op); });
    Tensor<std::int32_t> count = Tensor<std::int32_t>::from_vector({static_cast<std::int32_t>(N)}, Shape{1}).to(dev);
    Tensor<float> row_loss(Shape{N}, {.device = dev});
    cuda::cublas::linear_forward(x, w_pad, none, Activation::identity, buf, op);
    add("loss + gradient kernel alone (over the logits in place)", [&] {
      cuda::kernels::classifier_rows(buf.data(), N, Vp, V, labels.data(), {}, row_loss.data(), true, count.data(), 0);
    });
    add("ops::linear_cross_entropy, loss only", [&] { (void)ops::linear_cross_entropy(x, w, labels, {}, false); });
    add("ops::linear_cross_entropy with gradients (whole)", [&] { (void)ops::linear_cross_entropy(x, w, labels, {}, true); });
    const double bytes = 2.0 * static_cast<double>(N) * static_cast<double>(V) * 2;  // bf16 logits read and written
    std::printf("N %lld, V %lld (padded %lld), C %lld; a matmul is %.2f TFLOP; the logits %.2f GB\n",
                static_cast<long long>(N), static_cast<long long>(V), static_cast<long long>(Vp),
                static_cast<long long>(C), 2.0 * N * V * C / 1e12, bytes / 2 / 1e9);
    if (!json.empty()) {
      std::ofstream o(json);
      o << "{\"rows\": " << N << ", \"vocab\": " << V << ", \"dim\": " << C << ", \"ms\": {";
      for (std::size_t i = 0; i < rows.size(); ++i) o << (i ? ", " : "") << "\"" << rows[i].name << "\": " << rows[i].ms;
      o << "}}\n";
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_classifier_gpu: %s\n", e.what());
    return 1;
  }
}
