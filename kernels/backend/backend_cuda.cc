// The CUDA backend, in a build with the CUDA toolkit (see cuda_backend.h).
#include <cuda_runtime_api.h>

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/backend/backend.h"
#include "kernels/backend/cuda_backend.h"
#include "kernels/cuda/cuda_memory_source.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_status.h"
#include "runtime/core/status.h"

namespace tessera {

int VisibleCudaDevices() { return CudaDeviceCount(); }

bool BuiltWithCuda() { return true; }

absl::Status CudaUnavailableError() { return absl::OkStatus(); }

namespace backend_internal {

int64_t CudaFreeBytes() {
  size_t free_bytes = 0, total = 0;
  if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) return -1;
  return static_cast<int64_t>(free_bytes);
}

absl::Status InitCudaBackend(int gpu, Backend& b) {
  b.gpu = gpu;
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(b.gpu), "cudaSetDevice",
                             absl::StrCat("selecting GPU ", b.gpu)));
  b.source = std::make_unique<CudaMemorySource>(b.gpu);
  b.allocator = std::make_unique<PinnableBlockAllocator>(b.source.get());
  ASSIGN_OR_RETURN(std::unique_ptr<CudaOps> ops,
                   CudaOps::Create(b.gpu, b.allocator.get()));
  b.stream = ops->stream();
  b.ops = std::move(ops);
  return absl::OkStatus();
}

}  // namespace backend_internal
}  // namespace tessera
