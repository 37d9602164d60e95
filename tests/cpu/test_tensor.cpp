// Tensor<T>: layouts, views, copies, host round trips and bad input.
#include "gradcheck.hpp"

#include "cutrain/core/cast.hpp"
#include "cutrain/core/tensor.hpp"

namespace cutrain_test_tensor {  // one per file: the unity build compiles files together

using namespace cutrain;
using cutrain::test::random;

TEST_CASE("tensor: nchw and nhwc strides, logical order round trip") {
  Rng rng(1);
  auto a = random({2, 3, 4, 5}, rng, Layout::nchw);
  CHECK(a.layout() == Layout::nchw);
  CHECK(a.strides() == Strides{60, 20, 5, 1});
  auto b = a.contiguous(Layout::nhwc);
  CHECK(b.layout() == Layout::nhwc);
  CHECK(b.strides() == Strides{60, 1, 15, 3});
  CHECK(a.to_vector() == b.to_vector());
  CHECK(b(1, 2, 3, 4) == a(1, 2, 3, 4));
  CHECK(b.data()[1 * 60 + 3 * 15 + 4 * 3 + 2] == a(1, 2, 3, 4));
}

TEST_CASE("tensor: is_channels_last where one channel makes both layouts the same memory") {
  const Shape one{2, 1, 4, 4}, three{2, 3, 4, 4}, flat{2, 3, 1, 1};
  Tensor<float> a(one, {.layout = Layout::nhwc}), b(one, {.layout = Layout::nchw}), c(three, {.layout = Layout::nhwc});
  Tensor<float> d(three, {.layout = Layout::nchw}), e(flat, {.layout = Layout::nhwc}), f(flat, {.layout = Layout::nchw});
  CHECK(a.layout() == Layout::nchw);  // layout() cannot tell: NCHW comes first
  CHECK(is_channels_last(a.shape(), a.strides()));
  CHECK_FALSE(is_channels_last(b.shape(), b.strides()));
  CHECK(is_channels_last(c.shape(), c.strides()));
  CHECK_FALSE(is_channels_last(d.shape(), d.strides()));
  CHECK(is_channels_last(e.shape(), e.strides()));
  CHECK_FALSE(is_channels_last(f.shape(), f.strides()));
  CHECK_FALSE(is_channels_last(Shape{4, 4}, Strides{4, 1}));
  a.fill(1.5f);
  const auto h = cast<bfloat16>(a);  // a cast keeps the strides that were asked for
  CHECK(h.strides() == a.strides());
  CHECK(cast<float>(b).strides() == b.strides());
  CHECK(a.clone().strides() == a.strides());  // and so does a copy
  CHECK(a.to(Device::cpu()).strides() == a.strides());
  const auto an = a.contiguous(Layout::nchw);  // asked for NCHW: NCHW strides, the same memory
  CHECK_FALSE(is_channels_last(an.shape(), an.strides()));
  CHECK(an.data() == a.data());
  CHECK(a.contiguous(Layout::nhwc).data() == a.data());  // already NHWC: a view, not a copy
}

TEST_CASE("tensor: views share storage, clones do not") {
  auto a = Tensor<float>::from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  auto v = a.reshape({3, 2});
  v(0, 1) = 20;
  CHECK(a(0, 1) == 20);
  auto s = a.slice(1, 1, 3);
  CHECK(s.shape() == Shape{2, 2});
  CHECK(s.layout() == Layout::strided);
  CHECK(s.to_vector() == std::vector<float>{20, 3, 5, 6});
  auto c = s.clone();
  c(0, 0) = -1;
  CHECK(a(0, 1) == 20);
  CHECK(c.layout() == Layout::row_major);
}

TEST_CASE("tensor: fill, copy_from across layouts, move-only ownership") {
  Rng rng(2);
  auto a = random({1, 2, 3, 3}, rng, Layout::nhwc);
  Tensor<double> b({1, 2, 3, 3});
  b.copy_from(a);
  CHECK(b.to_vector() == a.to_vector());
  b.fill(2.5);
  for (auto v : b.to_vector()) CHECK(v == 2.5);
  Tensor<double> moved = std::move(b);
  CHECK(moved.defined());
  CHECK_FALSE(b.defined());
  CHECK(Shape{}.numel() == 1);
}

TEST_CASE("tensor: bad input throws InvalidArgument naming the op") {
  using cutrain::test::random;
  CUTRAIN_REQUIRE_THROWS_OP(Tensor<float>(Shape{2, -1}), InvalidArgument, "Tensor");
  CUTRAIN_REQUIRE_THROWS_OP(Tensor<float>(Shape{2, 3}, {.layout = Layout::nhwc}), InvalidArgument, "Tensor");
  CUTRAIN_REQUIRE_THROWS_OP(Tensor<float>::from_vector({1, 2, 3}, {2, 2}), InvalidArgument, "Tensor::from_vector");
  auto a = Tensor<float>::zeros({2, 3});
  CUTRAIN_REQUIRE_THROWS_OP(a.reshape({4, 2}), InvalidArgument, "Tensor::reshape");
  CUTRAIN_REQUIRE_THROWS_OP(a.slice(2, 0, 1), InvalidArgument, "Tensor::slice");
  CUTRAIN_REQUIRE_THROWS_OP(a.slice(1, 2, 4), InvalidArgument, "Tensor::slice");
  CUTRAIN_REQUIRE_THROWS_OP(a.slice(1, 0, 2).reshape({4}), InvalidArgument, "Tensor::reshape");
  Tensor<float> b({3, 2});
  CUTRAIN_REQUIRE_THROWS_OP(b.copy_from(a), InvalidArgument, "Tensor::copy_from");
}

TEST_CASE("tensor: cuda tensors without CUDA throw DeviceError") {
  if constexpr (!built_with_cuda) {
    CUTRAIN_REQUIRE_THROWS_OP(Tensor<float>(Shape{2}, {.device = Device::cuda(0)}), DeviceError, "Storage");
    auto a = Tensor<float>::zeros({2});
    CUTRAIN_REQUIRE_THROWS_OP(a.to(Device::cuda(0)), DeviceError, "Storage");
  } else {
    WARN("built with CUDA: the no-CUDA path is not exercised by this binary");
  }
}

}  // namespace cutrain_test_tensor
