// Tensor<T>: a shape, strides and an offset over shared storage on one device.
// A Tensor owns its storage and is move-only; views (reshape, slice, view) share the storage
// and keep it alive. Copies are explicit: clone(), copy_from(), to(device), contiguous(layout).
#pragma once

#include "cutrain/core/abi.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cutrain/core/device.hpp"
#include "cutrain/core/dtype.hpp"
#include "cutrain/core/error.hpp"
#include "cutrain/core/random.hpp"
#include "cutrain/core/shape.hpp"
#include "cutrain/core/storage.hpp"

namespace cutrain::inline CUTRAIN_ABI {

struct TensorOptions {
  Layout layout = Layout::row_major;  // nchw or nhwc for 4-d tensors
  Device device = Device::cpu();
};

namespace detail {
// Calls fn(logical_index, element_offset) for every element, in logical row-major order.
template <class Fn>
void for_each_offset(const Shape& shape, const Strides& strides, std::int64_t base, Fn&& fn) {
  const int r = shape.rank();
  const std::int64_t n = shape.numel();
  if (n == 0) return;
  std::vector<std::int64_t> idx(static_cast<std::size_t>(r), 0);
  std::int64_t off = base;
  for (std::int64_t i = 0; i < n; ++i) {
    fn(i, off);
    for (int d = r - 1; d >= 0; --d) {
      const auto ud = static_cast<std::size_t>(d);
      if (++idx[ud] < shape[d]) {
        off += strides[ud];
        break;
      }
      off -= strides[ud] * (shape[d] - 1);
      idx[ud] = 0;
    }
  }
}

// Calls fn(offset_a, offset_b) for every element of two equally shaped strided arrays; the
// innermost dimension runs as a plain loop.
template <class Fn>
void for_each_offset2(const Shape& shape, const Strides& sa, const Strides& sb, Fn&& fn) {
  const int r = shape.rank();
  if (shape.numel() == 0) return;
  if (r == 0) return fn(std::int64_t{0}, std::int64_t{0});
  const auto last = static_cast<std::size_t>(r - 1);
  const std::int64_t inner = shape[r - 1], ia = sa[last], ib = sb[last];
  std::vector<std::int64_t> idx(last, 0);
  std::int64_t oa = 0, ob = 0;
  for (;;) {
    for (std::int64_t i = 0; i < inner; ++i) fn(oa + i * ia, ob + i * ib);
    int d = r - 2;
    for (; d >= 0; --d) {
      const auto ud = static_cast<std::size_t>(d);
      if (++idx[ud] < shape[d]) {
        oa += sa[ud];
        ob += sb[ud];
        break;
      }
      oa -= sa[ud] * (shape[d] - 1);
      ob -= sb[ud] * (shape[d] - 1);
      idx[ud] = 0;
    }
    if (d < 0) return;
  }
}
}  // namespace detail

template <class T>
class Tensor {
 public:
  using value_type = T;

  Tensor() = default;
  Tensor(const Shape& shape, TensorOptions opts = {}) { allocate(shape, opts); }
  Tensor(Tensor&&) noexcept = default;
  Tensor& operator=(Tensor&&) noexcept = default;
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;

