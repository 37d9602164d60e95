// dist::DataParallel: the same module on every rank, each on its part of the batch; gradients
// averaged (or summed: DataParallelOptions::reduce) over the ranks while backward still runs, as
// PyTorch's DistributedDataParallel.
//
//   dist::GlooGroup pg(store);
//   dist::DataParallel dp(model, pg);         // rank 0's parameters and buffers on every rank
//   for (...) {
//     auto loss = loss_fn(model(x_local), y_local);  // x_local: this rank's part of the batch
//     dp.backward(loss);                      // loss.backward() + dp.finish(): averaged gradients
//     opt.step(); opt.zero_grad();
//   }
//   { auto guard = dp.no_sync(); dp.backward(micro_loss); }  // accumulate locally, no traffic
//
// Gradients are grouped into buckets (dist::assign_buckets: about 25 MiB, parameters in reverse
// registration order). A parameter's gradient hook counts its gradients; once every parameter of
// a bucket has all of its gradients for this backward, the bucket is copied into one flat
// buffer and its all-reduce starts while backward goes on. finish() starts what is left, waits,
// and writes the averages back into the parameters' grad(). How many gradients each parameter
// gets in one backward (a tied weight two) is learned from the first backward, whose buckets are
// all reduced in finish(); buckets always start in the same order on every rank.
// A parameter that got no gradient on a rank adds zeros; one that got none on any rank keeps no
// gradient (as DDP with find_unused_parameters). A parameter that gets a gradient after its
// bucket was reduced (a backward whose graph uses more than the first one did, or two backward()
// calls without finish() between) is refused by finish() with a DistError naming it.
// Limits: buffers (batch-norm statistics) are broadcast at construction and by sync_buffers(),
// not every step (each rank keeps local statistics; there is no SyncBatchNorm yet).
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cutrain/autograd/var.hpp"
#include "cutrain/dist/buckets.hpp"
#include "cutrain/dist/process_group.hpp"

namespace cutrain::inline CUTRAIN_ABI::dist {

struct DataParallelOptions {
  std::size_t bucket_cap_bytes = std::size_t{25} << 20;
  std::size_t first_bucket_cap_bytes = std::size_t{1} << 20;
  // The ranks' gradients averaged (each rank's loss a mean over its own rows), or summed: for
  // ranks with unequal rows (an uneven last batch), sum each rank's per-row losses, divide by
  // the rows of all ranks together, and reduce with ReduceOp::sum.
  ReduceOp reduce = ReduceOp::avg;
};

namespace detail {
template <class V> struct VarElem;
template <class T> struct VarElem<autograd::Var<T>> { using type = T; };

// FNV-1a over the parameters' names and shapes: every rank must build the same module.
inline std::uint64_t fnv1a(std::uint64_t h, std::string_view s) {
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}
}  // namespace detail

template <class M>
class DataParallel {
 public:
  using T = typename detail::VarElem<typename decltype(std::declval<M&>().parameters())::value_type>::type;

  DataParallel(M& module, ProcessGroup& pg, const DataParallelOptions& opts = {})
      : module_(module), pg_(pg), reduce_(opts.reduce) {
    constexpr std::string_view op = "dist::DataParallel";
    for (auto& [name, v] : module.named_parameters()) {
      names_.push_back(name);
      params_.push_back(v);
    }
    CUTRAIN_REQUIRE(!params_.empty(), InvalidArgument, op, "the module has no parameters");
    const Device dev = params_[0].device();
    std::uint64_t sig = 14695981039346656037ull;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      CUTRAIN_REQUIRE(params_[i].device() == dev, InvalidArgument, op, "parameter \"", names_[i], "\" is on ",
                      params_[i].device(), " but \"", names_[0], "\" on ", dev, ": move the module to one device first");
      CUTRAIN_REQUIRE(params_[i].value().is_contiguous(), InvalidArgument, op, "parameter \"", names_[i], "\" (",
                      params_[i].value().describe(), ") is not dense");
      sig = detail::fnv1a(sig, cutrain::detail::cat(names_[i], params_[i].shape(), ";"));
    }
    check_same_module(sig, dev);
    // Rank 0's parameters and buffers everywhere: one broadcast per tensor, in registration order.
    std::vector<Work> works;
    for (auto& p : params_) works.push_back(pg_.broadcast(p.value(), 0));
    module.visit_buffers("", [&](const std::string&, Tensor<T>& b) {
      if (b.defined() && b.is_contiguous()) works.push_back(pg_.broadcast(b, 0));
    });
    for (auto& w : works) w.wait();
    for (auto& p : params_) p.value().bump_version();

