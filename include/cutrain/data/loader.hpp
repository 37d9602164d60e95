// data::Loader: batches of an ImageDataset for the training loop, with seeded per-epoch shuffling,
// normalization and (seeded) random-crop-with-padding and horizontal-flip augmentation.
//
//   data::Loader train(data::fashion_mnist("train"), {.batch = 128, .shuffle = true, .device = dev});
//   for (auto [x, y] : train) { ... }   // x: Tensor<float> [B, C, H, W], y: Tensor<int32_t> [B]
//
// Each range-for over the loader is one epoch: begin() uses the current epoch() and advances it,
// so two loops give two different shuffles; set_epoch(e) replays epoch e exactly (resume).
// Everything random is a function of (seed, epoch, position), never of the order of evaluation.
//
// For a GPU device a batch is assembled in one of two pinned host buffers and copied to the
// device asynchronously on this thread's stream, so the host prepares the next batch while the
// GPU computes. Limits: batches are assembled on the calling thread (no worker threads).
// One mean and one std apply to every channel. Padding for the crop is zero in the dataset's
// pixel values (before normalization), as torchvision's RandomCrop(padding) then Normalize.
//
// Data-parallel sharding (.rank, .world_size, e.g. from dist::Env): every rank draws the same
// epoch order (same seed), keeps its first world_size * floor(N / world_size) positions and takes
// positions rank, rank + world_size, ... of it: disjoint samples, the same count on every rank.
// The remainder (fewer than world_size samples, a different few each shuffled epoch) is dropped,
// as DistributedSampler(drop_last=True), so no sample is seen twice in an epoch. The ranks'
// batches k together hold the samples of batch k of a one-process loader with the same seed and
// batch * world_size (in another order within the batch; its last batch may hold more), and
// augmentation draws from the global position, so each sample is augmented alike in both.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cmath>
#include <cstdint>
#include <algorithm>
#include <memory>
#include <numeric>
#include <utility>
#include <vector>

#include "cutrain/core/random.hpp"
#include "cutrain/core/tensor.hpp"
#include "cutrain/data/idx.hpp"

namespace cutrain::inline CUTRAIN_ABI::data {

struct LoaderOptions {
  std::int64_t batch = 64;
  bool shuffle = false;
  std::uint64_t seed = 0;
  bool drop_last = false;         // drop the last batch when it is smaller than .batch
  double normalize_mean = 0.0;    // x = (pixel - mean) / std, after augmentation
  double normalize_std = 1.0;
  int random_crop_padding = 0;    // 0 = off; else pad by this many pixels and crop back at random
  bool hflip = false;             // flip left-right with probability 1/2
  Device device = Device::cpu();  // where the batches are delivered
  std::int64_t rank = 0;          // this process's shard, in [0, world_size)
  std::int64_t world_size = 1;    // shards (processes); 1 = no sharding
};

template <class T>
struct Batch {
  Tensor<T> x;             // [B, C, H, W]
  Tensor<std::int32_t> y;  // [B]
};

template <class T = float>
class Loader {
 public:
  // Shares the dataset's storage (views): no copy of the images is made.
  Loader(const ImageDataset<T>& ds, const LoaderOptions& opts = {})
      : images_(ds.images.view()), labels_(ds.labels.view()), opts_(opts) {
    CUTRAIN_REQUIRE(opts.batch > 0, InvalidArgument, "data::Loader", "batch must be positive, got ", opts.batch);
    CUTRAIN_REQUIRE(std::isfinite(opts.normalize_mean), InvalidArgument, "data::Loader", "normalize_mean must be finite, got ",
                    opts.normalize_mean);
    CUTRAIN_REQUIRE(std::isfinite(opts.normalize_std) && opts.normalize_std > 0, InvalidArgument, "data::Loader",
                    "normalize_std must be positive and finite, got ", opts.normalize_std);
    CUTRAIN_REQUIRE(images_.rank() == 4, InvalidArgument, "data::Loader", "images must be [N, C, H, W], got ",
                    images_.describe());
    CUTRAIN_REQUIRE(labels_.rank() == 1 && labels_.shape()[0] == images_.shape()[0], InvalidArgument, "data::Loader",
                    "labels must be [N] with N = ", images_.shape()[0], " images, got ", labels_.describe());
    CUTRAIN_REQUIRE(opts.world_size >= 1 && opts.rank >= 0 && opts.rank < opts.world_size, InvalidArgument,
                    "data::Loader", "rank must be in [0, world_size) with world_size >= 1, got rank ", opts.rank,
                    ", world_size ", opts.world_size);
    CUTRAIN_REQUIRE(images_.shape()[0] >= opts.world_size, InvalidArgument, "data::Loader", "the dataset's ",
                    images_.shape()[0], " samples are fewer than world_size ", opts.world_size);
    CUTRAIN_REQUIRE(images_.device().is_cpu() && labels_.device().is_cpu(), InvalidArgument, "data::Loader",
                    "the dataset must be on the host, got ", images_.describe());
    const std::int64_t h = images_.shape()[2], w = images_.shape()[3];
    CUTRAIN_REQUIRE(opts.random_crop_padding >= 0 && opts.random_crop_padding <= std::min(h, w), InvalidArgument,
                    "data::Loader", "random_crop_padding must be in [0, ", std::min(h, w), "] (0 = off), got ",
                    opts.random_crop_padding);
    CUTRAIN_REQUIRE(opts.device.is_cpu() || cutrain::detail::has_device_backend(), InvalidArgument, "data::Loader",
                    "device ", opts.device, " needs the CUDA backend (link cutrain::cuda, include cutrain/cutrain.hpp)");
    if (!opts.device.is_cpu()) staging_ = cutrain::detail::device_backend("data::Loader").make_staging();
    // Contiguous row-major host copies make batch assembly plain indexing.
    if (images_.layout() != Layout::row_major && images_.layout() != Layout::nchw) images_ = images_.contiguous(Layout::row_major);
    if (labels_.layout() != Layout::row_major) labels_ = labels_.contiguous(Layout::row_major);
  }

