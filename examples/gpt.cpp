// Trains a GPT-2 (nn::GPT: learned positions, pre-norm blocks, tied output head, the fused
// classifier of nn::GPT::loss) from scratch on token shards in llm.c's .bin format
// (data/shards.hpp; scripts/make-shards writes them from Debian's fortunes), or on random tokens
// (--random-tokens: a timing run that needs no data). The recipe is GPT-2's: AdamW (0.9, 0.95),
// weight decay 0.1 on the matrices only, a linear warm-up then cosine decay to --min-lr, gradient
// clipping at 1.0, bf16 compute with f32 master weights on the GPU.
//
//   gpt (--data DIR | --random-tokens) [--preset tiny|d12|d24|d36] [--device cpu|cuda] [--vocab N]
//       [--batch N] [--context N] [--grad-accum N] [--steps N] [--lr X] [--min-lr X] [--warmup N]
//       [--weight-decay X] [--eval-every N] [--eval-batches N] [--seed N] [--checkpoint FILE]
//       [--resume] [--stop-after N] [--sample N] [--cuda-graphs] [--recompute] [--chunk-rows N]
//       [--peak-tflops X] [--log-every N] [--out FILE.json] [--zero]
//
// Presets: d12 is GPT-2 124M (12 layers, 12 heads, dim 768, context 1024), d24 350M (24, 16,
// 1024), d36 774M (36, 20, 1280); tiny (2 layers, 2 heads, dim 64, context 64) trains in minutes
// on 2 CPU cores and is the CPU default. The vocabulary is --vocab (default 50257, GPT-2's); the
// shards' tokens must lie below it. --batch is per micro-batch; --grad-accum K sums K micro-batches'
// gradients (each loss scaled by 1/K) into one step: the gradient of the K-times larger batch.
// Every --log-every steps a line shows the loss, learning rate, ms/step, tokens/s and MFU (model
// flops: 6 N + 12 L H Q T per token, PaLM's count, over --peak-tflops, default 989: an H100's
// dense bf16); every --eval-every steps the validation loss over --eval-batches batches of the
// val shards, and --checkpoint is written (model, optimizer, step, loader). The end: --sample
// tokens generated from token 0 (ids; make_shards --decode MODEL turns them into text), then "final val
// loss L, median step M ms, T tokens/s, MFU F%, peak device memory G GiB".
// --cuda-graphs runs the first step eagerly, then captures the whole step (forward, backward,
// clipping on the device, AdamW) once and replays it. --recompute keeps only each transformer
// block's input for backward and recomputes the block then (nn::GPTOptions::recompute).
// CUTRAIN_PROFILE=1 prints the ops of steps 10-19 by GPU time (docs/profiling.md).
// Data-parallel: started by scripts/launch -n N (or torchrun --no-python), each rank trains on its
// own --batch rows (the shards split by rank, random tokens seeded by rank) and the gradients are
// averaged over the ranks (dist::DataParallel on Gloo; GPU gradients staged through the host):
// tokens/s counts every rank's tokens; rank 0 alone logs, evaluates, samples and checkpoints.
// --zero shards AdamW's state over the ranks (dist::ZeroOptimizer; its checkpoints load anywhere).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iostream>
#include <memory>
#include <numbers>
#include <optional>
#include <string>
#include <vector>

#include "cutrain/cutrain.hpp"
#include "cutrain/data/shards.hpp"
#include "cutrain/dist/data_parallel.hpp"
#include "cutrain/dist/zero.hpp"
#ifdef CUTRAIN_GLOO
#include "cutrain/dist/gloo.hpp"
#endif
#include "cutrain/nn.hpp"
#include "cutrain/optim/adamw.hpp"

using namespace cutrain;
using Clock = std::chrono::steady_clock;
using autograd::Var;

