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
  prologue.rope = rope;
  prologue.metadata = &meta;
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

int64_t MoeWeights::bytes() const {
  int64_t b = static_cast<int64_t>(router.nbytes() + gate_up_proj.nbytes() +
                                   down_proj.nbytes()) +
              Bytes(shared_expert_gate);
  if (shared_expert.has_value()) b += shared_expert->bytes();
  return b;
}

absl::Status MoeBlock::Forward(Ops* ops, Communicator* tp, const TensorView& x,
                               const MoeScratch& scratch,
                               const TensorView& out) const {
  const MoeWeights& w = weights;
  const int64_t T = x.shape()[0];
  TensorView logits = scratch.router_logits.Rows(0, T);
  TensorView ids = scratch.topk_ids.Rows(0, T);
  TensorView topk_weights = scratch.topk_weights.Rows(0, T);
  RETURN_IF_ERROR(ops->Linear(x, w.router.view(), nullptr, logits));
  RETURN_IF_ERROR(ops->MoeRoute(logits, renormalize, ids, topk_weights));
  MoeExpertsArgs args;
  args.x = x;
  args.topk_ids = ids;
  args.topk_weights = topk_weights;
  args.gate_up = w.gate_up_proj;
  args.down = w.down_proj;
  args.first_expert = first_expert;
  args.scratch = scratch.experts;
  args.out = out;
  RETURN_IF_ERROR(ops->MoeExperts(args));
  if (w.shared_expert.has_value() && w.shared_expert_gate.has_value()) {
    // expert output + sigmoid(gate(x)) * shared(x), transformers' order; at
    // TP the shared expert's partial sum joins the experts' before the one
    // all-reduce (the gate, held whole, is the same on every rank).
    const GatedMlpWeights& s = *w.shared_expert;
    TensorView gate_up = scratch.shared.gate_up.Rows(0, T);
    TensorView act = scratch.shared.act.Rows(0, T);
    TensorView shared_out = scratch.shared_out.Rows(0, T);
    TensorView gate = scratch.shared_gate.Rows(0, T);
    RETURN_IF_ERROR(ops->GatedLinear(GatedActivationKind::kSilu, x,
                                     s.gate_up_proj.view(), nullptr, gate_up,
                                     act));
    RETURN_IF_ERROR(ops->Linear(act, s.down_proj.view(), nullptr, shared_out));
    RETURN_IF_ERROR(
        ops->Linear(x, w.shared_expert_gate->view(), nullptr, gate));
    RETURN_IF_ERROR(ops->SigmoidGatedAdd(gate, shared_out, out));
  }
  return FinishRowParallel(ops, tp, std::nullopt, out);
}

}  // namespace tessera
