extern "C" __global__ void cutrain_add(const T* a, const T* b, T* y, long long n) {
  for (long long i = thread_index(); i < n; i += grid_stride()) store(y + i, to_f32(a[i]) + to_f32(b[i]));
}

extern "C" __global__ void cutrain_multiply(const T* a, const T* b, T* y, long long n) {
  for (long long i = thread_index(); i < n; i += grid_stride()) store(y + i, to_f32(a[i]) * to_f32(b[i]));
}

extern "C" __global__ void cutrain_scale(const T* a, float alpha, T* y, long long n) {
  for (long long i = thread_index(); i < n; i += grid_stride()) store(y + i, alpha * to_f32(a[i]));
}
