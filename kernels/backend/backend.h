// Backend: the op set and the memory for one rank's device, chosen by name
// ("cpu" or "cuda"). The CPU backend computes in host memory the model owns;
// the CUDA backend owns an allocator over the GPU's memory (weights, scratch,
// KV cache) and the stream every op runs on.
#ifndef TESSERA_KERNELS_BACKEND_BACKEND_H_
#define TESSERA_KERNELS_BACKEND_BACKEND_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/ops.h"
#include "runtime/core/memory.h"

// cudaStream_t without the CUDA headers (it is CUstream_st*).
struct CUstream_st;

namespace tessera {

struct Backend {
  std::string device;  // "cpu" or "cuda".
  int gpu = -1;        // The CUDA device, or -1.
  std::unique_ptr<MemorySource> source;
  std::unique_ptr<PinnableBlockAllocator> allocator;  // Null on the CPU.
  std::unique_ptr<Ops> ops;
  // The CUDA ops' stream, on which every op runs and with which NCCL
  // collectives are ordered (a cudaStream_t); null on the CPU.
  CUstream_st* stream = nullptr;
  bool is_cuda() const { return device == "cuda"; }
  // Bytes free on the device (CUDA), or -1 (CPU: see AvailableHostMemory).
  int64_t FreeDeviceBytes() const;

  Backend() = default;
  Backend(Backend&&) = default;
  Backend& operator=(Backend&&) = default;
  ~Backend();
};

// "cpu", or "cuda" on GPU local_rank % G, where G is `gpus_per_node` when it
// is > 0 (the GPUs this node gives the job: --gpus-per-node) and otherwise the
// number of visible devices (CUDA_VISIBLE_DEVICES, as Slurm sets it, applies).
// InvalidArgument for an unknown name or gpus_per_node < 0;
// FailedPrecondition when CUDA is asked for and this build has no CUDA
// backend (CudaUnavailableError), no GPU is visible, or fewer than
// gpus_per_node are.
absl::StatusOr<Backend> CreateBackend(const std::string& device, int local_rank,
                                      int gpus_per_node = 0);

// The number of visible CUDA devices (0 without a driver or a device, and
// always 0 in a build without CUDA).
int VisibleCudaDevices();

// Whether this binary has the CUDA backend: the CUDA toolkit was found when it
// was built (third_party/cuda_configure.bzl). Without it every request for
// "cuda" fails with CudaUnavailableError().
bool BuiltWithCuda();

// The FailedPrecondition a build without CUDA answers "--device cuda" with,
// naming where the toolkit was looked for: "--device cuda: this tessera was
// built without CUDA (no CUDA toolkit found at /usr/local/cuda when it was
// built; install CUDA 13, or set TESSERA_CUDA_PATH to it, and rebuild)". OK in
// a build with CUDA.
absl::Status CudaUnavailableError();

}  // namespace tessera

#endif  // TESSERA_KERNELS_BACKEND_BACKEND_H_
