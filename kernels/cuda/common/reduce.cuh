// Warp and block reductions shared by the kernels (device code: include from
// .cu files only).
//
// Every reduction here is deterministic: the order of its operations depends
// only on the block shape, never on timing, and every participating thread
// ends with the same bits. Kernels whose results must not depend on the batch
// (attention, sampling) rely on that.
#ifndef TESSERA_KERNELS_CUDA_COMMON_REDUCE_CUH_
#define TESSERA_KERNELS_CUDA_COMMON_REDUCE_CUH_

#include <cuda_runtime.h>

#include <cmath>

namespace tessera {
namespace cuda {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;

struct SumOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return a + b;
  }
};

// fmaxf semantics: a NaN operand loses to a number.
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const {
    return fmaxf(a, b);
  }
};

// Butterfly reduction over the 32 lanes of a full warp: every lane ends with
// the same (bitwise) value, since each step combines the same two operands on
// both lanes.
template <typename T, typename Op>
__device__ __forceinline__ T WarpReduce(T v, Op op) {
  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1)
    v = op(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

template <typename T>
__device__ __forceinline__ T WarpSum(T v) {
  return WarpReduce(v, SumOp());
}

__device__ __forceinline__ float WarpMax(float v) {
  return WarpReduce(v, MaxOp());
}

// Reduction over a block of whole warps (at most 32 of them): a butterfly in
// each warp, then one over the warps' results (padded with `identity`) in
// warp 0. Every thread gets the result; all threads must call. `shared` holds
// kWarpSize + 1 elements; the reduction may be called again right away with
// the same `shared`.
template <typename T, typename Op>
__device__ T BlockReduce(T v, T* shared, Op op, T identity) {
  v = WarpReduce(v, op);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  __syncthreads();  // The previous use of `shared` is finished.
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    T w = lane < warps ? shared[lane] : identity;
    w = WarpReduce(w, op);
    if (lane == 0) shared[kWarpSize] = w;
  }
  __syncthreads();
  return shared[kWarpSize];
}

// Sum over the block (see BlockReduce). The sampler's sums of weights in
// double use it, and kernels/cpu/cpu_sampling.cc replays this exact order so
// that the CPU sampler keeps the same tokens: change both together.
template <typename T>
__device__ __forceinline__ T BlockSum(T v, T* shared) {
  return BlockReduce(v, shared, SumOp(), T{0});
}

// Maximum over the block ignoring NaN (-inf when there is none).
__device__ __forceinline__ float BlockMax(float v, float* shared) {
  return BlockReduce(v, shared, MaxOp(), -INFINITY);
}

}  // namespace cuda
}  // namespace tessera

#endif  // TESSERA_KERNELS_CUDA_COMMON_REDUCE_CUH_