namespace {

struct Args {
  std::string data, device, preset, checkpoint, out;
  std::int64_t vocab = 50257, batch = 0, context = 0, grad_accum = 1, steps = 0, warmup = -1, eval_every = 0;
  std::int64_t eval_batches = 0, stop_after = 0, sample = 0, chunk_rows = 0, log_every = 10;
  double lr = 6e-4, min_lr = 6e-5, weight_decay = 0.1, peak_tflops = 989;
  std::uint64_t seed = 1337;
  bool random_tokens = false, resume = false, cuda_graphs = false, recompute = false, zero = false;
  std::int64_t layers = 0, heads = 0, dim = 0;
};

[[noreturn]] void usage(const std::string& why) {
  std::cerr << "gpt: " << why << "\n"
            << "usage: gpt (--data DIR | --random-tokens) [--preset tiny|d12|d24|d36] [--device cpu|cuda]\n"
            << "           [--vocab N] [--batch N] [--context N] [--grad-accum N] [--steps N] [--lr X]\n"
            << "           [--min-lr X] [--warmup N] [--weight-decay X] [--eval-every N] [--eval-batches N]\n"
            << "           [--seed N] [--checkpoint FILE] [--resume] [--stop-after N] [--sample N]\n"
            << "           [--cuda-graphs] [--recompute] [--chunk-rows N] [--peak-tflops X] [--log-every N]\n"
            << "           [--out FILE.json]\n"
            << "  (scripts/make-shards DIR writes shards of Debian's fortunes)\n"
#ifdef CUTRAIN_GLOO
            << "  data-parallel: scripts/launch -n N gpt ... [--zero] (each rank trains on its --batch rows)\n"
#endif
            ;
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(f + " needs a value");
      return argv[++i];
    };
    const auto num = [&] {
      const std::string v = value();
      try {
        std::size_t used = 0;
        const long long n = std::stoll(v, &used);
        if (used != v.size() || n < 0) throw std::invalid_argument(v);
        return static_cast<std::int64_t>(n);
      } catch (const std::exception&) {
        usage(f + " wants a non-negative integer, got " + v);
      }
    };
    const auto real = [&] {
      const std::string v = value();
      try {
        std::size_t used = 0;
        const double x = std::stod(v, &used);
        if (used != v.size() || !std::isfinite(x) || x < 0) throw std::invalid_argument(v);
        return x;
      } catch (const std::exception&) {
        usage(f + " wants a non-negative number, got " + v);
      }
    };
    if (f == "--data") a.data = value();
    else if (f == "--random-tokens") a.random_tokens = true;
    else if (f == "--preset") a.preset = value();
    else if (f == "--device") a.device = value();
    else if (f == "--vocab") a.vocab = num();
    else if (f == "--batch") a.batch = num();
    else if (f == "--context") a.context = num();
    else if (f == "--grad-accum") a.grad_accum = num();
    else if (f == "--steps") a.steps = num();
    else if (f == "--lr") a.lr = real();
    else if (f == "--min-lr") a.min_lr = real();
    else if (f == "--warmup") a.warmup = num();
    else if (f == "--weight-decay") a.weight_decay = real();
    else if (f == "--eval-every") a.eval_every = num();
    else if (f == "--eval-batches") a.eval_batches = num();
    else if (f == "--seed") a.seed = static_cast<std::uint64_t>(num());
    else if (f == "--checkpoint") a.checkpoint = value();
    else if (f == "--resume") a.resume = true;
    else if (f == "--stop-after") a.stop_after = num();
    else if (f == "--sample") a.sample = num();
    else if (f == "--cuda-graphs") a.cuda_graphs = true;
    else if (f == "--recompute") a.recompute = true;
    else if (f == "--zero") a.zero = true;
    else if (f == "--chunk-rows") a.chunk_rows = num();
    else if (f == "--peak-tflops") a.peak_tflops = real();
    else if (f == "--log-every") a.log_every = num();
    else if (f == "--out") a.out = value();
    else if (f == "--help" || f == "-h") usage("trains a GPT-2 on token shards");
    else usage("unknown flag " + f);
  }
  if (a.data.empty() == !a.random_tokens) usage("give exactly one of --data DIR and --random-tokens");
  if (a.device != "" && a.device != "cpu" && a.device != "cuda") usage("--device is cpu or cuda, got " + a.device);
  if (a.resume && a.checkpoint.empty()) usage("--resume needs --checkpoint FILE");
  if (a.vocab < 1 || a.vocab > 65536) usage("--vocab must be in [1, 65536] (shards hold uint16 tokens)");
  if (a.grad_accum < 1 || a.log_every < 1) usage("--grad-accum and --log-every must be positive");
  return a;
}

