// Turning CUDA runtime errors into absl::Status, with the call and the intent
// in the message.
#ifndef TESSERA_KERNELS_CUDA_CUDA_STATUS_H_
#define TESSERA_KERNELS_CUDA_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tessera {

// "cudaMalloc failed while allocating the workspace: out of memory
// (cudaErrorMemoryAllocation)"
inline absl::Status CudaStatus(cudaError_t error, absl::string_view call,
                               absl::string_view doing) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(call, " failed while ", doing, ": ",
                                          cudaGetErrorString(error), " (",
                                          cudaGetErrorName(error), ")"));
}

// Number of usable CUDA devices; 0 when there is no driver or no device (never
// an error: the CPU backend is always available).
inline int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // Clear the sticky "no driver" error.
    return 0;
  }
  return count;
}

}  // namespace tessera

#endif  // TESSERA_KERNELS_CUDA_CUDA_STATUS_H_
