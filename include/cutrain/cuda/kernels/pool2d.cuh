// n / d for 0 <= n < 2^31 and 1 <= d < 2^31 by a multiply-high, an add and a shift (Granlund and
// Montgomery; PyTorch's IntDivider). magic = m | s << 32 comes from the host (fast_div_magic).
struct FastDiv {
  unsigned d, m, s;
  __device__ FastDiv(long long divisor, unsigned long long magic)
      : d(static_cast<unsigned>(divisor)), m(static_cast<unsigned>(magic)), s(static_cast<unsigned>(magic >> 32)) {}
  __device__ __forceinline__ unsigned div(unsigned n) const { return (__umulhi(n, m) + n) >> s; }
};
// Plain 64-bit division, for tensors of 2^31 elements or more.
struct WideDiv {
  long long d;
  __device__ WideDiv(long long divisor, unsigned long long) : d(divisor) {}
  __device__ __forceinline__ long long div(long long n) const { return n / d; }
};

// Index i of a 4-d tensor in memory order -> (n, c, h, w). d0, d1, d2 divide by its three inner
// extents, innermost first: (C, W, H) when channels_last (NHWC order), else (W, H, C) (NCHW).
template <class I, class D>
__device__ __forceinline__ void unravel4(I i, const D& d0, const D& d1, const D& d2, int channels_last, I& n, I& c,
                                         I& h, I& w) {
  const I q0 = d0.div(i), a0 = i - q0 * static_cast<I>(d0.d);
  const I q1 = d1.div(q0), a1 = q0 - q1 * static_cast<I>(d1.d);
  const I q2 = d2.div(q1), a2 = q1 - q2 * static_cast<I>(d2.d);
  n = q2;
  if (channels_last) {
    c = a0; w = a1; h = a2;
  } else {
    w = a0; h = a1; c = a2;
  }
}

__device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ int imax(int a, int b) { return a > b ? a : b; }
__device__ __forceinline__ bool is_nan(float v) { return v != v; }

// V adjacent elements moved by one load or store (V * sizeof(T) <= 16 bytes, aligned to that).
constexpr int VMAX = 16 / sizeof(T);
template <int V>
struct alignas(V * sizeof(T)) Pack {
  T v[V];
};
template <int V>
struct alignas(V * sizeof(int)) IntPack {
  int v[V];
};
template <int V>
__device__ __forceinline__ void load_f32(const T* p, float (&out)[V]) {
  const Pack<V> pk = *reinterpret_cast<const Pack<V>*>(p);
#pragma unroll
  for (int k = 0; k < V; ++k) out[k] = to_f32(pk.v[k]);
}
template <int V>
__device__ __forceinline__ void store_f32(T* p, const float (&in)[V]) {
  Pack<V> pk;
#pragma unroll
  for (int k = 0; k < V; ++k) store(&pk.v[k], in[k]);
  *reinterpret_cast<Pack<V>*>(p) = pk;
}

struct Strides4 {
  long long n, c, h, w;
  __device__ __forceinline__ long long at(long long in, long long ic, long long ih, long long iw) const {
    return in * n + ic * c + ih * h + iw * w;
  }
};

// Pooling parameters with the strides resolved (never 0); the host checks that every spatial
// quantity fits in an int.
struct PoolGeom {
  int H, W, OH, OW, kh, kw, sh, sw, pt, pb, pl, pr, avg, count_include_pad;
};

// The part of output (i, j)'s window inside the input, rows [h0, h1) and columns [w0, w1), and
// what an average divides by: count_include_pad counts the padding but not the ceil-mode
// overhang past it (as PyTorch and cpu/pool2d.hpp's pool_window).
struct PoolWin {
  int h0, h1, w0, w1;
  float divisor;
};

__device__ __forceinline__ PoolWin pool_window(const PoolGeom& g, int i, int j) {
  const int hs = i * g.sh - g.pt, ws = j * g.sw - g.pl;
  PoolWin win;
  win.h0 = imax(hs, 0);
  win.h1 = imin(hs + g.kh, g.H);
  win.w0 = imax(ws, 0);
  win.w1 = imin(ws + g.kw, g.W);
  const int padded = (imin(hs + g.kh, g.H + g.pb) - hs) * (imin(ws + g.kw, g.W + g.pr) - ws);
  win.divisor = static_cast<float>(g.count_include_pad ? padded : (win.h1 - win.h0) * (win.w1 - win.w0));
  return win;
}

