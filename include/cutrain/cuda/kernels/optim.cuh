// Element i's SGD update (the rule below): returns the new w[i], writes buf[i] with momentum.
__device__ __forceinline__ float sgd_update(float wi, float g, float* buf, long long i, float lr, float momentum,
                                            float dampening, float weight_decay, int nesterov, bool first_step) {
  if (weight_decay != 0.0f) g += weight_decay * wi;
  if (momentum != 0.0f) {
    const float b = first_step ? g : momentum * buf[i] + (1.0f - dampening) * g;
    buf[i] = b;
    g = nesterov ? g + momentum * b : b;
  }
  return wi - lr * g;
}

// Element i's AdamW update (the rule below): returns the new w[i], writes m[i] and v[i].
__device__ __forceinline__ float adamw_update(float wi, float g, float* m, float* v, long long i, float lr,
                                              float beta1, float beta2, float eps, float weight_decay,
                                              float step_size, float bias_correction2_sqrt) {
  wi *= 1.0f - lr * weight_decay;
  const float mi = beta1 * m[i] + (1.0f - beta1) * g;
  const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
  m[i] = mi;
  v[i] = vi;
  return wi - step_size * mi / (sqrtf(vi) / bias_correction2_sqrt + eps);
}

// g = grad + weight_decay * w; with momentum: buf = g on the first step, else
// buf = momentum * buf + (1 - dampening) * g, and g = buf (or g + momentum * buf, Nesterov);
// w -= lr * g. buf may be null when momentum == 0. hyper (may be null): lr and first_step read
// from device memory instead ({lr, first_step != 0}), for steps replayed from a CUDA graph.
extern "C" __global__ void cutrain_sgd_step(float* w, const G* grad, float* buf, long long n, float lr, float momentum,
                                            float dampening, float weight_decay, int nesterov, int first_step,
                                            const float* hyper) {
  if (hyper != 0) {
    lr = hyper[0];
    first_step = hyper[1] != 0.0f;
  }
  for (long long i = thread_index(); i < n; i += grid_stride())
    w[i] = sgd_update(w[i], to_f32(grad[i]), buf, i, lr, momentum, dampening, weight_decay, nesterov, first_step);
}

// w *= 1 - lr * weight_decay; m = beta1 m + (1 - beta1) g; v = beta2 v + (1 - beta2) g^2;
// w -= step_size * m / (sqrt(v) / bias_correction2_sqrt + eps), with step_size =
// lr / (1 - beta1^t) and bias_correction2_sqrt = sqrt(1 - beta2^t) computed on the host.
// hyper (may be null): {lr, step_size, bias_correction2_sqrt} read from device memory instead,
// for steps replayed from a CUDA graph.
extern "C" __global__ void cutrain_adamw_step(float* w, const G* grad, float* m, float* v, long long n, float lr,
                                              float beta1, float beta2, float eps, float weight_decay, float step_size,
                                              float bias_correction2_sqrt, const float* hyper) {
  if (hyper != 0) {
    lr = hyper[0];
    step_size = hyper[1];
    bias_correction2_sqrt = hyper[2];
  }
  for (long long i = thread_index(); i < n; i += grid_stride())
    w[i] = adamw_update(w[i], to_f32(grad[i]), m, v, i, lr, beta1, beta2, eps, weight_decay, step_size,
                        bias_correction2_sqrt);
}

// Many tensors' SGD or AdamW updates in one launch (PyTorch's foreach step): a list of up to 40
// tensors, cut into chunks of cutrain_optim_chunk elements; chunk c of the launch lies in the
// tensor t with first[t] <= c < first[t + 1]. Per tensor: h = SGD {lr, first_step, unused,
// weight_decay} or AdamW {lr, step_size, bias_correction2_sqrt, weight_decay}; hyper[t] (may be
// null) a device array whose first three floats replace h's (steps replayed from a CUDA graph);
// lo[t] (may be null) a 16-bit copy of w written with the new value, bf16 (lo_kind 1) or f16 (2),
// rounded as the cast kernel rounds.
#define cutrain_optim_list_max 40
#define cutrain_optim_chunk 8192
struct cutrain_optim_list {
  float* w[cutrain_optim_list_max];
  const G* g[cutrain_optim_list_max];
  float* s0[cutrain_optim_list_max];  // SGD: the momentum buffer (null without momentum); AdamW: m
  float* s1[cutrain_optim_list_max];  // AdamW: v
  const float* hyper[cutrain_optim_list_max];
  void* lo[cutrain_optim_list_max];
  float h[cutrain_optim_list_max][4];
  long long n[cutrain_optim_list_max];
  long long first[cutrain_optim_list_max + 1];
  int lo_kind[cutrain_optim_list_max];
  long long count;
};

