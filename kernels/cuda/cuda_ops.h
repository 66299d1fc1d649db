// CudaOps: the op set on one NVIDIA GPU. Activations are f32 on the device;
// weight matrices are bf16 (default), f32 (the golden mode) or f8_e4m3 with a
// scale (ops.h WeightView), and matrix products run through cuBLASLt
// (gemm/gemm_plans.h; bf16 inputs, f32 accumulation and output; or f32
// throughout, without TF32) or the skinny kernels. Every op is enqueued on
// the backend's one stream, in order; CopyToHost synchronizes.
//
// fp8 weights (Linear, GatedLinear):
//  - 1..8 rows (decode): the skinny weight-only kernel (gemm/fp8_gemm.h; x
//    kept in f32, the weights widened, per-channel or block scales; the gated
//    forms fused), or the tensor-core path where timing both on the shape's
//    first product says it is faster (ChooseLinearPath; a shape first seen
//    while capturing takes the skinny kernel). Timing rather than a fixed
//    threshold because the crossover depends on n, k and the row count, and
//    the machinery (decided at warm-up, kept) is the bf16 one.
//  - Otherwise the tensor-core path: x quantized to e4m3 as weight.activations
//    says (per token, static, or per 1x128 group) into the reserved GEMM input
//    scratch, then GemmPlans::MatmulFp8 (per-channel weights: per-token x
//    scales, OUTER_VEC; block weights: 1x128 x 128x128, VEC128/BLK128x128, B
//    = 128 only), then the bias. Block weights' scales whose rows are not a
//    multiple of 4 long are padded into a reserved 1 MiB scratch first;
//    cuBLASLt takes block-scaled products in multiples of 4 rows, so the last
//    t % 4 rows go through the skinny kernel. What neither path takes (K % 16
//    != 0, N % 4 != 0 beyond 8 rows, per-channel weights with per-block
//    activations, a block other than 128 beyond 8 rows) is Unimplemented,
//    naming the reason; there is no silent fallback.
//  - QuantizeWeightFp8 quantizes a bf16/f32 weight per channel on the device.
//  - Upload takes f8_e4m3 host data as bytes (dtype kF8E4M3) or widens it
//    exactly (f32, bf16). Embedding tables and expert weights are not fp8
//    (InvalidArgument / Unimplemented).
//
// Memory: weights (Upload), the model's scratch and the KV cache come from the
// PinnableBlockAllocator given at creation (over a CudaMemorySource), and so
// do step buffers (NewUploadBuffer: device memory beside a page-locked host
// staging block, which is the only memory not from the allocator, made at
// build time). The ops' own scratch (the bf16 or e4m3 copy of a GEMM input
// with its scales, the cuBLASLt workspace, the fp8 paths' scale padding and
// bf16-output chunk buffers, the split-K workspace of decode attention, the
// sampler's buffers) also comes from it: ReserveStepScratch sizes it once for
// the rank's largest step, after which those buffers never grow (a step that
// would need more fails), so no step allocates. Step arrays (ids, rows,
// positions, slots, the metadata's arrays) are device views read in place;
// their values are trusted (StepInputs checked them): an id outside the
// embedding table gives a zero row, a slot outside the cache is skipped.
#ifndef TESSERA_KERNELS_CUDA_CUDA_OPS_H_
#define TESSERA_KERNELS_CUDA_CUDA_OPS_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/gemm/gemm_plans.h"
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
  absl::StatusOr<Tensor> StackRows(absl::Span<const TensorView> parts,
                                   const Shape& shape) override;
  absl::StatusOr<std::unique_ptr<UploadBuffer>> NewUploadBuffer(
      size_t bytes) override;
  absl::Status ReserveStepScratch(const StepLimits& limits) override;
  // CUDA events on the ops' stream around each op, from a pool that grows on
  // first use and is reused after each Collect (which synchronizes and reads
  // the events' elapsed times). While the stream is capturing a graph,
  // Begin/End record nothing, so a capture is never disturbed and a replay
  // is not timed. The timer must not outlive the ops.
  absl::StatusOr<std::unique_ptr<OpTimer>> NewOpTimer() override;
  // moe/moe_kernels.h's layout: the sort's tables, the activations and the
  // experts' outputs of every routed row.
  int64_t MoeExpertsScratchBytes(int64_t tokens, int64_t top_k, int64_t experts,
                                 int64_t hidden,
                                 int64_t intermediate) const override;

 protected:
  absl::Status DoConcatShards(const TensorView& gathered, int64_t shards,
                              const TensorView& out) override;
  absl::Status DoGatherRows(const TensorView& src, const TensorView& rows,
                            const TensorView& dst) override;
  absl::Status DoEmbedding(const TensorView& table, const TensorView& ids,
                           const TensorView& out) override;
  absl::Status DoEmbeddingShard(const TensorView& table, const TensorView& ids,
                                int64_t first_id,
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
  // gemm/fp8_gemm.h's weight quantization into new device tensors; waits for
  // it (the source may be freed afterwards).
  absl::StatusOr<Weight> DoQuantizeWeightFp8(const TensorView& weight) override;
  absl::Status DoRope(const TensorView& x, const TensorView& positions,
                      const TensorView& inv_freq) override;
  absl::Status DoBiasAdd(const TensorView& x, const TensorView& bias) override;
  absl::Status DoScale(const TensorView& x, float factor) override;
  absl::Status DoSoftcap(const TensorView& x, float cap) override;
  absl::Status DoSiluMul(const TensorView& gate, const TensorView& up,
                         const TensorView& out) override;
  absl::Status DoStoreKvCache(const TensorView& k, const TensorView& v,
                              const TensorView& slot_mapping,
                              const KvCacheLayer& cache) override;
  // One kernel each (fused_kernels.h); QkvRopeStore takes head_dim <=
  // cuda::kMaxFusedHeadDim (InvalidArgument above it).
  // One skinny kernel (gemm/skinny_gemm.h: LaunchSkinnyGatedSilu, or
  // LaunchSkinnyGatedGeluTanh for GeGLU; gemm/fp8_gemm.h's for fp8 weights)
  // where Linear would take the skinny path for the gate/up product;
  // otherwise the two ops.
  absl::Status DoGatedLinear(GatedActivationKind kind, const TensorView& x,
                             const WeightView& gate_up, const TensorView* bias,
                             const TensorView& gate_up_scratch,
                             const TensorView& out) override;
  absl::Status DoGatedActivation(GatedActivationKind kind,
                                 const TensorView& gate_up,
                                 const TensorView& out) override;
  absl::Status DoQkvRopeStore(const QkvRopeStoreArgs& args) override;
  absl::Status DoPrefillAttention(const PagedAttentionArgs& args) override;
  absl::Status DoDecodeAttention(const PagedAttentionArgs& args) override;
  absl::Status DoStaticAttention(const PagedAttentionArgs& args) override;
  // Mixtures of experts (moe/moe_kernels.h): routing in one kernel; the
  // experts in four launches (sort by expert, grouped gate/up with SiLU,
  // grouped down, combine) for any number of experts, graph-safe, in the
  // model's scratch; bf16 or f32 weights.
  absl::Status DoMoeRoute(const TensorView& logits, bool renormalize,
                          const TensorView& topk_ids,
                          const TensorView& topk_weights) override;
  absl::Status DoMoeExperts(const MoeExpertsArgs& args) override;
  absl::Status DoSigmoidGatedAdd(const TensorView& gate, const TensorView& x,
                                 const TensorView& out) override;
  // Penalty arrays, masks and params staged per call; the penalties' [rows,
  // V] arrays only when a row has penalties.
  absl::Status DoSample(const TensorView& logits,
                        absl::Span<const SampleRow> rows,
                        std::vector<SampleResult>* out) override;

 private:
  // Device buffers of the ops themselves: grown on first use until
  // ReserveStepScratch sizes them, fixed afterwards.
  enum Buffer {
    kGemmInput,      // The bf16 copy of x, or its e4m3 copy and scales.
    kFp8ScalePad,    // A block weight scale with rows padded to 4s.
    kFp8Bf16Output,  // A bf16-output fp8 product's chunks (gemm_plans.h).
    kDecodeWorkspace,
    kGemmWorkspace,
    kSampleParams,
    kSampleCounts,
    kSampleMask,
    kSampleMasked,
    kSampleAllowed,  // Structured output's per-row allowed-token bitmasks.
    kSampleScratch,
    kSampleResults,     // Tokens, their logits, log_z, top ids and values.
    kLogprobWorkspace,  // LaunchLogprobs' per-chunk partial results.
    kNumBuffers
  };
  struct Scratch {
    void* data = nullptr;
    size_t bytes = 0;
    bool reserved = false;  // Sized by ReserveStepScratch: never grows.
  };

  CudaOps(int device, PinnableBlockAllocator* allocator);

  // Linear's two ways to a bf16 or fp8 product: the skinny kernel
  // (gemm/skinny_gemm.h, gemm/fp8_gemm.h: a few rows, f32 input read
  // directly, bias fused) and cuBLASLt (input cast to bf16 or quantized to
  // e4m3, bias added after). Where both apply, the faster of the two on that
  // shape (t, n, k, bias, weight format) is chosen by timing both on the
  // first product of the shape — the rank's warm-up, so at load — and kept; a
  // shape first seen while a graph is captured runs through cuBLASLt (bf16)
  // or the skinny kernel (fp8, which always applies there) and is decided on
  // its next eager product.
  enum class LinearPath { kSkinny, kCublasLt };
  struct LinearKey {
    int64_t t, n, k;
    bool bias;
    int32_t format;  // The weight's dtype, scale kind and activation scaling.
    bool operator==(const LinearKey& o) const {
      return t == o.t && n == o.n && k == o.k && bias == o.bias &&
             format == o.format;
    }
    template <typename H>
    friend H AbslHashValue(H h, const LinearKey& key) {
      return H::combine(std::move(h), key.t, key.n, key.k, key.bias,
                        key.format);
    }
  };
  absl::StatusOr<LinearPath> ChooseLinearPath(const TensorView& x,
                                              const WeightView& weight,
                                              const TensorView* bias,
                                              const TensorView& out);
  absl::Status SkinnyLinear(const TensorView& x, const WeightView& weight,
                            const TensorView* bias, const TensorView& out);
  absl::Status CublasLtLinear(const TensorView& x, const WeightView& weight,
                              const TensorView* bias, const TensorView& out);
  // fp8 weights: the choice between the two (see the top of this file), and
  // the tensor-core path (quantize x, MatmulFp8, bias, block tail rows).
  absl::Status Fp8Linear(const TensorView& x, const WeightView& weight,
                         const TensorView* bias, const TensorView& out);
  absl::Status Fp8CublasLtLinear(const TensorView& x, const WeightView& weight,
                                 const TensorView* bias, const TensorView& out);
  absl::Status Fp8GatedLinear(GatedActivationKind kind, const TensorView& x,
                              const WeightView& gate_up, const TensorView* bias,
                              const TensorView& gate_up_scratch,
                              const TensorView& out);

  // A buffer of at least `bytes`: reallocated (contents lost) when smaller and
  // not reserved; FailedPrecondition when smaller and reserved.
  absl::StatusOr<void*> Grow(enum Buffer which, size_t bytes);
  // Allocates `which` at exactly `bytes` (> 0) and fixes it.
  absl::Status Reserve(enum Buffer which, size_t bytes);
  // The sampler's per-step parameters to a scratch buffer (on the stream,
  // from pageable memory: the copy is complete when the call returns).
  absl::StatusOr<void*> CopySamplingInput(enum Buffer which, const void* host,
                                          size_t bytes);
  absl::Status Attention(const PagedAttentionArgs& args, AttentionKind kind);

  int device_;
  PinnableBlockAllocator* allocator_;
  cudaStream_t stream_ = nullptr;
  bool capturing_ = false;  // Between BeginCapture and EndCapture.
  std::unique_ptr<cuda::GemmPlans> gemm_;  // Linear's products.
  absl::flat_hash_map<LinearKey, LinearPath> linear_paths_;
  Scratch scratch_[kNumBuffers];
  // Host staging of the sampler, reused between steps.
  std::vector<int32_t> sample_counts_, sample_masked_;
  // The structured-output masks (one bitmask per row: 1.2 MB at 64 rows of a
  // 151,669-token vocabulary) in page-locked memory, so their copy is one
  // asynchronous DMA behind the forward rather than a staged copy the host
  // waits for after it (measured on an H200: +0.25 ms, 11%, on a 2.3 ms
  // batch-64 step). `allowed_copy_pending_`: a copy from it may still be
  // queued (a DoSample that failed before its results came back).
  struct PinnedHostFree {
    void operator()(void* p) const { cudaFreeHost(p); }
  };
  std::unique_ptr<void, PinnedHostFree> sample_allowed_;
  size_t sample_allowed_bytes_ = 0;
  bool allowed_copy_pending_ = false;
  std::vector<uint8_t> sample_mask_;
  // The packed results of one DoSample (kSampleResults' layout).
  std::vector<int32_t> sample_results_;
};

}  // namespace tessera

#endif  // TESSERA_KERNELS_CUDA_CUDA_OPS_H_
