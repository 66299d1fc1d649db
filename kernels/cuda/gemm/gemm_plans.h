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
//
// MatmulFp8 computes the same product from e4m3 operands with their scales,
// on the fp8 tensor cores (f32 accumulation; cuBLASLt's "TN" layout: A = w
// transposed, B = x, D column-major [n, t] = row-major out [t, n]):
//  kOuterVector: out[t, n] = x_scale[t] * w_scale[n] * sum_k x[t, k] w[n, k]
//                (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F for both: a
//                per-token x scale, which a static activation scale also
//                takes as t copies, and a per-channel weight scale).
//  kBlock:       x scaled per 1x128 group (VEC128_32F), x_scale[g * t + r]
//                for group g of row r (token-contiguous, cuBLASLt's layout),
//                and w per 128x128 block (BLK128x128_32F), w_scale[b * S + c]
//                for row block b and column block c, S =
//                Fp8BlockScaleStride(k) (the checkpoint's [ceil(n/128),
//                ceil(k/128)] with its rows padded to a multiple of 4).
// Requirements (InvalidArgument otherwise): t, n, k > 0, k % 16 == 0,
// n % 4 == 0, for kBlock t % 4 == 0 too (cuBLASLt's scale layouts need
// them), every pointer 16-byte aligned. The output dtype is decided when a
// shape's plan is made, by the heuristic's answer: f32 D written straight
// into out where cuBLASLt offers an algorithm for it (it does on an H200 with
// cuBLASLt 13.1, for both modes), otherwise bf16 D, computed in column chunks
// through `bf16_scratch` (a caller's buffer, kFp8Bf16ScratchBytes, asked for
// only then) and widened into out by a kernel. Neither offered: Unimplemented
// naming the mode and the shape (there is no other fp8 path to fall back to).
// Plans are cached per (t, n, k, mode) like the bf16 ones and tuned likewise
// at <= kMaxTunedRows rows; a shape first seen while a graph is captured gets
// the heuristic's first choice (planning is host work, timing is skipped).
#ifndef TESSERA_KERNELS_CUDA_GEMM_GEMM_PLANS_H_
#define TESSERA_KERNELS_CUDA_GEMM_GEMM_PLANS_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
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

  // The fp8 products' scalings (see the top of this file).
  enum class Fp8Scaling { kOuterVector, kBlock };
  // An e4m3 operand and its f32 scales, both device memory.
  struct Fp8Operand {
    const void* data = nullptr;
    const float* scale = nullptr;
  };
  // The scratch a bf16-output fp8 product goes through (column chunks of at
  // least 128 columns: t <= kFp8Bf16ScratchBytes / 256).
  static constexpr size_t kFp8Bf16ScratchBytes = size_t{16} << 20;
  // The row stride of a kBlock weight scale: ceil(k / 128) rounded up to a
  // multiple of 4.
  static int64_t Fp8BlockScaleStride(int64_t k);
  // The name of a scaling in messages.
  static const char* Fp8ScalingName(Fp8Scaling scaling);

  // out[t, n] = the scaled product of x [t, k] and w [n, k] (see the top of
  // this file). `bf16_scratch` is called only for a plan with bf16 output,
  // for kFp8Bf16ScratchBytes of device memory that nothing else uses until
  // the product has run.
  absl::Status MatmulFp8(
      int64_t t, int64_t n, int64_t k, Fp8Scaling scaling, Fp8Operand x,
      Fp8Operand w, float* out, void* workspace,
      absl::FunctionRef<absl::StatusOr<void*>()> bf16_scratch,
      cudaStream_t stream);

  // Tests: plans made afterwards never take f32 output, so the bf16 path
  // (chunks, widening) runs where cuBLASLt would offer f32.
  void ForceFp8Bf16OutputForTesting() { force_fp8_bf16_ = true; }

 private:
  struct Plan;  // Descriptors and algorithm, cuBLASLt types (gemm_plans.cc).
  struct Fp8Key {
    int64_t t, n, k;
    Fp8Scaling scaling;
    bool bf16_only;  // A chunk of a bf16-output product.
    bool operator==(const Fp8Key& o) const {
      return t == o.t && n == o.n && k == o.k && scaling == o.scaling &&
             bf16_only == o.bf16_only;
    }
    template <typename H>
    friend H AbslHashValue(H h, const Fp8Key& key) {
      return H::combine(std::move(h), key.t, key.n, key.k,
                        static_cast<int>(key.scaling), key.bf16_only);
    }
  };

  explicit GemmPlans(void* handle);
  // The plan of a shape: cached, or made now.
  absl::StatusOr<Plan*> Find(int64_t t, int64_t n, int64_t k, DType dtype);
  // The fp8 plan of a shape, made with these operands' scale pointers set.
  absl::StatusOr<Plan*> FindFp8(const Fp8Key& key, const float* x_scale,
                                const float* w_scale);
  // One fp8 product through `plan` into d (f32 or bf16 as the plan says,
  // leading dimension the plan's), tuning the plan first if it has
  // candidates.
  absl::Status RunFp8(Plan* plan, const Fp8Key& key, const void* x,
                      const float* x_scale, const void* w, const float* w_scale,
                      void* d, void* workspace, cudaStream_t stream);
  // Times the plan's candidates (run(algo) enqueues one product with that
  // cublasLtMatmulAlgo_t and says whether cuBLASLt took it; the stream is
  // synchronized) and keeps the fastest; nothing when the stream is
  // capturing.
  absl::Status Tune(Plan* plan, absl::FunctionRef<bool(const void* algo)> run,
                    cudaStream_t stream);

  void* handle_;  // cublasLtHandle_t.
  absl::flat_hash_map<uint64_t, std::unique_ptr<Plan>> plans_;
  absl::flat_hash_map<Fp8Key, std::unique_ptr<Plan>> fp8_plans_;
  bool force_fp8_bf16_ = false;
};

}  // namespace cuda
}  // namespace tessera

#endif  // TESSERA_KERNELS_CUDA_GEMM_GEMM_PLANS_H_
