// The CPU reference backend: f32 storage, f32 accumulation, OpenBLAS for matrix
// products, one CpuThreadPool for every parallel loop (cpu_threads.h). It
// defines what every other backend must compute (kernels are tested against
// it).
#ifndef TESSERA_KERNELS_CPU_CPU_OPS_H_
#define TESSERA_KERNELS_CPU_CPU_OPS_H_

#include "kernels/cpu/cpu_threads.h"
#include "kernels/ops.h"

namespace tessera {

class CpuOps final : public Ops {
 public:
  // Parallel loops run on CpuThreadPool::Default(), or on `pool` (not owned;
  // it must outlive this object).
  CpuOps();
  explicit CpuOps(CpuThreadPool* pool);

  absl::StatusOr<Tensor> Upload(const TensorView& host, DType dtype) override;
  absl::Status CopyToHost(const TensorView& src, void* dst) override;
  // Step buffers are host memory: packed in place, never copied.
  absl::StatusOr<std::unique_ptr<UploadBuffer>> NewUploadBuffer(
      size_t bytes) override;
  bool host_memory() const override { return true; }
  // The wall clock (WallClockOpTimer): every op has finished its work when
  // it returns (the pool's loops and OpenBLAS return when done).
  absl::StatusOr<std::unique_ptr<OpTimer>> NewOpTimer() override;

 protected:
  absl::Status DoEmbedding(const TensorView& table, const TensorView& ids,
                           const TensorView& out) override;
  absl::Status DoEmbeddingShard(const TensorView& table, const TensorView& ids,
                                int64_t first_id,
                                const TensorView& out) override;
  absl::Status DoConcatShards(const TensorView& gathered, int64_t shards,
                              const TensorView& out) override;
  absl::Status DoGatherRows(const TensorView& src, const TensorView& rows,
                            const TensorView& dst) override;
  absl::Status DoRmsNorm(const TensorView& x, const TensorView& weight,
                         float eps, const TensorView& out) override;
  absl::Status DoAdd(const TensorView& a, const TensorView& b,
                     const TensorView& out) override;
  absl::Status DoLinear(const TensorView& x, const WeightView& weight,
                        const TensorView* bias, const TensorView& out) override;
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
  absl::Status DoGatedActivation(GatedActivationKind kind,
                                 const TensorView& gate_up,
                                 const TensorView& out) override;
  // The unfused ops in sequence (RmsNorm, Rope, the StoreKvCache write) over
  // copies of qkv's k and v columns in a per-thread buffer; slot -1 skipped.
  absl::Status DoQkvRopeStore(const QkvRopeStoreArgs& args) override;
  // All three kernels read an f32 or an int8 cache (scales applied inside the
  // dot products and the value accumulation), run one (token, head) reduction
  // on one thread in a fixed order (so a sequence's result does not depend on
  // the rest of the batch) and spread (token, head) pairs over the pool's
  // threads when the step is large enough to pay for them.
  absl::Status DoPrefillAttention(const PagedAttentionArgs& args) override;
  absl::Status DoDecodeAttention(const PagedAttentionArgs& args) override;
  absl::Status DoStaticAttention(const PagedAttentionArgs& args) override;
  // Mixtures of experts. MoeRoute: one token after another, the softmax's
  // sum in expert order. MoeExperts: expert by expert (ascending), its routed
  // rows gathered in token order and run through Linear, GatedActivation and
  // Linear as a dense MLP would be; then each token's terms summed in
  // ascending expert order.
  absl::Status DoMoeRoute(const TensorView& logits, bool renormalize,
                          const TensorView& topk_ids,
                          const TensorView& topk_weights) override;
  absl::Status DoMoeExperts(const MoeExpertsArgs& args) override;
  absl::Status DoSigmoidGatedAdd(const TensorView& gate, const TensorView& x,
                                 const TensorView& out) override;
  // One row after another through kernels/cpu/cpu_sampling.h (the same tokens
  // as the CUDA sampler).
  absl::Status DoSample(const TensorView& logits,
                        absl::Span<const SampleRow> rows,
                        std::vector<SampleResult>* out) override;

 private:
  CpuThreadPool* pool_;
};

}  // namespace tessera

#endif  // TESSERA_KERNELS_CPU_CPU_OPS_H_