// For each of V adjacent channels, the window's maximum and its position (br, bq): the first
// maximum in row-then-column order, or the first NaN (cpu/pool2d.hpp's pool_argmax). Padding never
// wins: it is not visited. xp points at channel c of image n.
template <int V>
__device__ __forceinline__ void window_max(const T* xp, long long xh, long long xw, const PoolWin& win, float (&best)[V],
                                           int (&br)[V], int (&bq)[V]) {
  bool done[V];  // a NaN was found: the lane keeps it
  load_f32<V>(xp + win.h0 * xh + win.w0 * xw, best);
#pragma unroll
  for (int k = 0; k < V; ++k) {
    br[k] = win.h0;
    bq[k] = win.w0;
    done[k] = is_nan(best[k]);
  }
  for (int r = win.h0; r < win.h1; ++r)
    for (int q = win.w0; q < win.w1; ++q) {
      float v[V];
      load_f32<V>(xp + r * xh + q * xw, v);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        if (done[k]) continue;
        if (is_nan(v[k]) || v[k] > best[k]) {
          best[k] = v[k];
          br[k] = r;
          bq[k] = q;
          done[k] = is_nan(v[k]);
        }
      }
    }
}

// One thread per V adjacent outputs, in y's memory order; total counts those packs.
template <int V, class I, class D>
__device__ __forceinline__ void pool2d_forward_loop(const T* x, T* y, const PoolGeom& g, const Strides4& xs,
                                                    const Strides4& ys, I total, int channels_last, const D& d0,
                                                    const D& d1, const D& d2) {
  for (I i = static_cast<I>(thread_index()); i < total; i += static_cast<I>(grid_stride())) {
    I n, cv, oh, ow;
    unravel4(i, d0, d1, d2, channels_last, n, cv, oh, ow);
    const long long c = static_cast<long long>(cv) * V;
    const PoolWin win = pool_window(g, static_cast<int>(oh), static_cast<int>(ow));
    const T* xp = x + static_cast<long long>(n) * xs.n + c * xs.c;
    float v[V];
    if (g.avg) {
      float sum[V];
#pragma unroll
      for (int k = 0; k < V; ++k) sum[k] = 0.0f;
      for (int r = win.h0; r < win.h1; ++r)
        for (int q = win.w0; q < win.w1; ++q) {
          float e[V];
          load_f32<V>(xp + r * xs.h + q * xs.w, e);
#pragma unroll
          for (int k = 0; k < V; ++k) sum[k] += e[k];
        }
#pragma unroll
      for (int k = 0; k < V; ++k) v[k] = sum[k] / win.divisor;
    } else {
      int br[V], bq[V];
      window_max<V>(xp, xs.h, xs.w, win, v, br, bq);
    }
    store_f32<V>(y + ys.at(n, c, oh, ow), v);
  }
}

// Each kernel comes twice: NAME with one element per thread and NAME_vec with VMAX (the host's
// pool_vec decides), as separate kernels so that the scalar one keeps the scalar path's register
// count (and occupancy).
//
// y [N, C, OH, OW] from x [N, C, H, W]. total = N C OH OW / V; m0, m1, m2: fast_div_magic of the
// inner extents in the order unravel4 takes them, with C / V for C (unused from 2^31 on).
#define POOL2D_FORWARD_PARAMS                                                                                       \
  const T *x, T *y, long long C, int H, int W, int OH, int OW, int kh, int kw, int sh, int sw, int pt, int pb, int pl, \
      int pr, int avg, int count_include_pad, long long xn, long long xc, long long xh, long long xw, long long yn,    \
      long long yc, long long yh, long long yw, long long total, int channels_last, unsigned long long m0,           \
      unsigned long long m1, unsigned long long m2