// A preset's shape; flags given explicitly win.
void fill_defaults(Args& a, bool gpu) {
  if (a.preset.empty()) a.preset = gpu ? "d12" : "tiny";
  struct Shape4 { std::int64_t layers, heads, dim, context; };
  Shape4 s{};
  if (a.preset == "tiny") s = {2, 2, 64, 64};
  else if (a.preset == "d12") s = {12, 12, 768, 1024};
  else if (a.preset == "d24") s = {24, 16, 1024, 1024};
  else if (a.preset == "d36") s = {36, 20, 1280, 1024};
  else usage("--preset is tiny, d12, d24 or d36, got " + a.preset);
  a.layers = s.layers;
  a.heads = s.heads;
  a.dim = s.dim;
  const auto def = [](std::int64_t& v, std::int64_t d) { v = v > 0 ? v : d; };
  def(a.context, s.context);
  def(a.batch, gpu ? 16 : 8);
  def(a.steps, gpu ? 2000 : 300);
  def(a.eval_every, gpu ? 250 : 100);
  def(a.eval_batches, gpu ? 20 : 4);
  if (a.warmup < 0) a.warmup = std::min<std::int64_t>(700, a.steps / 10);
  if (a.warmup >= a.steps) usage("--warmup must be below --steps");
}

double lr_at(const Args& a, std::int64_t k) {
  if (k < a.warmup) return a.lr * static_cast<double>(k + 1) / static_cast<double>(a.warmup);
  const double p = static_cast<double>(k - a.warmup) / static_cast<double>(std::max<std::int64_t>(1, a.steps - 1 - a.warmup));
  return a.min_lr + (a.lr - a.min_lr) * (1 + std::cos(std::numbers::pi * std::min(1.0, p))) / 2;
}

// The run's token batches: shards (train and val) or random tokens from one Rng.
class Batches {
 public:
  Batches(const Args& a, const dist::Env& env)
      : args_(a), rng_(a.seed ^ 0xda7a ^ (0x9e3779b97f4a7c15ull * static_cast<std::uint64_t>(env.rank))) {
    if (a.random_tokens) return;
    const data::TokenShards train(data::find_shards(a.data, data::Split::train), a.vocab);
    const data::TokenShards val(data::find_shards(a.data, data::Split::val), a.vocab);
    train_.emplace(train, data::ShardLoaderOptions{
                              .batch = a.batch, .context = a.context, .rank = env.rank, .world = env.world_size, .seed = a.seed});
    val_.emplace(val, data::ShardLoaderOptions{.batch = a.batch, .context = a.context});
  }
  data::TokenBatch train() {
    if (train_) return train_->next();
    std::vector<std::int32_t> v(static_cast<std::size_t>(args_.batch * (args_.context + 1)));
    for (auto& t : v) t = static_cast<std::int32_t>(rng_.below(static_cast<std::uint64_t>(args_.vocab)));
    const auto all = Tensor<std::int32_t>::from_vector(v, Shape{args_.batch, args_.context + 1});
    return {all.slice(1, 0, args_.context).contiguous(), all.slice(1, 1, args_.context + 1).contiguous(), {}};
  }
  // The first n batches of the val shards (the same every time); none with random tokens.
  std::vector<data::TokenBatch> val(std::int64_t n) {
    std::vector<data::TokenBatch> out;
    if (!val_) return out;
    val_->reset();
    for (std::int64_t i = 0; i < n; ++i) out.push_back(val_->next());
    return out;
  }
  std::array<std::int64_t, 2> state() const { return train_ ? train_->state() : std::array<std::int64_t, 2>{0, 0}; }
  void set_state(const std::array<std::int64_t, 2>& s) {
    if (train_) train_->set_state(s);
  }

 private:
  const Args& args_;
  Rng rng_;
  std::optional<data::ShardLoader> train_, val_;
};

