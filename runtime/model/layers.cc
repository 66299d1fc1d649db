#include "runtime/model/layers.h"

#include <cmath>

#include "runtime/core/status.h"

namespace tessera {
namespace {

int64_t Bytes(const std::optional<Tensor>& t) {
  return t.has_value() ? static_cast<int64_t>(t->nbytes()) : 0;
}

const TensorView* OptionalView(const std::optional<Tensor>& t,
                               TensorView* storage) {
  if (!t.has_value()) return nullptr;
  *storage = t->view();
  return storage;
}

// The row-parallel output: partial sums meet in the all-reduce, then the
// bias (held whole) is added once.
absl::Status FinishRowParallel(Ops* ops, Communicator* tp,
                               const std::optional<Tensor>& bias,
                               const TensorView& out) {
  if (tp != nullptr && tp->size() > 1) RETURN_IF_ERROR(tp->AllReduceSum(out));
  if (!bias.has_value()) return absl::OkStatus();
  return ops->BiasAdd(out, bias->view());
}

}  // namespace

int64_t AttentionWeights::bytes() const {
  return static_cast<int64_t>(q_proj.nbytes() + k_proj.nbytes() +
                              v_proj.nbytes() + o_proj.nbytes()) +
         Bytes(q_bias) + Bytes(k_bias) + Bytes(v_bias) + Bytes(o_bias) +
         Bytes(q_norm) + Bytes(k_norm);
}

int64_t GatedMlpWeights::bytes() const {
  return static_cast<int64_t>(gate_proj.nbytes() + up_proj.nbytes() +
                              down_proj.nbytes()) +
         Bytes(gate_bias) + Bytes(up_bias) + Bytes(down_bias);
}

absl::Status AttentionBlock::Forward(
    Ops* ops, Communicator* tp, const TensorView& x,
    const AttentionMetadata& meta, AttentionBackend backend,
    const KvCacheLayer& cache, const TensorView& inv_freq,
    const AttentionScratch& scratch, const TensorView& out) const {
  const AttentionWeights& w = weights;
  const int64_t T = meta.num_tokens;
  const int64_t D = head_dim;
  TensorView q = scratch.q.Rows(0, T);
  TensorView k = scratch.k.Rows(0, T);
  TensorView v = scratch.v.Rows(0, T);
  TensorView attn = scratch.attn.Rows(0, T);
  TensorView bias_storage[3];
  ASSIGN_OR_RETURN(TensorView q2d, q.Reshape({T, local_heads * D}));
  ASSIGN_OR_RETURN(TensorView k2d, k.Reshape({T, local_kv_heads * D}));
  ASSIGN_OR_RETURN(TensorView v2d, v.Reshape({T, local_kv_heads * D}));
  RETURN_IF_ERROR(ops->Linear(x, w.q_proj.view(),
                              OptionalView(w.q_bias, &bias_storage[0]), q2d));
  RETURN_IF_ERROR(ops->Linear(x, w.k_proj.view(),
                              OptionalView(w.k_bias, &bias_storage[1]), k2d));
  RETURN_IF_ERROR(ops->Linear(x, w.v_proj.view(),
                              OptionalView(w.v_bias, &bias_storage[2]), v2d));
  if (w.q_norm.has_value()) {
    RETURN_IF_ERROR(ops->RmsNorm(q, w.q_norm->view(), rms_norm_eps, q));
  }
  if (w.k_norm.has_value()) {
    RETURN_IF_ERROR(ops->RmsNorm(k, w.k_norm->view(), rms_norm_eps, k));
  }
  RETURN_IF_ERROR(ops->Rope(q, meta.positions, inv_freq));
  RETURN_IF_ERROR(ops->Rope(k, meta.positions, inv_freq));
  // Every new key and value is in the cache before any sequence attends.
  RETURN_IF_ERROR(ops->StoreKvCache(k, v, meta.slot_mapping, cache));
  PagedAttentionArgs args;
  args.q = q;
  args.cache = cache;
  args.metadata = &meta;
  args.out = attn;
  args.sliding_window = sliding_window;
  args.scale = 1.0f / std::sqrt(static_cast<float>(D));
  if (backend == AttentionBackend::kStatic) {
    args.first_seq = 0;
    args.end_seq = meta.num_seqs;
    RETURN_IF_ERROR(ops->StaticAttention(args));
  } else {
    // Decodes lead the batch (see attention_metadata.h).
    if (meta.num_decode_seqs > 0) {
      args.first_seq = 0;
      args.end_seq = meta.num_decode_seqs;
      RETURN_IF_ERROR(ops->DecodeAttention(args));
    }
    if (meta.num_decode_seqs < meta.num_seqs) {
      args.first_seq = meta.num_decode_seqs;
      args.end_seq = meta.num_seqs;
      RETURN_IF_ERROR(ops->PrefillAttention(args));
    }
  }
  ASSIGN_OR_RETURN(TensorView attn2d, attn.Reshape({T, local_heads * D}));
  RETURN_IF_ERROR(ops->Linear(attn2d, w.o_proj.view(), nullptr, out));
  return FinishRowParallel(ops, tp, w.o_bias, out);
}

absl::Status GatedMlp::Forward(Ops* ops, Communicator* tp, const TensorView& x,
                               const GatedMlpScratch& scratch,
                               const TensorView& out) const {
  const GatedMlpWeights& w = weights;
  const int64_t T = x.shape()[0];
  TensorView gate = scratch.gate.Rows(0, T);
  TensorView up = scratch.up.Rows(0, T);
  TensorView bias_storage[2];
  RETURN_IF_ERROR(ops->Linear(x, w.gate_proj.view(),
                              OptionalView(w.gate_bias, &bias_storage[0]),
                              gate));
  RETURN_IF_ERROR(ops->Linear(x, w.up_proj.view(),
                              OptionalView(w.up_bias, &bias_storage[1]), up));
  RETURN_IF_ERROR(ops->SiluMul(gate, up, gate));
  RETURN_IF_ERROR(ops->Linear(gate, w.down_proj.view(), nullptr, out));
  return FinishRowParallel(ops, tp, w.down_bias, out);
}

}  // namespace tessera
