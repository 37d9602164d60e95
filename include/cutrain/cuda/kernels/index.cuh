// index_select and gather over strided tensors of rank <= 8 (cuda/kernels/index.hpp), forward
// and backward, and the range check of an index. One thread per element of the tensor written
// (row-major), grid-stride, except index_select's backward (a block per row of dx and chunk
// of the index, below).
// Forward copies elements as they are (no arithmetic). Backward: each dx element walks the
// index positions along dim in order and adds the dy elements whose index names it, in f32,
// then rounds once (index_select's: per chunk, then the chunks in order): deterministic, no
// atomics.

// The tensor walked (shape `size`: the output forward, dx backward), the dim indexed, and the
// strides (in elements) of the other tensors at the walked tensor's coordinates: `a` is x's
// (forward) or dy's (backward), `idx` the index's (index_select: idx_stride[0] only, its 1-d
// stride); idx_size is the index's shape (index_select: idx_size[0] its length); limit is x's
// size along dim (forward): an index outside [0, limit) reads nothing and writes NaN (the host
// checks indices before launching, except under CUDA graph capture, where it cannot).
struct cutrain_index_args {
  long long n, rank, dim;
  long long size[8], a_stride[8], idx_stride[8], idx_size[8];
  long long limit;
};

// Coordinate d of row-major element i of a.size, for every d: written into c.
__device__ __forceinline__ void index_coords(const cutrain_index_args& a, long long i, long long* c) {
  for (int d = static_cast<int>(a.rank) - 1; d >= 0; --d) {
    c[d] = i % a.size[d];
    i /= a.size[d];
  }
}

constexpr int VMAX = 16 / sizeof(T);
template <int V>
struct alignas(V * sizeof(T)) Pack {
  T v[V];
};

// An embedding lookup of R tokens: y[r, :] = table[index[r], :] + pos[r % period, :] (no pos:
// the row as it is), rows of C elements, table, pos and y dense row-major, index dense. A token
// outside [0, limit) gives a NaN row. One thread per V adjacent elements (16-byte accesses for V >
// 1: the host checks C and the alignment), grid-stride; the add in f32, rounded once.
template <int V>
__device__ __forceinline__ void embedding_rows(const T* table, const T* pos, const int* index, T* y, long long R,
                                               long long C, long long period, long long limit) {
  const long long packs = C / V;
  for (long long i = thread_index(); i < R * packs; i += grid_stride()) {
    const long long r = i / packs, c = (i - r * packs) * V;
    const int v = index[r];
    Pack<V> out;
    if (v < 0 || v >= limit) {
#pragma unroll
      for (int k = 0; k < V; ++k) store(&out.v[k], __int_as_float(0x7fc00000));
    } else {
      out = *reinterpret_cast<const Pack<V>*>(table + v * C + c);
      if (pos) {
        const Pack<V> p = *reinterpret_cast<const Pack<V>*>(pos + (r % period) * C + c);
#pragma unroll
        for (int k = 0; k < V; ++k) store(&out.v[k], to_f32(out.v[k]) + to_f32(p.v[k]));
      }
    }
    *reinterpret_cast<Pack<V>*>(y + r * C + c) = out;
  }
}

extern "C" __global__ void cutrain_embedding(const T* table, const T* pos, const int* index, T* y, long long R,
                                             long long C, long long period, long long limit) {
  embedding_rows<1>(table, pos, index, y, R, C, period, limit);
}

extern "C" __global__ void cutrain_embedding_vec(const T* table, const T* pos, const int* index, T* y, long long R,
                                                 long long C, long long period, long long limit) {
  embedding_rows<VMAX>(table, pos, index, y, R, C, period, limit);
}

// y[i] = x at y's coordinates, with coordinate dim replaced by index[c_dim].
extern "C" __global__ void cutrain_index_select(const T* x, const int* index, T* y, cutrain_index_args a) {
  long long c[8];
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < a.n; i += (long long)gridDim.x * blockDim.x) {
    index_coords(a, i, c);
    const long long v = index[c[a.dim] * a.idx_stride[0]];
    if (v < 0 || v >= a.limit) {
      store(&y[i], __int_as_float(0x7fc00000));
      continue;
    }
    long long off = 0;
    for (int d = 0; d < a.rank; ++d) off += (d == a.dim ? v : c[d]) * a.a_stride[d];
    y[i] = x[off];
  }
}