template <int V>
__device__ __forceinline__ void pool2d_forward_entry(POOL2D_FORWARD_PARAMS) {
  const PoolGeom g = {H, W, OH, OW, kh, kw, sh, sw, pt, pb, pl, pr, avg, count_include_pad};
  const Strides4 xs = {xn, xc, xh, xw}, ys = {yn, yc, yh, yw};
  const long long Cv = C / V;
  const long long e0 = channels_last ? Cv : OW, e1 = channels_last ? OW : OH, e2 = channels_last ? OH : Cv;
  if (total < 0x80000000LL)
    pool2d_forward_loop<V, unsigned>(x, y, g, xs, ys, static_cast<unsigned>(total), channels_last, FastDiv(e0, m0),
                                     FastDiv(e1, m1), FastDiv(e2, m2));
  else
    pool2d_forward_loop<V, long long>(x, y, g, xs, ys, total, channels_last, WideDiv(e0, m0), WideDiv(e1, m1),
                                      WideDiv(e2, m2));
}
#define POOL2D_FORWARD_ARGS \
  x, y, C, H, W, OH, OW, kh, kw, sh, sw, pt, pb, pl, pr, avg, count_include_pad, xn, xc, xh, xw, yn, yc, yh, yw, total, \
      channels_last, m0, m1, m2
extern "C" __global__ void cutrain_pool2d_forward(POOL2D_FORWARD_PARAMS) { pool2d_forward_entry<1>(POOL2D_FORWARD_ARGS); }
extern "C" __global__ void cutrain_pool2d_forward_vec(POOL2D_FORWARD_PARAMS) {
  pool2d_forward_entry<VMAX>(POOL2D_FORWARD_ARGS);
}

// The first half of a max-pool backward whose windows overlap or leave gaps: each output's argmax,
// as its offset (r - hs) kw + (q - ws) inside the unclipped window (hs, ws: the window's first
// row and column), into arg[] indexed like the outputs walked densely in memory order
// (channels_last: NHWC order, else NCHW). One thread per V adjacent outputs.
template <int V, class I, class D>
__device__ __forceinline__ void pool2d_argmax_loop(const T* x, int* arg, const PoolGeom& g, const Strides4& xs, I total,
                                                   int channels_last, const D& d0, const D& d1, const D& d2) {
  for (I i = static_cast<I>(thread_index()); i < total; i += static_cast<I>(grid_stride())) {
    I n, cv, oh, ow;
    unravel4(i, d0, d1, d2, channels_last, n, cv, oh, ow);
    const long long c = static_cast<long long>(cv) * V;
    const int ohi = static_cast<int>(oh), owi = static_cast<int>(ow);
    const PoolWin win = pool_window(g, ohi, owi);
    float best[V];
    int br[V], bq[V];
    window_max<V>(x + static_cast<long long>(n) * xs.n + c * xs.c, xs.h, xs.w, win, best, br, bq);
    const int hs = ohi * g.sh - g.pt, ws = owi * g.sw - g.pl;
    IntPack<V> out;
#pragma unroll
    for (int k = 0; k < V; ++k) out.v[k] = (br[k] - hs) * g.kw + (bq[k] - ws);
    *reinterpret_cast<IntPack<V>*>(arg + static_cast<long long>(i) * V) = out;
  }
}

// total = N C OH OW / V; m0, m1, m2 as for the forward.
#define POOL2D_ARGMAX_PARAMS                                                                                          \
  const T *x, int *arg, long long C, int H, int W, int OH, int OW, int kh, int kw, int sh, int sw, int pt, int pb,    \
      int pl, int pr, long long xn, long long xc, long long xh, long long xw, long long total, int channels_last,      \
      unsigned long long m0, unsigned long long m1, unsigned long long m2
template <int V>
__device__ __forceinline__ void pool2d_argmax_entry(POOL2D_ARGMAX_PARAMS) {
  const PoolGeom g = {H, W, OH, OW, kh, kw, sh, sw, pt, pb, pl, pr, 0, 0};
  const Strides4 xs = {xn, xc, xh, xw};
  const long long Cv = C / V;
  const long long e0 = channels_last ? Cv : OW, e1 = channels_last ? OW : OH, e2 = channels_last ? OH : Cv;
  if (total < 0x80000000LL)
    pool2d_argmax_loop<V, unsigned>(x, arg, g, xs, static_cast<unsigned>(total), channels_last, FastDiv(e0, m0),
                                    FastDiv(e1, m1), FastDiv(e2, m2));
  else
    pool2d_argmax_loop<V, long long>(x, arg, g, xs, total, channels_last, WideDiv(e0, m0), WideDiv(e1, m1),
                                     WideDiv(e2, m2));
}
#define POOL2D_ARGMAX_ARGS \
  x, arg, C, H, W, OH, OW, kh, kw, sh, sw, pt, pb, pl, pr, xn, xc, xh, xw, total, channels_last, m0, m1, m2
