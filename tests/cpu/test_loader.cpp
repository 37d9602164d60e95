// data::Loader: batching covers every sample once per epoch, seeded shuffles that differ between
// epochs, drop_last, normalization values, random crop with padding and horizontal flip on a
// small hand-made dataset, and clear errors on bad options.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <set>
#include <vector>

#include "cutrain/data/loader.hpp"

namespace cutrain_test_loader {  // one per file: the unity build compiles files together

using namespace cutrain;
using data::Loader;
using data::LoaderOptions;

namespace {

// n images [1, h, w]; image i has every pixel = i + 1 (so the image identifies the sample), label i.
data::ImageDataset<float> constant_images(std::int64_t n, std::int64_t h = 2, std::int64_t w = 3) {
  std::vector<float> px(static_cast<std::size_t>(n * h * w));
  std::vector<std::int32_t> lbl(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    lbl[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i);
    for (std::int64_t p = 0; p < h * w; ++p) px[static_cast<std::size_t>(i * h * w + p)] = static_cast<float>(i + 1);
  }
  return {Tensor<float>::from_vector(px, Shape{n, 1, h, w}), Tensor<std::int32_t>::from_vector(lbl, Shape{n})};
}

// One 3x3 image with pixels 1..9 row by row.
data::ImageDataset<float> ramp_image() {
  std::vector<float> px{1, 2, 3, 4, 5, 6, 7, 8, 9};
  return {Tensor<float>::from_vector(px, Shape{1, 1, 3, 3}), Tensor<std::int32_t>::from_vector({7}, Shape{1})};
}

// Labels of one epoch, batch by batch, checking the batch shapes and that x agrees with y.
std::vector<std::vector<std::int32_t>> run_epoch(Loader<float>& loader) {
  std::vector<std::vector<std::int32_t>> out;
  for (auto [x, y] : loader) {
    REQUIRE(x.rank() == 4);
    REQUIRE(x.shape()[0] == y.shape()[0]);
    const auto xs = x.to_vector();
    const auto ys = y.to_vector();
    const std::int64_t per = x.numel() / x.shape()[0];
    for (std::size_t i = 0; i < ys.size(); ++i) CHECK(xs[i * static_cast<std::size_t>(per)] == float(ys[i] + 1));
    out.push_back(ys);
  }
  return out;
}

std::vector<std::int32_t> flatten(const std::vector<std::vector<std::int32_t>>& b) {
  std::vector<std::int32_t> v;
  for (const auto& x : b) v.insert(v.end(), x.begin(), x.end());
  return v;
}

}  // namespace

TEST_CASE("loader: batching covers every sample once per epoch", "[data]") {
  const auto ds = constant_images(10);
  Loader train(ds, {.batch = 4});
  CHECK(train.size() == 3);
  CHECK(train.samples_per_epoch() == 10);
  const auto batches = run_epoch(train);
  REQUIRE(batches.size() == 3);
  CHECK(batches[0].size() == 4);
  CHECK(batches[1].size() == 4);
  CHECK(batches[2].size() == 2);  // the last partial batch
  const auto all = flatten(batches);
  CHECK(all == std::vector<std::int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});  // no shuffle: in order

