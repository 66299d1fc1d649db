#include "kernels/backend/backend.h"

#include <cuda_runtime_api.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_memory_source.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_status.h"
#include "runtime/core/status.h"

namespace tessera {

Backend::~Backend() {
  // The ops' buffers go back to the allocator before it dies.
  ops.reset();
  allocator.reset();
  source.reset();
}

int64_t Backend::FreeDeviceBytes() const {
  if (!is_cuda()) return -1;
  size_t free_bytes = 0, total = 0;
  if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) return -1;
  return static_cast<int64_t>(free_bytes);
}

int VisibleCudaDevices() { return CudaDeviceCount(); }

absl::StatusOr<Backend> CreateBackend(const std::string& device, int local_rank,
                                      int gpus_per_node) {
  if (gpus_per_node < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--gpus-per-node must be >= 0 (0: every visible GPU), got ",
        gpus_per_node));
  }
  Backend b;
  b.device = device;
  if (device == "cpu") {
    b.ops = std::make_unique<CpuOps>();
    return b;
  }
  if (device != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("--device must be cpu or cuda, got \"", device, "\""));
  }
  const int count = CudaDeviceCount();
  if (count == 0) {
    return absl::FailedPreconditionError(
        "--device cuda: no CUDA device is visible on this host");
  }
  if (gpus_per_node > count) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--gpus-per-node ", gpus_per_node, " but only ", count,
        " CUDA devices are visible on this host (CUDA_VISIBLE_DEVICES=",
        std::getenv("CUDA_VISIBLE_DEVICES") != nullptr
            ? std::getenv("CUDA_VISIBLE_DEVICES")
            : "unset",
        ")"));
  }
  b.gpu = local_rank % (gpus_per_node > 0 ? gpus_per_node : count);
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(b.gpu), "cudaSetDevice",
                             absl::StrCat("selecting GPU ", b.gpu)));
  b.source = std::make_unique<CudaMemorySource>(b.gpu);
  b.allocator = std::make_unique<PinnableBlockAllocator>(b.source.get());
  ASSIGN_OR_RETURN(std::unique_ptr<CudaOps> ops,
                   CudaOps::Create(b.gpu, b.allocator.get()));
  b.stream = ops->stream();
  b.ops = std::move(ops);
  return b;
}

}  // namespace tessera
