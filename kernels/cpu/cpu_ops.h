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
  explicit CpuOps(CpuThreadPool* pool) : pool_(pool) {}

  absl::Status Embedding(const TensorView& table, const TensorView& ids,
                         const TensorView& out) override;
  absl::Status EmbeddingShard(const TensorView& table, const TensorView& ids,
                              int64_t first_id, const TensorView& out) override;
  absl::StatusOr<Tensor> Upload(const TensorView& host, DType dtype) override;
  absl::Status ConcatShards(const TensorView& gathered, int64_t shards,
                            const TensorView& out) override;
  // Step buffers are host memory: packed in place, never copied.
  absl::StatusOr<std::unique_ptr<UploadBuffer>> NewUploadBuffer(
      size_t bytes) override;
  absl::Status GatherRows(const TensorView& src, const TensorView& rows,
                          const TensorView& dst) override;
  absl::Status CopyToHost(const TensorView& src, void* dst) override;
  absl::Status RmsNorm(const TensorView& x, const TensorView& weight, float eps,
                       const TensorView& out) override;
  absl::Status Add(const TensorView& a, const TensorView& b,
                   const TensorView& out) override;
  absl::Status Linear(const TensorView& x, const TensorView& weight,
                      const TensorView* bias, const TensorView& out) override;
  absl::Status Rope(const TensorView& x, const TensorView& positions,
                    const TensorView& inv_freq) override;
  absl::Status BiasAdd(const TensorView& x, const TensorView& bias) override;
  absl::Status SiluMul(const TensorView& gate, const TensorView& up,
                       const TensorView& out) override;
  absl::Status StoreKvCache(const TensorView& k, const TensorView& v,
                            const TensorView& slot_mapping,
                            const KvCacheLayer& cache) override;
  // All three kernels read an f32 or an int8 cache (scales applied inside the
  // dot products and the value accumulation), run one (token, head) reduction
  // on one thread in a fixed order (so a sequence's result does not depend on
  // the rest of the batch) and spread (token, head) pairs over the pool's
  // threads when the step is large enough to pay for them.
  absl::Status PrefillAttention(const PagedAttentionArgs& args) override;
  absl::Status DecodeAttention(const PagedAttentionArgs& args) override;
  absl::Status StaticAttention(const PagedAttentionArgs& args) override;

 private:
  CpuThreadPool* pool_;
};

}  // namespace tessera

#endif  // TESSERA_KERNELS_CPU_CPU_OPS_H_
