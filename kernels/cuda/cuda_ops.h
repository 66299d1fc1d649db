// CudaOps: the op set on one NVIDIA GPU. Activations are f32 on the device;
// weight matrices are bf16 (default) or f32 (the golden mode), and matrix
// products run through cuBLASLt (bf16 inputs, f32 accumulation and output; or
// f32 throughout, without TF32). Every op is enqueued on the backend's one
// stream, in order; CopyToHost synchronizes.
//
// Memory: weights (Upload), the model's scratch and the KV cache come from the
// PinnableBlockAllocator given at creation (over a CudaMemorySource). The ops'
// own scratch (token ids, step metadata, the bf16 copy of a GEMM input, the
// split-K workspace of decode attention) also comes from it, in buffers that
// only grow, so a steady decode step allocates nothing.
#ifndef TESSERA_KERNELS_CUDA_CUDA_OPS_H_
#define TESSERA_KERNELS_CUDA_CUDA_OPS_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "kernels/op_checks.h"
#include "kernels/ops.h"
#include "runtime/core/memory.h"

namespace tessera {

class CudaOps final : public Ops {
 public:
  // Makes `device` current for this thread, creates the stream and the
  // cuBLASLt handle. `allocator` must hand out memory of that device and
  // outlive the ops.
  static absl::StatusOr<std::unique_ptr<CudaOps>> Create(
      int device, PinnableBlockAllocator* allocator);
  ~CudaOps() override;

  CudaOps(const CudaOps&) = delete;
  CudaOps& operator=(const CudaOps&) = delete;

  int device() const { return device_; }
  cudaStream_t stream() const override { return stream_; }
  // Waits for everything enqueued so far.
  absl::Status Synchronize() override;
  // Stream capture into a CudaGraph (cuda_graph.h). A graph must not outlive
  // the ops that captured it. FailedPrecondition for a second BeginCapture
  // or an EndCapture without one.
  absl::Status BeginCapture() override;
  absl::StatusOr<std::unique_ptr<DeviceGraph>> EndCapture() override;

  absl::StatusOr<Tensor> Upload(const TensorView& host, DType dtype) override;
  absl::Status CopyToHost(const TensorView& src, void* dst) override;
  absl::Status BeginStep(const AttentionMetadata& metadata) override;
  bool samples_on_device() const override { return true; }
  absl::Status SampleOnDevice(const TensorView& logits,
                              absl::Span<const DeviceSampleRow> rows,
                              std::vector<DeviceSample>* out) override;

 protected:
  absl::Status DoConcatShards(const TensorView& gathered, int64_t shards,
                              const TensorView& out) override;
  absl::Status DoGatherRows(const TensorView& src,
                            absl::Span<const int32_t> rows,
                            const TensorView& dst) override;
  absl::Status DoEmbedding(const TensorView& table,
                           absl::Span<const int32_t> ids,
                           const TensorView& out) override;
  absl::Status DoEmbeddingShard(const TensorView& table,
                                absl::Span<const int32_t> ids, int64_t first_id,
                                const TensorView& out) override;
  absl::Status DoRmsNorm(const TensorView& x, const TensorView& weight,
                         float eps, const TensorView& out) override;
  absl::Status DoAdd(const TensorView& a, const TensorView& b,
                     const TensorView& out) override;
  absl::Status DoAddRmsNorm(const TensorView& residual, const TensorView& x,
                            const TensorView& weight, float eps,
                            const TensorView& out) override;
  absl::Status DoLinear(const TensorView& x, const WeightView& weight,
                        const TensorView* bias, const TensorView& out) override;
  absl::Status DoRope(const TensorView& x, absl::Span<const int32_t> positions,
                      const TensorView& inv_freq) override;
  absl::Status DoBiasAdd(const TensorView& x, const TensorView& bias) override;
  absl::Status DoSiluMul(const TensorView& gate, const TensorView& up,
                         const TensorView& out) override;
  absl::Status DoStoreKvCache(const TensorView& k, const TensorView& v,
                              absl::Span<const int64_t> slot_mapping,
                              const KvCacheLayer& cache) override;
  absl::Status DoPrefillAttention(const PagedAttentionArgs& args) override;
  absl::Status DoDecodeAttention(const PagedAttentionArgs& args) override;
  absl::Status DoStaticAttention(const PagedAttentionArgs& args) override;

 private:
  // Grow-only device buffers of the ops themselves.
  enum Buffer {
    kIds,
    kRows,
    kPositions,
    kSlots,
    kQueryStarts,
    kContextLens,
    kSeqLens,
    kBlockTables,
    kGemmInput,
    kDecodeWorkspace,
    kGemmWorkspace,
    kSampleParams,
    kSampleCounts,
    kSampleMask,
    kSampleMasked,
    kSampleScratch,
    kSampleTokens,
    kSampleIndex,
    kSampleChosen,
    kSampleLogZ,
    kSampleTopIds,
    kSampleTopLogprobs,
    kNumBuffers
  };
  struct Scratch {
    void* data = nullptr;
    size_t bytes = 0;
  };
  struct GemmPlan;  // Cached cuBLASLt descriptors and algorithm per shape.

  CudaOps(int device, PinnableBlockAllocator* allocator);

  // A buffer of at least `bytes`, reallocated (contents lost) when smaller.
  absl::StatusOr<void*> Grow(enum Buffer which, size_t bytes);
  // Copies host data into a scratch buffer (on the stream, from pageable
  // memory: the copy is complete when the call returns).
  absl::StatusOr<void*> Stage(enum Buffer which, const void* host,
                              size_t bytes);
  // Device copies of the step's positions and slots when `host` is the
  // current step's array; otherwise staged now.
  absl::StatusOr<const int32_t*> DevicePositions(
      absl::Span<const int32_t> positions);
  absl::StatusOr<const int64_t*> DeviceSlots(absl::Span<const int64_t> slots);
  absl::Status Attention(const PagedAttentionArgs& args, AttentionKind kind);
  absl::StatusOr<GemmPlan*> PlanGemm(int64_t t, int64_t n, int64_t k,
                                     DType dtype);

  int device_;
  PinnableBlockAllocator* allocator_;
  cudaStream_t stream_ = nullptr;
  bool capturing_ = false;     // Between BeginCapture and EndCapture.
  void* lt_handle_ = nullptr;  // cublasLtHandle_t.
  Scratch scratch_[kNumBuffers];
  absl::flat_hash_map<uint64_t, std::unique_ptr<GemmPlan>> gemm_plans_;
  // The current step (BeginStep): its host arrays and device copies.
  const AttentionMetadata* step_ = nullptr;
  // Host staging of the sampler, reused between steps.
  std::vector<int32_t> sample_counts_, sample_index_, sample_tokens_,
      sample_top_ids_, sample_masked_;
  std::vector<uint8_t> sample_mask_;
  std::vector<float> sample_chosen_, sample_log_z_, sample_top_logprobs_;
  int64_t step_blocks_ = 0;
};

}  // namespace tessera

#endif  // TESSERA_KERNELS_CUDA_CUDA_OPS_H_