extern "C" __global__ void cutrain_pool2d_argmax(POOL2D_ARGMAX_PARAMS) { pool2d_argmax_entry<1>(POOL2D_ARGMAX_ARGS); }
extern "C" __global__ void cutrain_pool2d_argmax_vec(POOL2D_ARGMAX_PARAMS) {
  pool2d_argmax_entry<VMAX>(POOL2D_ARGMAX_ARGS);
}

// The gather backward: one thread per V adjacent dx elements, in dx's memory order, visits the
// output windows that hold them (in row-major order, as the CPU adds them) and adds their dy:
// average dy / divisor; max dy where the window's argmax (arg[], from cutrain_pool2d_argmax in
// the order arg_channels_last) is this element. No atomics: the result is deterministic. by_sh,
// by_sw divide by the pooling strides.
template <int V, class I, class D>
__device__ __forceinline__ void pool2d_backward_loop(const int* arg, int arg_channels_last, const T* dy, T* dx,
                                                     const PoolGeom& g, long long C, const Strides4& dys,
                                                     const Strides4& dxs, I total, int channels_last, const D& d0,
                                                     const D& d1, const D& d2, const FastDiv& by_sh,
                                                     const FastDiv& by_sw) {
  for (I i = static_cast<I>(thread_index()); i < total; i += static_cast<I>(grid_stride())) {
    I n, cv, h, w;
    unravel4(i, d0, d1, d2, channels_last, n, cv, h, w);
    const long long c = static_cast<long long>(cv) * V, nl = static_cast<long long>(n);
    const int hi = static_cast<int>(h), wi = static_cast<int>(w);
    // Output rows oi whose window holds row hi: oi sh - pt <= hi < oi sh - pt + kh; columns alike.
    const int ah = hi + g.pt - g.kh + 1, aw = wi + g.pl - g.kw + 1;
    const int i0 = ah <= 0 ? 0 : static_cast<int>(by_sh.div(static_cast<unsigned>(ah + g.sh - 1)));
    const int i1 = imin(g.OH - 1, static_cast<int>(by_sh.div(static_cast<unsigned>(hi + g.pt))));
    const int j0 = aw <= 0 ? 0 : static_cast<int>(by_sw.div(static_cast<unsigned>(aw + g.sw - 1)));
    const int j1 = imin(g.OW - 1, static_cast<int>(by_sw.div(static_cast<unsigned>(wi + g.pl))));
    const T* dyp = dy + nl * dys.n + c * dys.c;
    // arg[] of (n, c, oi, oj) at abase + oi * a_h + oj * a_w
    const long long a_w = arg_channels_last ? C : 1, a_h = a_w * g.OW;
    const long long abase = arg_channels_last ? nl * g.OH * a_h + c : (nl * C + c) * g.OH * a_h;
    float acc[V];
#pragma unroll
    for (int k = 0; k < V; ++k) acc[k] = 0.0f;
    for (int oi = i0; oi <= i1; ++oi)
      for (int oj = j0; oj <= j1; ++oj) {
        if (g.avg) {
          const PoolWin win = pool_window(g, oi, oj);
          float d[V];
          load_f32<V>(dyp + oi * dys.h + oj * dys.w, d);
#pragma unroll
          for (int k = 0; k < V; ++k) acc[k] += d[k] / win.divisor;
        } else {
          const int rel = (hi - (oi * g.sh - g.pt)) * g.kw + (wi - (oj * g.sw - g.pl));
          const IntPack<V> a = *reinterpret_cast<const IntPack<V>*>(arg + abase + oi * a_h + oj * a_w);
          bool any = false;
#pragma unroll
          for (int k = 0; k < V; ++k) any |= a.v[k] == rel;
          if (any) {
            float d[V];
            load_f32<V>(dyp + oi * dys.h + oj * dys.w, d);
#pragma unroll
            for (int k = 0; k < V; ++k)
              if (a.v[k] == rel) acc[k] += d[k];
          }
        }
      }
    store_f32<V>(dx + dxs.at(n, c, h, w), acc);
  }
}

