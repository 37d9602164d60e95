// index_select and gather on the GPU (NVRTC kernels, index.cuh), forward and backward, with the
// semantics of cpu/index.hpp, and the range check of an index. x, dy and the index are read in
// place through their strides (never staged, never through the host); outputs are contiguous
// row-major tensors the caller allocates. The caller (ops/index.hpp) has checked shapes and index
// values. Backward is deterministic: each dx element sums the dy positions its index names in
// index order. gather's scans the index along dim per dx element (O(dx elements x index
// positions)); index_select's reads the index once per row of dx and tile of up to 512 of its
// elements (O(rows x index positions), a block per row; see docs/ops/shape_ops.md). embedding:
// the dense fast path of a token lookup (rows of a table, a position row added), for
// deploy::GptEngine.
#pragma once

#include "cutrain/core/abi.hpp"

#ifndef CUTRAIN_WITH_CUDA
#error "cutrain/cuda/ needs CUTRAIN_WITH_CUDA (link cutrain::cuda)"
#endif

#include <cstdint>
#include <algorithm>
#include <concepts>
#include <cstring>
#include <string_view>
#include <utility>
#include <vector>

#include "cutrain/core/storage.hpp"
#include "cutrain/cuda/gpu_float.hpp"
#include "cutrain/cuda/kernels/nvrtc.hpp"
#include "cutrain/cuda/kernels/programs.hpp"  // programs::index, the kernels of index.cuh

