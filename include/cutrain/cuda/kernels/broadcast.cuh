// Broadcasting elementwise ops (cuda/kernels/broadcast.hpp), the formulas of cpu/broadcast.hpp
// in f32: binary ops and their local gradients, unary ops and their backward, comparisons (u8
// 0/1) and where. One thread per output element, grid-stride; each operand is read (or written)
// through its own strides at the output's coordinates, 0 along the dims it is broadcast over.
// The op codes are the values of core/params/elementwise.hpp's enums.

// The output's dims (after the host merged dims that every operand walks contiguously, and
// dropped size-1 ones), and per operand its strides in elements: operand 0 is what the kernel
// writes, 1-3 what it reads, in the order of the kernel's pointer arguments.
struct cutrain_bcast_args {
  long long n, rank;
  long long size[8];
  long long stride[4][8];
};

// The offsets of output element i in the first K operands.
template <int K>
__device__ __forceinline__ void bcast_offsets(const cutrain_bcast_args& g, long long i, long long (&off)[K]) {
  for (int k = 0; k < K; ++k) off[k] = 0;
  for (int d = static_cast<int>(g.rank) - 1; d >= 0; --d) {
    const long long c = i % g.size[d];
    i /= g.size[d];
    for (int k = 0; k < K; ++k) off[k] += c * g.stride[k][d];
  }
}

// minimum (4) / maximum (5) take b only where b is strictly smaller / larger, or NaN: ties go to
// a, and a NaN in either input is the result.
__device__ __forceinline__ bool bcast_picks_b(int op, float a, float b) {
  return op == 4 ? (b < a || b != b) : (b > a || b != b);
}

__device__ __forceinline__ float bcast_binary_value(int op, float a, float b) {
  switch (op) {
    case 0: return a + b;
    case 1: return a - b;
    case 2: return a * b;
    case 3: return a / b;
    case 6: return powf(a, b);
    default: return bcast_picks_b(op, a, b) ? b : a;
  }
}

// d(a op b)/da (which 0) or /db (which 1); pow's as cpu/broadcast.hpp's (PyTorch's zeros).
__device__ __forceinline__ float bcast_binary_derivative(int op, float a, float b, int which) {
  switch (op) {
    case 0: return 1.0f;
    case 1: return which == 0 ? 1.0f : -1.0f;
    case 2: return which == 0 ? b : a;
    case 3: return which == 0 ? 1.0f / b : -a / (b * b);
    case 6:
      if (which == 0) return b == 0.0f ? 0.0f : b * powf(a, b - 1.0f);
      return a == 0.0f && b >= 0.0f ? 0.0f : powf(a, b) * logf(a);
    default: return (bcast_picks_b(op, a, b) == (which == 1)) ? 1.0f : 0.0f;
  }
}

// exp, log, sqrt, rsqrt, neg, abs, pow (p: the exponent).
__device__ __forceinline__ float bcast_unary_value(int op, float x, float p) {
  switch (op) {
    case 0: return expf(x);
    case 1: return logf(x);
    case 2: return sqrtf(x);
    case 3: return 1.0f / sqrtf(x);
    case 4: return -x;
    case 5: return fabsf(x);
    default: return powf(x, p);
  }
}

// f'(x); abs' is sign(x) (0 at 0), pow's with exponent 0 is 0.
__device__ __forceinline__ float bcast_unary_derivative(int op, float x, float p) {
  switch (op) {
    case 0: return expf(x);
    case 1: return 1.0f / x;
    case 2: return 0.5f / sqrtf(x);
    case 3: return -0.5f / (x * sqrtf(x));
    case 4: return -1.0f;
    case 5: return x > 0.0f ? 1.0f : x < 0.0f ? -1.0f : 0.0f;
    default: return p == 0.0f ? 0.0f : p * powf(x, p - 1.0f);
  }
}

// eq, ne, lt, le, gt, ge.
__device__ __forceinline__ bool bcast_compare_value(int op, float a, float b) {
  switch (op) {
    case 0: return a == b;
    case 1: return a != b;
    case 2: return a < b;
    case 3: return a <= b;
    case 4: return a > b;
    default: return a >= b;
  }
}

// Operands: y, a, b.
extern "C" __global__ void cutrain_bcast_binary(const T* a, const T* b, T* y, cutrain_bcast_args g, int op) {
  for (long long i = thread_index(); i < g.n; i += grid_stride()) {
    long long o[3];
    bcast_offsets<3>(g, i, o);
    store(y + o[0], bcast_binary_value(op, to_f32(a[o[1]]), to_f32(b[o[2]])));
  }
}

// Operands: gr, a, b, dy. gr = dy * d(a op b)/d(input `which`).
extern "C" __global__ void cutrain_bcast_binary_grad(const T* a, const T* b, const T* dy, T* gr, cutrain_bcast_args g,
                                                     int op, int which) {
  for (long long i = thread_index(); i < g.n; i += grid_stride()) {
    long long o[4];
    bcast_offsets<4>(g, i, o);
    store(gr + o[0], to_f32(dy[o[3]]) * bcast_binary_derivative(op, to_f32(a[o[1]]), to_f32(b[o[2]]), which));
  }
}

// Operands: y, x.
extern "C" __global__ void cutrain_bcast_unary(const T* x, T* y, cutrain_bcast_args g, int op, float p) {
  for (long long i = thread_index(); i < g.n; i += grid_stride()) {
    long long o[2];
    bcast_offsets<2>(g, i, o);
    store(y + o[0], bcast_unary_value(op, to_f32(x[o[1]]), p));
  }
}

// Operands: dx, x, dy.
extern "C" __global__ void cutrain_bcast_unary_grad(const T* x, const T* dy, T* dx, cutrain_bcast_args g, int op,
                                                    float p) {
  for (long long i = thread_index(); i < g.n; i += grid_stride()) {
    long long o[3];
    bcast_offsets<3>(g, i, o);
    store(dx + o[0], to_f32(dy[o[2]]) * bcast_unary_derivative(op, to_f32(x[o[1]]), p));
  }
}

// Operands: y (u8), a, b.
extern "C" __global__ void cutrain_bcast_compare(const T* a, const T* b, unsigned char* y, cutrain_bcast_args g,
                                                 int op) {
  for (long long i = thread_index(); i < g.n; i += grid_stride()) {
    long long o[3];
    bcast_offsets<3>(g, i, o);
    y[o[0]] = bcast_compare_value(op, to_f32(a[o[1]]), to_f32(b[o[2]])) ? 1 : 0;
  }
}

// Operands: y, cond, a, b. Selects without converting: the element's bits are copied.
extern "C" __global__ void cutrain_bcast_where(const unsigned char* c, const T* a, const T* b, T* y,
                                               cutrain_bcast_args g) {
  for (long long i = thread_index(); i < g.n; i += grid_stride()) {
    long long o[4];
    bcast_offsets<4>(g, i, o);
    y[o[0]] = c[o[1]] != 0 ? a[o[2]] : b[o[3]];
  }
}

// Operands: gr, cond, dy. gr = dy where cond selects input `which` (0: a, 1: b), else 0.
extern "C" __global__ void cutrain_bcast_where_grad(const unsigned char* c, const T* dy, T* gr, cutrain_bcast_args g,
                                                    int which) {
  for (long long i = thread_index(); i < g.n; i += grid_stride()) {
    long long o[3];
    bcast_offsets<3>(g, i, o);
    if ((c[o[1]] != 0) == (which == 0)) gr[o[0]] = dy[o[2]];
    else store(gr + o[0], 0.0f);
  }
}
