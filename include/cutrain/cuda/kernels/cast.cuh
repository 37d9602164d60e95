extern "C" __global__ void cutrain_cast(const T* x, U* y, long long n) {
  for (long long i = thread_index(); i < n; i += grid_stride()) store(y + i, to_f32(x[i]));
}
