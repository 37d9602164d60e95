// Reductions over any set of axes of a strided tensor of rank <= 8 (cuda/kernels/reduce.hpp).
// Forward: one block per output element (a grid-stride loop over outputs when there are more than
// blocks), or for sums over leading axes one thread per output (cutrain_reduce_sum_columns); the block's threads walk the output's reduced elements, thread t taking elements
// t, t + blockDim.x, ..., and block_sum (prelude.cuh) or block_arg combine them in a fixed order:
// deterministic. Backward: one thread per input element, grid-stride. f32 arithmetic throughout.

// The input's axes split in two: the kept ones (in order: their row-major index is the output
// index) and the reduced ones (their row-major index is the element's index within its output);
// sizes and the input's strides, in elements.
struct cutrain_reduce_args {
  long long n_out, n_red, out_rank, red_rank;
  long long out_size[8], out_stride[8];
  long long red_size[8], red_stride[8];
};

// Per input axis (rank of them): its size, and strides at which the input x, dy and the saved
// output-shaped tensor (indices, mean or y) are read at the input's coordinates (0 along reduced
// axes for the output-shaped ones), and the weight of the coordinate in the reduced row-major
// index (0 along kept axes). dx is written row-major at the input element's index.
struct cutrain_reduce_grad_args {
  long long n, rank;
  long long size[8], x_stride[8], dy_stride[8], aux_stride[8], red_index[8];
};

__device__ __forceinline__ long long reduce_base(const cutrain_reduce_args& a, long long o) {
  long long off = 0;
  for (int d = static_cast<int>(a.out_rank) - 1; d >= 0; --d) {
    off += (o % a.out_size[d]) * a.out_stride[d];
    o /= a.out_size[d];
  }
  return off;
}

__device__ __forceinline__ long long reduce_offset(const cutrain_reduce_args& a, long long j) {
  long long off = 0;
  for (int d = static_cast<int>(a.red_rank) - 1; d >= 0; --d) {
    off += (j % a.red_size[d]) * a.red_stride[d];
    j /= a.red_size[d];
  }
  return off;
}

// sum over output o's elements, scaled; every thread of the block must call it.
__device__ __forceinline__ float reduce_block_sum(const T* x, const cutrain_reduce_args& a, long long o) {
  const T* xb = x + reduce_base(a, o);
  float s = 0.0f;
  for (long long j = threadIdx.x; j < a.n_red; j += blockDim.x) s += to_f32(xb[reduce_offset(a, j)]);
  return block_sum(s);
}

// y = scale * sum (sum: scale 1; mean: 1 / n_red).
extern "C" __global__ void cutrain_reduce_sum(const T* x, T* y, cutrain_reduce_args a, float scale) {
  for (long long o = blockIdx.x; o < a.n_out; o += gridDim.x) {
    const float s = reduce_block_sum(x, a, o);
    if (threadIdx.x == 0) store(y + o, s * scale);
  }
}

// The same, one thread per output, which adds its elements in their row-major order: for sums
// whose outputs lie next to each other in x and whose elements lie far apart (over leading axes,
// as a broadcast's gradient), where a warp then reads 32 adjacent values per step and a block per
// output would read one. Deterministic too (another fixed order than cutrain_reduce_sum's).
extern "C" __global__ void cutrain_reduce_sum_columns(const T* x, T* y, cutrain_reduce_args a, float scale) {
  for (long long o = thread_index(); o < a.n_out; o += grid_stride()) {
    const T* xb = x + reduce_base(a, o);
    float s = 0.0f;
    for (long long j = 0; j < a.n_red; ++j) s += to_f32(xb[reduce_offset(a, j)]);
    store(y + o, s * scale);
  }
}

// The same into f32 (var's backward keeps the mean in f32).
extern "C" __global__ void cutrain_reduce_sum_f32(const T* x, float* y, cutrain_reduce_args a, float scale) {
  for (long long o = blockIdx.x; o < a.n_out; o += gridDim.x) {
    const float s = reduce_block_sum(x, a, o);
    if (threadIdx.x == 0) y[o] = s * scale;
  }
}

// y = sum (x - mean)^2 * inv_denom, the mean from a first pass (two passes: no cancellation).
extern "C" __global__ void cutrain_reduce_var(const T* x, T* y, cutrain_reduce_args a, float inv_n, float inv_denom) {
  for (long long o = blockIdx.x; o < a.n_out; o += gridDim.x) {
    const float mean = reduce_block_sum(x, a, o) * inv_n;
    const T* xb = x + reduce_base(a, o);
    float s = 0.0f;
    for (long long j = threadIdx.x; j < a.n_red; j += blockDim.x) {
      const float d = to_f32(xb[reduce_offset(a, j)]) - mean;
      s += d * d;
    }
    s = block_sum(s);
    if (threadIdx.x == 0) store(y + o, s * inv_denom);
  }
}

__device__ __forceinline__ float reduce_pow_abs(float v, float p) {
  v = fabsf(v);
  return p == 1.0f ? v : p == 2.0f ? v * v : powf(v, p);
}

// y = (sum |x|^p)^(1 / p), p >= 1 finite.
extern "C" __global__ void cutrain_reduce_norm(const T* x, T* y, cutrain_reduce_args a, float p) {
  for (long long o = blockIdx.x; o < a.n_out; o += gridDim.x) {
    const T* xb = x + reduce_base(a, o);
    float s = 0.0f;
    for (long long j = threadIdx.x; j < a.n_red; j += blockDim.x) s += reduce_pow_abs(to_f32(xb[reduce_offset(a, j)]), p);
    s = block_sum(s);
    if (threadIdx.x == 0) store(y + o, p == 1.0f ? s : p == 2.0f ? sqrtf(s) : powf(s, 1.0f / p));
  }
}