  const LoaderOptions& options() const { return opts_; }
  std::int64_t dataset_size() const { return images_.shape()[0]; }
  // Samples of this rank's shard per epoch: dataset_size() / world_size (the remainder is dropped).
  std::int64_t shard_size() const { return dataset_size() / opts_.world_size; }
  // Batches per epoch.
  std::int64_t size() const {
    const std::int64_t n = shard_size(), b = opts_.batch;
    return opts_.drop_last ? n / b : (n + b - 1) / b;
  }
  // This rank's samples per epoch (fewer than shard_size() with drop_last).
  std::int64_t samples_per_epoch() const { return opts_.drop_last ? size() * opts_.batch : shard_size(); }

  // The epoch the next begin() runs.
  std::int64_t epoch() const { return epoch_; }
  void set_epoch(std::int64_t e) {
    CUTRAIN_REQUIRE(e >= 0, InvalidArgument, "data::Loader::set_epoch", "epoch must be >= 0, got ", e);
    epoch_ = e;
  }

  // This rank's sample order of epoch e: its shard of global_order(e).
  std::vector<std::int64_t> order(std::int64_t e) const {
    auto p = global_order(e);
    if (opts_.world_size == 1) return p;
    std::vector<std::int64_t> mine(static_cast<std::size_t>(shard_size()));
    for (std::size_t i = 0; i < mine.size(); ++i)
      mine[i] = p[i * static_cast<std::size_t>(opts_.world_size) + static_cast<std::size_t>(opts_.rank)];
    return mine;
  }

  // The order of all samples in epoch e, the same on every rank (the identity without .shuffle).
  std::vector<std::int64_t> global_order(std::int64_t e) const {
    std::vector<std::int64_t> p(static_cast<std::size_t>(dataset_size()));
    std::iota(p.begin(), p.end(), std::int64_t{0});
    if (opts_.shuffle) {
      Rng rng(epoch_seed(e, 0x5bd1e995u));
      for (std::size_t i = p.size(); i > 1; --i) std::swap(p[i - 1], p[static_cast<std::size_t>(rng.below(i))]);
    }
    return p;
  }

