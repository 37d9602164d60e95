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
  for (long long i = thread_index(); i < n; i += grid_stride()) {
    const float wi = w[i];
    float g = to_f32(grad[i]);
    if (weight_decay != 0.0f) g += weight_decay * wi;
    if (momentum != 0.0f) {
      const float b = first_step ? g : momentum * buf[i] + (1.0f - dampening) * g;
      buf[i] = b;
      g = nesterov ? g + momentum * b : b;
    }
    w[i] = wi - lr * g;
  }
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
  for (long long i = thread_index(); i < n; i += grid_stride()) {
    const float g = to_f32(grad[i]);
    const float wi = w[i] * (1.0f - lr * weight_decay);
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    w[i] = wi - step_size * mi / (sqrtf(vi) / bias_correction2_sqrt + eps);
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
