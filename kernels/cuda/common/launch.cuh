// Launch dimensions and grid-stride loops shared by the kernels (device code
// and host launchers in .cu files only).
#ifndef TESSERA_KERNELS_CUDA_COMMON_LAUNCH_CUH_
#define TESSERA_KERNELS_CUDA_COMMON_LAUNCH_CUH_

#include <cuda_runtime.h>

#include <cstdint>

namespace tessera {
namespace cuda {

// The largest grid along y and z (and the cap the grid-stride launches put on
// x, which is enough blocks to fill any GPU).
constexpr int64_t kMaxGridDim = 65535;

// Blocks for a grid-stride loop over `count` elements with `threads` threads
// a block: one element a thread, at most kMaxGridDim blocks.
inline unsigned GridStrideBlocks(int64_t count, int threads) {
  const int64_t blocks = (count + threads - 1) / threads;
  return static_cast<unsigned>(blocks < kMaxGridDim ? blocks : kMaxGridDim);
}

// The calling thread's first element of a grid-stride loop, and the stride:
//   for (int64_t i = GridStrideBegin(); i < n; i += GridStrideStep()) ...
__device__ __forceinline__ int64_t GridStrideBegin() {
  return blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
}
__device__ __forceinline__ int64_t GridStrideStep() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

}  // namespace cuda
}  // namespace tessera

#endif  // TESSERA_KERNELS_CUDA_COMMON_LAUNCH_CUH_