  // Factories. Host data is given in logical row-major order, whatever the layout.
  // Tensor(shape, opts) leaves device memory uninitialized (host memory is zeroed); zeros() zeroes both.
  // Memory left as the allocator gives it, on the host too: for an op's output that the op writes
  // in full before anything reads it (a pass of zero-filling saved per call).
  static Tensor empty(const Shape& shape, TensorOptions opts = {}) {
    Tensor t;
    t.allocate(shape, opts, /*zero_host=*/false);
    return t;
  }
  static Tensor zeros(const Shape& shape, TensorOptions opts = {}) {
    Tensor t(shape, opts);
    if (!opts.device.is_cpu()) zero_bytes(t.data(), opts.device, static_cast<std::size_t>(t.numel()) * sizeof(T));
    return t;
  }
  static Tensor full(const Shape& shape, T value, TensorOptions opts = {}) {
    Tensor t(shape, opts);
    t.fill(value);
    return t;
  }
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape, TensorOptions opts = {}) {
    check_shape_valid("Tensor::from_vector", shape, sizeof(T));
    CUTRAIN_REQUIRE(static_cast<std::int64_t>(values.size()) == shape.numel(), InvalidArgument,
                    "Tensor::from_vector", "got ", values.size(), " values for shape ", shape);
    Tensor t(shape, opts);
    t.assign(values);
    return t;
  }
  static Tensor uniform(const Shape& shape, Rng& rng, double lo, double hi, TensorOptions opts = {}) {
    check_shape_valid("Tensor::uniform", shape, sizeof(T));
    std::vector<T> v(static_cast<std::size_t>(shape.numel()));
    for (auto& x : v) x = static_cast<T>(rng.uniform(lo, hi));
    return from_vector(v, shape, opts);
  }
  static Tensor randn(const Shape& shape, Rng& rng, double stddev = 1.0, TensorOptions opts = {}) {
    check_shape_valid("Tensor::randn", shape, sizeof(T));
    std::vector<T> v(static_cast<std::size_t>(shape.numel()));
    for (auto& x : v) x = static_cast<T>(stddev * rng.normal());
    return from_vector(v, shape, opts);
  }

  bool defined() const { return storage_ != nullptr; }
  // Bumped by every in-place write through this API (fill, assign, copy_from), shared by views:
  // autograd checks that what it saved is unchanged when backward runs.
  std::uint64_t version() const { return storage_ ? storage_->version() : 0; }
  // Records an in-place write made through data() or a kernel (optimizer steps call it), so that
  // autograd sees it as it sees fill, assign and copy_from.
  void bump_version() {
    require_defined("Tensor::bump_version");
    storage_->bump_version();
  }
  const Shape& shape() const { return shape_; }
  int rank() const { return shape_.rank(); }
  std::int64_t dim(int i) const {
    CUTRAIN_REQUIRE(i >= 0 && i < rank(), InvalidArgument, "Tensor::dim", "dim ", i, " out of range for ", describe(),
                    " of rank ", rank());
    return shape_[i];
  }
  std::int64_t numel() const { return shape_.numel(); }
  const Strides& strides() const { return strides_; }
  std::int64_t offset() const { return offset_; }
  Layout layout() const { return layout_of(shape_, strides_); }
  bool is_contiguous() const { return layout() != Layout::strided; }
  Device device() const { return storage_ ? storage_->device() : Device::cpu(); }
  static constexpr DType dtype() { return dtype_of<T>; }

  // Pointer to the first element (host memory for cpu tensors, device memory for cuda ones).
  T* data() const { return storage_ ? static_cast<T*>(storage_->data()) + offset_ : nullptr; }

  // Element offset (from data()) of the element at a logical row-major index.
  std::int64_t offset_of(std::int64_t logical) const {
    std::int64_t off = 0;
    for (int d = rank() - 1; d >= 0; --d) {
      off += (logical % shape_[d]) * strides_[static_cast<std::size_t>(d)];
      logical /= shape_[d];
    }
    return off;
  }

  // Host element access by logical multi-index (cpu tensors only).
  template <class... I>
  T& operator()(I... idx) const {
    const std::int64_t is[] = {static_cast<std::int64_t>(idx)...};
    constexpr std::string_view op = "Tensor::operator()";
    require_host(op);
    CUTRAIN_REQUIRE(sizeof...(I) == static_cast<std::size_t>(rank()), InvalidArgument, op, "got ", sizeof...(I),
                    " indices for ", describe(), " of rank ", rank());
    std::int64_t off = 0;
    for (std::size_t d = 0; d < sizeof...(I); ++d) {
      CUTRAIN_REQUIRE(is[d] >= 0 && is[d] < shape_.dims()[d], InvalidArgument, op, "index ", is[d],
                      " out of range for dim ", d, " of ", describe());
      off += is[d] * strides_[d];
    }
    return data()[off];
  }
  // Host element access by logical row-major index (cpu tensors only).
  T& flat(std::int64_t logical) const {
    require_host("Tensor::flat");
    CUTRAIN_REQUIRE(logical >= 0 && logical < numel(), InvalidArgument, "Tensor::flat", "index ", logical,
                    " out of range for ", describe(), " of ", numel(), " elements");
    return data()[offset_of(logical)];
  }

