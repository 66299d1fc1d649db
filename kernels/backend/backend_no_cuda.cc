// The CUDA half of the backend in a build without the CUDA toolkit (see
// cuda_backend.h): no device is ever visible, and asking for one names the
// toolkit the build looked for.
#include <string>

#include "absl/strings/str_cat.h"
#include "cuda_configure/cuda_config.h"
#include "kernels/backend/backend.h"
#include "kernels/backend/cuda_backend.h"

#if TESSERA_CUDA_FOUND
#error "backend_no_cuda.cc is for builds without the CUDA toolkit"
#endif

namespace tessera {

int VisibleCudaDevices() { return 0; }

bool BuiltWithCuda() { return false; }

absl::Status CudaUnavailableError() {
  const std::string path = TESSERA_CUDA_PATH;
  const std::string missing = TESSERA_CUDA_MISSING;
  // Without nvcc there is no toolkit to speak of; otherwise name the part
  // that was missing (cuBLAS, NCCL, ...), which is what to install.
  const std::string what =
      missing.rfind("bin/nvcc", 0) == 0
          ? absl::StrCat("no CUDA toolkit found at ", path)
          : absl::StrCat("the CUDA toolkit at ", path, " lacks ", missing);
  return absl::FailedPreconditionError(absl::StrCat(
      "--device cuda: this tessera was built without CUDA (", what,
      " when it was built; install CUDA 13, or set TESSERA_CUDA_PATH to it, "
      "and rebuild)"));
}

namespace backend_internal {

int64_t CudaFreeBytes() { return -1; }

absl::Status InitCudaBackend(int /*gpu*/, Backend& /*b*/) {
  return CudaUnavailableError();
}

}  // namespace backend_internal
}  // namespace tessera