// dx [N, C, H, W]; total = N C H W / V; m0, m1, m2 as for the forward but of dx's extents; mh,
// mw: fast_div_magic(sh), fast_div_magic(sw). arg: null for average pooling. For the _vec kernel
// arg's order must be channels-last too (V adjacent channels are V adjacent ints).
#define POOL2D_BACKWARD_PARAMS                                                                                       \
  const int *arg, int arg_channels_last, const T *dy, T *dx, long long C, int H, int W, int OH, int OW, int kh,      \
      int kw, int sh, int sw, int pt, int pb, int pl, int pr, int avg, int count_include_pad, long long dyn,          \
      long long dyc, long long dyh, long long dyw, long long dxn, long long dxc, long long dxh, long long dxw,        \
      long long total, int channels_last, unsigned long long m0, unsigned long long m1, unsigned long long m2,        \
      unsigned long long mh, unsigned long long mw
template <int V>
__device__ __forceinline__ void pool2d_backward_entry(POOL2D_BACKWARD_PARAMS) {
  const PoolGeom g = {H, W, OH, OW, kh, kw, sh, sw, pt, pb, pl, pr, avg, count_include_pad};
  const Strides4 dys = {dyn, dyc, dyh, dyw}, dxs = {dxn, dxc, dxh, dxw};
  const long long Cv = C / V;
  const long long e0 = channels_last ? Cv : W, e1 = channels_last ? W : H, e2 = channels_last ? H : Cv;
  const FastDiv by_sh(sh, mh), by_sw(sw, mw);
  if (total < 0x80000000LL)
    pool2d_backward_loop<V, unsigned>(arg, arg_channels_last, dy, dx, g, C, dys, dxs, static_cast<unsigned>(total),
                                      channels_last, FastDiv(e0, m0), FastDiv(e1, m1), FastDiv(e2, m2), by_sh, by_sw);
  else
    pool2d_backward_loop<V, long long>(arg, arg_channels_last, dy, dx, g, C, dys, dxs, total, channels_last,
                                       WideDiv(e0, m0), WideDiv(e1, m1), WideDiv(e2, m2), by_sh, by_sw);
}
#define POOL2D_BACKWARD_ARGS                                                                                         \
  arg, arg_channels_last, dy, dx, C, H, W, OH, OW, kh, kw, sh, sw, pt, pb, pl, pr, avg, count_include_pad, dyn, dyc, \
      dyh, dyw, dxn, dxc, dxh, dxw, total, channels_last, m0, m1, m2, mh, mw
extern "C" __global__ void cutrain_pool2d_backward(POOL2D_BACKWARD_PARAMS) {
  pool2d_backward_entry<1>(POOL2D_BACKWARD_ARGS);
}
extern "C" __global__ void cutrain_pool2d_backward_vec(POOL2D_BACKWARD_PARAMS) {
  pool2d_backward_entry<VMAX>(POOL2D_BACKWARD_ARGS);
}

