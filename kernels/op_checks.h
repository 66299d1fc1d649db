// Argument checks shared by the backends' ops, so that the CPU reference and
// the GPU refuse the same inputs with the same messages. The public ops of
// class Ops (ops.h) run them once; a backend's Do* never repeats them.
#ifndef TESSERA_KERNELS_OP_CHECKS_H_
#define TESSERA_KERNELS_OP_CHECKS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/ops.h"
#include "runtime/core/tensor.h"

namespace tessera {

// InvalidArgument unless `t` has dtype `want` and storage (when non-empty).
inline absl::Status CheckDType(absl::string_view op, absl::string_view name,
                               const TensorView& t, DType want) {
  if (t.dtype() != want) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " must be ",
                                                   DTypeName(want), ", got ",
                                                   DTypeName(t.dtype())));
  }
  if (t.data() == nullptr && t.numel() > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", name, " has no storage"));
  }
  return absl::OkStatus();
}

// "Op: what (a vs b)".
inline absl::Status ShapeError(absl::string_view op, absl::string_view what,
                               const Shape& a, const Shape& b) {
  return absl::InvalidArgumentError(absl::StrCat(
      op, ": ", what, " (", a.ToString(), " vs ", b.ToString(), ")"));
}

// "f32", "f32 or bf16", "f32, bf16 or int8".
std::string DTypeList(absl::Span<const DType> dtypes);

// InvalidArgument unless `t` has one of `allowed` and storage (when
// non-empty): "Op: name must be f32 or bf16, got f16".
absl::Status CheckDTypeIn(absl::string_view op, absl::string_view name,
                          const TensorView& t, absl::Span<const DType> allowed);

// A step array (ops.h): `dtype`, rank 1, storage when non-empty.
absl::Status CheckStepArray(absl::string_view op, absl::string_view name,
                            const TensorView& t, DType dtype);

// The checks every public op of class Ops runs before its Do* (one function
// an op; `support` is the backend's). Each states what it refuses; the
// contracts themselves are the ops' comments in ops.h. Step arrays are
// checked for dtype and shape; the *Values checks read their contents and
// run only where the backend's memory is host memory (Device::host_memory).

// Table in a weight dtype [V, H], ids kI32 [T], out f32 [T, H].
absl::Status CheckEmbedding(const OpSupport& support, const TensorView& table,
                            const TensorView& ids, const TensorView& out);
// Every id in [0, V).
absl::Status CheckEmbeddingValues(const TensorView& table,
                                  const TensorView& ids);
// As Embedding.
absl::Status CheckEmbeddingShard(const OpSupport& support,
                                 const TensorView& table, const TensorView& ids,
                                 const TensorView& out);
// Every id >= 0.
absl::Status CheckEmbeddingShardValues(const TensorView& ids);
// f32 src [R, N], rows kI32 [n], dst [n, N].
absl::Status CheckGatherRows(const TensorView& src, const TensorView& rows,
                             const TensorView& dst);
// Every row in [0, R).
absl::Status CheckGatherRowsValues(const TensorView& src,
                                   const TensorView& rows);
// f32 gathered [shards * n, Vp] covering out [n, V].
absl::Status CheckConcatShards(const TensorView& gathered, int64_t shards,
                               const TensorView& out);
// f32 x, out [R, N] (any rank >= 1, same shape), weight [N].
absl::Status CheckRmsNorm(const TensorView& x, const TensorView& weight,
                          const TensorView& out);
// f32 residual, x, out [R, N], weight [N]; out must not be residual's
// storage (it may be x's).
absl::Status CheckAddRmsNorm(const TensorView& residual, const TensorView& x,
                             const TensorView& weight, const TensorView& out);
// f32 a, b, out of one shape.
absl::Status CheckAdd(const TensorView& a, const TensorView& b,
                      const TensorView& out);
// f32 x [T, K], weight [N, K] in a weight dtype and unscaled, f32 bias [N]
// or null, f32 out [T, N].
// A weight's scale (ops.h WeightView): present exactly for f8_e4m3 data,
// f32 and shaped as its kind says ([N], or [ceil(N/B), ceil(K/B)] with B >=
// 1), and a static input scale f32 [1].
absl::Status CheckWeightScale(absl::string_view op, const WeightView& weight);
absl::Status CheckLinear(const OpSupport& support, const TensorView& x,
                         const WeightView& weight, const TensorView* bias,
                         const TensorView& out);
// f32 x [T, heads, D] with D even, positions kI32 [T], f32 inv_freq [D/2].
absl::Status CheckRope(const TensorView& x, const TensorView& positions,
                       const TensorView& inv_freq);