// y[i] = x at y's coordinates (= the index's), with coordinate dim replaced by the index there.
extern "C" __global__ void cutrain_gather(const T* x, const int* index, T* y, cutrain_index_args a) {
  long long c[8];
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < a.n; i += (long long)gridDim.x * blockDim.x) {
    index_coords(a, i, c);
    long long io = 0;
    for (int d = 0; d < a.rank; ++d) io += c[d] * a.idx_stride[d];
    const long long v = index[io];
    if (v < 0 || v >= a.limit) {
      store(&y[i], __int_as_float(0x7fc00000));
      continue;
    }
    long long off = 0;
    for (int d = 0; d < a.rank; ++d) off += (d == a.dim ? v : c[d]) * a.a_stride[d];
    y[i] = x[off];
  }
}

// dx[i] = sum over j (in order) with index[j] == c_dim of dy at (c with coordinate dim = j).
// dx is walked as rows [outer, num, inner] (num = its size along dim, inner the product of the
// dims after it), in tiles of cutrain_rows_tile elements of a row, and the index positions in
// chunks of `chunk` (a multiple of blockDim): one block per (row, tile, chunk), grid-stride. The
// block reads its chunk of the index blockDim positions at a time, keeps the positions that name
// its row in order (a ballot per warp, a prefix over the warps), and each thread adds dy at those
// positions into its cutrain_rows_cols accumulators, in f32. With one chunk the sum is rounded
// into dx; with several, chunk c's f32 sum goes to partial[c * n + i] and
// cutrain_index_partial_sum adds the chunks in order: deterministic either way, and a frequent
// index (a space in a character vocabulary) is spread over many blocks instead of one.
// blockDim: a multiple of 32, at most 1024.
#define cutrain_rows_cols 4
extern "C" __global__ void cutrain_index_select_backward(const T* dy, const int* index, T* dx, float* partial,
                                                         long long chunk, cutrain_index_args a) {
  __shared__ int hits[1024];
  __shared__ int warp_hits[32];
  const long long n_idx = a.idx_size[0], is = a.idx_stride[0], ds = a.a_stride[a.dim];
  long long inner = 1;
  for (int d = static_cast<int>(a.dim) + 1; d < a.rank; ++d) inner *= a.size[d];
  const long long num = a.size[a.dim], rows = a.n / inner;
  const long long tile = static_cast<long long>(blockDim.x) * cutrain_rows_cols;
  const long long tiles = (inner + tile - 1) / tile, chunks = (n_idx + chunk - 1) / chunk;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (long long w = blockIdx.x; w < rows * tiles * chunks; w += gridDim.x) {
    const long long ch = w % chunks, rt = w / chunks;
    const long long row = rt / tiles, k0 = (rt % tiles) * tile;
    const int v = static_cast<int>(row % num);
    long long base[cutrain_rows_cols];
    bool mine[cutrain_rows_cols];  // column k of this tile lies inside the row
    float s[cutrain_rows_cols];
    for (int q = 0; q < cutrain_rows_cols; ++q) {
      const long long k = k0 + q * blockDim.x + threadIdx.x;
      s[q] = 0.0f;
      base[q] = 0;
      mine[q] = k < inner;
      if (!mine[q]) continue;
      long long c[8];
      index_coords(a, row * inner + k, c);
      for (int d = 0; d < a.rank; ++d)
        if (d != a.dim) base[q] += c[d] * a.a_stride[d];
    }
    const long long j_end = min(n_idx, (ch + 1) * chunk);
    for (long long j0 = ch * chunk; j0 < j_end; j0 += blockDim.x) {
      const long long j = j0 + threadIdx.x;
      const bool hit = j < j_end && index[j * is] == v;
      const unsigned m = __ballot_sync(0xffffffffu, hit);
      if (lane == 0) warp_hits[warp] = __popc(m);
      __syncthreads();
      int before = 0, total = 0;
      for (int u = 0; u < warps; ++u) {
        before += u < warp ? warp_hits[u] : 0;
        total += warp_hits[u];
      }
      if (hit) hits[before + __popc(m & ((1u << lane) - 1u))] = threadIdx.x;
      __syncthreads();
      for (int h = 0; h < total; ++h) {
        const long long jj = j0 + hits[h];
        for (int q = 0; q < cutrain_rows_cols; ++q)
          if (mine[q]) s[q] += to_f32(dy[base[q] + jj * ds]);
      }
      __syncthreads();  // hits and warp_hits are rewritten by the next chunk
    }
    for (int q = 0; q < cutrain_rows_cols; ++q) {
      if (!mine[q]) continue;
      const long long i = row * inner + k0 + q * blockDim.x + threadIdx.x;
      if (partial) partial[ch * a.n + i] = s[q];
      else store(dx + i, s[q]);
    }
  }
}