// The backward when the windows tile the input exactly (stride = kernel, no padding, H = OH kh,
// W = OW kw: every dx element lies in exactly one window): one thread per V adjacent windows, in
// dx's memory order, writes their kh x kw dx elements. The same values as the gather, x read once.
template <int V, class I, class D>
__device__ __forceinline__ void pool2d_backward_tiled_loop(const T* x, const T* dy, T* dx, const PoolGeom& g,
                                                           const Strides4& xs, const Strides4& dys,
                                                           const Strides4& dxs, I total, int channels_last, const D& d0,
                                                           const D& d1, const D& d2) {
  for (I i = static_cast<I>(thread_index()); i < total; i += static_cast<I>(grid_stride())) {
    I n, cv, oh, ow;
    unravel4(i, d0, d1, d2, channels_last, n, cv, oh, ow);
    const long long c = static_cast<long long>(cv) * V, nl = static_cast<long long>(n);
    PoolWin win;
    win.h0 = static_cast<int>(oh) * g.kh;
    win.h1 = win.h0 + g.kh;
    win.w0 = static_cast<int>(ow) * g.kw;
    win.w1 = win.w0 + g.kw;
    float d[V], v[V];  // 0 + ..., as the gather's sum, so that even the sign of a zero agrees
    load_f32<V>(dy + dys.at(n, c, oh, ow), d);
    int br[V], bq[V];
#pragma unroll
    for (int k = 0; k < V; ++k) br[k] = bq[k] = -1;
    if (g.avg) {
#pragma unroll
      for (int k = 0; k < V; ++k) v[k] = 0.0f + d[k] / static_cast<float>(g.kh * g.kw);
    } else {
      float best[V];
      window_max<V>(x + nl * xs.n + c * xs.c, xs.h, xs.w, win, best, br, bq);
#pragma unroll
      for (int k = 0; k < V; ++k) v[k] = 0.0f + d[k];
    }
    T* dxp = dx + nl * dxs.n + c * dxs.c;
    for (int r = win.h0; r < win.h1; ++r)
      for (int q = win.w0; q < win.w1; ++q) {
        float o[V];
#pragma unroll
        for (int k = 0; k < V; ++k) o[k] = (g.avg || (r == br[k] && q == bq[k])) ? v[k] : 0.0f;
        store_f32<V>(dxp + r * dxs.h + q * dxs.w, o);
      }
  }
}

// total = N C OH OW / V; m0, m1, m2: fast_div_magic of dy's inner extents in dx's order.
#define POOL2D_TILED_PARAMS                                                                                           \
  const T *x, const T *dy, T *dx, long long C, int H, int W, int OH, int OW, int kh, int kw, int avg, long long xn,   \
      long long xc, long long xh, long long xw, long long dyn, long long dyc, long long dyh, long long dyw,            \
      long long dxn, long long dxc, long long dxh, long long dxw, long long total, int channels_last,                 \
      unsigned long long m0, unsigned long long m1, unsigned long long m2
template <int V>
__device__ __forceinline__ void pool2d_backward_tiled_entry(POOL2D_TILED_PARAMS) {
  const PoolGeom g = {H, W, OH, OW, kh, kw, kh, kw, 0, 0, 0, 0, avg, 1};
  const Strides4 xs = {xn, xc, xh, xw}, dys = {dyn, dyc, dyh, dyw}, dxs = {dxn, dxc, dxh, dxw};
  const long long Cv = C / V;
  const long long e0 = channels_last ? Cv : OW, e1 = channels_last ? OW : OH, e2 = channels_last ? OH : Cv;
  if (total < 0x80000000LL)
    pool2d_backward_tiled_loop<V, unsigned>(x, dy, dx, g, xs, dys, dxs, static_cast<unsigned>(total), channels_last,
                                            FastDiv(e0, m0), FastDiv(e1, m1), FastDiv(e2, m2));
  else
    pool2d_backward_tiled_loop<V, long long>(x, dy, dx, g, xs, dys, dxs, total, channels_last, WideDiv(e0, m0),
                                             WideDiv(e1, m1), WideDiv(e2, m2));
}
#define POOL2D_TILED_ARGS                                                                                              \
  x, dy, dx, C, H, W, OH, OW, kh, kw, avg, xn, xc, xh, xw, dyn, dyc, dyh, dyw, dxn, dxc, dxh, dxw, total, channels_last, \
      m0, m1, m2
extern "C" __global__ void cutrain_pool2d_backward_tiled(POOL2D_TILED_PARAMS) {
  pool2d_backward_tiled_entry<1>(POOL2D_TILED_ARGS);
}
extern "C" __global__ void cutrain_pool2d_backward_tiled_vec(POOL2D_TILED_PARAMS) {
  pool2d_backward_tiled_entry<VMAX>(POOL2D_TILED_ARGS);
}

