// dist::ZeroOptimizer: ZeRO stage 1, the optimizer state sharded over the ranks (PyTorch's
// ZeroRedundancyOptimizer): each parameter belongs to one rank, whose inner optimizer (AdamW,
// SGD) alone keeps its state and updates it; after the step every parameter is broadcast from
// its owner. With DataParallel's averaged gradients the result is the unsharded optimizer's,
// while each rank holds about 1/world of the state (AdamW: 2 floats per parameter).
//
//   dist::DataParallel dp(model, pg);
//   dist::ZeroOptimizer<float, optim::AdamW<float>> opt(pg, model.parameters(), [](auto mine) {
//     return std::make_unique<optim::AdamW<float>>(mine, optim::AdamWOptions{.lr = 3e-4});
//   });
//   dp.backward(loss); opt.step(); opt.zero_grad();
//   opt.save_state(ckpt, "optimizer");   // every rank calls it; rank 0 then writes ckpt
//
// Pass the parameters in the order the plain optimizer numbers them (group after group), so that
// the checkpoints agree. Ownership: parameters in decreasing size, each to the rank holding the fewest elements so far
// (ties: the lower rank), so every rank computes the same partition. make(mine) builds the inner
// optimizer over this rank's parameters (in registration order); a rank that owns none has none.
// save_state() gathers every rank's state into the unsharded optimizer's own format (records
// prefix.<k>.* by global parameter index k), so a checkpoint saved at one world size loads at
// any other, and into the plain optimizer; load_state() takes this rank's part of such a
// checkpoint. Both are collective: every rank calls them, in the same order.
// Limits: gradients are all-reduced by DataParallel, not reduce-scattered (the saving is the
// optimizer state, not the gradient traffic); the state travels through a temporary file per
// rank and whole-checkpoint broadcasts when saved.
#pragma once

#include "cutrain/core/abi.hpp"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "cutrain/autograd/var.hpp"
#include "cutrain/core/checkpoint.hpp"
#include "cutrain/dist/process_group.hpp"

namespace cutrain::inline CUTRAIN_ABI::dist {

namespace detail {

// root's bytes on every rank (as 16-bit elements: a broadcast copies them bit for bit).
inline std::string broadcast_bytes(ProcessGroup& pg, const std::string& bytes, int root, Device dev) {
  auto n = Tensor<double>::from_vector({static_cast<double>(bytes.size())}, {1}).to(dev);
  pg.broadcast(n, root).wait();
  const auto size = static_cast<std::size_t>(n.to_vector()[0]);
  if (size == 0) return {};
  std::vector<half> buf((size + 1) / 2);
  if (pg.rank() == root) std::memcpy(static_cast<void*>(buf.data()), bytes.data(), size);
  auto t = Tensor<half>::from_vector(buf, {static_cast<std::int64_t>(buf.size())}).to(dev);
  pg.broadcast(t, root).wait();
  const auto got = t.to_vector();
  std::string out(size, '\0');
  std::memcpy(out.data(), static_cast<const void*>(got.data()), size);
  return out;
}

// A checkpoint as bytes and back, through a file of this process's own.
inline std::filesystem::path scratch_path(int rank) {
  static_assert(sizeof(pid_t) <= sizeof(long long));
  return std::filesystem::temp_directory_path() /
         cutrain::detail::cat("cutrain_zero_", static_cast<long long>(::getpid()), "_", rank, ".ckpt");
}
inline std::string checkpoint_bytes(const Checkpoint& c, int rank) {
  const auto path = scratch_path(rank);
  c.save(path);
  std::ifstream in(path, std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::filesystem::remove(path);
  return s;
}
inline Checkpoint checkpoint_of(const std::string& bytes, int rank) {
  const auto path = scratch_path(rank);
  {
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) throw IoError("dist::ZeroOptimizer", cutrain::detail::cat("cannot write ", path.string()));
  }
  Checkpoint c = Checkpoint::load(path);
  std::filesystem::remove(path);
  return c;
}

}  // namespace detail

template <class T, class Opt>
class ZeroOptimizer {
 public:
  using Make = std::function<std::unique_ptr<Opt>(std::vector<autograd::Var<T>>)>;