// f32 x [T, N], f32 bias [N].
absl::Status CheckBiasAdd(const TensorView& x, const TensorView& bias);
// f32 x (any shape), a finite factor.
absl::Status CheckScale(const TensorView& x, float factor);
// f32 x (any shape), cap > 0 and finite.
absl::Status CheckSoftcap(const TensorView& x, float cap);
// f32 gate, up, out of one shape.
absl::Status CheckSiluMul(const TensorView& gate, const TensorView& up,
                          const TensorView& out);

// k [S, kv_heads, D] and v [S, kv_heads, Dv] of one cache dtype; scales f32
// [S, kv_heads] for an int8 cache and absent (empty views) otherwise.
absl::Status CheckKvCache(const OpSupport& support, absl::string_view op,
                          const KvCacheLayer& cache);
// f32 k [T, kv_heads, D] and v [T, kv_heads, Dv] matching a valid cache,
// slot_mapping kI64 [T].
absl::Status CheckStoreKvCache(const OpSupport& support, const TensorView& k,
                               const TensorView& v,
                               const TensorView& slot_mapping,
                               const KvCacheLayer& cache);
// Every slot in [0, S).
absl::Status CheckStoreKvCacheValues(const TensorView& slot_mapping,
                                     const KvCacheLayer& cache);

// f32 gate_up [T, 2I] and out [T, I] that do not overlap.
absl::Status CheckGatedActivation(const TensorView& gate_up,
                                  const TensorView& out);
// Linear's checks of (x, gate_up, bias, gate_up_scratch) and
// GatedActivation's of (gate_up_scratch, out); neither out nor the scratch
// overlaps x.
absl::Status CheckGatedLinear(const OpSupport& support, const TensorView& x,
                              const WeightView& gate_up, const TensorView* bias,
                              const TensorView& gate_up_scratch,
                              const TensorView& out);
// QkvRopeStoreArgs' contract (ops.h): f32 qkv [T, (H + 2 Hkv) D] with Hkv and
// D (even, == Dv) the valid cache's, q_out [T, H, D] not overlapping qkv,
// norms f32 [D] when given, inv_freq f32 [R/2] (2 <= R <= D), positions kI32
// [T], slot_mapping kI64 [T]; RopeOptions: a finite cos_sin_scale, and for
// length scaling original_max_len > 0, metadata of T tokens (query_start_loc
// and seq_lens of its num_seqs), long_inv_freq shaped as inv_freq (LongRoPE),
// R > 2 and finite constants (dynamic NTK).
absl::Status CheckQkvRopeStore(const OpSupport& support,
                               const QkvRopeStoreArgs& args);
// Every slot in [0, S) or -1.
absl::Status CheckQkvRopeStoreValues(const QkvRopeStoreArgs& args);

// f32 logits [T, E], kI32 topk_ids and f32 topk_weights [T, k] with
// 1 <= k <= min(E, kMaxMoeTopK), neither overlapping logits.
absl::Status CheckMoeRoute(const TensorView& logits, const TensorView& topk_ids,
                           const TensorView& topk_weights);
// MoeExpertsArgs' contract (ops.h), with `scratch_bytes` the backend's
// MoeExpertsScratchBytes for the call's sizes.
absl::Status CheckMoeExperts(const OpSupport& support,
                             const MoeExpertsArgs& args, int64_t scratch_bytes);
// f32 gate [T, 1], x and out [T, N]; out overlapping neither.
absl::Status CheckSigmoidGatedAdd(const TensorView& gate, const TensorView& x,
                                  const TensorView& out);

enum class AttentionKind { kPrefill, kDecode, kStatic };
// Well-formed metadata (sane scalars; kI32 arrays of the shapes they give)
// whose values were checked once for the step (num_blocks > 0, see
// attention_metadata.h) against no more blocks than the cache holds;
// sequences [first_seq, end_seq) of it, among the leading num_decode_seqs
// for decode; for static, no sequence longer than its block; f32 q
// [num_tokens, heads, D] and out [num_tokens, heads, Dv] with heads a
// multiple of the cache's kv heads; a valid cache; a sliding window >= 0; a
// softcap of 0 or positive and finite.
// O(1): it reads no array (they may be device memory, and this runs for
// every layer).
absl::Status CheckPagedAttention(const OpSupport& support, AttentionKind kind,
                                 const PagedAttentionArgs& args);

// f32 logits [rows, V] with V > 0 (and storage when rows > 0), every row's
// params set and valid (SamplingParams::Validate), top_logprobs in
// [0, support.max_top_logprobs], an output.
absl::Status CheckSample(const OpSupport& support, const TensorView& logits,
                         absl::Span<const SampleRow> rows,
                         const std::vector<SampleResult>* out);

// The op's name in messages: "PrefillAttention", ...
absl::string_view AttentionOpName(AttentionKind kind);

}  // namespace tessera

#endif  // TESSERA_KERNELS_OP_CHECKS_H_
