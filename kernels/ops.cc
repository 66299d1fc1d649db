#include "kernels/ops.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/op_checks.h"
#include "runtime/core/status.h"

namespace tessera {
namespace {

// The last dimension of x (the feature width an op's label names).
int64_t Width(const TensorView& x) {
  const Shape& shape = x.shape();
  return shape.rank() == 0 ? 1 : shape[shape.rank() - 1];
}

}  // namespace

absl::Status Ops::Embedding(const TensorView& table, const TensorView& ids,
                            const TensorView& out) {
  RETURN_IF_ERROR(CheckEmbedding(support_, table, ids, out));
  if (host_memory()) RETURN_IF_ERROR(CheckEmbeddingValues(table, ids));
  return Timed([] { return std::string("Embedding"); },
               [&] { return DoEmbedding(table, ids, out); });
}

absl::Status Ops::EmbeddingShard(const TensorView& table, const TensorView& ids,
                                 int64_t first_id, const TensorView& out) {
  RETURN_IF_ERROR(CheckEmbeddingShard(support_, table, ids, out));
  if (host_memory()) RETURN_IF_ERROR(CheckEmbeddingShardValues(ids));
  return Timed([] { return std::string("EmbeddingShard"); },
               [&] { return DoEmbeddingShard(table, ids, first_id, out); });
}

absl::Status Ops::GatherRows(const TensorView& src, const TensorView& rows,
                             const TensorView& dst) {
  RETURN_IF_ERROR(CheckGatherRows(src, rows, dst));
  if (host_memory()) RETURN_IF_ERROR(CheckGatherRowsValues(src, rows));
  return Timed([] { return std::string("GatherRows"); },
               [&] { return DoGatherRows(src, rows, dst); });
}

absl::Status Ops::ConcatShards(const TensorView& gathered, int64_t shards,
                               const TensorView& out) {
  RETURN_IF_ERROR(CheckConcatShards(gathered, shards, out));
  return Timed([] { return std::string("ConcatShards"); },
               [&] { return DoConcatShards(gathered, shards, out); });
}

absl::Status Ops::RmsNorm(const TensorView& x, const TensorView& weight,
                          float eps, const TensorView& out) {
  RETURN_IF_ERROR(CheckRmsNorm(x, weight, out));
  return Timed([&] { return absl::StrCat("RmsNorm ", Width(x)); },
               [&] { return DoRmsNorm(x, weight, eps, out); });
}

absl::Status Ops::AddRmsNorm(const TensorView& residual, const TensorView& x,
                             const TensorView& weight, float eps,
                             const TensorView& out) {
  RETURN_IF_ERROR(CheckAddRmsNorm(residual, x, weight, out));
  return Timed([&] { return absl::StrCat("AddRmsNorm ", Width(x)); },
               [&] { return DoAddRmsNorm(residual, x, weight, eps, out); });
}

absl::Status Ops::DoAddRmsNorm(const TensorView& residual, const TensorView& x,
                               const TensorView& weight, float eps,
                               const TensorView& out) {
  RETURN_IF_ERROR(DoAdd(residual, x, residual));
  return DoRmsNorm(residual, weight, eps, out);
}

absl::Status Ops::Add(const TensorView& a, const TensorView& b,
                      const TensorView& out) {
  RETURN_IF_ERROR(CheckAdd(a, b, out));
  return Timed([&] { return absl::StrCat("Add ", Width(out)); },
               [&] { return DoAdd(a, b, out); });
}

absl::Status Ops::Linear(const TensorView& x, const WeightView& weight,
                         const TensorView* bias, const TensorView& out) {
  RETURN_IF_ERROR(CheckLinear(support_, x, weight, bias, out));
  return Timed(
      [&] {
        return absl::StrCat("Linear ", weight.data.shape()[0], "x",
                            weight.data.shape()[1],
                            bias != nullptr ? "+bias" : "");
      },
      [&] { return DoLinear(x, weight, bias, out); });
}

absl::StatusOr<Weight> Ops::QuantizeWeightFp8(const TensorView& weight) {
  if (weight.shape().rank() != 2 ||
      (weight.dtype() != DType::kF32 && weight.dtype() != DType::kBF16)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "QuantizeWeightFp8: the weight is ", DTypeName(weight.dtype()), " ",
        weight.shape().ToString(), ", expected f32 or bf16 [N, K]"));
  }
  return DoQuantizeWeightFp8(weight);
}