  std::string describe() const {
    if (!defined()) return "an undefined tensor";
    return detail::cat(dtype(), shape_, " ", layout(), " ", device());
  }

  // All elements, in logical row-major order, on the host.
  std::vector<T> to_vector() const {
    require_defined("Tensor::to_vector");
    std::vector<T> out(static_cast<std::size_t>(numel()));
    if (numel() == 0) return out;
    if (device().is_cpu()) {
      const T* base = data();
      detail::for_each_offset(shape_, strides_, 0, [&](std::int64_t i, std::int64_t off) { out[static_cast<std::size_t>(i)] = base[off]; });
      return out;
    }
    Tensor host = Tensor(Shape{span()}, {.device = Device::cpu()});
    copy_bytes(host.data(), Device::cpu(), data() + min_offset(), device(), static_cast<std::size_t>(span()) * sizeof(T));
    const T* base = host.data() - min_offset();
    detail::for_each_offset(shape_, strides_, 0, [&](std::int64_t i, std::int64_t off) { out[static_cast<std::size_t>(i)] = base[off]; });
    return out;
  }

  // Writes values given in logical row-major order into this tensor's elements.
  void assign(const std::vector<T>& values) {
    require_defined("Tensor::assign");
    CUTRAIN_REQUIRE(static_cast<std::int64_t>(values.size()) == numel(), InvalidArgument, "Tensor::assign",
                    "got ", values.size(), " values for ", describe());
    storage_->bump_version();
    if (device().is_cpu() || !is_contiguous()) {
      CUTRAIN_REQUIRE(device().is_cpu(), NotImplemented, "Tensor::assign", "strided writes to ", describe());
      T* base = data();
      detail::for_each_offset(shape_, strides_, 0, [&](std::int64_t i, std::int64_t off) { base[off] = values[static_cast<std::size_t>(i)]; });
      return;
    }
    Tensor host(shape_, {.layout = layout() == Layout::nhwc ? Layout::nhwc : Layout::row_major});
    host.assign(values);
    copy_bytes(data(), device(), host.data(), Device::cpu(), static_cast<std::size_t>(numel()) * sizeof(T));
  }

  void fill(T value) {
    require_defined("Tensor::fill");
    storage_->bump_version();
    if (device().is_cpu()) {
      T* base = data();
      detail::for_each_offset(shape_, strides_, 0, [&](std::int64_t, std::int64_t off) { base[off] = value; });
    } else {
      assign(std::vector<T>(static_cast<std::size_t>(numel()), value));
    }
  }

  // Copies src's elements (same shape, any layout or device) into this tensor.
  void copy_from(const Tensor& src) {
    require_defined("Tensor::copy_from");
    CUTRAIN_REQUIRE(src.defined(), InvalidArgument, "Tensor::copy_from", "the source is an undefined tensor (destination ",
                    describe(), ")");
    CUTRAIN_REQUIRE(src.shape() == shape_, InvalidArgument, "Tensor::copy_from", "source ", src.describe(),
                    " and destination ", describe(), " differ in shape");
    storage_->bump_version();
    if (numel() == 0) return;  // nothing to copy (and an empty tensor's data may be null)
    if (device().is_cpu() && src.device().is_cpu()) {
      T* dst = data();
      const T* s = src.data();
      if (is_contiguous() && src.layout() == layout()) {
        std::memmove(static_cast<void*>(dst), s, static_cast<std::size_t>(numel()) * sizeof(T));  // views may overlap
        return;
      }
      if (storage_ == src.storage_) {  // views of one storage may overlap: read all before writing
        assign(src.to_vector());
        return;
      }
      detail::for_each_offset2(shape_, strides_, src.strides_, [&](std::int64_t od, std::int64_t os) { dst[od] = s[os]; });
      return;
    }
    if (src.layout() == layout() && is_contiguous()) {
      copy_bytes(data(), device(), src.data(), src.device(), static_cast<std::size_t>(numel()) * sizeof(T));
      return;
    }
    // Between two layouts of one GPU: the backend's kernel on the current stream, where it has
    // one (overlapping views of one storage excepted: they go through the host, which reads all
    // before it writes).
    const auto strided_copy = detail::device_backend_slot().strided_copy;
    if (strided_copy && src.device() == device() && rank() <= 8 && storage_ != src.storage_) {
      if (numel() == 0) return;
      detail::StridedCopy c{.dst = data(), .src = src.data(), .elem_bytes = sizeof(T), .device = device().index};
      c.dims.rank = rank();
      for (int d = 0; d < rank(); ++d) {
        const auto k = static_cast<std::size_t>(d);
        c.dims.shape[k] = shape_[d];
        c.dims.dst[k] = strides_[k];
        c.dims.src[k] = src.strides_[k];
      }
      strided_copy(c);
      return;
    }
    assign(src.to_vector());
  }