    std::vector<ParamSpec> specs;
    for (auto& p : params_) specs.push_back({.numel = p.numel(), .dtype = dtype_of<T>});
    const auto buckets = assign_buckets(specs, {.cap_bytes = opts.bucket_cap_bytes,
                                                .first_cap_bytes = opts.first_bucket_cap_bytes});
    bucket_of_.resize(params_.size());
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      Slot s;
      s.params = buckets[b].params;
      s.offsets = buckets[b].offsets;
      // The bucket's gradients, then one "had a gradient" flag per parameter (averaged with them).
      s.flat = Tensor<T>::zeros({buckets[b].numel + static_cast<std::int64_t>(s.params.size())}, {.device = dev});
      s.grad_numel = buckets[b].numel;
      for (std::size_t i : s.params) bucket_of_[i] = b;
      slots_.push_back(std::move(s));
    }
    arrived_.assign(params_.size(), 0);
    expected_.assign(params_.size(), -1);
    for (std::size_t i = 0; i < params_.size(); ++i) params_[i].set_grad_hook([this, i] { on_grad(i); });
    start_step();
  }
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;
  ~DataParallel() {
    for (auto& p : params_) p.set_grad_hook(nullptr);
    for (auto& s : slots_) try { s.work.wait(); } catch (...) {}  // never leave a collective on freed memory
  }

  M& module() { return module_; }
  ProcessGroup& group() { return pg_; }
  template <class... A>
  decltype(auto) operator()(A&&... a) { return module_(std::forward<A>(a)...); }

  // loss.backward(), then finish().
  template <class V>
  void backward(const V& loss) {
    loss.backward();
    finish();
  }

  // Starts the buckets not yet started, waits for all, and writes each parameter's averaged
  // gradient into its grad(). Inside no_sync() it only ends the backward (gradients stay local).
  void finish() {
    CUTRAIN_REQUIRE(params_[0].device().is_cpu() || !cutrain::detail::device_capturing(), DistError,
                    "dist::DataParallel::finish",
                    "a DataParallel step cannot be captured in a CUDA graph yet (finish() reads which parameters "
                    "had gradients on the host): run the step eagerly");
    if (!sync_) {
      start_step();
      return;
    }
    std::string late;  // the first parameter with a gradient after its bucket started
    for (std::size_t i = 0; i < params_.size() && late.empty(); ++i)
      if (late_[i])
        late = cutrain::detail::cat(
            "parameter \"", names_[i], "\" got a gradient after its bucket's all-reduce had started (",
            arrived_[i], " gradients in this backward, ", expected_[i],
            " in the first): call finish() (or dp.backward) after each backward(), use no_sync() to accumulate, "
            "and keep the graph the same from step to step");
    early_ = next_;
    // Every bucket starts once per finish(), also on a failure, so that the ranks stay in step.
    while (next_ < slots_.size()) start(next_++);
    for (auto& s : slots_) s.work.wait();
    if (!late.empty()) {
      start_step();
      throw DistError("dist::DataParallel::finish", late);
    }
    for (auto& s : slots_) {
      const Tensor<T> used = s.flat.slice(0, s.grad_numel, s.flat.numel()).to(Device::cpu());
      for (std::size_t k = 0; k < s.params.size(); ++k) {
        auto& p = params_[s.params[k]];
        if (static_cast<float>(used.flat(static_cast<std::int64_t>(k))) == 0.0f) {  // no rank had a gradient
          p.grad() = Tensor<T>{};
          continue;
        }
        const Tensor<T> avg = s.flat.slice(0, s.offsets[k], s.offsets[k] + p.numel()).reshape(p.shape());
        if (p.grad().defined() && !p.grad().shares_storage() && p.grad().shape() == p.shape()) p.grad().copy_from(avg);
        else p.grad() = avg.clone();
      }
    }
    for (std::size_t i = 0; i < params_.size(); ++i) expected_[i] = arrived_[i];
    learned_ = true;
    start_step();
  }

  // While the guard lives, backward accumulates gradients locally (no collective): for gradient
  // accumulation, the last micro-batch's backward goes outside it.
  class NoSync {
   public:
    explicit NoSync(DataParallel& dp) : dp_(&dp) {
      CUTRAIN_REQUIRE(dp.sync_, InvalidArgument, "dist::DataParallel::no_sync", "no_sync() is already active");
      dp.sync_ = false;
    }
    NoSync(NoSync&& o) noexcept : dp_(std::exchange(o.dp_, nullptr)) {}
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;
    NoSync& operator=(NoSync&&) = delete;
    ~NoSync() {
      if (!dp_) return;
      dp_->sync_ = true;
      dp_->start_step();
    }

   private:
    DataParallel* dp_;
  };
  [[nodiscard]] NoSync no_sync() { return NoSync(*this); }

  // Rank 0's buffers (batch-norm running statistics) on every rank.
  void sync_buffers() {
    std::vector<Work> works;
    module_.visit_buffers("", [&](const std::string&, Tensor<T>& b) {
      if (b.defined() && b.is_contiguous()) works.push_back(pg_.broadcast(b, 0));
    });
    for (auto& w : works) w.wait();
  }

  std::size_t bucket_count() const { return slots_.size(); }
  // How many buckets started during the last synchronized backward, before its finish() (the
  // overlap with backward; 0 for the first backward, which learns).
  std::size_t started_early() const { return early_; }

 private:
  struct Slot {
    std::vector<std::size_t> params;
    std::vector<std::int64_t> offsets;
    Tensor<T> flat;
    std::int64_t grad_numel = 0;
    std::size_t ready = 0;  // parameters with all their gradients this backward
    bool started = false;
    Work work;
  };

  void check_same_module(std::uint64_t sig, Device dev) {
    // The signature as four 16-bit pieces in f64 (exact), gathered from every rank (on the
    // parameters' device: NCCL reduces GPU tensors only).
    std::vector<double> pieces;
    for (int k = 0; k < 4; ++k) pieces.push_back(static_cast<double>((sig >> (16 * k)) & 0xffff));
    const auto mine = Tensor<double>::from_vector(pieces, {4}).to(dev);
    auto all = Tensor<double>::empty({4 * pg_.size()}, {.device = dev});
    pg_.all_gather(all, mine).wait();
    const auto got = all.to_vector();
    for (int r = 0; r < pg_.size(); ++r)
      for (std::size_t k = 0; k < 4; ++k)
        if (got[4 * static_cast<std::size_t>(r) + k] != got[k])
          throw DistError("dist::DataParallel",
                          cutrain::detail::cat("rank ", r, "'s module differs from rank 0's (its parameters' names or "
                                               "shapes; this is rank ", pg_.rank(), " of ", pg_.size(), ")"));
  }

  void start_step() {
    std::fill(arrived_.begin(), arrived_.end(), 0);
    late_.assign(params_.size(), false);
    for (auto& s : slots_) {
      s.started = false;
      s.ready = 0;
      if (learned_)
        for (auto i : s.params) s.ready += expected_[i] == 0;
    }
    next_ = 0;
    if (sync_ && learned_) start_ready();  // buckets of parameters that get no gradient
  }

  void on_grad(std::size_t i) {
    ++arrived_[i];
    if (!sync_ || !learned_) return;
    const std::size_t b = bucket_of_[i];
    if (slots_[b].started) {
      late_[i] = true;
      return;
    }
    if (arrived_[i] == expected_[i]) {
      ++slots_[b].ready;
      start_ready();
    }
  }

  // Buckets start in order: the next one only when it is complete.
  void start_ready() {
    while (next_ < slots_.size() && slots_[next_].ready == slots_[next_].params.size()) start(next_++);
  }

  void start(std::size_t b) {
    auto& s = slots_[b];
    std::vector<T> had(s.params.size());
    for (std::size_t k = 0; k < s.params.size(); ++k) {
      auto& p = params_[s.params[k]];
      Tensor<T> dst = s.flat.slice(0, s.offsets[k], s.offsets[k] + p.numel());
      had[k] = T(p.grad().defined() ? 1.0f : 0.0f);
      if (p.grad().defined()) dst.copy_from(p.grad().reshape({p.numel()}));
      else dst.fill(T(0.0f));
    }
    s.flat.slice(0, s.grad_numel, s.flat.numel()).assign(had);
    s.started = true;
    s.work = pg_.all_reduce(s.flat, reduce_);
  }

  M& module_;
  ProcessGroup& pg_;
  std::vector<std::string> names_;
  std::vector<autograd::Var<T>> params_;
  std::vector<Slot> slots_;
  std::vector<std::size_t> bucket_of_;  // parameter -> its bucket
  std::vector<int> arrived_, expected_;
  std::vector<bool> late_;
  ReduceOp reduce_;
  bool learned_ = false, sync_ = true;
  std::size_t next_ = 0, early_ = 0;
};

}  // namespace cutrain::inline CUTRAIN_ABI::dist