absl::StatusOr<Weight> Ops::DoQuantizeWeightFp8(const TensorView&) {
  return absl::UnimplementedError(
      "QuantizeWeightFp8 needs a backend with fp8 products (the CUDA "
      "backend)");
}

absl::Status Ops::Rope(const TensorView& x, const TensorView& positions,
                       const TensorView& inv_freq) {
  RETURN_IF_ERROR(CheckRope(x, positions, inv_freq));
  return Timed(
      [&] { return absl::StrCat("Rope ", x.shape()[1], "x", x.shape()[2]); },
      [&] { return DoRope(x, positions, inv_freq); });
}

absl::Status Ops::BiasAdd(const TensorView& x, const TensorView& bias) {
  RETURN_IF_ERROR(CheckBiasAdd(x, bias));
  return Timed([&] { return absl::StrCat("BiasAdd ", Width(x)); },
               [&] { return DoBiasAdd(x, bias); });
}

absl::Status Ops::Scale(const TensorView& x, float factor) {
  RETURN_IF_ERROR(CheckScale(x, factor));
  return Timed([&] { return absl::StrCat("Scale ", Width(x)); },
               [&] { return DoScale(x, factor); });
}

absl::Status Ops::Softcap(const TensorView& x, float cap) {
  RETURN_IF_ERROR(CheckSoftcap(x, cap));
  return Timed([&] { return absl::StrCat("Softcap ", Width(x)); },
               [&] { return DoSoftcap(x, cap); });
}

absl::Status Ops::SiluMul(const TensorView& gate, const TensorView& up,
                          const TensorView& out) {
  RETURN_IF_ERROR(CheckSiluMul(gate, up, out));
  return Timed([&] { return absl::StrCat("SiluMul ", Width(out)); },
               [&] { return DoSiluMul(gate, up, out); });
}

absl::Status Ops::StoreKvCache(const TensorView& k, const TensorView& v,
                               const TensorView& slot_mapping,
                               const KvCacheLayer& cache) {
  RETURN_IF_ERROR(CheckStoreKvCache(support_, k, v, slot_mapping, cache));
  if (host_memory()) {
    RETURN_IF_ERROR(CheckStoreKvCacheValues(slot_mapping, cache));
  }
  return Timed(
      [&] {
        return absl::StrCat("StoreKvCache ", k.shape()[1], "x", k.shape()[2]);
      },
      [&] { return DoStoreKvCache(k, v, slot_mapping, cache); });
}

absl::Status Ops::GatedLinear(GatedActivationKind kind, const TensorView& x,
                              const WeightView& gate_up, const TensorView* bias,
                              const TensorView& gate_up_scratch,
                              const TensorView& out) {
  RETURN_IF_ERROR(
      CheckGatedLinear(support_, x, gate_up, bias, gate_up_scratch, out));
  return Timed(
      [&] {
        return absl::StrCat("GatedLinear ", gate_up.data.shape()[0], "x",
                            gate_up.data.shape()[1],
                            bias != nullptr ? "+bias" : "");
      },
      [&] {
        return DoGatedLinear(kind, x, gate_up, bias, gate_up_scratch, out);
      });
}

absl::Status Ops::DoGatedLinear(GatedActivationKind kind, const TensorView& x,
                                const WeightView& gate_up,
                                const TensorView* bias,
                                const TensorView& gate_up_scratch,
                                const TensorView& out) {
  RETURN_IF_ERROR(DoLinear(x, gate_up, bias, gate_up_scratch));
  return DoGatedActivation(kind, gate_up_scratch, out);
}

absl::Status Ops::GatedActivation(GatedActivationKind kind,
                                  const TensorView& gate_up,
                                  const TensorView& out) {
  RETURN_IF_ERROR(CheckGatedActivation(gate_up, out));
  return Timed([&] { return absl::StrCat("GatedActivation ", Width(out)); },
               [&] { return DoGatedActivation(kind, gate_up, out); });
}

absl::Status Ops::QkvRopeStore(const QkvRopeStoreArgs& args) {
  RETURN_IF_ERROR(CheckQkvRopeStore(support_, args));
  if (host_memory()) RETURN_IF_ERROR(CheckQkvRopeStoreValues(args));
  return Timed(
      [&] {
        return absl::StrCat("QkvRopeStore ", args.q_out.shape()[1], "/",
                            args.cache.k.shape()[1], "x",
                            args.q_out.shape()[2]);
      },
      [&] { return DoQkvRopeStore(args); });
}

