#include "kernels/cuda/elementwise_kernels.h"

namespace tessera {
namespace cuda {
namespace {

constexpr int kRmsNormThreads =
    256;  // One block per row; a multiple of the warp size.
static_assert(kRmsNormThreads % 32 == 0, "RmsNorm block must be whole warps");

__device__ float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Accumulates the sum of squares in f32 per thread, reduces across warps
// through shared memory, then scales. Matches the CPU reference to f32
// rounding.
__global__ void RmsNormKernel(const float* __restrict__ x,
                              const float* __restrict__ weight, float eps,
                              int64_t n, float* __restrict__ out) {
  const int64_t row = blockIdx.x;
  const float* in = x + row * n;
  float* o = out + row * n;
  float sum_sq = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sum_sq += in[i] * in[i];
  __shared__ float warp_sums[kRmsNormThreads / 32];
  sum_sq = WarpSum(sum_sq);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum_sq;
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = threadIdx.x < blockDim.x / 32 ? warp_sums[threadIdx.x] : 0.0f;
    v = WarpSum(v);
    if (threadIdx.x == 0) warp_sums[0] = v;
  }
  __syncthreads();
  const float inv_rms = rsqrtf(warp_sums[0] / static_cast<float>(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    o[i] = in[i] * inv_rms * weight[i];
}

__global__ void SiluMulKernel(const float* __restrict__ gate,
                              const float* __restrict__ up, int64_t count,
                              float* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       i < count; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    out[i] = g / (1.0f + __expf(-g)) * up[i];
  }
}

}  // namespace

cudaError_t LaunchRmsNorm(const float* x, const float* weight, float eps,
                          int64_t rows, int64_t n, float* out,
                          cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  RmsNormKernel<<<static_cast<unsigned>(rows), kRmsNormThreads, 0, stream>>>(
      x, weight, eps, n, out);
  return cudaGetLastError();
}

cudaError_t LaunchSiluMul(const float* gate, const float* up, int64_t count,
                          float* out, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const int64_t blocks = (count + kThreads - 1) / kThreads;
  SiluMulKernel<<<static_cast<unsigned>(blocks < 65535 ? blocks : 65535),
                  kThreads, 0, stream>>>(gate, up, count, out);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace tessera
