// Raw CUDA launchers for the element-wise part of the op set. Plain C++ types
// only: nvcc compiles the .cu side, and the abseil-facing wrappers (cuda_ops.h)
// turn the returned cudaError_t into a Status that says what was being done.
//
// Layouts match kernels/ops.h: row-major, f32, device pointers.
#ifndef TESSERA_KERNELS_CUDA_ELEMENTWISE_KERNELS_H_
#define TESSERA_KERNELS_CUDA_ELEMENTWISE_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tessera {
namespace cuda {

// out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * weight, rows x n. out may
// alias x.
cudaError_t LaunchRmsNorm(const float* x, const float* weight, float eps,
                          int64_t rows, int64_t n, float* out,
                          cudaStream_t stream);

// out[i] = silu(gate[i]) * up[i] for i < count. out may alias gate or up.
cudaError_t LaunchSiluMul(const float* gate, const float* up, int64_t count,
                          float* out, cudaStream_t stream);

}  // namespace cuda
}  // namespace tessera

#endif  // TESSERA_KERNELS_CUDA_ELEMENTWISE_KERNELS_H_