  // A copy in its own storage, contiguous in the given layout (default: this one's, channels-last
  // wherever is_channels_last says so, or row-major/nchw when this one is strided).
  Tensor clone(Layout l = Layout::strided) const {
    require_defined("Tensor::clone");
    return copy_to(device(), l);
  }
  Tensor to(Device dev) const {
    require_defined("Tensor::to");
    return copy_to(dev, Layout::strided);
  }
  Tensor contiguous(Layout l) const {
    require_defined("Tensor::contiguous");
    if (l == Layout::nhwc && is_channels_last(shape_, strides_)) return view();
    if (layout() == l || (l == Layout::row_major && layout() == Layout::nchw)) {
      // One channel (or H = W = 1) with NHWC strides asked for NCHW: the same memory, NCHW strides.
      if (l != Layout::nhwc && is_channels_last(shape_, strides_))
        return as_strided(shape_, contiguous_strides(shape_, Layout::row_major), offset_);
      return view();
    }
    return copy_to(device(), l);
  }

  // Views share storage.
  // Whether another tensor (a view) holds this one's storage too.
  bool shares_storage() const { return storage_ && storage_.use_count() > 1; }
  Tensor view() const {
    Tensor t;
    t.storage_ = storage_;
    t.shape_ = shape_;
    t.strides_ = strides_;
    t.offset_ = offset_;
    return t;
  }
  // Contiguous (row-major, nchw or nhwc): a view; else a row-major copy on this tensor's device
  // (a cuda tensor through the backend's strided-copy kernel, never through the host).
  Tensor contiguous() const { return is_contiguous() ? view() : copy_to(device(), Layout::row_major); }
  // A view of the same storage with any shape, strides (in elements, 0 and negative allowed) and
  // storage offset, checked to stay inside the storage. The general views (core/view.hpp) are
  // built on it.
  Tensor as_strided(const Shape& shape, const Strides& strides, std::int64_t offset) const {
    constexpr std::string_view op = "Tensor::as_strided";
    CUTRAIN_REQUIRE(defined(), InvalidArgument, op, "the tensor is undefined (default-constructed)");
    check_shape_valid(op, shape);
    CUTRAIN_REQUIRE(static_cast<int>(strides.size()) == shape.rank(), InvalidArgument, op, "shape ", shape, " and strides ",
                    strides_str(strides), " differ in rank");
    const auto elems = static_cast<std::int64_t>(storage_->bytes() / sizeof(T));
    std::int64_t lo = offset, hi = offset, n = 1;
    bool overflow = false;
    for (int d = 0; d < shape.rank(); ++d) {
      std::int64_t reach = 0;
      overflow = overflow || __builtin_mul_overflow(strides[static_cast<std::size_t>(d)], std::max<std::int64_t>(shape[d] - 1, 0), &reach) ||
                 __builtin_add_overflow(reach < 0 ? lo : hi, reach, reach < 0 ? &lo : &hi) || __builtin_mul_overflow(n, shape[d], &n);
    }
    CUTRAIN_REQUIRE(!overflow && (n == 0 ? 0 <= offset && offset <= elems : 0 <= lo && hi < elems), InvalidArgument, op,
                    "shape ", shape, ", strides ", strides_str(strides), " and offset ", offset,
                    " reach outside the storage of ", elems, " elements under ", describe());
    Tensor t = view();
    t.shape_ = shape;
    t.strides_ = strides;
    t.offset_ = offset;
    return t;
  }
  Tensor reshape(const Shape& shape) const {
    require_defined("Tensor::reshape");
    check_shape_valid("Tensor::reshape", shape);
    CUTRAIN_REQUIRE(shape.numel() == numel(), InvalidArgument, "Tensor::reshape", "cannot reshape ", describe(),
                    " to ", shape, ": element counts differ");
    const Layout l = layout();
    CUTRAIN_REQUIRE(l == Layout::row_major || l == Layout::nchw, InvalidArgument, "Tensor::reshape",
                    "needs a row-major (nchw) contiguous tensor, got ", describe(), "; call contiguous(Layout::nchw) first");
    Tensor t = view();
    t.shape_ = shape;
    t.strides_ = contiguous_strides(shape, Layout::row_major);
    return t;
  }
  Tensor slice(int dim, std::int64_t begin, std::int64_t end) const {
    require_defined("Tensor::slice");
    CUTRAIN_REQUIRE(dim >= 0 && dim < rank(), InvalidArgument, "Tensor::slice", "dim ", dim, " out of range for ", describe());
    CUTRAIN_REQUIRE(0 <= begin && begin <= end && end <= shape_[dim], InvalidArgument, "Tensor::slice", "range [", begin, ",",
                    end, ") out of bounds for dim ", dim, " of ", describe());
    Tensor t = view();
    t.shape_[dim] = end - begin;
    // An empty view starts where this tensor does (its offset is never read), so that it stays
    // inside the storage, as core/view.hpp's slice does.
    if (t.shape_.numel() > 0) t.offset_ += begin * strides_[static_cast<std::size_t>(dim)];
    return t;
  }

