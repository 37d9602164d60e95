// Dilated 2-d pooling (dilation_h or dilation_w != 1), forward and backward, with the semantics of
// cpu/pool2d.hpp: a window's taps lie dilation apart; max takes the first maximum in
// row-then-column order or the first NaN, padding never wins (it is not visited); average divides
// by the taps inside the input, or with count_include_pad by those inside the padded input (not
// the ceil-mode overhang). A simple path, one element per thread, 64-bit index math: the fast
// kernels of pool2d.cuh handle dilation 1. Every tensor is indexed by its own strides.

struct DilStrides {
  long long n, c, h, w;
  __device__ __forceinline__ long long at(long long in, long long ic, long long ih, long long iw) const {
    return in * n + ic * c + ih * h + iw * w;
  }
};

struct DilGeom {
  long long C, H, W, OH, OW;
  int kh, kw, sh, sw, pt, pb, pl, pr, dh, dw, avg, count_include_pad;
};

// Of the taps start, start + d, ... (kernel of them): the first inside [0, in), how many are
// inside [0, in), and how many lie below in + pad_hi (what count_include_pad counts): as
// cpu/pool2d.hpp's pool_taps.
struct DilTaps {
  long long first, taps, padded;
};

__device__ __forceinline__ long long dil_below(long long limit, long long start, long long kernel, long long d) {
  const long long t = (limit - start + d - 1) / d;
  return t <= 0 ? 0 : (t < kernel ? t : kernel);
}

__device__ __forceinline__ DilTaps dil_taps(long long start, long long kernel, long long d, long long in,
                                            long long pad_hi) {
  const long long t0 = start >= 0 ? 0 : (-start + d - 1) / d;
  const long long t1 = dil_below(in, start, kernel, d);
  DilTaps r;
  r.first = start + t0 * d;
  r.taps = t1 > t0 ? t1 - t0 : 0;
  r.padded = dil_below(in + pad_hi, start, kernel, d);
  return r;
}

// Output (i, j)'s window: rows rt.first + a dh (a < rt.taps), columns ct.first + b dw (b < ct.taps).
struct DilWin {
  DilTaps rt, ct;
};

__device__ __forceinline__ DilWin dil_window(const DilGeom& g, long long i, long long j) {
  DilWin win;
  win.rt = dil_taps(i * g.sh - g.pt, g.kh, g.dh, g.H, g.pb);
  win.ct = dil_taps(j * g.sw - g.pl, g.kw, g.dw, g.W, g.pr);
  return win;
}

__device__ __forceinline__ float dil_divisor(const DilGeom& g, const DilWin& win) {
  return static_cast<float>(g.count_include_pad ? win.rt.padded * win.ct.padded : win.rt.taps * win.ct.taps);
}

// The window's maximum and its row and column: the first maximum in row-then-column order, or the
// first NaN (cpu/pool2d.hpp's pool_argmax). xp points at (n, c); every window holds a tap (the
// host's pool2d_output_shape refuses the others).
__device__ __forceinline__ float dil_max(const T* xp, const DilStrides& xs, const DilGeom& g, const DilWin& win,
                                         long long& br, long long& bq) {
  br = win.rt.first;
  bq = win.ct.first;
  float best = to_f32(xp[br * xs.h + bq * xs.w]);
  if (best != best) return best;
  for (long long a = 0; a < win.rt.taps; ++a) {
    const long long r = win.rt.first + a * g.dh;
    for (long long b = 0; b < win.ct.taps; ++b) {
      const long long q = win.ct.first + b * g.dw;
      const float v = to_f32(xp[r * xs.h + q * xs.w]);
      if (v != v) {
        br = r;
        bq = q;
        return v;
      }
      if (v > best) {
        best = v;
        br = r;
        bq = q;
      }
    }
  }
  return best;
}

// Element i of a [N, C, E1, E2] tensor walked in memory order (channels_last: C fastest, else E2
// fastest) -> (n, c, e1, e2).
__device__ __forceinline__ void dil_unravel(long long i, long long C, long long E1, long long E2, int channels_last,
                                            long long& n, long long& c, long long& e1, long long& e2) {
  if (channels_last) {
    c = i % C;
    i /= C;
    e2 = i % E2;
    i /= E2;
    e1 = i % E1;
    n = i / E1;
  } else {
    e2 = i % E2;
    i /= E2;
    e1 = i % E1;
    i /= E1;
    c = i % C;
    n = i / C;
  }
}

#define POOL2D_DILATED_GEOM_PARAMS                                                                                   \
  long long C, long long H, long long W, long long OH, long long OW, int kh, int kw, int sh, int sw, int pt, int pb, \
      int pl, int pr, int dh, int dw, int avg, int count_include_pad
#define POOL2D_DILATED_GEOM {C, H, W, OH, OW, kh, kw, sh, sw, pt, pb, pl, pr, dh, dw, avg, count_include_pad}