namespace cutrain::inline CUTRAIN_ABI::cuda::kernels {

namespace detail {
// cutrain_index_args of index.cuh, field for field.
struct IndexArgs {
  long long n, rank, dim;
  long long size[8], a_stride[8], idx_stride[8], idx_size[8];
  long long limit;  // x's size along dim (forward)
};
static_assert(sizeof(IndexArgs) == 36 * sizeof(long long));

// The args of a kernel that walks one index tensor (any strides) element by element.
template <class I>
IndexArgs walk_index_args(const Tensor<I>& index) {
  IndexArgs a{};
  a.n = index.numel();
  a.rank = index.rank();
  for (int d = 0; d < index.rank(); ++d) {
    a.size[d] = index.dim(d);
    a.idx_stride[d] = index.strides()[static_cast<std::size_t>(d)];
  }
  return a;
}

template <GpuFloat T>
const Program& index_program() {
  static const Program p = programs::index(device_type<T>);
  return p;
}

// index_select's backward for an embedding table of at least this many rows (dim 0, dense rows,
// a 1-d dense index): the positions sorted by row first (index.cuh's cutrain_embedding_grad_*),
// O(positions + rows) instead of every row walking the whole index. Below it (a character
// vocabulary: few rows, each named often) the block-per-row kernel is the faster.
inline constexpr std::int64_t embedding_grad_min_rows = 4096;

template <GpuFloat T>
void embedding_grad(const Tensor<T>& dy, const Tensor<std::int32_t>& index, Tensor<T>& dx) {
  constexpr std::string_view op = "cuda::kernels::index_select_backward";
  const long long n = index.numel(), num = dx.dim(0), C = dx.dim(1);
  const Device dev = dy.device();
  const int d = dev.index;
  DeviceScope scope(d);
  Tensor<std::int32_t> counts(Shape{2 * num + 1}, {.device = dev});  // counts, then the cursors
  Tensor<std::int32_t> offsets(Shape{num + 1}, {.device = dev}), order(Shape{std::max(n, 1LL)}, {.device = dev});
  zero_bytes(counts.data(), dev, static_cast<std::size_t>(2 * num + 1) * sizeof(std::int32_t));
  const Program& prog = index_program<T>();
  const int* idx = index.data();
  int* cnt = counts.data();
  int* cursor = counts.data() + num;
  launch(function(d, prog, "cutrain_embedding_grad_count"), grid_for(std::max(n, 1LL)), 256, op, idx, n, num, cnt);
  launch(function(d, prog, "cutrain_embedding_grad_scan"), 1, 1024, op, static_cast<const int*>(cnt), num, offsets.data());
  launch(function(d, prog, "cutrain_embedding_grad_place"), grid_for(std::max(n, 1LL)), 256, op, idx, n, num,
         static_cast<const int*>(offsets.data()), cursor, order.data());
  launch(function(d, prog, "cutrain_embedding_grad_rows"), static_cast<unsigned>(std::min<long long>(num, 1 << 20)), 256,
         op, dy.data(), idx, n, static_cast<const int*>(offsets.data()), static_cast<const int*>(order.data()), dx.data(),
         num, C);
}

// Arguments for walking `walked` (the output forward, dx backward), reading x or dy at its
// coordinates through a_strides, and the index through its strides (and shape).
inline IndexArgs index_args(std::string_view op, const Shape& walked, int dim, const Strides& a_strides,
                            const Tensor<std::int32_t>& index) {
  CUTRAIN_REQUIRE(walked.rank() >= 1 && walked.rank() <= 8 && index.rank() <= 8, InvalidArgument, op,
                  "the kernels take rank 1 to 8, got shape ", walked, " and index ", index.describe());
  IndexArgs a{};
  a.n = walked.numel();
  a.rank = walked.rank();
  a.dim = dim;
  for (int d = 0; d < walked.rank(); ++d) {
    const auto k = static_cast<std::size_t>(d);
    a.size[k] = walked[d];
    a.a_stride[k] = a_strides[k];
  }
  for (int d = 0; d < index.rank(); ++d) {
    const auto k = static_cast<std::size_t>(d);
    a.idx_stride[k] = index.strides()[k];
    a.idx_size[k] = index.dim(d);
  }
  return a;
}

template <GpuFloat T, class... Args>
void launch_index(std::string_view op, std::string_view kernel, const IndexArgs& a, Device device, const Args&... args) {
  if (a.n == 0) return;
  DeviceScope scope(device.index);
  launch(function(device.index, index_program<T>(), kernel), grid_for(a.n), 256, op, args..., a);
}

template <class T>
void require_row_major_output(std::string_view op, const Tensor<T>& t, const Shape& shape, Device device,
                              std::string_view name) {
  require_output(op, t, shape, device, name);
  CUTRAIN_REQUIRE(t.layout() != Layout::nhwc || t.numel() <= 1, InvalidArgument, op, name, " must be row-major, got ",
                  t.describe());
}
}  // namespace detail

// Queues the count of index values outside [0, limit) into report (int32 [4] on index's device,
// read as two 64-bit values: the count and one of the values, any one), zeroing it first. Nothing
// is read back: capturable in a CUDA graph.
inline void index_range_count(const Tensor<std::int32_t>& index, std::int64_t limit, Tensor<std::int32_t>& report) {
  constexpr std::string_view op = "cuda::kernels::index_range_count";
  detail::require_cuda_input(op, index, "index");
  detail::require_output(op, report, Shape{4}, index.device(), "report");
  CUTRAIN_REQUIRE(reinterpret_cast<std::uintptr_t>(report.data()) % 8 == 0, InvalidArgument, op,
                  "report must be 8-byte aligned (the kernel adds to it as 64-bit values), got ", report.describe());
  CUTRAIN_REQUIRE(index.rank() <= 8, InvalidArgument, op, "the kernel takes rank 0 to 8, got ", index.describe());
  cutrain::zero_bytes(report.data(), report.device(), 4 * sizeof(std::int32_t));
  if (index.numel() == 0) return;
  const detail::IndexArgs a = detail::walk_index_args(index);
  const int* id = index.data();
  auto* rd = reinterpret_cast<unsigned long long*>(report.data());
  detail::launch_index<float>(op, "cutrain_index_check", a, index.device(), id, static_cast<long long>(limit), rd);
}

// index_range_count's report read on the host (a stream synchronization): {count, a value}.
inline std::pair<std::int64_t, std::int64_t> read_index_report(const Tensor<std::int32_t>& report) {
  const std::vector<std::int32_t> host = report.to_vector();
  std::int64_t r[2];
  std::memcpy(r, host.data(), sizeof r);
  return {r[0], r[1]};
}

// How many values of index lie outside [0, limit), and one of them (any one). Reads 16 bytes
// back to the host: synchronizes the current stream.
inline std::pair<std::int64_t, std::int64_t> index_range_check(const Tensor<std::int32_t>& index, std::int64_t limit) {
  if (index.numel() == 0) return {0, 0};
  Tensor<std::int32_t> report(Shape{4}, {.device = index.device()});
  index_range_count(index, limit, report);
  return read_index_report(report);
}

// out (int32, index's shape, dense row-major) = index (int32 or int64, any strides), each value
// v as w = v (+ wrap when v < 0 and wrap > 0); a w outside [lo, hi) becomes fallback. report
// (int64 [3] on index's device, zeroed first) gets the count of such values, the first one's v
// and its row-major position. Nothing is read back: capturable in a CUDA graph.
template <class I>
  requires std::same_as<I, std::int32_t> || std::same_as<I, std::int64_t>
void index_narrow(const Tensor<I>& index, std::int64_t lo, std::int64_t hi, std::int64_t wrap, std::int32_t fallback,
                  Tensor<std::int32_t>& out, Tensor<std::int64_t>& report) {
  constexpr std::string_view op = "cuda::kernels::index_narrow";
  detail::require_cuda_input(op, index, "index");
  detail::require_row_major_output(op, out, index.shape(), index.device(), "out");
  detail::require_output(op, report, Shape{3}, index.device(), "report");
  CUTRAIN_REQUIRE(index.rank() <= 8, InvalidArgument, op, "the kernel takes rank 0 to 8, got ", index.describe());
  cutrain::zero_bytes(report.data(), report.device(), 3 * sizeof(std::int64_t));
  if (index.numel() == 0) return;
  const detail::IndexArgs a = detail::walk_index_args(index);
  const I* id = index.data();
  int* od = out.data();
  auto* rd = reinterpret_cast<unsigned long long*>(report.data());
  const long long lo_ll = lo, hi_ll = hi, wrap_ll = wrap;
  const int fb = fallback;
  const std::string_view kernel = sizeof(I) == 8 ? "cutrain_index_narrow64" : "cutrain_index_narrow32";
  detail::launch_index<float>(op, kernel, a, index.device(), id, od, lo_ll, hi_ll, wrap_ll, fb, rd);
}

// y = x with position j of dim taken from position index[j] (index 1-d). y: row-major.
template <GpuFloat T>
void index_select(const Tensor<T>& x, int dim, const Tensor<std::int32_t>& index, Tensor<T>& y) {
  constexpr std::string_view op = "cuda::kernels::index_select";
  detail::require_cuda_input(op, x, "x");
  detail::require_cuda_input(op, index, "index");
  Shape s = x.shape();
  s[dim] = index.numel();
  detail::require_row_major_output(op, y, s, x.device(), "y");
  auto a = detail::index_args(op, s, dim, x.strides(), index);
  a.limit = x.dim(dim);
  const T* xd = x.data();
  const int* id = index.data();
  T* yd = y.data();
  detail::launch_index<T>(op, "cutrain_index_select", a, x.device(), xd, id, yd);
}

// An embedding lookup: y [R, C] = table[index[r]] (+ pos[r % pos.dim(0)] when pos is defined) for
// index int32 [R], table [V, C] and pos [P, C], all dense row-major on one device. A token outside
// [0, V) gives a NaN row (check the index with index_range_count). One kernel: the position add
// rides on the lookup.
template <GpuFloat T>
void embedding(const Tensor<T>& table, const Tensor<std::int32_t>& index, const Tensor<T>& pos, Tensor<T>& y) {
  constexpr std::string_view op = "cuda::kernels::embedding";
  const auto dense = [](const auto& t) { return t.layout() == Layout::row_major || t.numel() <= 1; };
  detail::require_cuda_input(op, table, "table");
  detail::require_cuda_input(op, index, "index");
  CUTRAIN_REQUIRE(table.rank() == 2 && dense(table) && index.rank() == 1 && dense(index), InvalidArgument, op,
                  "table must be a row-major [V, C] and index a dense [R], got ", table.describe(), " and ",
                  index.describe());
  const std::int64_t R = index.dim(0), C = table.dim(1);
  CUTRAIN_REQUIRE(!pos.defined() || (pos.rank() == 2 && pos.dim(1) == C && pos.dim(0) > 0 && dense(pos)), InvalidArgument,
                  op, "pos must be a row-major [P, ", C, "], got ", pos.describe());
  CUTRAIN_REQUIRE(index.device() == table.device() && (!pos.defined() || pos.device() == table.device()), DeviceError,
                  op, "table ", table.describe(), ", index ", index.describe(), " and pos must be on one device");
  detail::require_row_major_output(op, y, Shape{R, C}, table.device(), "y");
  if (R == 0 || C == 0) return;
  constexpr std::int64_t V = 16 / sizeof(T);
  const auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  const bool vec = C % V == 0 && aligned(table.data()) && aligned(y.data()) && (!pos.defined() || aligned(pos.data()));
  const int dev = table.device().index;
  DeviceScope scope(dev);
  const T* td = table.data();
  const T* pd = pos.defined() ? pos.data() : nullptr;
  const int* id = index.data();
  T* yd = y.data();
  const long long period = pos.defined() ? pos.dim(0) : 1;
  launch(function(dev, detail::index_program<T>(), vec ? "cutrain_embedding_vec" : "cutrain_embedding"),
         grid_for(R * (vec ? C / V : C)), 256u, op, td, pd, id, yd, static_cast<long long>(R), static_cast<long long>(C),
         period, static_cast<long long>(table.dim(0)));
}

// dx (row-major, x's shape) = zeros + dy at positions j added into position index[j] of dim.
template <GpuFloat T>
void index_select_backward(const Tensor<T>& dy, int dim, const Tensor<std::int32_t>& index, Tensor<T>& dx) {
  constexpr std::string_view op = "cuda::kernels::index_select_backward";
  detail::require_cuda_input(op, dy, "dy");
  detail::require_cuda_input(op, index, "index");
  CUTRAIN_REQUIRE(dx.defined(), InvalidArgument, op, "dx is an undefined tensor");
  detail::require_row_major_output(op, dx, dx.shape(), dy.device(), "dx");
  const auto a = detail::index_args(op, dx.shape(), dim, dy.strides(), index);
  if (a.n == 0) return;
  if (dim == 0 && dx.rank() == 2 && index.rank() == 1 && index.is_contiguous() && dy.is_contiguous() &&
      dx.dim(0) >= detail::embedding_grad_min_rows) {
    detail::embedding_grad(dy, index, dx);
    return;
  }
  // One block per (row, tile, chunk) of dx viewed as [outer, num, inner] and of the index
  // (index.cuh): 128 threads of 4 columns each cover a row of up to 512 elements in one tile.
  // Few rows (a character vocabulary) would leave most SMs idle and put a frequent index's whole
  // sum on one block: the index is then cut into chunks of at least 256 positions, enough for
  // about 2048 blocks, their f32 sums (at most 16M floats) added in order by a second kernel.
  std::int64_t inner = 1;
  for (int d = dim + 1; d < dx.rank(); ++d) inner *= dx.dim(d);
  const unsigned threads = inner <= 512 ? 128 : 256;
  const std::int64_t tiles = (inner + 4 * threads - 1) / (4 * threads), work = a.n / inner * tiles;
  const std::int64_t n_idx = index.numel();
  std::int64_t chunks = std::min<std::int64_t>({(2048 + work - 1) / work, (n_idx + 255) / 256, (std::int64_t{1} << 24) / a.n});
  chunks = std::max<std::int64_t>(chunks, 1);
  std::int64_t chunk = (n_idx + chunks - 1) / chunks;
  chunk = std::max<std::int64_t>((chunk + threads - 1) / threads * threads, threads);
  chunks = (n_idx + chunk - 1) / chunk;
  const auto blocks = static_cast<unsigned>(std::min<std::int64_t>(work * chunks, std::int64_t{1} << 20));
  Tensor<float> partial;
  if (chunks > 1) partial = Tensor<float>(Shape{chunks, a.n}, {.device = dy.device()});
  const T* dyd = dy.data();
  const int* id = index.data();
  T* dxd = dx.data();
  float* pd = chunks > 1 ? partial.data() : nullptr;
  const long long chunk_ll = chunk;
  DeviceScope scope(dy.device().index);
  launch(function(dy.device().index, detail::index_program<T>(), "cutrain_index_select_backward"), blocks, threads, op,
         dyd, id, dxd, pd, chunk_ll, a);
  if (chunks == 1) return;
  const long long n = a.n, chunks_ll = chunks;
  launch(function(dy.device().index, detail::index_program<T>(), "cutrain_index_partial_sum"), grid_for(a.n), 256, op,
         pd, dxd, n, chunks_ll);
}

// y (index's shape, row-major) = x with coordinate dim replaced by the index value.
template <GpuFloat T>
void gather(const Tensor<T>& x, int dim, const Tensor<std::int32_t>& index, Tensor<T>& y) {
  constexpr std::string_view op = "cuda::kernels::gather";
  detail::require_cuda_input(op, x, "x");
  detail::require_cuda_input(op, index, "index");
  detail::require_row_major_output(op, y, index.shape(), x.device(), "y");
  auto a = detail::index_args(op, index.shape(), dim, x.strides(), index);
  a.limit = x.dim(dim);
  const T* xd = x.data();
  const int* id = index.data();
  T* yd = y.data();
  detail::launch_index<T>(op, "cutrain_gather", a, x.device(), xd, id, yd);
}

// dx (row-major, x's shape) = zeros + dy at c added at (c with coordinate dim = index at c).
template <GpuFloat T>
void gather_backward(const Tensor<T>& dy, int dim, const Tensor<std::int32_t>& index, Tensor<T>& dx) {
  constexpr std::string_view op = "cuda::kernels::gather_backward";
  detail::require_cuda_input(op, dy, "dy");
  detail::require_cuda_input(op, index, "index");
  CUTRAIN_REQUIRE(dx.defined() && dx.rank() == index.rank(), InvalidArgument, op, "dx must have the index's rank, got ",
                  dx.defined() ? dx.describe() : std::string("an undefined tensor"));
  detail::require_row_major_output(op, dx, dx.shape(), dy.device(), "dx");
  const auto a = detail::index_args(op, dx.shape(), dim, dy.strides(), index);
  const T* dyd = dy.data();
  const int* id = index.data();
  T* dxd = dx.data();
  detail::launch_index<T>(op, "cutrain_gather_backward", a, dy.device(), dyd, id, dxd);
}

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::kernels
