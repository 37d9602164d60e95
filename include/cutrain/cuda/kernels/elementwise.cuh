constexpr int VMAX = 16 / sizeof(T);
template <int V>
struct alignas(V * sizeof(T)) Pack {
  T v[V];
};

extern "C" __global__ void cutrain_add(const T* a, const T* b, T* y, long long n) {
  for (long long i = thread_index(); i < n; i += grid_stride()) store(y + i, to_f32(a[i]) + to_f32(b[i]));
}

// add with VMAX elements (16 bytes) per thread over n / VMAX packs: the host launches it where n
// is a multiple of VMAX and a, b and y are 16-byte aligned (memory-bound: the wide accesses
// reach the bandwidth that 2-byte ones do not).
extern "C" __global__ void cutrain_add_vec(const T* a, const T* b, T* y, long long packs) {
  for (long long i = thread_index(); i < packs; i += grid_stride()) {
    const Pack<VMAX> pa = reinterpret_cast<const Pack<VMAX>*>(a)[i], pb = reinterpret_cast<const Pack<VMAX>*>(b)[i];
    Pack<VMAX> py;
#pragma unroll
    for (int k = 0; k < VMAX; ++k) store(&py.v[k], to_f32(pa.v[k]) + to_f32(pb.v[k]));
    reinterpret_cast<Pack<VMAX>*>(y)[i] = py;
  }
}

extern "C" __global__ void cutrain_multiply(const T* a, const T* b, T* y, long long n) {
  for (long long i = thread_index(); i < n; i += grid_stride()) store(y + i, to_f32(a[i]) * to_f32(b[i]));
}

extern "C" __global__ void cutrain_scale(const T* a, float alpha, T* y, long long n) {
  for (long long i = thread_index(); i < n; i += grid_stride()) store(y + i, alpha * to_f32(a[i]));
}
