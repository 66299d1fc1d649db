// Mixture-of-experts kernels (CudaOps::MoeRoute, MoeExperts,
// SigmoidGatedAdd), graph-safe: launch configurations depend only on the
// host sizes of a call (tokens, top-k, experts, hidden, intermediate), never
// on the routing, and no kernel reads host memory, allocates or
// synchronizes.
//
// MoeRoute: one warp per token does the softmax (f32), the top-k and the
// renormalisation in registers — one kernel.
//
// MoeExperts: four launches whatever the number of experts:
//  1. sort: one block counts each expert's routed rows (token t's j-th choice
//     is row t * k + j), scans the counts into each expert's first position
//     and first row tile, and places every row at its expert's positions;
//  2. the gate/up product with SiLU fused, grouped: one launch covers every
//     expert. The grid is sized for the worst case (every row tile of every
//     expert: rows / BM + experts tiles) and a block whose tile lies beyond
//     the experts' tiles exits; a block finds its expert by a binary search
//     of the tile offsets, so the counts never travel to the host;
//  3. the down product, grouped the same way, each row's output written to
//     its (token, j) slot;
//  4. combine: each token's slots weighted and added in ascending expert id
//     (ties by j), each product rounded before its add (the CPU reference's
//     order).
// The products are decode-shaped (kernels/cuda/gemm/skinny_gemm.cu's style):
// a warp streams 4 weight rows with 16-byte loads (8 weights a lane), its
// block's BM routed rows read beside them, f32 accumulation, sums across the
// warp by shuffles. BM (1, 2, 4 or 8 rows a tile) follows the expected rows
// per expert. Every output depends on its own input row and the expert's
// weights only, in a fixed order, so where a row lands in its expert's
// segment (the sort's atomics) never changes a result.
#ifndef TESSERA_KERNELS_CUDA_MOE_MOE_KERNELS_H_
#define TESSERA_KERNELS_CUDA_MOE_MOE_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tessera {
namespace cuda {

// The most experts one token is routed to (ops.h kMaxMoeTopK).
inline constexpr int kMaxMoeRouteK = 32;

// ids [T, k] and weights [T, k] from logits [T, E] (f32): see Ops::MoeRoute.
// cudaErrorInvalidValue for k outside [1, min(E, kMaxMoeRouteK)].
cudaError_t LaunchMoeRoute(const float* logits, int64_t tokens, int64_t experts,
                           int64_t k, bool renormalize, int32_t* ids,
                           float* weights, cudaStream_t stream);

// Bytes of the device scratch LaunchMoeExperts needs (16-byte aligned
// pieces: the sort's int32 tables, the activations [T * k, I] and the
// experts' outputs [T * k, H], f32).
int64_t MoeExpertsScratchBytes(int64_t tokens, int64_t top_k, int64_t experts,
                               int64_t hidden, int64_t intermediate);

enum class MoeWeightType { kBF16, kF32 };

struct MoeExpertsLaunch {
  const float* x = nullptr;             // [T, H]
  const int32_t* topk_ids = nullptr;    // [T, k]
  const float* topk_weights = nullptr;  // [T, k]
  const void* gate_up = nullptr;        // [E, 2I, H]
  const void* down = nullptr;           // [E, H, I]
  MoeWeightType weight_type = MoeWeightType::kBF16;
  int64_t tokens = 0, top_k = 0, experts = 0, hidden = 0, intermediate = 0;
  int64_t first_expert = 0;
  void* scratch = nullptr;  // >= MoeExpertsScratchBytes, 16-byte aligned.
  float* out = nullptr;     // [T, H]
};

// out = Ops::MoeExperts (see ops.h MoeExpertsArgs). cudaErrorInvalidValue
// for sizes out of range or a misaligned scratch; otherwise the launches'
// error.
cudaError_t LaunchMoeExperts(const MoeExpertsLaunch& launch,
                             cudaStream_t stream);

// out[t, :] += sigmoid(gate[t]) * x[t, :] for gate [T], x and out [T, n].
cudaError_t LaunchSigmoidGatedAdd(const float* gate, const float* x,
                                  int64_t tokens, int64_t n, float* out,
                                  cudaStream_t stream);

}  // namespace cuda
}  // namespace tessera

#endif  // TESSERA_KERNELS_CUDA_MOE_MOE_KERNELS_H_
