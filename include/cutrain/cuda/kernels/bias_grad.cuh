// NCHW dy viewed as [N, K, HW]: block (k, s) sums dy[n, k, :] for n = s, s + S, ... into
// partial[s * K + k]. Grid (K, S), one-dimensional blocks of a multiple of 32 threads.
extern "C" __global__ void cutrain_bias_grad_nchw(const T* dy, long long N, long long K, long long HW, float* partial) {
  const long long k = blockIdx.x, s = blockIdx.y, S = gridDim.y;
  float acc = 0.0f;
  for (long long img = s; img < N; img += S) {
    const T* p = dy + (img * K + k) * HW;
    for (long long j = threadIdx.x; j < HW; j += blockDim.x) acc += to_f32(p[j]);
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) partial[s * K + k] = acc;
}

// NHWC dy viewed as rows [R = N*H*W, K]: block (b, s) of 32 x 8 threads; thread (x, y) sums
// channel k = 32 b + x over rows r = 8 s + y, stepping 8 S (reads of a warp are coalesced), and
// the 8 sums of a channel meet in shared memory. Grid (ceil(K / 32), S).
extern "C" __global__ void cutrain_bias_grad_nhwc(const T* dy, long long R, long long K, float* partial) {
  __shared__ float tile[8][33];
  const long long k = static_cast<long long>(blockIdx.x) * 32 + threadIdx.x;
  const long long s = blockIdx.y, S = gridDim.y;
  float acc = 0.0f;
  if (k < K)
    for (long long r = s * 8 + threadIdx.y; r < R; r += S * 8) acc += to_f32(dy[r * K + k]);
  tile[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && k < K) {
    float t = 0.0f;
    for (int j = 0; j < 8; ++j) t += tile[j][threadIdx.x];
    partial[s * K + k] = t;
  }
}

// db[k] = sum over s of partial[s * K + k], in order.
extern "C" __global__ void cutrain_bias_grad_finish(const float* partial, long long K, long long S, T* db) {
  for (long long k = thread_index(); k < K; k += grid_stride()) {
    float t = 0.0f;
    for (long long s = 0; s < S; ++s) t += partial[s * K + k];
    store(db + k, t);
  }
}
