// Launch dimensions and grid-stride loops shared by the kernels (device code
// and host launchers in .cu files only).
#ifndef TESSERA_KERNELS_CUDA_COMMON_LAUNCH_CUH_
#define TESSERA_KERNELS_CUDA_COMMON_LAUNCH_CUH_

#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

namespace tessera {
namespace cuda {

// The largest grid along y and z (and the cap the grid-stride launches put on
// x, which is enough blocks to fill any GPU).
constexpr int64_t kMaxGridDim = 65535;

// Blocks for a grid-stride loop over `count` elements with `threads` threads
// a block: one element a thread, at most kMaxGridDim blocks.
inline unsigned GridStrideBlocks(int64_t count, int threads) {
  const int64_t blocks = (count + threads - 1) / threads;
  return static_cast<unsigned>(blocks < kMaxGridDim ? blocks : kMaxGridDim);
}

// The calling thread's first element of a grid-stride loop, and the stride:
//   for (int64_t i = GridStrideBegin(); i < n; i += GridStrideStep()) ...
__device__ __forceinline__ int64_t GridStrideBegin() {
  return blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
}
__device__ __forceinline__ int64_t GridStrideStep() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

// Programmatic dependent launch (PDL). A kernel launched with LaunchPdl may
// start while the kernel before it on the stream is still running, so its
// launch latency and ramp overlap that kernel's tail; at decode sizes (a few
// microseconds a kernel) that is a large part of a step. Graph capture keeps
// the overlap (the edge becomes a programmatic one).
//
// The contract for a kernel launched this way: every thread calls PdlWait()
// before it reads anything an earlier kernel wrote or writes anything an
// earlier kernel reads, and every block calls it, even one that has no work
// (so the grid cannot finish before the kernel ahead of it, and the kernel
// after it, waiting on this one, waits on that one too). Only reads of data
// no kernel of the stream writes (weights) may come before it. PdlWait
// returns once the kernel ahead has finished and its writes are visible; it
// is a no-op for a launch with no programmatic dependency (a plain launch,
// or one after a copy or a library kernel).
__device__ __forceinline__ void PdlWait() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}
// Lets the kernel after this one launch (its blocks then wait in PdlWait).
// Called once every block has started its work: the next kernel's blocks
// cannot take the place of this kernel's own.
__device__ __forceinline__ void PdlLaunchDependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// Launches `kernel` with programmatic stream serialization allowed (the
// contract above); returns the launch's error.
template <typename... Params, typename... Args>
cudaError_t LaunchPdl(void (*kernel)(Params...), dim3 grid, dim3 block,
                      size_t shared_bytes, cudaStream_t stream,
                      Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel,
                            static_cast<Params>(std::forward<Args>(args))...);
}

}  // namespace cuda
}  // namespace tessera

#endif  // TESSERA_KERNELS_CUDA_COMMON_LAUNCH_CUH_