// Global average pooling, x's planes contiguous or nearly (NCHW): one warp per (n, c) plane,
// lanes striding over its H W elements; y[n, c] = sum / (H W). Blocks of a multiple of 32 threads.
extern "C" __global__ void cutrain_global_avg_pool_planes(const T* x, T* y, long long N, long long C, long long H,
                                                          long long W, long long xn, long long xc, long long xh,
                                                          long long xw, long long yn, long long yc) {
  const long long warps = static_cast<long long>(gridDim.x) * (blockDim.x >> 5);
  const int lane = threadIdx.x & 31;
  const long long HW = H * W;
  const bool merged = xh == W * xw;  // the plane as one stride: no division per element
  for (long long p = static_cast<long long>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5); p < N * C;
       p += warps) {
    const long long n = p / C, c = p - n * C;
    const T* xp = x + n * xn + c * xc;
    float s = 0.0f;
    if (merged) {
      for (long long k = lane; k < HW; k += 32) s += to_f32(xp[k * xw]);
    } else {
      for (long long k = lane; k < HW; k += 32) {
        const long long h = k / W;
        s += to_f32(xp[h * xh + (k - h * W) * xw]);
      }
    }
    s = warp_sum(s);
    if (lane == 0) store(y + n * yn + c * yc, s / static_cast<float>(HW));
  }
}

// Global average pooling, channels innermost in x (NHWC): blocks of 32 x 8 threads; thread
// (tx, ty) sums channel 32 blockIdx.x + tx over positions ty, ty + 8, ... (a warp reads 32
// adjacent channels), and the 8 partial sums meet in shared memory. Grid (ceil(C / 32), images).
extern "C" __global__ void cutrain_global_avg_pool_channels(const T* x, T* y, long long N, long long C, long long H,
                                                            long long W, long long xn, long long xc, long long xh,
                                                            long long xw, long long yn, long long yc) {
  __shared__ float tile[8][33];
  const long long c = static_cast<long long>(blockIdx.x) * 32 + threadIdx.x;
  const long long HW = H * W;
  const bool merged = xh == W * xw;
  for (long long n = blockIdx.y; n < N; n += gridDim.y) {
    float s = 0.0f;
    if (c < C) {
      const T* xp = x + n * xn + c * xc;
      if (merged) {
        for (long long k = threadIdx.y; k < HW; k += 8) s += to_f32(xp[k * xw]);
      } else {
        for (long long k = threadIdx.y; k < HW; k += 8) {
          const long long h = k / W;
          s += to_f32(xp[h * xh + (k - h * W) * xw]);
        }
      }
    }
    tile[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
      float t = 0.0f;
      for (int j = 0; j < 8; ++j) t += tile[j][threadIdx.x];
      store(y + n * yn + c * yc, t / static_cast<float>(HW));
    }
    __syncthreads();  // the tile is reused by the next image
  }
}

// dx[n, c, h, w] = dy[n, c] / (H W): one thread per dx element, in dx's memory order.
template <class I, class D>
__device__ __forceinline__ void global_avg_pool_backward_loop(const T* dy, T* dx, long long dyn, long long dyc,
                                                              const Strides4& dxs, float hw, I total,
                                                              int channels_last, const D& d0, const D& d1,
                                                              const D& d2) {
  for (I i = static_cast<I>(thread_index()); i < total; i += static_cast<I>(grid_stride())) {
    I n, c, h, w;
    unravel4(i, d0, d1, d2, channels_last, n, c, h, w);
    store(dx + dxs.at(n, c, h, w), to_f32(dy[static_cast<long long>(n) * dyn + static_cast<long long>(c) * dyc]) / hw);
  }
}

extern "C" __global__ void cutrain_global_avg_pool_backward(const T* dy, T* dx, long long C, long long H, long long W,
                                                            long long dyn, long long dyc, long long dxn, long long dxc,
                                                            long long dxh, long long dxw, long long total,
                                                            int channels_last, unsigned long long m0,
                                                            unsigned long long m1, unsigned long long m2) {
  const Strides4 dxs = {dxn, dxc, dxh, dxw};
  const float hw = static_cast<float>(H * W);
  const long long e0 = channels_last ? C : W, e1 = channels_last ? W : H, e2 = channels_last ? H : C;
  if (total < 0x80000000LL)
    global_avg_pool_backward_loop<unsigned>(dy, dx, dyn, dyc, dxs, hw, static_cast<unsigned>(total), channels_last,
                                            FastDiv(e0, m0), FastDiv(e1, m1), FastDiv(e2, m2));
  else
    global_avg_pool_backward_loop<long long>(dy, dx, dyn, dyc, dxs, hw, total, channels_last, WideDiv(e0, m0),
                                             WideDiv(e1, m1), WideDiv(e2, m2));
}