  ZeroOptimizer(ProcessGroup& pg, std::vector<autograd::Var<T>> params, const Make& make)
      : pg_(pg), params_(std::move(params)) {
    CUTRAIN_REQUIRE(!params_.empty(), InvalidArgument, "dist::ZeroOptimizer", "got no parameters");
    std::vector<std::size_t> order(params_.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return params_[a].numel() > params_[b].numel(); });
    std::vector<std::int64_t> load(static_cast<std::size_t>(pg.size()), 0);
    owner_.resize(params_.size());
    for (std::size_t k : order) {
      const auto r = static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
      owner_[k] = static_cast<int>(r);
      load[r] += params_[k].numel();
    }
    std::vector<autograd::Var<T>> mine;
    for (std::size_t k = 0; k < params_.size(); ++k)
      if (owner_[k] == pg.rank()) {
        local_.push_back(k);
        mine.push_back(params_[k]);
      }
    if (!mine.empty()) {
      inner_ = make(std::move(mine));
      CUTRAIN_REQUIRE(inner_ != nullptr, InvalidArgument, "dist::ZeroOptimizer", "make() returned no optimizer");
      lr_ = inner_->lr();
      // The inner optimizer's own numbering (groups reorder): its j-th parameter is params[k].
      for (const auto& p : inner_->params()) {
        std::size_t k = 0;
        while (k < params_.size() && !(params_[k] == p)) ++k;
        CUTRAIN_REQUIRE(k < params_.size() && owner_[k] == pg.rank(), InvalidArgument, "dist::ZeroOptimizer",
                        "make() built an optimizer over a parameter it was not given");
        inner_global_.push_back(k);
      }
      CUTRAIN_REQUIRE(inner_global_.size() == local_.size(), InvalidArgument, "dist::ZeroOptimizer", "make() built an "
                      "optimizer over ", inner_global_.size(), " parameters, it was given ", local_.size());
    }
  }

  // The inner step on this rank's parameters, then every parameter from its owner.
  void step() {
    if (inner_) inner_->step();
    std::vector<Work> works;
    works.reserve(params_.size());
    for (std::size_t k = 0; k < params_.size(); ++k) works.push_back(pg_.broadcast(params_[k].value(), owner_[k]));
    for (auto& w : works) w.wait();
    for (auto& p : params_) p.value().bump_version();
  }
  void zero_grad() {
    for (auto& p : params_) p.zero_grad();
  }
  double lr() const { return lr_; }
  void set_lr(double lr) {
    if (inner_) inner_->set_lr(lr);
    lr_ = lr;
  }
  int owner(std::size_t k) const { return owner_.at(k); }
  // This rank's optimizer (null when it owns no parameter) and its parameters' global indices.
  Opt* inner() { return inner_.get(); }
  const std::vector<std::size_t>& local_params() const { return local_; }

  // Collective. Writes the unsharded optimizer's records for every parameter under prefix.
  void save_state(Checkpoint& ckpt, const std::string& prefix) const {
    Checkpoint inner, mine;  // mine: the inner records renumbered z.<k>.*, k the global index
    if (inner_) inner_->save_state(inner, "z");
    for (const std::string& n : inner.names()) {
      const auto j = local_index(n);
      if (j < 0) mine.copy_record(inner, n, n);
      else mine.copy_record(inner, n, cutrain::detail::cat("z.", inner_global_.at(static_cast<std::size_t>(j)),
                                                            n.substr(n.find('.', 2))));
    }
    const Device dev = params_[0].device();
    const std::string bytes = detail::checkpoint_bytes(mine, pg_.rank());
    // A reused checkpoint keeps no stale record of these parameters.
    const std::string head = prefix.empty() ? "" : prefix + ".";
    for (const std::string& name : ckpt.names())
      if (name.compare(0, head.size(), head) == 0 && name.size() > head.size() &&
          std::isdigit(static_cast<unsigned char>(name[head.size()])))
        ckpt.erase(name);
    std::string type;
    for (int r = 0; r < pg_.size(); ++r) {
      const std::string got = detail::broadcast_bytes(pg_, r == pg_.rank() ? bytes : std::string(), r, dev);
      const Checkpoint part = detail::checkpoint_of(got, pg_.rank());
      if (part.size() == 0) continue;
      type = part.get_string("z.type");
      for (const std::string& n : part.names())
        if (local_index(n) >= 0) ckpt.copy_record(part, n, head + n.substr(2));
    }
    CUTRAIN_REQUIRE(!type.empty(), Error, "dist::ZeroOptimizer::save_state", "no rank had an optimizer");
    ckpt.put_string(Checkpoint::key(prefix, "type"), type);
    ckpt.put_double(Checkpoint::key(prefix, "lr"), lr_);
    ckpt.put_int(Checkpoint::key(prefix, "params"), static_cast<std::int64_t>(params_.size()));
  }