  // Batch k of epoch e, with its given sample order (from order(e)).
  Batch<T> batch(std::int64_t e, const std::vector<std::int64_t>& perm, std::int64_t k) const {
    CUTRAIN_REQUIRE(k >= 0 && k < size(), InvalidArgument, "data::Loader::batch", "batch ", k, " out of range for ", size());
    const std::int64_t c = images_.shape()[1], h = images_.shape()[2], w = images_.shape()[3];
    const std::int64_t begin = k * opts_.batch, end = std::min(begin + opts_.batch, shard_size());
    const std::int64_t b = end - begin, plane = h * w, sample = c * plane;
    // On the CPU the batch is assembled in its tensors; for a GPU, in a pinned staging buffer
    // (x, then y at a 256-byte aligned offset) copied to the device asynchronously.
    Tensor<T> x;
    Tensor<std::int32_t> y;
    T* dst = nullptr;
    std::int32_t* ydst = nullptr;
    const auto x_bytes = static_cast<std::size_t>(b * sample) * sizeof(T);
    const std::size_t y_offset = (x_bytes + 255) / 256 * 256;
    if (!opts_.device.is_cpu()) {
      auto* base = static_cast<unsigned char*>(staging_->acquire(y_offset + static_cast<std::size_t>(b) * sizeof(std::int32_t)));
      dst = reinterpret_cast<T*>(base);
      ydst = reinterpret_cast<std::int32_t*>(base + y_offset);
    }
    if (!dst) {
      x = Tensor<T>({b, c, h, w});
      y = Tensor<std::int32_t>({b});
      dst = x.data();
      ydst = y.data();
    }
    const T* src = images_.data();
    const std::int32_t* lsrc = labels_.data();
    const T mean = static_cast<T>(opts_.normalize_mean);
    const T inv_std = static_cast<T>(1.0 / opts_.normalize_std);
    const T pad_value = (T(0) - mean) * inv_std;
    const std::uint64_t aug_seed = epoch_seed(e, 0xa5a5a5a5u);
    const int p = opts_.random_crop_padding;
    for (std::int64_t i = 0; i < b; ++i) {
      const std::int64_t pos = begin + i, s = perm[static_cast<std::size_t>(pos)];
      ydst[i] = lsrc[s];
      // Offsets of the crop window in the padded image, in [0, 2p]; dy = dx = p is the identity.
      std::int64_t dy = p, dx = p;
      bool flip = false;
      // Drawn at the global position, so a rank's sample is augmented as a single process would.
      const auto u = static_cast<std::uint64_t>(pos * opts_.world_size + opts_.rank) * 3;
      if (p > 0) {
        dy = static_cast<std::int64_t>(uniform_at(aug_seed, u) * (2 * p + 1));
        dx = static_cast<std::int64_t>(uniform_at(aug_seed, u + 1) * (2 * p + 1));
      }
      if (opts_.hflip) flip = uniform_at(aug_seed, u + 2) < 0.5;
      const T* in = src + s * sample;
      T* out = dst + i * sample;
      for (std::int64_t ch = 0; ch < c; ++ch) {
        for (std::int64_t r = 0; r < h; ++r) {
          const std::int64_t sr = r + dy - p;
          T* orow = out + ch * plane + r * w;
          if (sr < 0 || sr >= h) {
            for (std::int64_t q = 0; q < w; ++q) orow[q] = pad_value;
            continue;
          }
          const T* irow = in + ch * plane + sr * w;
          for (std::int64_t q = 0; q < w; ++q) {
            const std::int64_t sq = (flip ? w - 1 - q : q) + dx - p;
            orow[q] = (sq < 0 || sq >= w) ? pad_value : (irow[sq] - mean) * inv_std;
          }
        }
      }
    }
    if (opts_.device.is_cpu()) return {std::move(x), std::move(y)};
    Tensor<T> xd(Shape{b, c, h, w}, {.device = opts_.device});
    Tensor<std::int32_t> yd(Shape{b}, {.device = opts_.device});
    staging_->upload(xd.data(), opts_.device, dst, x_bytes);
    staging_->upload(yd.data(), opts_.device, ydst, static_cast<std::size_t>(b) * sizeof(std::int32_t));
    staging_->release();
    return {std::move(xd), std::move(yd)};
  }

  class iterator {
   public:
    using difference_type = std::ptrdiff_t;
    using value_type = Batch<T>;
    iterator() = default;
    Batch<T> operator*() const { return loader_->batch(epoch_, *perm_, k_); }
    iterator& operator++() {
      ++k_;
      return *this;
    }
    void operator++(int) { ++k_; }
    friend bool operator==(const iterator& a, const iterator& b) { return a.k_ == b.k_; }
    std::int64_t index() const { return k_; }

   private:
    friend class Loader;
    iterator(const Loader* l, std::int64_t e, std::shared_ptr<const std::vector<std::int64_t>> perm, std::int64_t k)
        : loader_(l), epoch_(e), perm_(std::move(perm)), k_(k) {}
    const Loader* loader_ = nullptr;
    std::int64_t epoch_ = 0;
    std::shared_ptr<const std::vector<std::int64_t>> perm_;
    std::int64_t k_ = 0;
  };

  // Starts epoch(): draws its order and advances epoch() for the next loop.
  iterator begin() {
    const std::int64_t e = epoch_++;
    return iterator(this, e, std::make_shared<const std::vector<std::int64_t>>(order(e)), 0);
  }
  iterator end() const { return iterator(this, 0, nullptr, size()); }

 private:
  std::uint64_t epoch_seed(std::int64_t e, std::uint64_t salt) const {
    return splitmix64(splitmix64(opts_.seed ^ salt) ^ static_cast<std::uint64_t>(e));
  }

  Tensor<T> images_;
  Tensor<std::int32_t> labels_;
  LoaderOptions opts_;
  std::int64_t epoch_ = 0;
  // For a device: the backend's pinned buffers the batches are assembled in.
  std::shared_ptr<cutrain::detail::HostStaging> staging_;
};

template <class T>
Loader(const ImageDataset<T>&, const LoaderOptions&) -> Loader<T>;
template <class T>
Loader(const ImageDataset<T>&) -> Loader<T>;

}  // namespace cutrain::inline CUTRAIN_ABI::data