Var<float> step_loss(const nn::GPT<float>& gpt, const Tensor<std::int32_t>& x, const Tensor<std::int32_t>& y, bool bf16,
                     const LinearCrossEntropyParams& p) {
  if (bf16) return gpt.loss<bfloat16>(x, y, p);
  return gpt.loss(x, y, p);
}

double evaluate(const nn::GPT<float>& gpt, Batches& batches, const Args& a, Device dev, bool bf16) {
  autograd::NoGradGuard no_grad;
  double sum = 0;
  std::int64_t n = 0;
  for (const auto& b : batches.val(a.eval_batches)) {
    const auto loss = step_loss(gpt, b.x.to(dev), b.y.to(dev), bf16, {.reduction = Reduction::sum});
    sum += loss.value().to_vector()[0];
    n += b.y.numel();
  }
  return n ? sum / static_cast<double>(n) : std::nan("");
}

// n tokens after token 0, sampled from softmax(logits) over the top 40 (ids).
std::vector<std::int32_t> sample(const nn::GPT<float>& gpt, const Args& a, Device dev, bool bf16, Rng& rng) {
  autograd::NoGradGuard no_grad;
  std::vector<std::int32_t> ids{0};
  for (std::int64_t k = 0; k < a.sample; ++k) {
    const std::int64_t s = std::min<std::int64_t>(static_cast<std::int64_t>(ids.size()), a.context);
    std::vector<std::int32_t> window(ids.end() - s, ids.end());
    window.resize(static_cast<std::size_t>(a.context), 0);
    const auto x = Tensor<std::int32_t>::from_vector(window, Shape{1, a.context}).to(dev);
    const Tensor<float> logits = bf16 ? cast<float>(gpt.operator()<bfloat16>(x).value().slice(0, s - 1, s))
                                      : gpt(x).value().slice(0, s - 1, s).to(Device::cpu());
    const auto row = logits.to_vector();
    std::vector<std::pair<float, std::int32_t>> top;
    for (std::size_t c = 0; c < row.size(); ++c) top.emplace_back(row[c], static_cast<std::int32_t>(c));
    const std::size_t k_top = std::min<std::size_t>(40, top.size());
    std::partial_sort(top.begin(), top.begin() + static_cast<std::ptrdiff_t>(k_top), top.end(), std::greater<>());
    double total = 0;
    for (std::size_t i = 0; i < k_top; ++i) total += std::exp(top[i].first - top[0].first);
    double u = rng.uniform() * total;
    std::int32_t pick = top[k_top - 1].second;
    for (std::size_t i = 0; i < k_top; ++i)
      if ((u -= std::exp(top[i].first - top[0].first)) <= 0) {
        pick = top[i].second;
        break;
      }
    ids.push_back(pick);
  }
  return ids;
}

double peak_device_gib([[maybe_unused]] Device dev) {
#ifdef CUTRAIN_WITH_CUDA
  // The caching allocator keeps what it took: in use now is the peak reserved.
  if (dev.is_cuda()) {
    std::size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) return static_cast<double>(total_b - free_b) / (1 << 30);
  }
#endif
  return 0;
}

void sync([[maybe_unused]] Device dev) {
#ifdef CUTRAIN_WITH_CUDA
  if (dev.is_cuda()) cuda::synchronize("gpt");
#endif
}

}  // namespace