  // Collective. This rank's part of a checkpoint that save_state (any world size) or the plain
  // optimizer wrote. The inner optimizer checks the records (type, shapes, counts).
  void load_state(const Checkpoint& ckpt, const std::string& prefix) {
    constexpr std::string_view op = "dist::ZeroOptimizer::load_state";
    const auto key = [&](const std::string& n) { return Checkpoint::key(prefix, n); };
    CUTRAIN_REQUIRE(ckpt.contains(key("params")) && ckpt.contains(key("type")), InvalidArgument, op,
                    "the checkpoint has no optimizer state under \"", prefix, "\"");
    const std::int64_t n = ckpt.get_int(key("params"));
    CUTRAIN_REQUIRE(n == static_cast<std::int64_t>(params_.size()), InvalidArgument, op, "the checkpoint has state for ",
                    n, " parameters, this optimizer has ", params_.size());
    if (inner_) {
      Checkpoint mine;
      mine.put_string("z.type", ckpt.get_string(key("type")));
      mine.put_double("z.lr", ckpt.get_double(key("lr")));
      mine.put_int("z.params", static_cast<std::int64_t>(local_.size()));
      std::vector<std::int64_t> local_of(params_.size(), -1);
      for (std::size_t j = 0; j < inner_global_.size(); ++j) local_of[inner_global_[j]] = static_cast<std::int64_t>(j);
      const std::string head = prefix.empty() ? "" : prefix + ".";
      for (const std::string& name : ckpt.names()) {
        if (name.compare(0, head.size(), head) != 0) continue;
        const std::string tail = name.substr(head.size());
        const auto dot = tail.find('.');
        if (dot == std::string::npos || dot == 0 || tail.find_first_not_of("0123456789") != dot) continue;
        const auto k = std::stoull(tail.substr(0, dot));
        if (k >= params_.size() || local_of[k] < 0) continue;
        mine.copy_record(ckpt, name, "z." + std::to_string(local_of[k]) + tail.substr(dot));
      }
      inner_->load_state(mine, "z");
    }
    lr_ = ckpt.get_double(key("lr"));
    pg_.barrier();  // every rank loaded (or threw before it)
  }

 private:
  // j of a record "z.<j>.<rest>", or -1 for the others (z.type, z.lr, z.params).
  static std::int64_t local_index(const std::string& name) {
    if (name.compare(0, 2, "z.") != 0) return -1;
    const auto dot = name.find('.', 2);
    if (dot == std::string::npos || dot == 2) return -1;
    const std::string j = name.substr(2, dot - 2);
    if (j.find_first_not_of("0123456789") != std::string::npos) return -1;
    return std::stoll(j);
  }

  ProcessGroup& pg_;
  std::vector<autograd::Var<T>> params_;
  std::vector<int> owner_;
  std::vector<std::size_t> local_;         // this rank's parameters, in the order of params
  std::vector<std::size_t> inner_global_;  // the inner optimizer's j-th parameter is params[k]
  std::unique_ptr<Opt> inner_;
  double lr_ = 0;
};

}  // namespace cutrain::inline CUTRAIN_ABI::dist