// y [N, C, OH, OW] from x [N, C, H, W]: one thread per output, in y's memory order
// (channels_last: NHWC order); total = N C OH OW.
extern "C" __global__ void cutrain_pool2d_dilated_forward(const T* x, T* y, POOL2D_DILATED_GEOM_PARAMS, long long xn,
                                                          long long xc, long long xh, long long xw, long long yn,
                                                          long long yc, long long yh, long long yw, long long total,
                                                          int channels_last) {
  const DilGeom g = POOL2D_DILATED_GEOM;
  const DilStrides xs = {xn, xc, xh, xw}, ys = {yn, yc, yh, yw};
  for (long long i = thread_index(); i < total; i += grid_stride()) {
    long long n, c, oh, ow;
    dil_unravel(i, g.C, g.OH, g.OW, channels_last, n, c, oh, ow);
    const DilWin win = dil_window(g, oh, ow);
    const T* xp = x + n * xs.n + c * xs.c;
    float v;
    if (g.avg) {
      float sum = 0.0f;
      for (long long a = 0; a < win.rt.taps; ++a) {
        const long long r = win.rt.first + a * g.dh;
        for (long long b = 0; b < win.ct.taps; ++b) sum += to_f32(xp[r * xs.h + (win.ct.first + b * g.dw) * xs.w]);
      }
      v = sum / dil_divisor(g, win);
    } else {
      long long br, bq;
      v = dil_max(xp, xs, g, win, br, bq);
    }
    store(y + ys.at(n, c, oh, ow), v);
  }
}

// The indices of the maxima (ops::max_pool2d_indices): idx [N, C, OH, OW], contiguous NCHW, gets
// r W + q, the flat index in its (n, c) plane of the window's maximum by dil_max's rule. One thread
// per output; total = N C OH OW. Any dilation, 1 included.
extern "C" __global__ void cutrain_pool2d_dilated_indices(const T* x, int* idx, POOL2D_DILATED_GEOM_PARAMS, long long xn,
                                                          long long xc, long long xh, long long xw, long long total) {
  const DilGeom g = POOL2D_DILATED_GEOM;
  const DilStrides xs = {xn, xc, xh, xw};
  for (long long i = thread_index(); i < total; i += grid_stride()) {
    long long n, c, oh, ow, br, bq;
    dil_unravel(i, g.C, g.OH, g.OW, 0, n, c, oh, ow);
    dil_max(x + n * xs.n + c * xs.c, xs, g, dil_window(g, oh, ow), br, bq);
    idx[i] = static_cast<int>(br * g.W + bq);
  }
}

// dx [N, C, H, W] for dy = dL/dy: one thread per dx element, in dx's memory order; total = N C H W.
// Each visits the windows holding it, oi sh - pt + a dh == h and oj sw - pl + b dw == w, in
// row-major order of (oi, oj) as the CPU adds them, and adds dy / divisor (average) or dy where
// the window's maximum, recomputed with the forward's rule, is this element (max). No atomics:
// deterministic. x is read for max only.
extern "C" __global__ void cutrain_pool2d_dilated_backward(const T* x, const T* dy, T* dx, POOL2D_DILATED_GEOM_PARAMS,
                                                           long long xn, long long xc, long long xh, long long xw,
                                                           long long dyn, long long dyc, long long dyh, long long dyw,
                                                           long long dxn, long long dxc, long long dxh, long long dxw,
                                                           long long total, int channels_last) {
  const DilGeom g = POOL2D_DILATED_GEOM;
  const DilStrides xs = {xn, xc, xh, xw}, dys = {dyn, dyc, dyh, dyw}, dxs = {dxn, dxc, dxh, dxw};
  for (long long i = thread_index(); i < total; i += grid_stride()) {
    long long n, c, h, w;
    dil_unravel(i, g.C, g.H, g.W, channels_last, n, c, h, w);
    const T* xp = x + n * xs.n + c * xs.c;
    const T* dyp = dy + n * dys.n + c * dys.c;
    float acc = 0.0f;
    // oi grows as the tap a falls: walk a from the last tap down for rising oi (each oi has at
    // most one a with oi sh - pt + a dh == h, since dh >= 1).
    for (int a = g.kh - 1; a >= 0; --a) {
      const long long nh = h + g.pt - static_cast<long long>(a) * g.dh;
      if (nh < 0 || nh % g.sh != 0) continue;
      const long long oi = nh / g.sh;
      if (oi >= g.OH) continue;
      for (int b = g.kw - 1; b >= 0; --b) {
        const long long nw = w + g.pl - static_cast<long long>(b) * g.dw;
        if (nw < 0 || nw % g.sw != 0) continue;
        const long long oj = nw / g.sw;
        if (oj >= g.OW) continue;
        const DilWin win = dil_window(g, oi, oj);
        const float d = to_f32(dyp[oi * dys.h + oj * dys.w]);
        if (g.avg) {
          acc += d / dil_divisor(g, win);
        } else {
          long long br, bq;
          dil_max(xp, xs, g, win, br, bq);
          if (br == h && bq == w) acc += d;
        }
      }
    }
    store(dx + dxs.at(n, c, h, w), acc);
  }
}