__device__ __forceinline__ void store_copy(void* lo, int kind, long long i, float v) {
  if (kind == 1) store(static_cast<cutrain_bf16*>(lo) + i, v);
  else if (kind == 2) store(static_cast<cutrain_f16*>(lo) + i, v);
}

// The tensor of a list (cutrain_optim_list, cutrain_clip_list) that chunk c lies in.
template <class List>
__device__ __forceinline__ int list_tensor_of(const List& l, long long c) {
  int t = 0;
  while (t + 1 < l.count && l.first[t + 1] <= c) ++t;
  return t;
}

// Chunk c of the list: its tensor t, its elements [lo, hi), and h with hyper applied.
__device__ __forceinline__ int optim_chunk(const cutrain_optim_list& l, long long c, long long& lo, long long& hi,
                                           float h[4]) {
  const int t = list_tensor_of(l, c);
  lo = (c - l.first[t]) * cutrain_optim_chunk;
  hi = min(lo + cutrain_optim_chunk, l.n[t]);
  for (int j = 0; j < 4; ++j) h[j] = l.h[t][j];
  if (l.hyper[t] != 0)
    for (int j = 0; j < 3; ++j) h[j] = l.hyper[t][j];
  return t;
}

// cutrain_sgd_step over a list.
extern "C" __global__ void cutrain_sgd_list(cutrain_optim_list l, float momentum, float dampening, int nesterov) {
  for (long long c = blockIdx.x; c < l.first[l.count]; c += gridDim.x) {
    long long lo, hi;
    float h[4];
    const int t = optim_chunk(l, c, lo, hi, h);
    const float lr = h[0], weight_decay = h[3];
    const bool first_step = h[1] != 0.0f;
    float* w = l.w[t];
    float* buf = l.s0[t];
    const G* grad = l.g[t];
    void* copy = l.lo[t];
    const int kind = l.lo_kind[t];
    for (long long i = lo + threadIdx.x; i < hi; i += blockDim.x) {
      const float wn = sgd_update(w[i], to_f32(grad[i]), buf, i, lr, momentum, dampening, weight_decay, nesterov,
                                  first_step);
      w[i] = wn;
      store_copy(copy, kind, i, wn);
    }
  }
}

// cutrain_adamw_step over a list.
extern "C" __global__ void cutrain_adamw_list(cutrain_optim_list l, float beta1, float beta2, float eps) {
  for (long long c = blockIdx.x; c < l.first[l.count]; c += gridDim.x) {
    long long lo, hi;
    float h[4];
    const int t = optim_chunk(l, c, lo, hi, h);
    const float lr = h[0], step_size = h[1], bias_correction2_sqrt = h[2], weight_decay = h[3];
    float* w = l.w[t];
    float* m = l.s0[t];
    float* v = l.s1[t];
    const G* grad = l.g[t];
    void* copy = l.lo[t];
    const int kind = l.lo_kind[t];
    for (long long i = lo + threadIdx.x; i < hi; i += blockDim.x) {
      const float wn = adamw_update(w[i], to_f32(grad[i]), m, v, i, lr, beta1, beta2, eps, weight_decay, step_size,
                                    bias_correction2_sqrt);
      w[i] = wn;
      store_copy(copy, kind, i, wn);
    }
  }
}