// dx[i] = sum over c in [0, chunks), in order, of partial[c * n + i], rounded once.
extern "C" __global__ void cutrain_index_partial_sum(const float* partial, T* dx, long long n, long long chunks) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    float s = 0.0f;
    for (long long c = 0; c < chunks; ++c) s += partial[c * n + i];
    store(dx + i, s);
  }
}

// dx[i] = sum over j (in order) with index at (c, dim = j) == c_dim of dy there; 0 where c lies
// outside the index's shape in another dim.
extern "C" __global__ void cutrain_gather_backward(const T* dy, const int* index, T* dx, cutrain_index_args a) {
  long long c[8];
  const long long n_idx = a.idx_size[a.dim], is = a.idx_stride[a.dim], ds = a.a_stride[a.dim];
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < a.n; i += (long long)gridDim.x * blockDim.x) {
    index_coords(a, i, c);
    long long base = 0, ibase = 0;
    bool inside = true;
    for (int d = 0; d < a.rank; ++d) {
      if (d == a.dim) continue;
      inside = inside && c[d] < a.idx_size[d];
      base += c[d] * a.a_stride[d];
      ibase += c[d] * a.idx_stride[d];
    }
    const int v = static_cast<int>(c[a.dim]);
    float s = 0.0f;
    if (inside)
      for (long long j = 0; j < n_idx; ++j)
        if (index[ibase + j * is] == v) s += to_f32(dy[base + j * ds]);
    store(dx + i, s);
  }
}

// For the index (shape a.size, strides a.idx_stride): report[0] += the values outside
// [0, limit), report[1] = one of them. report starts zeroed.
extern "C" __global__ void cutrain_index_check(const int* index, long long limit, unsigned long long* report,
                                               cutrain_index_args a) {
  long long c[8];
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < a.n; i += (long long)gridDim.x * blockDim.x) {
    index_coords(a, i, c);
    long long off = 0;
    for (int d = 0; d < a.rank; ++d) off += c[d] * a.idx_stride[d];
    const int v = index[off];
    if (v >= 0 && v < limit) continue;
    atomicAdd(report, 1ull);
    atomicExch(report + 1, static_cast<unsigned long long>(static_cast<long long>(v)));
  }
}

// index (shape a.size, strides a.idx_stride, element type I) as a dense row-major int32 out:
// w = v, plus wrap when v < 0 and wrap > 0 (counting from the end); a w outside [lo, hi) is
// written as fallback and counted: report[0] += 1, and the first one counted sets report[1] = v
// and report[2] = its row-major position. report starts zeroed.
template <class I>
__device__ __forceinline__ void index_narrow(const I* index, int* out, long long lo, long long hi, long long wrap,
                                             int fallback, unsigned long long* report, const cutrain_index_args& a) {
  long long c[8];
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < a.n; i += (long long)gridDim.x * blockDim.x) {
    index_coords(a, i, c);
    long long off = 0;
    for (int d = 0; d < a.rank; ++d) off += c[d] * a.idx_stride[d];
    const long long v = static_cast<long long>(index[off]);
    const long long w = v < 0 && wrap > 0 ? v + wrap : v;
    if (w >= lo && w < hi) {
      out[i] = static_cast<int>(w);
      continue;
    }
    out[i] = fallback;
    if (atomicAdd(report, 1ull) == 0ull) {
      report[1] = static_cast<unsigned long long>(v);
      report[2] = static_cast<unsigned long long>(i);
    }
  }
}
extern "C" __global__ void cutrain_index_narrow32(const int* index, int* out, long long lo, long long hi, long long wrap,
                                                  int fallback, unsigned long long* report, cutrain_index_args a) {
  index_narrow(index, out, lo, hi, wrap, fallback, report, a);
}
extern "C" __global__ void cutrain_index_narrow64(const long long* index, int* out, long long lo, long long hi,
                                                  long long wrap, int fallback, unsigned long long* report,
                                                  cutrain_index_args a) {
  index_narrow(index, out, lo, hi, wrap, fallback, report, a);
}

