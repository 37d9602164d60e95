// The classifier's softmax cross-entropy over logits that a matmul wrote into rows of ld elements,
// the first C of which are classes (ld >= C, padded so that the matmuls see aligned rows), with
// label smoothing eps (target (1 - eps) onehot + eps / C) and an ignored label. The gradient is
// written over the logits: no second [rows, classes] buffer.

// *count = the number of labels that are not ignore_index. One block of 256 threads.
extern "C" __global__ void cutrain_lce_count(const int* labels, long long n, int ignore_index, int* count) {
  __shared__ long long part[256];
  long long k = 0;
  for (long long i = threadIdx.x; i < n; i += blockDim.x) k += labels[i] != ignore_index ? 1 : 0;
  part[threadIdx.x] = k;
  __syncthreads();
  for (unsigned half_size = 128; half_size > 0; half_size >>= 1) {
    if (threadIdx.x < half_size) part[threadIdx.x] += part[threadIdx.x + half_size];
    __syncthreads();
  }
  if (threadIdx.x == 0) *count = static_cast<int>(part[0]);
}

// 16 bytes of T: what one thread loads at once where rows are 16-byte aligned.
#define CUTRAIN_LCE_VEC (16 / static_cast<int>(sizeof(T)))
union cutrain_lce_pack {
  uint4 u;
  T e[16 / sizeof(T)];
};

// One block per row (a multiple of 32 threads). row_loss[row] = the row's loss in f32 (0 for an
// ignored row). When grad != 0 the row's first C logits become (softmax - q) * scale, with scale
// 1 / *count for the mean, 1 for the sum (0 on an ignored row). vec != 0: rows start 16-byte
// aligned, read 16 bytes a thread. A label outside [0, C) that is not ignore_index gives NaN.
extern "C" __global__ void cutrain_lce_rows(T* logits, long long ld, const int* labels, long long C, float eps,
                                            int ignore_index, float* row_loss, int grad, const int* count, int mean,
                                            int vec) {
  const long long row = blockIdx.x;
  T* x = logits + row * ld;
  const int label = labels[row];
  const bool ignored = label == ignore_index;
  const bool bad_label = !ignored && (label < 0 || label >= C);
  const float neg_inf = __uint_as_float(0xff800000u), nan = __uint_as_float(0x7fc00000u);
  const long long packs = vec ? C / CUTRAIN_LCE_VEC : 0;

  // One pass for the max and the sum of exponentials (rescaled as the max grows), and the sum.
  float m = neg_inf, s = 0.0f, sx = 0.0f;
  for (long long p = threadIdx.x; p < packs; p += blockDim.x) {
    cutrain_lce_pack k;
    k.u = reinterpret_cast<const uint4*>(x)[p];
    float pm = neg_inf;
    for (int j = 0; j < CUTRAIN_LCE_VEC; ++j) pm = fmaxf(pm, to_f32(k.e[j]));
    const float mn = fmaxf(m, pm);
    s *= expf(m - mn);
    m = mn;
    for (int j = 0; j < CUTRAIN_LCE_VEC; ++j) {
      const float v = to_f32(k.e[j]);
      s += expf(v - m);
      sx += v;
    }
  }
  for (long long c = packs * CUTRAIN_LCE_VEC + threadIdx.x; c < C; c += blockDim.x) {
    const float v = to_f32(x[c]);
    const float mn = fmaxf(m, v);
    s = s * expf(m - mn) + expf(v - mn);
    m = mn;
    sx += v;
  }
  const float row_max = block_max(m);
  s = m == neg_inf ? 0.0f : s * expf(m - row_max);
  s = block_sum(s);
  sx = block_sum(sx);
  const float lse = row_max + logf(s);  // log_softmax(x)_c = x_c - lse

  if (threadIdx.x == 0) {
    float l = 0.0f;
    if (bad_label) l = nan;
    else if (!ignored) l = -((1.0f - eps) * (to_f32(x[label]) - lse) + eps / static_cast<float>(C) * (sx - static_cast<float>(C) * lse));
    row_loss[row] = l;
  }
  if (grad == 0) return;
  __syncthreads();  // thread 0 has read x[label] before it is overwritten

  const float scale = ignored ? 0.0f : bad_label ? nan : mean ? 1.0f / static_cast<float>(*count) : 1.0f;
  const float off = eps / static_cast<float>(C), hit = 1.0f - eps;
  for (long long p = threadIdx.x; p < packs; p += blockDim.x) {
    cutrain_lce_pack k;
    k.u = reinterpret_cast<const uint4*>(x)[p];
    for (int j = 0; j < CUTRAIN_LCE_VEC; ++j) {
      const long long c = p * CUTRAIN_LCE_VEC + j;
      const float g = expf(to_f32(k.e[j]) - lse) - off - (c == label ? hit : 0.0f);
      store(&k.e[j], g * scale);
    }
    reinterpret_cast<uint4*>(x)[p] = k.u;
  }
  for (long long c = packs * CUTRAIN_LCE_VEC + threadIdx.x; c < C; c += blockDim.x) {
    const float g = expf(to_f32(x[c]) - lse) - off - (c == label ? hit : 0.0f);
    store(x + c, g * scale);
  }
}

// loss[0] = the sum of row_loss[0..n), divided by *count when mean != 0, summed in f64 in a fixed
// order (deterministic). One block of 256 threads.
extern "C" __global__ void cutrain_lce_reduce(const float* row_loss, long long n, const int* count, int mean,
                                              float* loss) {
  __shared__ double part[256];
  double s = 0.0;
  for (long long i = threadIdx.x; i < n; i += blockDim.x) s += row_loss[i];
  part[threadIdx.x] = s;
  __syncthreads();
  for (unsigned half_size = 128; half_size > 0; half_size >>= 1) {
    if (threadIdx.x < half_size) part[threadIdx.x] += part[threadIdx.x + half_size];
    __syncthreads();
  }
  if (threadIdx.x == 0) *loss = static_cast<float>(mean ? part[0] / static_cast<double>(*count) : part[0]);
}

// acc (f32) = src when assign != 0, else acc + src: a chunk's weight gradient added up in f32.
extern "C" __global__ void cutrain_lce_accumulate(const T* src, float* acc, long long n, int assign) {
  for (long long i = thread_index(); i < n; i += grid_stride())
    acc[i] = assign ? to_f32(src[i]) : acc[i] + to_f32(src[i]);
}

// y = x * *s: the gradients scaled by the upstream gradient of the loss, read on the device.
extern "C" __global__ void cutrain_lce_scale(const T* x, T* y, long long n, const float* s) {
  const float k = *s;
  for (long long i = thread_index(); i < n; i += grid_stride()) store(y + i, to_f32(x[i]) * k);
}
extern "C" __global__ void cutrain_lce_scale_f32(const float* x, float* y, long long n, const float* s) {
  const float k = *s;
  for (long long i = thread_index(); i < n; i += grid_stride()) y[i] = x[i] * k;
}