absl::Status Ops::MoeRoute(const TensorView& logits, bool renormalize,
                           const TensorView& topk_ids,
                           const TensorView& topk_weights) {
  RETURN_IF_ERROR(CheckMoeRoute(logits, topk_ids, topk_weights));
  return Timed(
      [&] {
        return absl::StrCat("MoeRoute ", logits.shape()[1], " top ",
                            topk_ids.shape()[1]);
      },
      [&] { return DoMoeRoute(logits, renormalize, topk_ids, topk_weights); });
}

absl::Status Ops::MoeExperts(const MoeExpertsArgs& args) {
  // The sizes come from the shapes, checked before they are read.
  const Shape& x = args.x.shape();
  const Shape& ids = args.topk_ids.shape();
  const Shape& gu = args.gate_up.data.shape();
  int64_t need = 0;
  if (x.rank() == 2 && ids.rank() == 2 && gu.rank() == 3) {
    need = MoeExpertsScratchBytes(x[0], ids[1], gu[0], x[1], gu[1] / 2);
  }
  RETURN_IF_ERROR(CheckMoeExperts(support_, args, need));
  return Timed(
      [&] {
        return absl::StrCat("MoeExperts ", gu[0], "x", gu[1] / 2, "x", gu[2],
                            " top ", ids[1]);
      },
      [&] { return DoMoeExperts(args); });
}

int64_t Ops::MoeExpertsScratchBytes(int64_t tokens, int64_t top_k,
                                    int64_t experts, int64_t hidden,
                                    int64_t intermediate) const {
  // The CPU reference's layout (cpu_ops.cc): one expert's gathered rows, its
  // gate/up product and activation (at most `tokens` rows each), every
  // routed row's output, and the routing's int32 tables.
  const int64_t rows = tokens * top_k;
  return 4 * (tokens * (hidden + 3 * intermediate) + rows * hidden + 2 * rows +
              experts + 1);
}

absl::Status Ops::SigmoidGatedAdd(const TensorView& gate, const TensorView& x,
                                  const TensorView& out) {
  RETURN_IF_ERROR(CheckSigmoidGatedAdd(gate, x, out));
  return Timed([&] { return absl::StrCat("SigmoidGatedAdd ", Width(out)); },
               [&] { return DoSigmoidGatedAdd(gate, x, out); });
}

absl::Status Ops::DoMoeRoute(const TensorView&, bool, const TensorView&,
                             const TensorView&) {
  return absl::UnimplementedError("MoeRoute: not implemented by this backend");
}

absl::Status Ops::DoMoeExperts(const MoeExpertsArgs&) {
  return absl::UnimplementedError(
      "MoeExperts: not implemented by this backend");
}

absl::Status Ops::DoSigmoidGatedAdd(const TensorView&, const TensorView&,
                                    const TensorView&) {
  return absl::UnimplementedError(
      "SigmoidGatedAdd: not implemented by this backend");
}

absl::Status Ops::PrefillAttention(const PagedAttentionArgs& args) {
  RETURN_IF_ERROR(CheckPagedAttention(support_, AttentionKind::kPrefill, args));
  return Timed([] { return std::string("PrefillAttention"); },
               [&] { return DoPrefillAttention(args); });
}

absl::Status Ops::DecodeAttention(const PagedAttentionArgs& args) {
  RETURN_IF_ERROR(CheckPagedAttention(support_, AttentionKind::kDecode, args));
  return Timed([] { return std::string("DecodeAttention"); },
               [&] { return DoDecodeAttention(args); });
}

absl::Status Ops::StaticAttention(const PagedAttentionArgs& args) {
  RETURN_IF_ERROR(CheckPagedAttention(support_, AttentionKind::kStatic, args));
  return Timed([] { return std::string("StaticAttention"); },
               [&] { return DoStaticAttention(args); });
}

absl::Status Ops::Sample(const TensorView& logits,
                         absl::Span<const SampleRow> rows,
                         std::vector<SampleResult>* out) {
  RETURN_IF_ERROR(CheckSample(support_, logits, rows, out));
  out->resize(rows.size());
  if (rows.empty()) return absl::OkStatus();
  return Timed([] { return std::string("Sample"); },
               [&] { return DoSample(logits, rows, out); });
}

}  // namespace tessera
