// Trains a character-level GPT (nn::GPT: token + position embeddings, pre-norm transformer
// blocks with fused attention, tied output head) on a plain-text corpus, the fortunes that
// Debian's `fortunes` package ships (scripts/char-corpus FILE writes them as one file), and
// prints a few generated lines at the end. The recipe is bench/torch_char_gpt.py's, so the
// validation losses compare: AdamW (betas 0.9, 0.99; weight decay 0.1 on the Linear weights
// only: two parameter groups), gradient clipping at norm 1, a linear warm-up
// to the peak learning rate and a cosine decay to the minimum, bf16 autocast on the GPU.
//
//   char_gpt --corpus FILE [--device cpu|cuda] [--steps N] [--batch N] [--context N] [--layers N]
//            [--heads N] [--dim N] [--lr X] [--min-lr X] [--warmup N] [--eval-every N]
//            [--eval-batches N] [--seed N] [--precision f32|bf16] [--checkpoint FILE] [--resume]
//            [--stop-after N] [--sample N] [--temperature X] [--top-k N] [--out FILE] [--cuda-graphs]
//            [--export FILE.onnx]
//
// On the GPU the defaults are the ~10.8M-parameter model (6 layers, 6 heads, dim 384, context
// 256, batch 64, 3000 steps, bf16); on the CPU a tiny one that trains in minutes on 2 cores
// (2 layers, 2 heads, dim 64, context 64, batch 16, 600 steps, f32). Every --eval-every steps it
// prints the train loss (mean of the steps since the last report), the validation loss over
// --eval-batches deterministic windows of the last 10% of the corpus and bits per character, and
// writes --checkpoint (model, optimizer, step, sampler state); --resume continues from it.
// The last lines: generated text, then "final val loss L, bpc B, median step M ms, T tokens/s".
// --cuda-graphs (GPU) runs the first step eagerly, captures the whole step (forward, backward,
// clipping on the device, both AdamW updates) as a CUDA graph and replays it for the others.
// --export FILE.onnx writes the trained model as ONNX (deploy::export_onnx; tokens [1, context]
// -> logits [context, vocab], f32) and beside it FILE_input.npy, one validation window, and
// FILE_expected.npy, cutrain's f32 CPU logits for it, to check the file in another runtime.
// Data-parallel: scripts/launch -n N char_gpt ... trains on N ranks, each sampling its own
// --batch windows (dist::DataParallel on Gloo); rank 0 prints, exports and checkpoints.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <numbers>
#include <optional>
#include <string>
#include <vector>

#include <unistd.h>

#include "cutrain/cutrain.hpp"
#include "cutrain/data/text.hpp"
#include "cutrain/deploy/onnx_gpt.hpp"
#include "cutrain/dist/data_parallel.hpp"
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
  std::string corpus, device, checkpoint, out, precision, export_path;
  std::int64_t steps = 0, batch = 0, context = 0, layers = 0, heads = 0, dim = 0;
  std::int64_t warmup = 100, eval_every = 0, eval_batches = 0, sample = 400, top_k = 10, stop_after = 0;
  double lr = 1e-3, min_lr = 1e-4, temperature = 0.8;
  std::uint64_t seed = 1337;
  bool resume = false, cuda_graphs = false;
};

