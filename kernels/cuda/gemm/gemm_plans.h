// GemmPlans: the matrix products of one GPU's op set through cuBLASLt.
//
// Owns a cuBLASLt handle and one plan per (rows, out features, in features,
// dtype): the descriptors and an algorithm, found on the first product of a
// shape and reused afterwards, so that a step after warm-up only enqueues
// cublasLtMatmul. The algorithm: for bf16 products of at most kMaxTunedRows
// rows (the decode batches, whose shapes are few and fixed by the graph
// buckets, and where the heuristic's first guess is often not the fastest)
// the fastest of the heuristic's first kTuneCandidates, timed on the first
// product's own buffers (the rank's warm-up runs every bucket at load, so the
// choice is made then); for every other product (prefill, whose row counts
// vary per step, and f32, the golden mode, kept on one deterministic choice)
// the heuristic's first. A shape first seen during a graph capture cannot be
// timed and keeps the first guess. Not thread-safe; use it from the thread (and
// the device) that created it, as CudaOps does.
//
// Matmul computes, row-major, out[t, n] = x[t, k] · w[n, k]ᵀ with f32
// accumulation and f32 output. x and w are both bf16 or both f32 (f32 runs
// without TF32: the golden mode). The product is enqueued on `stream` and uses
// `workspace`, which must hold kWorkspaceBytes of device memory that nothing
// else touches until the product has run. cuBLASLt failures (and a shape with
// no algorithm) come back as Internal errors that name the call and the shape.
#ifndef TESSERA_KERNELS_CUDA_GEMM_GEMM_PLANS_H_
#define TESSERA_KERNELS_CUDA_GEMM_GEMM_PLANS_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/core/dtype.h"

namespace tessera {
namespace cuda {

class GemmPlans {
 public:
  // The workspace every plan is chosen for (and Matmul's caller provides).
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;
  static constexpr int64_t kMaxTunedRows = 256;
  static constexpr int kTuneCandidates = 8;
  static constexpr int kTuneRepetitions = 3;

  // Creates the cuBLASLt handle on the current device.
  static absl::StatusOr<std::unique_ptr<GemmPlans>> Create();
  // Destroys the plans and the handle; products still enqueued must have
  // finished (the caller synchronizes its stream first).
  ~GemmPlans();

  GemmPlans(const GemmPlans&) = delete;
  GemmPlans& operator=(const GemmPlans&) = delete;

  // out[t, n] = x[t, k] · w[n, k]ᵀ (see the top of this file). `dtype` is
  // that of x and w: DType::kBF16 or DType::kF32. t, n, k > 0.
  absl::Status Matmul(int64_t t, int64_t n, int64_t k, DType dtype,
                      const void* x, const void* w, float* out, void* workspace,
                      cudaStream_t stream);

 private:
  struct Plan;  // Descriptors and algorithm, cuBLASLt types (gemm_plans.cc).

  explicit GemmPlans(void* handle);
  // The plan of a shape: cached, or made now.
  absl::StatusOr<Plan*> Find(int64_t t, int64_t n, int64_t k, DType dtype);
  // Times the plan's candidates on these buffers (synchronizing the stream)
  // and keeps the fastest; nothing when the stream is capturing.
  absl::Status Tune(Plan* plan, const void* x, const void* w, float* out,
                    void* workspace, cudaStream_t stream);

  void* handle_;  // cublasLtHandle_t.
  absl::flat_hash_map<uint64_t, std::unique_ptr<Plan>> plans_;
};

}  // namespace cuda
}  // namespace tessera

#endif  // TESSERA_KERNELS_CUDA_GEMM_GEMM_PLANS_H_
