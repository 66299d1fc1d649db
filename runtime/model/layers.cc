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
  return static_cast<int64_t>(qkv_proj.nbytes() + o_proj.nbytes()) +
         Bytes(qkv_bias) + Bytes(o_bias) + Bytes(q_norm) + Bytes(k_norm);
}

int64_t GatedMlpWeights::bytes() const {
  return static_cast<int64_t>(gate_up_proj.nbytes() + down_proj.nbytes()) +
         Bytes(gate_up_bias) + Bytes(down_bias);
}

absl::Status AttentionBlock::Forward(
    Ops* ops, Communicator* tp, const TensorView& x,
    const AttentionMetadata& meta, AttentionBackend backend,
    const KvCacheLayer& cache, const TensorView& inv_freq,
    const AttentionScratch& scratch, const TensorView& out) const {
  const AttentionWeights& w = weights;
  const int64_t T = meta.num_tokens;
  const int64_t D = head_dim;
  TensorView qkv = scratch.qkv.Rows(0, T);
  TensorView q = scratch.q.Rows(0, T);
  TensorView attn = scratch.attn.Rows(0, T);
  TensorView storage[3];
  RETURN_IF_ERROR(ops->Linear(x, w.qkv_proj.view(),
                              OptionalView(w.qkv_bias, &storage[0]), qkv));
  // Every new key and value is in the cache before any sequence attends.
  QkvRopeStoreArgs prologue;
  prologue.qkv = qkv;
  prologue.q_norm = OptionalView(w.q_norm, &storage[1]);
  prologue.k_norm = OptionalView(w.k_norm, &storage[2]);
  prologue.eps = rms_norm_eps;
  prologue.positions = meta.positions;
  prologue.inv_freq = inv_freq;
  prologue.slot_mapping = meta.slot_mapping;
  prologue.cache = cache;
  prologue.q_out = q;
  RETURN_IF_ERROR(ops->QkvRopeStore(prologue));
  PagedAttentionArgs args;
  args.q = q;
  args.cache = cache;
  args.metadata = &meta;
  args.out = attn;
  args.sliding_window = sliding_window;
  args.scale = scale > 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(D));
  args.softcap = softcap;
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
  TensorView gate_up = scratch.gate_up.Rows(0, T);
  TensorView act = scratch.act.Rows(0, T);
  TensorView bias_storage;
  // act = act(x · gateᵀ) * (x · upᵀ), fused where the backend can.
  RETURN_IF_ERROR(ops->GatedLinear(activation, x, w.gate_up_proj.view(),
                                   OptionalView(w.gate_up_bias, &bias_storage),
                                   gate_up, act));
  RETURN_IF_ERROR(ops->Linear(act, w.down_proj.view(), nullptr, out));
  return FinishRowParallel(ops, tp, w.down_bias, out);
}

}  // namespace tessera