[[noreturn]] void usage(const std::string& why) {
  std::cerr << "char_gpt: " << why << "\n"
            << "usage: char_gpt --corpus FILE [--device cpu|cuda] [--steps N] [--batch N] [--context N]\n"
            << "                [--layers N] [--heads N] [--dim N] [--lr X] [--min-lr X] [--warmup N]\n"
            << "                [--eval-every N] [--eval-batches N] [--seed N] [--precision f32|bf16]\n"
            << "                [--checkpoint FILE] [--resume] [--stop-after N] [--sample N]\n"
            << "                [--temperature X] [--top-k N] [--out FILE] [--cuda-graphs]\n"
            << "                [--export FILE.onnx]\n"
            << "  (scripts/char-corpus FILE writes the fortunes corpus)\n";
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  if (const char* c = std::getenv("CUTRAIN_CHAR_CORPUS")) a.corpus = c;
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
    if (f == "--corpus") a.corpus = value();
    else if (f == "--device") a.device = value();
    else if (f == "--steps") a.steps = num();
    else if (f == "--batch") a.batch = num();
    else if (f == "--context") a.context = num();
    else if (f == "--layers") a.layers = num();
    else if (f == "--heads") a.heads = num();
    else if (f == "--dim") a.dim = num();
    else if (f == "--lr") a.lr = real();
    else if (f == "--min-lr") a.min_lr = real();
    else if (f == "--warmup") a.warmup = num();
    else if (f == "--eval-every") a.eval_every = num();
    else if (f == "--eval-batches") a.eval_batches = num();
    else if (f == "--seed") a.seed = static_cast<std::uint64_t>(num());
    else if (f == "--precision") a.precision = value();
    else if (f == "--checkpoint") a.checkpoint = value();
    else if (f == "--resume") a.resume = true;
    else if (f == "--cuda-graphs") a.cuda_graphs = true;
    else if (f == "--stop-after") a.stop_after = num();
    else if (f == "--sample") a.sample = num();
    else if (f == "--temperature") a.temperature = real();
    else if (f == "--top-k") a.top_k = num();
    else if (f == "--out") a.out = value();
    else if (f == "--export") a.export_path = value();
    else if (f == "--help" || f == "-h") usage("trains a character-level GPT");
    else usage("unknown flag " + f);
  }
  if (a.corpus.empty()) usage("--corpus FILE is required (or CUTRAIN_CHAR_CORPUS)");
  if (a.device != "" && a.device != "cpu" && a.device != "cuda") usage("--device is cpu or cuda, got " + a.device);
  if (a.resume && a.checkpoint.empty()) usage("--resume needs --checkpoint FILE");
  if (a.precision != "" && a.precision != "f32" && a.precision != "bf16") usage("--precision is f32 or bf16");
  if (a.temperature <= 0) usage("--temperature must be positive");
  return a;
}

Device pick_device(const std::string& want) {
#ifdef CUTRAIN_WITH_CUDA
  const bool gpu = cuda::available();
#else
  const bool gpu = false;
#endif
  if (want == "cuda" && !gpu) usage("--device cuda, but there is no GPU (or cutrain was built without CUDA)");
  return (want == "cuda" || (want.empty() && gpu)) ? Device::cuda(0) : Device::cpu();
}

// The defaults of a device: the ~10M model on the GPU, a tiny one on the CPU.
void fill_defaults(Args& a, bool gpu) {
  const auto def = [](std::int64_t& v, std::int64_t d) { v = v > 0 ? v : d; };
  def(a.layers, gpu ? 6 : 2);
  def(a.heads, gpu ? 6 : 2);
  def(a.dim, gpu ? 384 : 64);
  def(a.context, gpu ? 256 : 64);
  def(a.batch, gpu ? 64 : 16);
  def(a.steps, gpu ? 3000 : 600);
  def(a.eval_every, gpu ? 500 : 100);
  def(a.eval_batches, gpu ? 50 : 8);
  if (a.precision.empty()) a.precision = gpu ? "bf16" : "f32";
  if (a.precision == "bf16" && !gpu) usage("--precision bf16 needs the GPU (the CPU computes in f32 and f64)");
  if (a.warmup >= a.steps) usage("--warmup must be below --steps");
}

// What a checkpoint must agree on with the run that resumes it.
std::vector<std::pair<std::string, std::int64_t>> run_shape(const Args& a) {
  return {{"steps", a.steps}, {"batch", a.batch}, {"context", a.context}, {"layers", a.layers},
          {"heads", a.heads}, {"dim", a.dim}, {"warmup", a.warmup}, {"eval_every", a.eval_every},
          {"seed", static_cast<std::int64_t>(a.seed)}};
}

// bench/torch_char_gpt.py's schedule: peak k / W for k < W, then cosine to min_lr at the last step.
double lr_at(const Args& a, std::int64_t k) {
  if (k < a.warmup) return a.lr * static_cast<double>(k) / static_cast<double>(a.warmup);
  const double p = static_cast<double>(k - a.warmup) / static_cast<double>(std::max<std::int64_t>(1, a.steps - 1 - a.warmup));
  return a.min_lr + (a.lr - a.min_lr) * (1 + std::cos(std::numbers::pi * std::min(1.0, p))) / 2;
}

// logits [B·S, V] in f32 for tokens [B, S], computed in the run's precision.
Var<float> logits(const nn::GPT<float>& gpt, const Tensor<std::int32_t>& x, bool bf16) {
  if (bf16) return autograd::cast<float>(gpt.template operator()<bfloat16>(x));
  return gpt(x);
}