  Loader shuffled(ds, {.batch = 3, .shuffle = true, .seed = 5});
  for (int epoch = 0; epoch < 3; ++epoch) {
    auto v = flatten(run_epoch(shuffled));
    std::sort(v.begin(), v.end());
    CHECK(v == std::vector<std::int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  }
  CHECK(shuffled.epoch() == 3);
}

TEST_CASE("loader: shuffling is seeded and differs between epochs", "[data]") {
  const auto ds = constant_images(50);
  Loader a(ds, {.batch = 8, .shuffle = true, .seed = 42});
  Loader b(ds, {.batch = 8, .shuffle = true, .seed = 42});
  Loader c(ds, {.batch = 8, .shuffle = true, .seed = 43});
  const auto a0 = flatten(run_epoch(a)), a1 = flatten(run_epoch(a));
  const auto b0 = flatten(run_epoch(b)), b1 = flatten(run_epoch(b));
  const auto c0 = flatten(run_epoch(c));
  CHECK(a0 == b0);  // same seed, same epoch: same order
  CHECK(a1 == b1);
  CHECK(a0 != a1);  // a new order each epoch
  CHECK(a0 != c0);  // another seed, another order
  std::vector<std::int32_t> identity(50);
  for (int i = 0; i < 50; ++i) identity[static_cast<std::size_t>(i)] = i;
  CHECK(a0 != identity);
  // set_epoch replays an epoch exactly (resume).
  a.set_epoch(1);
  CHECK(flatten(run_epoch(a)) == a1);
  CHECK(a.epoch() == 2);
}

TEST_CASE("loader: drop_last", "[data]") {
  const auto ds = constant_images(10);
  Loader keep(ds, {.batch = 4, .drop_last = false});
  Loader drop(ds, {.batch = 4, .shuffle = true, .seed = 1, .drop_last = true});
  CHECK(keep.size() == 3);
  CHECK(drop.size() == 2);
  CHECK(drop.samples_per_epoch() == 8);
  const auto batches = run_epoch(drop);
  REQUIRE(batches.size() == 2);
  for (const auto& b : batches) CHECK(b.size() == 4);
  const auto v = flatten(batches);
  CHECK(std::set<std::int32_t>(v.begin(), v.end()).size() == 8);  // no sample twice
  // An exact multiple drops nothing; a batch larger than the data set gives no batch.
  CHECK(Loader(constant_images(8), {.batch = 4, .drop_last = true}).size() == 2);
  CHECK(Loader(constant_images(3), {.batch = 4, .drop_last = true}).size() == 0);
  Loader empty(constant_images(3), {.batch = 4, .drop_last = true});
  CHECK(run_epoch(empty).empty());
}

TEST_CASE("loader: normalization values", "[data]") {
  const auto ds = ramp_image();
  Loader l(ds, {.batch = 1, .normalize_mean = 2.0, .normalize_std = 4.0});
  for (auto [x, y] : l) {
    CHECK(x.shape() == Shape{1, 1, 3, 3});
    CHECK(y.to_vector() == std::vector<std::int32_t>{7});
    const auto v = x.to_vector();
    for (int i = 0; i < 9; ++i) CHECK(v[static_cast<std::size_t>(i)] == Approx((i + 1 - 2.0) / 4.0));
  }
  // The dataset itself is untouched.
  CHECK(ds.images.to_vector()[0] == 1.0f);
}

TEST_CASE("loader: horizontal flip on a hand-made image", "[data]") {
  const auto ds = ramp_image();
  Loader l(ds, {.batch = 1, .seed = 3, .hflip = true});
  const std::vector<float> plain{1, 2, 3, 4, 5, 6, 7, 8, 9}, flipped{3, 2, 1, 6, 5, 4, 9, 8, 7};
  int n_plain = 0, n_flipped = 0;
  std::vector<std::vector<float>> seen;
  for (int epoch = 0; epoch < 64; ++epoch)
    for (auto [x, y] : l) {
      const auto v = x.to_vector();
      seen.push_back(v);
      if (v == plain) ++n_plain;
      else if (v == flipped) ++n_flipped;
      else FAIL("neither the image nor its mirror");
    }
  CHECK(n_plain + n_flipped == 64);
  CHECK(n_plain > 16);  // about half each
  CHECK(n_flipped > 16);
  // Seeded: another loader with the same seed flips the same epochs.
  Loader again(ds, {.batch = 1, .seed = 3, .hflip = true});
  for (int epoch = 0; epoch < 64; ++epoch)
    for (auto [x, y] : again) CHECK(x.to_vector() == seen[static_cast<std::size_t>(epoch)]);
}

TEST_CASE("loader: random crop with padding on a hand-made image", "[data]") {
  const auto ds = ramp_image();
  // All 9 windows of a 3x3 image padded by 1, with zeros in the padding.
  std::set<std::vector<float>> windows;
  for (int dy = 0; dy <= 2; ++dy)
    for (int dx = 0; dx <= 2; ++dx) {
      std::vector<float> w;
      for (int r = 0; r < 3; ++r)
        for (int c = 0; c < 3; ++c) {
          const int sr = r + dy - 1, sc = c + dx - 1;
          w.push_back(sr < 0 || sr > 2 || sc < 0 || sc > 2 ? 0.0f : float(sr * 3 + sc + 1));
        }
      windows.insert(w);
    }
  REQUIRE(windows.size() == 9);
  Loader l(ds, {.batch = 1, .seed = 11, .random_crop_padding = 1});
  std::set<std::vector<float>> seen;
  for (int epoch = 0; epoch < 200; ++epoch)
    for (auto [x, y] : l) {
      const auto v = x.to_vector();
      CHECK(windows.count(v) == 1);
      seen.insert(v);
    }
  CHECK(seen.size() == 9);  // every offset happens

  // The padding is zero before normalization: (0 - mean) / std after it.
  Loader n(ds, {.batch = 1, .seed = 11, .normalize_mean = 1.0, .normalize_std = 2.0, .random_crop_padding = 1});
  bool saw_pad = false;
  for (int epoch = 0; epoch < 50; ++epoch)
    for (auto [x, y] : n) {
      const auto v = x.to_vector();
      for (float f : v) {
        CHECK((f == -0.5f || (f >= 0.0f && f <= 4.0f)));
        saw_pad = saw_pad || f == -0.5f;
      }
    }
  CHECK(saw_pad);

  // Crop and flip together on a bigger batch keep labels with their images.
  const auto many = constant_images(20, 4, 4);
  Loader both(many, {.batch = 6, .shuffle = true, .seed = 2, .random_crop_padding = 2, .hflip = true});
  for (auto [x, y] : both) {
    const auto xs = x.to_vector();
    const auto ys = y.to_vector();
    for (std::size_t i = 0; i < ys.size(); ++i)
      for (std::size_t p = 0; p < 16; ++p) {
        const float f = xs[i * 16 + p];
        CHECK((f == 0.0f || f == float(ys[i] + 1)));
      }
  }
}

TEST_CASE("loader: bad options and datasets are clear errors", "[data]") {
  const auto ds = constant_images(4);
  CHECK_THROWS_AS(Loader(ds, {.batch = 0}), InvalidArgument);
  CHECK_THROWS_WITH(Loader(ds, {.batch = -3}), Catch::Contains("batch must be positive"));
  CHECK_THROWS_WITH(Loader(ds, {.batch = 2, .normalize_std = 0.0}), Catch::Contains("normalize_std"));
  CHECK_THROWS_AS(Loader(ds, {.batch = 2, .normalize_std = -1.0}), InvalidArgument);
  CHECK_THROWS_WITH(Loader(ds, {.batch = 2, .random_crop_padding = -1}), Catch::Contains("random_crop_padding"));
  CHECK_THROWS_AS(Loader(ds, {.batch = 2, .random_crop_padding = 3}), InvalidArgument);  // image is 2x3
  data::ImageDataset<float> flat{Tensor<float>({4, 6}), Tensor<std::int32_t>({4})};
  CHECK_THROWS_WITH(Loader(flat, {.batch = 2}), Catch::Contains("[N, C, H, W]"));
  data::ImageDataset<float> mismatch{Tensor<float>({4, 1, 2, 2}), Tensor<std::int32_t>({3})};
  CHECK_THROWS_WITH(Loader(mismatch, {.batch = 2}), Catch::Contains("labels"));
  Loader ok(ds, {.batch = 2});
  CHECK_THROWS_AS(ok.set_epoch(-1), InvalidArgument);
  CHECK_THROWS_AS(ok.batch(0, ok.order(0), 2), InvalidArgument);
  if constexpr (!built_with_cuda) {
    CHECK_THROWS_WITH(Loader(ds, {.batch = 2, .device = Device::cuda(0)}), Catch::Contains("CUDA"));
  }
}

}  // namespace cutrain_test_loader
