// MemorySource over cudaMalloc/cudaFree for one device: the bytes under a
// PinnableBlockAllocator on the GPU.
#ifndef TESSERA_KERNELS_CUDA_CUDA_MEMORY_SOURCE_H_
#define TESSERA_KERNELS_CUDA_CUDA_MEMORY_SOURCE_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/core/memory.h"

namespace tessera {

class CudaMemorySource final : public MemorySource {
 public:
  explicit CudaMemorySource(int device) : device_(device) {}

  // cudaMalloc on the device (the caller's current device is restored).
  // ResourceExhausted when the device is out of memory, so that the allocator
  // trims and retries; Internal for any other CUDA error; InvalidArgument for
  // an alignment above the 256 bytes cudaMalloc guarantees.
  absl::StatusOr<void*> Allocate(size_t bytes, size_t alignment) override;

  // Free cannot report failure through MemorySource, so the first error is
  // kept for status() (and printed to stderr).
  void Free(void* ptr, size_t bytes) override;

  std::string name() const override;
  int device() const { return device_; }

  // The first error a Free hit, or OK.
  absl::Status status() const { return deferred_; }

 private:
  int device_;
  absl::Status deferred_;
};

}  // namespace tessera

#endif  // TESSERA_KERNELS_CUDA_CUDA_MEMORY_SOURCE_H_