// Mean cross-entropy over the deterministic validation windows (no autograd).
double evaluate(const nn::GPT<float>& gpt, const data::CharCorpus& corpus, const Args& a, Device dev) {
  autograd::NoGradGuard no_grad;
  double sum = 0;
  std::int64_t n = 0;
  for (const auto& b : corpus.eval_batches(data::Split::val, a.batch, a.context, a.eval_batches)) {
    const auto loss = autograd::cross_entropy(logits(gpt, b.x.to(dev), a.precision == "bf16"),
                                              b.y.reshape({b.y.numel()}).to(dev), {.reduction = Reduction::sum});
    sum += loss.value().to_vector()[0];
    n += b.y.numel();
  }
  return sum / static_cast<double>(n);
}

// `count` bytes continuing `prompt`: softmax(logits / temperature) over the top_k logits.
std::string generate(const nn::GPT<float>& gpt, const data::CharCorpus& corpus, const Args& a, Device dev,
                     const std::string& prompt, Rng& rng) {
  autograd::NoGradGuard no_grad;
  std::vector<std::int32_t> ids = corpus.encode(prompt);
  const std::int64_t v = corpus.vocab_size();
  for (std::int64_t n = 0; n < a.sample; ++n) {
    // The last s bytes, padded to the full context at the end: with causal attention row s - 1
    // sees only them, and one signature serves every step (no graphs built per length).
    const std::int64_t s = std::min<std::int64_t>(static_cast<std::int64_t>(ids.size()), a.context);
    std::vector<std::int32_t> window(ids.end() - s, ids.end());
    window.resize(static_cast<std::size_t>(a.context), 0);
    const auto x = Tensor<std::int32_t>::from_vector(window, Shape{1, a.context}).to(dev);
    const auto all = logits(gpt, x, a.precision == "bf16").value().to_vector();
    std::vector<std::pair<double, std::int32_t>> last;
    for (std::int64_t c = 0; c < v; ++c) last.emplace_back(all[static_cast<std::size_t>((s - 1) * v + c)] / a.temperature, c);
    const std::size_t k = static_cast<std::size_t>(a.top_k > 0 ? std::min<std::int64_t>(a.top_k, v) : v);
    std::partial_sort(last.begin(), last.begin() + static_cast<std::ptrdiff_t>(k), last.end(), std::greater<>());
    double total = 0;
    for (std::size_t i = 0; i < k; ++i) total += std::exp(last[i].first - last[0].first);
    double u = rng.uniform() * total;
    std::int32_t pick = last[k - 1].second;
    for (std::size_t i = 0; i < k; ++i)
      if ((u -= std::exp(last[i].first - last[0].first)) <= 0) {
        pick = last[i].second;
        break;
      }
    ids.push_back(pick);
  }
  return corpus.decode(std::vector<std::int32_t>(ids.begin() + static_cast<std::ptrdiff_t>(prompt.size()), ids.end()));
}

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

void sync([[maybe_unused]] Device dev) {
#ifdef CUTRAIN_WITH_CUDA
  if (dev.is_cuda()) cuda::synchronize("char_gpt");
#endif
}

// The device memory this process holds (CUDA's total minus free: the caching allocator's blocks,
// plans' workspaces and the context), in MiB; 0 on the CPU. Flat over a long run means no leak.
double device_mib([[maybe_unused]] Device dev) {
#ifdef CUTRAIN_WITH_CUDA
  std::size_t free_b = 0, total_b = 0;
  if (dev.is_cuda() && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
    return static_cast<double>(total_b - free_b) / (1 << 20);
#endif
  return 0;
}

// Copies one loss value into slot k of losses, in stream order (no host read per step).
void record_loss(Tensor<float>& losses, std::int64_t k, const Tensor<float>& loss) {
  copy_bytes(losses.data() + k, losses.device(), loss.data(), loss.device(), sizeof(float));
}

// --export: the trained weights copied into a CPU model, written as ONNX with tokens [1, context],
// with one validation window and the copy's f32 logits for it beside the file.
void export_model(nn::GPT<float>& gpt, const data::CharCorpus& corpus, const Args& a) {
  nn::GPT<float> host(gpt.options());
  const std::vector<Var<float>> from = gpt.parameters(), to = host.parameters();
  for (std::size_t i = 0; i < from.size(); ++i) {
    Var<float> p = to[i];
    p.value().assign(from[i].value().to_vector());
  }
  host.eval();
  autograd::NoGradGuard no_grad;
  const auto window = std::move(corpus.eval_batches(data::Split::val, 1, a.context, 1)[0].x);
  const auto y = host(window);
  const std::filesystem::path path = a.export_path;
  const auto info = deploy::export_onnx(host, path, Shape{1, a.context});
  std::filesystem::path stem = path;
  stem.replace_extension();
  save_npy(stem.string() + "_input.npy", window);
  save_npy(stem.string() + "_expected.npy", y.value());
  std::printf("exported %s: %zu ONNX nodes, tokens [1, %lld] -> logits %s; %s_{input,expected}.npy: a validation "
              "window and cutrain's logits for it\n",
              path.string().c_str(), info.op_types.size(), static_cast<long long>(a.context),
              cutrain::detail::cat(info.output_shape).c_str(), stem.string().c_str());
}

}  // namespace