// index_select's backward for a large table (an embedding's [num, C] rows, index 1-d dense, dy
// and dx dense row-major) in four steps: the count of each row's positions, their offsets (a
// scan), the positions placed by row, then one block per row that puts its positions in
// ascending order and adds the dy rows there in f32, rounded once: the sums of the block-per-
// row kernel above, in the same order, for O(positions + rows) work instead of O(positions x
// rows). Positions whose index is outside [0, num) are left out (the host checks them).
extern "C" __global__ void cutrain_embedding_grad_count(const int* index, long long n, long long num, int* counts) {
  for (long long i = thread_index(); i < n; i += grid_stride()) {
    const int v = index[i];
    if (v >= 0 && v < num) atomicAdd(counts + v, 1);
  }
}

// offsets[0..num] = the exclusive scan of counts[0..num): one block of 1024 threads, each a
// contiguous run of the rows.
extern "C" __global__ void cutrain_embedding_grad_scan(const int* counts, long long num, int* offsets) {
  __shared__ int part[1024];
  const long long per = (num + blockDim.x - 1) / blockDim.x, lo = min(num, threadIdx.x * per), hi = min(num, lo + per);
  int s = 0;
  for (long long v = lo; v < hi; ++v) s += counts[v];
  part[threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    int run = 0;
    for (unsigned t = 0; t < blockDim.x; ++t) {
      const int c = part[t];
      part[t] = run;
      run += c;
    }
    offsets[num] = run;
  }
  __syncthreads();
  int run = part[threadIdx.x];
  for (long long v = lo; v < hi; ++v) {
    offsets[v] = run;
    run += counts[v];
  }
}

// order[offsets[v] + k] = the k-th position placed for row v (in no particular order: the rows
// kernel sorts them). cursor: num zeros.
extern "C" __global__ void cutrain_embedding_grad_place(const int* index, long long n, long long num, const int* offsets,
                                                        int* cursor, int* order) {
  for (long long i = thread_index(); i < n; i += grid_stride()) {
    const int v = index[i];
    if (v >= 0 && v < num) order[offsets[v] + atomicAdd(cursor + v, 1)] = static_cast<int>(i);
  }
}

#define cutrain_grad_sort_max 2048
// One block per row v (blockDim a power of two, at most 1024): dx[v, :] = sum of dy[p, :] over
// the row's positions p in ascending order. Up to 2048 positions are sorted in shared memory
// (bitonic); a row with more (a very frequent token) walks the whole index in order instead.
extern "C" __global__ void cutrain_embedding_grad_rows(const T* dy, const int* index, long long n, const int* offsets,
                                                       const int* order, T* dx, long long num, long long C) {
  __shared__ int pos[cutrain_grad_sort_max];
  __shared__ int warp_hits[32];
  for (long long v = blockIdx.x; v < num; v += gridDim.x) {
    const int first = offsets[v], k = offsets[v + 1] - first;
    const bool sorted_here = k <= cutrain_grad_sort_max;
    if (sorted_here) {
      int p2 = 1;
      while (p2 < k) p2 <<= 1;
      for (int i = threadIdx.x; i < p2; i += blockDim.x) pos[i] = i < k ? order[first + i] : 0x7fffffff;
      __syncthreads();
      for (int size = 2; size <= p2; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
          for (int i = threadIdx.x; i < p2; i += blockDim.x) {
            const int j = i ^ stride;
            if (j > i) {
              const bool up = (i & size) == 0;
              const int a = pos[i], b = pos[j];
              if ((a > b) == up) {
                pos[i] = b;
                pos[j] = a;
              }
            }
          }
          __syncthreads();
        }
      }
    }
    for (long long c0 = 0; c0 < C; c0 += blockDim.x) {
      const long long c = c0 + threadIdx.x;
      float s = 0.0f;
      if (sorted_here) {
        if (c < C)
          for (int h = 0; h < k; ++h) s += to_f32(dy[static_cast<long long>(pos[h]) * C + c]);
      } else {
        // The positions in order by a walk of the index: a ballot per warp, the warps in order.
        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
        for (long long j0 = 0; j0 < n; j0 += blockDim.x) {
          const long long j = j0 + threadIdx.x;
          const bool hit = j < n && index[j] == v;
          const unsigned m = __ballot_sync(0xffffffffu, hit);
          if (lane == 0) warp_hits[warp] = m;
          __syncthreads();
          for (int u = 0; u < warps; ++u)
            for (unsigned bits = static_cast<unsigned>(warp_hits[u]); bits != 0; bits &= bits - 1)
              if (c < C) s += to_f32(dy[(j0 + u * 32 + __ffs(static_cast<int>(bits)) - 1) * C + c]);
          __syncthreads();
        }
      }
      if (c < C) store(dx + v * C + c, s);
    }
    __syncthreads();  // pos is rewritten for the next row
  }
}