 private:
  void allocate(const Shape& shape, const TensorOptions& opts, bool zero_host = true) {
    check_shape_valid("Tensor", shape, sizeof(T));
    Layout l = opts.layout;
    if (l == Layout::nchw && shape.rank() != 4) l = Layout::row_major;
    CUTRAIN_REQUIRE(l != Layout::strided, InvalidArgument, "Tensor", "cannot allocate with layout strided");
    CUTRAIN_REQUIRE(l != Layout::nhwc || shape.rank() == 4, InvalidArgument, "Tensor", "layout nhwc needs a 4-d shape, got ", shape);
    shape_ = shape;
    strides_ = contiguous_strides(shape, l);
    offset_ = 0;
    storage_ = std::make_shared<Storage>(static_cast<std::size_t>(shape.numel()) * sizeof(T), opts.device, zero_host);
  }
  Tensor copy_to(Device dev, Layout l) const {
    if (l == Layout::strided) l = is_channels_last(shape_, strides_) ? Layout::nhwc : Layout::row_major;
    Tensor t(shape_, {.layout = l, .device = dev});
    t.copy_from(*this);
    return t;
  }
  void require_defined(std::string_view op) const {
    CUTRAIN_REQUIRE(defined(), InvalidArgument, op, "the tensor is undefined (default-constructed or moved from)");
  }
  void require_host(std::string_view op) const {
    require_defined(op);
    CUTRAIN_REQUIRE(device().is_cpu(), DeviceError, op, "host element access to ", describe(), ": copy it with to(Device::cpu()) first");
  }
  std::int64_t min_offset() const {
    std::int64_t m = 0;
    for (int d = 0; d < rank(); ++d)
      if (strides_[static_cast<std::size_t>(d)] < 0) m += strides_[static_cast<std::size_t>(d)] * (shape_[d] - 1);
    return m;
  }
  std::int64_t span() const {
    std::int64_t lo = 0, hi = 0;
    for (int d = 0; d < rank(); ++d) {
      const auto s = strides_[static_cast<std::size_t>(d)] * (shape_[d] - 1);
      (s < 0 ? lo : hi) += s;
    }
    return numel() == 0 ? 0 : hi - lo + 1;
  }

  std::shared_ptr<Storage> storage_;
  Shape shape_;
  Strides strides_;
  std::int64_t offset_ = 0;
};

}  // namespace cutrain::inline CUTRAIN_ABI