int main(int argc, char** argv) {
  Args args = parse(argc, argv);
  try {
    const auto env = dist::Env::from_environment();
    if (env.rank != 0 && !std::freopen("/dev/null", "w", stdout)) return 1;  // rank 0 prints
    if (args.cuda_graphs && env.world_size > 1) usage("--cuda-graphs with several ranks: Gloo's collectives cannot be captured");
    const Device dev = pick_device(args.device);
    fill_defaults(args, dev.is_cuda());
    const bool bf16 = args.precision == "bf16";
    const data::CharCorpus corpus(args.corpus);
    nn::GPT<float> gpt({.vocab = corpus.vocab_size(), .context = args.context, .dim = args.dim, .heads = args.heads,
                        .layers = args.layers, .seed = args.seed});
    gpt.to(dev);
    // Weight decay on the Linear weights (2-d, not the embeddings); none on biases and norms.
    std::vector<Var<float>> decay, no_decay;
    for (auto& [name, p] : gpt.named_parameters())
      (p.value().rank() == 2 && !name.starts_with("wte") && !name.starts_with("wpe") ? decay : no_decay).push_back(p);
    optim::AdamW<float> opt({{decay, 0.1}, {no_decay, 0.0}}, {.lr = 0, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8});
    const std::vector<Var<float>> params = gpt.parameters();
    // Each rank samples its own windows: rank r's sampler seed (rank 0's is --seed).
    const auto rank_seed = [&](std::uint64_t seed) { return seed + 0x9e3779b97f4a7c15ull * static_cast<std::uint64_t>(env.rank); };
    Rng sampler(rank_seed(args.seed));

    std::int64_t step = 0;
    struct Eval {
      std::int64_t step;
      double train, val, device_mib;
    };
    std::vector<Eval> evals;
    if (args.resume) {
      const auto ck = Checkpoint::load(args.checkpoint);
      for (const auto& [k, v] : run_shape(args))
        CUTRAIN_REQUIRE(ck.get_int(k) == v, InvalidArgument, "char_gpt", args.checkpoint, " was written by a run with ",
                        k, " ", ck.get_int(k), "; this run has ", v, " (resume with the same flags)");
      CUTRAIN_REQUIRE(ck.get_string("precision") == args.precision, InvalidArgument, "char_gpt", args.checkpoint,
                      " was written by a run in ", ck.get_string("precision"), "; this run is in ", args.precision);
      nn::load_module(ck, "model", gpt);
      opt.load_state(ck, "optimizer");
      step = ck.get_int("step");
      sampler.set_state(rank_seed(static_cast<std::uint64_t>(ck.get_int("sampler_seed"))),
                        static_cast<std::uint64_t>(ck.get_int("sampler_counter")));  // every rank drew as many
      std::cout << "char_gpt: resumed from " << args.checkpoint << " at step " << step << std::endl;
    }
    // Several ranks: rank 0's model everywhere, gradients averaged.
    dist::ProcessGroup* group = nullptr;  // one rank: none
#ifdef CUTRAIN_GLOO
    std::unique_ptr<dist::GlooWorld> world;
#endif
    std::unique_ptr<dist::DataParallel<nn::GPT<float>>> dp;  // after world: destroyed before it
    if (env.world_size > 1) {
#ifdef CUTRAIN_GLOO
      world = std::make_unique<dist::GlooWorld>(env);
      group = &world->group;
      dp = std::make_unique<dist::DataParallel<nn::GPT<float>>>(gpt, *group);
#else
      usage("WORLD_SIZE > 1, but this char_gpt was built without Gloo (Debian's libgloo-dev)");
#endif
    }
    std::cout << "char_gpt: " << env.world_size << " rank(s), device " << dev << ", " << corpus.name() << " (" << corpus.size() << " bytes, vocab "
              << corpus.vocab_size() << "), " << gpt.parameter_count() << " parameters (" << args.layers
              << " layers, " << args.heads << " heads, dim " << args.dim << ", context " << args.context << "), batch "
              << args.batch << ", " << args.steps << " steps, " << args.precision << std::endl;

    if (args.cuda_graphs && !dev.is_cuda()) usage("--cuda-graphs needs the GPU");
    if (args.cuda_graphs && !bf16)
      usage("--cuda-graphs needs --precision bf16 (f32 attention takes the composed path, which cannot be captured)");
#ifdef CUTRAIN_WITH_CUDA
    // On the GPU everything runs on a stream of our own: a CUDA graph cannot be captured on the
    // default stream, and eager runs use the same one so that both behave alike.
    std::optional<cuda::Stream> stream;
    std::optional<cuda::StreamGuard> on_stream;
    if (dev.is_cuda()) {
      stream.emplace(dev.index);
      on_stream.emplace(stream->get());
    }
    std::optional<cuda::CudaGraph> graph;
#endif
    // One step on the batch in x_in, y_in (device tensors the host refills before each step).
    Tensor<std::int32_t> x_in(Shape{args.batch, args.context}, {.device = dev});
    Tensor<std::int32_t> y_in(Shape{args.batch * args.context}, {.device = dev});
    const auto train_step = [&] {
      for (const auto& p : params) p.zero_grad();
      Var<float> loss = autograd::cross_entropy(logits(gpt, x_in, bf16), y_in);
      loss.backward();
      if (dp) dp->finish();
      if (dev.is_cuda())
        (void)optim::clip_grad_norm_device(params, 1.0);
      else
        (void)optim::clip_grad_norm(params, 1.0);
      opt.step();
      return loss;
    };
    Var<float> graph_loss;
    Tensor<float> losses(Shape{args.eval_every}, {.device = dev});

    const bool tty = isatty(STDOUT_FILENO) != 0;
    std::vector<double> step_ms;
    double window_loss = 0;
    std::int64_t window_steps = 0, tokens = 0;
    double train_s = 0;
    // CUTRAIN_PROFILE=1: the ops of steps 50 to 99 timed and tabled (core/profile.hpp).
    std::unique_ptr<profile::Session> prof;
    while (step < args.steps) {
      if (step == 50) prof = profile::Session::from_env();
      const auto t0 = Clock::now();
      const double lr = lr_at(args, step);
      opt.set_lr(lr);
      const data::TokenBatch b = corpus.sample(data::Split::train, args.batch, args.context, sampler);
      x_in.copy_from(b.x);
      y_in.copy_from(b.y.reshape({b.y.numel()}));
#ifdef CUTRAIN_WITH_CUDA
      if (args.cuda_graphs && graph) {
        graph->replay();
        record_loss(losses, window_steps, graph_loss.value());
      } else if (args.cuda_graphs) {
        record_loss(losses, window_steps, train_step().value());  // eager: builds plans and optimizer state
        graph.emplace();
        graph->capture([&] { graph_loss = train_step(); });
      } else
#endif
      {
        record_loss(losses, window_steps, train_step().value());
      }
      ++window_steps;
      ++step;
      sync(dev);
      if (step == 100 && prof) {
        std::fprintf(stderr, "\nprofile of steps 50-99:");
        prof.reset();
      }
      const double ms = seconds(t0, Clock::now()) * 1e3;
      step_ms.push_back(ms);
      train_s += ms / 1e3;
      tokens += args.batch * args.context * env.world_size;
      if (tty && (step % 10 == 0 || step == args.steps)) {
        window_loss = 0;
        for (float l : losses.slice(0, 0, window_steps).to_vector()) window_loss += l;
        const int fill = static_cast<int>(30 * step / args.steps);
        std::printf("\rstep %lld/%lld [%s%s] loss %.4f lr %.2e %.0f tokens/s ", static_cast<long long>(step),
                    static_cast<long long>(args.steps), std::string(static_cast<std::size_t>(fill), '=').c_str(),
                    std::string(static_cast<std::size_t>(30 - fill), ' ').c_str(), window_loss / window_steps, lr,
                    static_cast<double>(tokens) / train_s);
        std::fflush(stdout);
      }
      if (step % args.eval_every == 0 || step == args.steps) {
        window_loss = 0;
        for (float l : losses.slice(0, 0, window_steps).to_vector()) window_loss += l;
        const double val = evaluate(gpt, corpus, args, dev);
        evals.push_back({step, window_loss / window_steps, val, device_mib(dev)});
        std::printf("%sstep %lld: train loss %.4f, val loss %.4f, %.3f bits/char, %.0f tokens/s", tty ? "\n" : "",
                    static_cast<long long>(step), window_loss / window_steps, val, val / std::numbers::ln2,
                    static_cast<double>(tokens) / train_s);
        if (dev.is_cuda()) std::printf(", device memory %.0f MiB", evals.back().device_mib);
        std::printf("\n");
        std::fflush(stdout);
        window_loss = 0;
        window_steps = 0;
        if (!args.checkpoint.empty() && env.rank == 0) {
          Checkpoint ck;
          nn::save_module(ck, "model", gpt);
          opt.save_state(ck, "optimizer");
          ck.put_int("step", step);
          ck.put_int("sampler_seed", static_cast<std::int64_t>(sampler.seed()));  // rank 0: the base seed
          ck.put_int("sampler_counter", static_cast<std::int64_t>(sampler.counter()));
          for (const auto& [k, v] : run_shape(args)) ck.put_int(k, v);
          ck.put_string("precision", args.precision);
          ck.save(args.checkpoint);
        }
        if (args.stop_after > 0 && step >= args.stop_after && step < args.steps) {
          std::printf("stopped at step %lld (--stop-after); continue with --resume\n", static_cast<long long>(step));
          if (group) group->barrier();
          return 0;
        }
      }
    }
    if (group) group->barrier();  // rank 0's store outlives the others' use of it
    if (env.rank != 0) return 0;
    if (!args.export_path.empty()) export_model(gpt, corpus, args);
    Rng gen(args.seed + 1);
    std::printf("--- generated (temperature %.2f, top-k %lld) ---\n%s\n---\n", args.temperature,
                static_cast<long long>(args.top_k), generate(gpt, corpus, args, dev, "\n", gen).c_str());
    // The median step, leaving out the first 50 (plans, kernels and the allocator warming up).
    std::vector<double> tail(step_ms.begin() + std::min<std::ptrdiff_t>(50, static_cast<std::ptrdiff_t>(step_ms.size()) / 2),
                             step_ms.end());
    std::nth_element(tail.begin(), tail.begin() + static_cast<std::ptrdiff_t>(tail.size() / 2), tail.end());
    const double median = tail.empty() ? 0 : tail[tail.size() / 2];
    const double val = evals.empty() ? 0 : evals.back().val;
    std::printf("final val loss %.4f, bpc %.3f, median step %.2f ms, %.0f tokens/s\n", val, val / std::numbers::ln2,
                median, median > 0 ? static_cast<double>(args.batch * args.context * env.world_size) / (median / 1e3) : 0.0);
    if (!args.out.empty()) {
      std::ofstream o(args.out);
      o << "{\"device\": \"" << dev << "\", \"precision\": \"" << args.precision << "\", \"steps\": " << args.steps
        << ", \"batch\": " << args.batch << ", \"context\": " << args.context << ", \"layers\": " << args.layers
        << ", \"heads\": " << args.heads << ", \"dim\": " << args.dim << ", \"parameters\": " << gpt.parameter_count()
        << ", \"median_step_ms\": " << median << ", \"evals\": [";
      for (std::size_t i = 0; i < evals.size(); ++i)
        o << (i ? ", " : "") << "{\"step\": " << evals[i].step << ", \"train_loss\": " << evals[i].train
          << ", \"val_loss\": " << evals[i].val << ", \"device_mib\": " << evals[i].device_mib << "}";
      o << "]}\n";
      if (!o) throw IoError("char_gpt", "cannot write " + args.out);
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "char_gpt: " << e.what() << "\n";
    return 1;
  }
}