int main(int argc, char** argv) {
  Args args = parse(argc, argv);
  try {
#ifdef CUTRAIN_WITH_CUDA
    const bool gpu = cuda::available();
#else
    const bool gpu = false;
#endif
    if (args.device == "cuda" && !gpu) usage("--device cuda, but there is no GPU (or cutrain was built without CUDA)");
    const auto env = dist::Env::from_environment();
    const bool lead = env.rank == 0;  // logs, evaluates, samples, checkpoints
#ifdef CUTRAIN_WITH_CUDA
    const int gpu_index = gpu ? env.local_rank % cuda::device_count() : 0;
#else
    const int gpu_index = 0;
#endif
    const Device dev = (args.device == "cuda" || (args.device.empty() && gpu)) ? Device::cuda(gpu_index) : Device::cpu();
    fill_defaults(args, dev.is_cuda());
    const bool bf16 = dev.is_cuda();
    if (args.cuda_graphs && !dev.is_cuda()) usage("--cuda-graphs needs the GPU");
    if (args.cuda_graphs && env.world_size > 1) usage("--cuda-graphs with several ranks: Gloo's collectives cannot be captured");
    Batches batches(args, env);
    nn::GPT<float> gpt({.vocab = args.vocab, .context = args.context, .dim = args.dim, .heads = args.heads,
                        .layers = args.layers, .recompute = args.recompute, .seed = args.seed});
    gpt.to(dev);
    std::vector<Var<float>> decay, no_decay;
    for (auto& [name, p] : gpt.named_parameters())
      (p.value().rank() == 2 && !name.starts_with("wte") && !name.starts_with("wpe") ? decay : no_decay).push_back(p);
    // Several ranks: a process group on Gloo (rank 0's model everywhere, then gradients averaged
    // in buckets during backward: DataParallel below, after a resume).
    dist::ProcessGroup* group = nullptr;  // one rank: none
#ifdef CUTRAIN_GLOO
    std::unique_ptr<dist::GlooWorld> world;
#endif
    if (env.world_size > 1) {
#ifdef CUTRAIN_GLOO
      world = std::make_unique<dist::GlooWorld>(env);
      group = &world->group;
#else
      usage("WORLD_SIZE > 1, but this gpt was built without Gloo (Debian's libgloo-dev)");
#endif
    }
    if (args.zero && !group) usage("--zero needs several ranks (scripts/launch -n N gpt ...)");
    // AdamW, weight decay on the matrices; with --zero its state sharded over the ranks (ZeRO-1).
    const auto make_adamw = [&](const std::vector<Var<float>>& ps) {
      std::vector<Var<float>> d, nd;
      for (const auto& p : ps) (std::find(decay.begin(), decay.end(), p) != decay.end() ? d : nd).push_back(p);
      return std::make_unique<optim::AdamW<float>>(std::vector<optim::ParamGroup<float>>{{d, args.weight_decay}, {nd, 0.0}},
                                                   optim::AdamWOptions{.lr = 0, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8});
    };
    std::unique_ptr<optim::AdamW<float>> adamw;
    std::unique_ptr<dist::ZeroOptimizer<float, optim::AdamW<float>>> zero;
    std::vector<Var<float>> numbered = decay;  // as AdamW numbers them: group after group
    numbered.insert(numbered.end(), no_decay.begin(), no_decay.end());
    if (args.zero) zero = std::make_unique<dist::ZeroOptimizer<float, optim::AdamW<float>>>(*group, numbered, make_adamw);
    else adamw = make_adamw(gpt.parameters());
    const std::vector<Var<float>> params = gpt.parameters();
    const std::int64_t n_params = gpt.parameter_count();
    const std::int64_t tokens_per_step = args.batch * args.context * args.grad_accum * env.world_size;
    const double flops_per_token =
        6.0 * static_cast<double>(n_params) + 12.0 * static_cast<double>(args.layers * args.dim * args.context);

    std::int64_t step = 0;
    if (args.resume) {
      const auto ck = Checkpoint::load(args.checkpoint);
      nn::load_module(ck, "model", gpt);
      adamw ? adamw->load_state(ck, "optimizer") : zero->load_state(ck, "optimizer");
      step = ck.get_int("step");
      batches.set_state({ck.get_int("loader_0"), ck.get_int("loader_1")});
      if (lead) std::cout << "gpt: resumed from " << args.checkpoint << " at step " << step << std::endl;
    }
    std::unique_ptr<dist::DataParallel<nn::GPT<float>>> dp;
    if (group) dp = std::make_unique<dist::DataParallel<nn::GPT<float>>>(gpt, *group);
    if (lead)
      std::cout << "gpt: " << env.world_size << " rank" << (env.world_size > 1 ? "s" : "") << ", device " << dev << ", " << (args.random_tokens ? std::string("random tokens") : args.data)
              << ", preset " << args.preset << ": " << n_params << " parameters (" << args.layers << " layers, "
              << args.heads << " heads, dim " << args.dim << ", context " << args.context << ", vocab " << args.vocab
              << "), batch " << args.batch << " x " << args.grad_accum << " micro-batches, " << args.steps
              << " steps, " << (bf16 ? "bf16" : "f32") << (args.recompute ? ", recompute" : "")
              << (args.cuda_graphs ? ", CUDA graph" : "") << (args.zero ? ", ZeRO-1" : "") << std::endl;

#ifdef CUTRAIN_WITH_CUDA
    std::optional<cuda::Stream> stream;
    std::optional<cuda::StreamGuard> on_stream;
    if (dev.is_cuda()) {
      stream.emplace(dev.index);
      on_stream.emplace(stream->get());
    }
    std::optional<cuda::CudaGraph> graph;
#endif
    // The step's micro-batches, refilled by the host before each step.
    Tensor<std::int32_t> x_in(Shape{args.grad_accum * args.batch, args.context}, {.device = dev});
    Tensor<std::int32_t> y_in(Shape{args.grad_accum * args.batch, args.context}, {.device = dev});
    const LinearCrossEntropyParams lce{.chunk_rows = args.chunk_rows};
    const Tensor<float> accum_seed = Tensor<float>::full(Shape{}, 1.0f / static_cast<float>(args.grad_accum)).to(dev);
    Tensor<float> losses(Shape{args.grad_accum}, {.device = dev});  // each micro-batch's, in stream order
    const auto train_step = [&] {
      for (const auto& p : params) p.zero_grad();
      for (std::int64_t k = 0; k < args.grad_accum; ++k) {
        const auto rows = [&](const Tensor<std::int32_t>& t) { return t.slice(0, k * args.batch, (k + 1) * args.batch); };
        Var<float> loss = step_loss(gpt, rows(x_in), rows(y_in), bf16, lce);
        if (dp && k + 1 < args.grad_accum) {
          auto local = dp->no_sync();  // the last micro-batch's backward reduces the sum
          loss.backward(accum_seed);
        } else {
          loss.backward(accum_seed);
          if (dp) dp->finish();
        }
        copy_bytes(losses.data() + k, dev, loss.value().data(), dev, sizeof(float));
      }
      if (dev.is_cuda()) (void)optim::clip_grad_norm_device(params, 1.0);
      else (void)optim::clip_grad_norm(params, 1.0);
      adamw ? adamw->step() : zero->step();
    };

    std::vector<double> step_ms;
    double window_loss = 0, val = std::nan("");
    std::int64_t window_steps = 0;
    Rng gen(args.seed + 1);
    // CUTRAIN_PROFILE=1: the ops of steps 10 to 19 timed and tabled (core/profile.hpp).
    std::unique_ptr<profile::Session> prof;
    const std::int64_t first_step = step;
    while (step < args.steps) {
      if (step == first_step + 10) prof = profile::Session::from_env();
      const double lr = lr_at(args, step);
      adamw ? adamw->set_lr(lr) : zero->set_lr(lr);
      for (std::int64_t k = 0; k < args.grad_accum; ++k) {
        const data::TokenBatch b = batches.train();
        x_in.slice(0, k * args.batch, (k + 1) * args.batch).copy_from(b.x);
        y_in.slice(0, k * args.batch, (k + 1) * args.batch).copy_from(b.y);
      }
      const auto t0 = Clock::now();
#ifdef CUTRAIN_WITH_CUDA
      if (args.cuda_graphs && graph) {
        graph->replay();
      } else if (args.cuda_graphs) {
        train_step();  // eager first: plans, kernels and optimizer state
        graph.emplace();
        graph->capture(train_step);
      } else
#endif
      {
        train_step();
      }
      if (group) group->all_reduce(losses, dist::ReduceOp::avg).wait();  // the mean over the ranks
      double l = 0;
      for (float v : losses.to_vector()) l += v / static_cast<double>(args.grad_accum);  // waits for the step
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      step_ms.push_back(ms);
      window_loss += l;
      ++window_steps;
      ++step;
      if (step == first_step + 20 && prof) {
        std::fprintf(stderr, "\nprofile of steps %lld-%lld:", static_cast<long long>(first_step + 10),
                     static_cast<long long>(first_step + 19));
        prof.reset();
      }
      if (lead && (step % args.log_every == 0 || step == args.steps)) {
        const double tps = static_cast<double>(tokens_per_step) / (ms / 1e3);
        std::printf("step %5lld/%lld | loss %.4f | lr %.2e | %.1f ms | %.0f tokens/s | MFU %.1f%%\n",
                    static_cast<long long>(step), static_cast<long long>(args.steps), window_loss / window_steps, lr, ms,
                    tps, 100 * tps * flops_per_token / (args.peak_tflops * 1e12));
        std::fflush(stdout);
        window_loss = 0;
        window_steps = 0;
      }
      if (step % args.eval_every == 0 || step == args.steps) {
        if (lead) val = evaluate(gpt, batches, args, dev, bf16);
        if (lead && !std::isnan(val)) std::printf("step %lld: val loss %.4f\n", static_cast<long long>(step), val);
        if (!args.checkpoint.empty()) {  // ZeRO's state is gathered from every rank; rank 0 writes
          Checkpoint ck;
          if (zero) zero->save_state(ck, "optimizer");
          if (lead) {
            nn::save_module(ck, "model", gpt);
            if (adamw) adamw->save_state(ck, "optimizer");
            ck.put_int("step", step);
            const auto s = batches.state();
            ck.put_int("loader_0", s[0]);
            ck.put_int("loader_1", s[1]);
            ck.save(args.checkpoint);
          }
        }
        if (args.stop_after > 0 && step >= args.stop_after && step < args.steps) {
          if (lead) std::printf("stopped at step %lld (--stop-after); continue with --resume\n", static_cast<long long>(step));
          if (group) group->barrier();
          return 0;
        }
      }
    }
    sync(dev);
    if (group) group->barrier();  // rank 0's store outlives the others' use of it
    if (!lead) return 0;
    if (args.sample > 0) {
      std::printf("--- %lld sampled tokens (ids) ---\n", static_cast<long long>(args.sample));
      for (std::int32_t id : sample(gpt, args, dev, bf16, gen)) std::printf("%d ", id);
      std::printf("\n---\n");
    }
    // The median step, leaving out the first 10 (plans, kernels and the allocator warming up).
    std::vector<double> tail(step_ms.begin() + std::min<std::ptrdiff_t>(10, static_cast<std::ptrdiff_t>(step_ms.size()) / 2),
                             step_ms.end());
    std::nth_element(tail.begin(), tail.begin() + static_cast<std::ptrdiff_t>(tail.size() / 2), tail.end());
    const double median = tail.empty() ? 0 : tail[tail.size() / 2];
    const double tps = median > 0 ? static_cast<double>(tokens_per_step) / (median / 1e3) : 0;
    const double mfu = tps * flops_per_token / (args.peak_tflops * 1e12);
    const double peak = peak_device_gib(dev);
    std::printf("final val loss %.4f (%d rank%s), median step %.2f ms, %.0f tokens/s, MFU %.1f%%, peak device memory %.1f GiB\n",
                val, env.world_size, env.world_size > 1 ? "s" : "", median, tps, 100 * mfu, peak);
    if (!args.out.empty()) {
      std::ofstream o(args.out);
      o << "{\"device\": \"" << dev << "\", \"preset\": \"" << args.preset << "\", \"parameters\": " << n_params
        << ", \"ranks\": " << env.world_size << ", \"vocab\": " << args.vocab << ", \"batch\": " << args.batch << ", \"grad_accum\": " << args.grad_accum
        << ", \"context\": " << args.context << ", \"steps\": " << args.steps
        << ", \"cuda_graphs\": " << (args.cuda_graphs ? "true" : "false")
        << ", \"recompute\": " << (args.recompute ? "true" : "false") << ", \"median_step_ms\": " << median
        << ", \"tokens_per_s\": " << tps << ", \"mfu\": " << mfu << ", \"peak_reserved_gib\": " << peak
        << ", \"val_loss\": " << (std::isnan(val) ? std::string("null") : std::to_string(val)) << "}\n";
      if (!o) throw IoError("gpt", "cannot write " + args.out);
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "gpt: " << e.what() << "\n";
    return 1;
  }
}
