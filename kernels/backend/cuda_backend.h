// The CUDA half of CreateBackend, private to this package. backend_cuda.cc
// implements it over kernels/cuda where the CUDA toolkit was found;
// backend_no_cuda.cc, in a build without it, says so instead
// (third_party/cuda_configure.bzl picks the file).
#ifndef TESSERA_KERNELS_BACKEND_CUDA_BACKEND_H_
#define TESSERA_KERNELS_BACKEND_CUDA_BACKEND_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/backend/backend.h"

namespace tessera::backend_internal {

// Fills b's source, allocator, ops and stream for CUDA device `gpu`, which
// the caller has checked is visible.
absl::Status InitCudaBackend(int gpu, Backend& b);

// Bytes free on the current CUDA device, or -1.
int64_t CudaFreeBytes();

}  // namespace tessera::backend_internal

#endif  // TESSERA_KERNELS_BACKEND_CUDA_BACKEND_H_