// Exponential moving average of weights (optim::EMA): s = s + (1 - decay) * (w - s), in f32.
extern "C" __global__ void cutrain_ema_update(float* s, const float* w, long long n, float decay) {
  const float k = 1.0f - decay;
  for (long long i = thread_index(); i < n; i += grid_stride()) s[i] += k * (w[i] - s[i]);
}

// cutrain_ema_update over a list (f32 programs): w[t] the averages, g[t] the values they follow.
extern "C" __global__ void cutrain_ema_list(cutrain_optim_list l, float decay) {
  const float k = 1.0f - decay;
  for (long long c = blockIdx.x; c < l.first[l.count]; c += gridDim.x) {
    long long lo, hi;
    float h[4];
    const int t = optim_chunk(l, c, lo, hi, h);
    float* s = l.w[t];
    const G* w = l.g[t];
    for (long long i = lo + threadIdx.x; i < hi; i += blockDim.x) s[i] += k * (to_f32(w[i]) - s[i]);
  }
}

// Dynamic loss scaling: g *= inv_scale in place, and *found_inf = 1 when a result is inf or NaN
// (never cleared here; every writer writes 1).
extern "C" __global__ void cutrain_unscale_check(G* g, long long n, float inv_scale, int* found_inf) {
  int bad = 0;
  for (long long i = thread_index(); i < n; i += grid_stride()) {
    const float v = to_f32(g[i]) * inv_scale;
    bad |= !(fabsf(v) <= 3.402823466e38f);  // false for NaN too
    store(g + i, v);
  }
  if (bad) *found_inf = 1;
}

// Gradient clipping over many tensors at once (optim/clip.hpp), a list of up to 64 dense
// tensors a launch, cut into chunks of cutrain_clip_chunk elements; chunk c of the launch lies
// in the tensor t with first[t] <= c < first[t + 1].
#define cutrain_clip_list_max 64
#define cutrain_clip_chunk 8192
struct cutrain_clip_list {
  const G* in[cutrain_clip_list_max];
  G* out[cutrain_clip_list_max];
  long long n[cutrain_clip_list_max];
  long long first[cutrain_clip_list_max + 1];
  long long count, partial_offset;
};

// partial[partial_offset + c] = the sum of squares of chunk c, in f32 (a fixed order).
extern "C" __global__ void cutrain_clip_sum_squares(cutrain_clip_list l, float* partial) {
  for (long long c = blockIdx.x; c < l.first[l.count]; c += gridDim.x) {
    const int t = list_tensor_of(l, c);
    const long long lo = (c - l.first[t]) * cutrain_clip_chunk;
    const long long hi = min(lo + cutrain_clip_chunk, l.n[t]);
    float s = 0.0f;
    for (long long i = lo + threadIdx.x; i < hi; i += blockDim.x) {
      const float v = to_f32(l.in[t][i]);
      s += v * v;
    }
    s = block_sum(s);
    if (threadIdx.x == 0) partial[l.partial_offset + c] = s;
  }
}

// One block: norm = sqrt(sum of the partials), coef = min(1, max_norm / (norm + 1e-6)).
extern "C" __global__ void cutrain_clip_coef(const float* partial, long long count, float max_norm, G* norm,
                                             float* coef) {
  float s = 0.0f;
  for (long long i = threadIdx.x; i < count; i += blockDim.x) s += partial[i];
  s = block_sum(s);
  if (threadIdx.x == 0) {
    const float r = sqrtf(s);
    store(norm, r);
    *coef = fminf(1.0f, max_norm / (r + 1e-6f));
  }
}

// out[t][i] = in[t][i] * coef, chunk by chunk.
extern "C" __global__ void cutrain_clip_scale(cutrain_clip_list l, const float* coef) {
  const float k = *coef;
  for (long long c = blockIdx.x; c < l.first[l.count]; c += gridDim.x) {
    const int t = list_tensor_of(l, c);
    const long long lo = (c - l.first[t]) * cutrain_clip_chunk;
    const long long hi = min(lo + cutrain_clip_chunk, l.n[t]);
    for (long long i = lo + threadIdx.x; i < hi; i += blockDim.x) store(l.out[t] + i, to_f32(l.in[t][i]) * k);
  }
}
