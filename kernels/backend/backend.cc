#include "kernels/backend/backend.h"

#include <cstdlib>
#include <memory>

#include "absl/strings/str_cat.h"
#include "kernels/backend/cuda_backend.h"
#include "kernels/cpu/cpu_ops.h"
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
  return backend_internal::CudaFreeBytes();
}

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
  // Before the device count: a build without CUDA says that, not "no GPU".
  RETURN_IF_ERROR(CudaUnavailableError());
  const int count = VisibleCudaDevices();
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
  RETURN_IF_ERROR(backend_internal::InitCudaBackend(
      local_rank % (gpus_per_node > 0 ? gpus_per_node : count), b));
  return b;
}

}  // namespace tessera
