#include "kernels/cuda/cuda_memory_source.h"

#include <cuda_runtime_api.h>

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"
#include "runtime/core/status.h"

namespace tessera {
namespace {

// cudaMalloc's documented alignment for any allocation.
constexpr size_t kCudaMallocAlignment = 256;

// Makes `device` current for a scope and restores the caller's device, so a
// source for device 1 does not silently move the caller's later launches.
class ScopedDevice {
 public:
  absl::Status Enter(int device, absl::string_view doing) {
    RETURN_IF_ERROR(
        CudaStatus(cudaGetDevice(&previous_), "cudaGetDevice", doing));
    if (previous_ == device) return absl::OkStatus();
    RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), "cudaSetDevice", doing));
    switched_ = true;
    return absl::OkStatus();
  }

  absl::Status Exit(absl::string_view doing) {
    if (!switched_) return absl::OkStatus();
    switched_ = false;
    return CudaStatus(cudaSetDevice(previous_), "cudaSetDevice", doing);
  }

  ~ScopedDevice() {
    if (switched_) (void)cudaSetDevice(previous_);
  }

 private:
  int previous_ = 0;
  bool switched_ = false;
};

}  // namespace

std::string CudaMemorySource::name() const {
  return absl::StrCat("cuda:", device_);
}

absl::StatusOr<void*> CudaMemorySource::Allocate(size_t bytes,
                                                 size_t alignment) {
  const std::string doing =
      absl::StrCat("allocating ", bytes, " bytes on ", name());
  if (bytes == 0 || alignment == 0 || alignment > kCudaMallocAlignment ||
      kCudaMallocAlignment % alignment != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(doing, ": alignment ", alignment, " is not a divisor of ",
                     kCudaMallocAlignment));
  }
  ScopedDevice scope;
  RETURN_IF_ERROR(scope.Enter(device_, doing));
  void* ptr = nullptr;
  const cudaError_t error = cudaMalloc(&ptr, bytes);
  if (error == cudaErrorMemoryAllocation) {
    // Not sticky, but clear it so a later cudaGetLastError does not report
    // an error the allocator already handled (by trimming and retrying).
    (void)cudaGetLastError();
    RETURN_IF_ERROR(scope.Exit(doing));
    return absl::ResourceExhaustedError(
        CudaStatus(error, "cudaMalloc", doing).message());
  }
  RETURN_IF_ERROR(CudaStatus(error, "cudaMalloc", doing));
  absl::Status restored = scope.Exit(doing);
  if (!restored.ok()) {
    (void)cudaFree(ptr);
    return restored;
  }
  return ptr;
}

void CudaMemorySource::Free(void* ptr, size_t bytes) {
  if (ptr == nullptr) return;
  const std::string doing =
      absl::StrCat("freeing ", bytes, " bytes on ", name());
  ScopedDevice scope;
  absl::Status status = scope.Enter(device_, doing);
  if (status.ok()) status = CudaStatus(cudaFree(ptr), "cudaFree", doing);
  absl::Status restored = scope.Exit(doing);
  if (status.ok()) status = restored;
  if (!status.ok()) {
    std::fprintf(stderr, "CudaMemorySource: %s\n",
                 std::string(status.message()).c_str());
    if (deferred_.ok()) deferred_ = status;
  }
}

}  // namespace tessera
