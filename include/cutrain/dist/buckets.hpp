// dist::assign_buckets: which gradients are all-reduced together, as PyTorch DDP groups them.
//
//   std::vector<dist::ParamSpec> ps{{.numel = 4096, .dtype = DType::f32}, ...};  // registration order
//   auto buckets = dist::assign_buckets(ps, {.cap_bytes = 25 << 20});
//   // buckets[0].params: the parameters registered last (their gradients are ready first)
//
// Parameters are taken in reverse order of registration (the order backward produces their
// gradients). Each dtype has one open bucket; a parameter joins its dtype's open bucket when the
// bucket stays within the cap, else that bucket closes and a new one opens with it. A parameter
// at least as large as the cap gets a bucket of its own. The first bucket of each dtype has the
// smaller cap first_cap_bytes (1 MiB, as DDP's), so the first all-reduce starts early.
// Unlike DDP, which closes a bucket once it reaches the cap (so its buckets can exceed it), a
// bucket here never exceeds its cap unless it holds one parameter alone.
// Buckets come out in the order they were opened; offsets are in elements, within the bucket's
// flat buffer, each parameter's start aligned to `align_elems` elements.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "cutrain/core/dtype.hpp"
#include "cutrain/core/error.hpp"

namespace cutrain::inline CUTRAIN_ABI::dist {

struct ParamSpec {
  std::int64_t numel = 0;
  DType dtype = DType::f32;
};

struct BucketOptions {
  std::size_t cap_bytes = std::size_t{25} << 20;       // DDP's bucket_cap_mb = 25
  std::size_t first_cap_bytes = std::size_t{1} << 20;  // the first bucket of each dtype; = cap_bytes for none
  std::int64_t align_elems = 1;                        // each parameter's offset is a multiple of this
};

struct Bucket {
  DType dtype = DType::f32;
  std::vector<std::size_t> params;     // indices into the registration order, in the order added
  std::vector<std::int64_t> offsets;   // each parameter's first element in the bucket's buffer
  std::int64_t numel = 0;              // elements in the bucket's buffer (with alignment padding)
  std::size_t bytes() const;
};

inline std::size_t Bucket::bytes() const { return static_cast<std::size_t>(numel) * dtype_size(dtype); }

inline std::vector<Bucket> assign_buckets(const std::vector<ParamSpec>& params, const BucketOptions& opts = {}) {
  static constexpr const char* op = "dist::assign_buckets";
  CUTRAIN_REQUIRE(opts.cap_bytes > 0, InvalidArgument, op, "cap_bytes must be positive");
  CUTRAIN_REQUIRE(opts.first_cap_bytes > 0 && opts.first_cap_bytes <= opts.cap_bytes, InvalidArgument, op,
                  "first_cap_bytes must be in [1, cap_bytes=", opts.cap_bytes, "], got ", opts.first_cap_bytes);
  CUTRAIN_REQUIRE(opts.align_elems > 0, InvalidArgument, op, "align_elems must be positive, got ", opts.align_elems);
  std::vector<Bucket> out;
  std::map<DType, std::size_t> open;    // dtype -> its open bucket in out
  std::map<DType, bool> had_first;      // dtype -> its first bucket has been closed
  auto cap_of = [&](DType d) { return had_first[d] ? opts.cap_bytes : opts.first_cap_bytes; };
  for (std::size_t k = params.size(); k-- > 0;) {
    const auto& p = params[k];
    CUTRAIN_REQUIRE(p.numel >= 0, InvalidArgument, op, "parameter ", k, " has numel ", p.numel);
    const auto esize = dtype_size(p.dtype);
    auto it = open.find(p.dtype);
    if (it != open.end()) {
      const auto& b = out[it->second];
      const std::int64_t start = (b.numel + opts.align_elems - 1) / opts.align_elems * opts.align_elems;
      if (static_cast<std::size_t>(start + p.numel) * esize > cap_of(p.dtype)) {
        had_first[p.dtype] = true;
        open.erase(it);
        it = open.end();
      }
    }
    if (it == open.end()) {
      out.push_back(Bucket{.dtype = p.dtype, .params = {}, .offsets = {}, .numel = 0});
      it = open.emplace(p.dtype, out.size() - 1).first;
    }
    auto& b = out[it->second];
    const std::int64_t start = (b.numel + opts.align_elems - 1) / opts.align_elems * opts.align_elems;
    b.params.push_back(k);
    b.offsets.push_back(start);
    b.numel = start + p.numel;
    // Full (or a lone oversized parameter): close it so the next parameter opens a new one.
    if (b.bytes() >= cap_of(p.dtype)) {
      had_first[p.dtype] = true;
      open.erase(it);
    }
  }
  return out;
}

}  // namespace cutrain::inline CUTRAIN_ABI::dist