// (a, ia) beats (b, ib) for a max (is_max) or a min: an index < 0 is no candidate; NaN beats
// every number; ties go to the lower index. A total order on distinct indices, so any order of
// combining gives the same winner.
__device__ __forceinline__ bool reduce_arg_better(float a, long long ia, float b, long long ib, bool is_max) {
  if (ib < 0) return ia >= 0;
  if (ia < 0) return false;
  const bool an = a != a, bn = b != b;
  if (an || bn) return an && (!bn || ia < ib);
  if (a != b) return is_max ? a > b : a < b;
  return ia < ib;
}

// The best (value, index) over a one-dimensional block whose size is a multiple of 32; every
// thread gets it. Every thread of the block must call it.
__device__ void block_arg(float* v, long long* i, bool is_max) {
  __shared__ float pv[32];
  __shared__ long long pi[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  float bv = *v;
  long long bi = *i;
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const long long oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (reduce_arg_better(ov, oi, bv, bi, is_max)) {
      bv = ov;
      bi = oi;
    }
  }
  __syncthreads();  // a previous call's readers are done with pv, pi
  if (lane == 0) {
    pv[warp] = bv;
    pi[warp] = bi;
  }
  __syncthreads();
  bv = lane < warps ? pv[lane] : 0.0f;
  bi = lane < warps ? pi[lane] : -1;
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const long long oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (reduce_arg_better(ov, oi, bv, bi, is_max)) {
      bv = ov;
      bi = oi;
    }
  }
  *v = bv;
  *i = bi;
}

// The max (is_max != 0) or min and its index among the output's elements (n_red > 0).
extern "C" __global__ void cutrain_reduce_arg(const T* x, T* y, int* idx, cutrain_reduce_args a, int is_max) {
  for (long long o = blockIdx.x; o < a.n_out; o += gridDim.x) {
    const T* xb = x + reduce_base(a, o);
    float bv = 0.0f;
    long long bi = -1;
    for (long long j = threadIdx.x; j < a.n_red; j += blockDim.x) {
      const float v = to_f32(xb[reduce_offset(a, j)]);
      if (reduce_arg_better(v, j, bv, bi, is_max != 0)) {
        bv = v;
        bi = j;
      }
    }
    block_arg(&bv, &bi, is_max != 0);
    if (threadIdx.x == 0) {
      store(y + o, bv);
      idx[o] = static_cast<int>(bi);
    }
  }
}

// The offsets of input element i (row-major) in x, dy and aux, and its reduced index.
struct reduce_grad_offsets {
  long long x, dy, aux, red;
};
__device__ __forceinline__ reduce_grad_offsets reduce_grad_offsets_of(const cutrain_reduce_grad_args& a, long long i) {
  reduce_grad_offsets g = {0, 0, 0, 0};
  for (int d = static_cast<int>(a.rank) - 1; d >= 0; --d) {
    const long long c = i % a.size[d];
    i /= a.size[d];
    g.x += c * a.x_stride[d];
    g.dy += c * a.dy_stride[d];
    g.aux += c * a.aux_stride[d];
    g.red += c * a.red_index[d];
  }
  return g;
}

// dx = scale * dy, broadcast over the reduced axes (sum, mean).
extern "C" __global__ void cutrain_reduce_sum_backward(const T* dy, T* dx, cutrain_reduce_grad_args a, float scale) {
  for (long long i = thread_index(); i < a.n; i += grid_stride()) {
    const reduce_grad_offsets g = reduce_grad_offsets_of(a, i);
    store(dx + i, to_f32(dy[g.dy]) * scale);
  }
}

// dx = dy at the element the index names, 0 elsewhere (max, min).
extern "C" __global__ void cutrain_reduce_arg_backward(const T* dy, const int* idx, T* dx, cutrain_reduce_grad_args a) {
  for (long long i = thread_index(); i < a.n; i += grid_stride()) {
    const reduce_grad_offsets g = reduce_grad_offsets_of(a, i);
    store(dx + i, static_cast<long long>(idx[g.aux]) == g.red ? to_f32(dy[g.dy]) : 0.0f);
  }
}

// dx = dy * scale * (x - mean), scale = 2 / (n_red - correction).
extern "C" __global__ void cutrain_reduce_var_backward(const T* x, const float* mean, const T* dy, T* dx,
                                                       cutrain_reduce_grad_args a, float scale) {
  for (long long i = thread_index(); i < a.n; i += grid_stride()) {
    const reduce_grad_offsets g = reduce_grad_offsets_of(a, i);
    store(dx + i, to_f32(dy[g.dy]) * scale * (to_f32(x[g.x]) - mean[g.aux]));
  }
}

// y = norm_p(x): dx = dy sign(x) (|x| / y)^(p - 1); 0 where y is 0 (then x is 0 too).
extern "C" __global__ void cutrain_reduce_norm_backward(const T* x, const T* y, const T* dy, T* dx,
                                                        cutrain_reduce_grad_args a, float p) {
  for (long long i = thread_index(); i < a.n; i += grid_stride()) {
    const reduce_grad_offsets g = reduce_grad_offsets_of(a, i);
    const float xv = to_f32(x[g.x]), yv = to_f32(y[g.aux]), d = to_f32(dy[g.dy]);
    const float sign = xv > 0.0f ? 1.0f : xv < 0.0f ? -1.0f : 0.0f;
    float v = 0.0f;
    if (p == 1.0f) v = d * sign;
    else if (yv != 0.0f) v = p == 2.0f ? d * xv / yv : d * sign * powf(fabsf(xv) / yv, p - 1.0f);
    store(dx + i, v);
  }
}
