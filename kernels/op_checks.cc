#include "kernels/op_checks.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "runtime/core/status.h"

namespace tessera {
namespace {

absl::Status CheckF32(absl::string_view op, absl::string_view name,
                      const TensorView& t) {
  return CheckDType(op, name, t, DType::kF32);
}

// A view that stands for "no tensor" (the scales of an f32 cache).
bool IsAbsent(const TensorView& t) {
  return t.data() == nullptr || t.numel() == 0;
}

absl::Status CheckStorage(absl::string_view op, absl::string_view name,
                          const TensorView& t) {
  if (t.data() == nullptr && t.numel() > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", name, " has no storage"));
  }
  return absl::OkStatus();
}

bool Contains(absl::Span<const DType> dtypes, DType d) {
  return std::find(dtypes.begin(), dtypes.end(), d) != dtypes.end();
}

// "a", "a or b", "a, b or c", every piece but the first prefixed by
// `prefix` ("f32 or both int8").
std::string JoinOr(absl::Span<const DType> dtypes, absl::string_view prefix,
                   absl::string_view (*name)(DType)) {
  std::string out;
  for (size_t i = 0; i < dtypes.size(); ++i) {
    if (i > 0) {
      absl::StrAppend(&out, i + 1 == dtypes.size() ? " or " : ", ", prefix);
    }
    absl::StrAppend(&out, name(dtypes[i]));
  }
  return out;
}

// The cache messages have always said "int8"; fp8 is the flag's name too.
absl::string_view CacheDTypeName(DType d) {
  if (d == DType::kI8) return "int8";
  if (d == DType::kF8E4M3) return "fp8";
  return DTypeName(d);
}

// Table [V, H] and out [T, H] for T ids (both embedding forms).
absl::Status CheckEmbeddingShapes(const OpSupport& support,
                                  absl::string_view op, const TensorView& table,
                                  const TensorView& ids,
                                  const TensorView& out) {
  RETURN_IF_ERROR(CheckDTypeIn(op, "table", table, support.weights));
  RETURN_IF_ERROR(CheckF32(op, "out", out));
  RETURN_IF_ERROR(CheckStepArray(op, "ids", ids, DType::kI32));
  if (table.shape().rank() != 2 || out.shape().rank() != 2 ||
      out.shape()[0] != ids.shape()[0] || out.shape()[1] != table.shape()[1]) {
    return ShapeError(op, "table [V, H] and out [T, H] disagree", table.shape(),
                      out.shape());
  }
  return absl::OkStatus();
}

template <typename T>
absl::Span<const T> Host(const TensorView& t) {
  return absl::MakeConstSpan(t.data_as<const T>(),
                             static_cast<size_t>(t.numel()));
}

}  // namespace

absl::Status CheckStepArray(absl::string_view op, absl::string_view name,
                            const TensorView& t, DType dtype) {
  RETURN_IF_ERROR(CheckDType(op, name, t, dtype));
  if (t.shape().rank() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", name, " must be a vector, got ", t.shape().ToString()));
  }
  return absl::OkStatus();
}

std::string DTypeList(absl::Span<const DType> dtypes) {
  return JoinOr(dtypes, "", &DTypeName);
}

absl::Status CheckDTypeIn(absl::string_view op, absl::string_view name,
                          const TensorView& t,
                          absl::Span<const DType> allowed) {
  if (!Contains(allowed, t.dtype())) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " must be ",
                                                   DTypeList(allowed), ", got ",
                                                   DTypeName(t.dtype())));
  }
  return CheckStorage(op, name, t);
}

absl::Status CheckEmbedding(const OpSupport& support, const TensorView& table,
                            const TensorView& ids, const TensorView& out) {
  return CheckEmbeddingShapes(support, "Embedding", table, ids, out);
}

absl::Status CheckEmbeddingValues(const TensorView& table,
                                  const TensorView& ids) {
  const int64_t vocab = table.shape()[0];
  for (int32_t id : Host<int32_t>(ids)) {
    if (id < 0 || id >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("Embedding: token id ", id,
                       " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckEmbeddingShard(const OpSupport& support,
                                 const TensorView& table, const TensorView& ids,
                                 const TensorView& out) {
  return CheckEmbeddingShapes(support, "EmbeddingShard", table, ids, out);
}

absl::Status CheckEmbeddingShardValues(const TensorView& ids) {
  for (int32_t id : Host<int32_t>(ids)) {
    if (id < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("EmbeddingShard: negative token id ", id));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckGatherRows(const TensorView& src, const TensorView& rows,
                             const TensorView& dst) {
  RETURN_IF_ERROR(CheckF32("GatherRows", "src", src));
  RETURN_IF_ERROR(CheckF32("GatherRows", "dst", dst));
  RETURN_IF_ERROR(CheckStepArray("GatherRows", "rows", rows, DType::kI32));
  if (src.shape().rank() != 2 || dst.shape().rank() != 2 ||
      dst.shape()[0] != rows.shape()[0] || dst.shape()[1] != src.shape()[1]) {
    return ShapeError("GatherRows", "src [R, N] and dst [rows, N] disagree",
                      src.shape(), dst.shape());
  }
  return absl::OkStatus();
}

absl::Status CheckGatherRowsValues(const TensorView& src,
                                   const TensorView& rows) {
  for (int32_t r : Host<int32_t>(rows)) {
    if (r < 0 || r >= src.shape()[0]) {
      return absl::InvalidArgumentError(
          absl::StrCat("GatherRows: row ", r, " of ", src.shape()[0]));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckConcatShards(const TensorView& gathered, int64_t shards,
                               const TensorView& out) {
  RETURN_IF_ERROR(CheckF32("ConcatShards", "gathered", gathered));
  RETURN_IF_ERROR(CheckF32("ConcatShards", "out", out));
  if (shards < 1 || gathered.shape().rank() != 2 || out.shape().rank() != 2 ||
      gathered.shape()[0] != shards * out.shape()[0] ||
      gathered.shape()[1] * shards < out.shape()[1]) {
    return ShapeError("ConcatShards",
                      "gathered [shards * n, Vp] cannot fill out [n, V]",
                      gathered.shape(), out.shape());
  }
  return absl::OkStatus();
}

absl::Status CheckRmsNorm(const TensorView& x, const TensorView& weight,
                          const TensorView& out) {
  RETURN_IF_ERROR(CheckF32("RmsNorm", "x", x));
  RETURN_IF_ERROR(CheckF32("RmsNorm", "weight", weight));
  RETURN_IF_ERROR(CheckF32("RmsNorm", "out", out));
  if (x.shape() != out.shape() || weight.shape().rank() != 1 ||
      x.shape().rank() < 1 ||
      x.shape()[x.shape().rank() - 1] != weight.shape()[0]) {
    return ShapeError("RmsNorm", "x [R, N], weight [N] and out [R, N] disagree",
                      x.shape(), weight.shape());
  }
  return absl::OkStatus();
}

absl::Status CheckAddRmsNorm(const TensorView& residual, const TensorView& x,
                             const TensorView& weight, const TensorView& out) {
  RETURN_IF_ERROR(CheckF32("AddRmsNorm", "residual", residual));
  RETURN_IF_ERROR(CheckF32("AddRmsNorm", "x", x));
  RETURN_IF_ERROR(CheckF32("AddRmsNorm", "weight", weight));
  RETURN_IF_ERROR(CheckF32("AddRmsNorm", "out", out));
  if (residual.shape() != x.shape() || x.shape() != out.shape() ||
      weight.shape().rank() != 1 || x.shape().rank() != 2 ||
      x.shape()[1] != weight.shape()[0] ||
      (out.data() == residual.data() && out.numel() > 0)) {
    return ShapeError("AddRmsNorm",
                      "residual, x, out [R, N] and weight [N] disagree (or out "
                      "aliases residual)",
                      x.shape(), weight.shape());
  }
  return absl::OkStatus();
}

absl::Status CheckAdd(const TensorView& a, const TensorView& b,
                      const TensorView& out) {
  RETURN_IF_ERROR(CheckF32("Add", "a", a));
  RETURN_IF_ERROR(CheckF32("Add", "b", b));
  RETURN_IF_ERROR(CheckF32("Add", "out", out));
  if (a.shape() != b.shape() || a.shape() != out.shape()) {
    return ShapeError("Add", "operand shapes differ", a.shape(), b.shape());
  }
  return absl::OkStatus();
}

absl::Status CheckWeightScale(absl::string_view op, const WeightView& w) {
  const bool fp8 = w.data.dtype() == DType::kF8E4M3;
  if (fp8 != w.has_scale()) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", DTypeName(w.data.dtype()), " weights ",
        fp8 ? "need a scale" : "take no scale (only f8_e4m3 weights do)"));
  }
  if (!fp8) return absl::OkStatus();
  RETURN_IF_ERROR(CheckF32(op, "weight scale", w.scale));
  const Shape& ws = w.data.shape();
  Shape expected;
  if (w.scale_kind == WeightScaleKind::kPerChannel) {
    expected = Shape({ws[0]});
  } else {
    if (w.block < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": block scale of block size ", w.block));
    }
    expected = Shape(
        {(ws[0] + w.block - 1) / w.block, (ws[1] + w.block - 1) / w.block});
  }
  if (w.scale.shape() != expected) {
    return ShapeError(op, "the weight scale's shape does not fit the weight",
                      w.scale.shape(), ws);
  }
  if (w.activations == ActivationScaleKind::kStatic) {
    RETURN_IF_ERROR(CheckF32(op, "input scale", w.input_scale));
    if (w.input_scale.shape() != Shape({1})) {
      return ShapeError(op, "a static input scale is [1]",
                        w.input_scale.shape(), ws);
    }
  }
  return absl::OkStatus();
}

absl::Status CheckLinear(const OpSupport& support, const TensorView& x,
                         const WeightView& weight, const TensorView* bias,
                         const TensorView& out) {
  RETURN_IF_ERROR(CheckF32("Linear", "x", x));
  RETURN_IF_ERROR(
      CheckDTypeIn("Linear", "weight", weight.data, support.weights));
  RETURN_IF_ERROR(CheckF32("Linear", "out", out));
  const Shape& ws = weight.data.shape();
  if (x.shape().rank() != 2 || ws.rank() != 2 || out.shape().rank() != 2 ||
      x.shape()[1] != ws[1] || out.shape()[0] != x.shape()[0] ||
      out.shape()[1] != ws[0]) {
    return ShapeError("Linear",
                      "x [T, K], weight [N, K] and out [T, N] disagree",
                      x.shape(), ws);
  }
  RETURN_IF_ERROR(CheckWeightScale("Linear", weight));
  if (bias != nullptr) {
    RETURN_IF_ERROR(CheckF32("Linear", "bias", *bias));
    if (bias->shape() != Shape({ws[0]})) {
      return ShapeError("Linear", "bias must be [N]", bias->shape(), ws);
    }
  }
  return absl::OkStatus();
}

absl::Status CheckRope(const TensorView& x, const TensorView& positions,
                       const TensorView& inv_freq) {
  RETURN_IF_ERROR(CheckF32("Rope", "x", x));
  RETURN_IF_ERROR(CheckF32("Rope", "inv_freq", inv_freq));
  RETURN_IF_ERROR(CheckStepArray("Rope", "positions", positions, DType::kI32));
  if (x.shape().rank() != 3 || x.shape()[0] != positions.shape()[0] ||
      x.shape()[2] % 2 != 0 || inv_freq.shape() != Shape({x.shape()[2] / 2})) {
    return ShapeError("Rope",
                      "x [T, heads, D] needs T positions and inv_freq [D/2]",
                      x.shape(), inv_freq.shape());
  }
  return absl::OkStatus();
}

absl::Status CheckScale(const TensorView& x, float factor) {
  RETURN_IF_ERROR(CheckF32("Scale", "x", x));
  if (!std::isfinite(factor)) {
    return absl::InvalidArgumentError(
        absl::StrCat("Scale: factor must be finite, got ", factor));
  }
  return absl::OkStatus();
}

absl::Status CheckSoftcap(const TensorView& x, float cap) {
  RETURN_IF_ERROR(CheckF32("Softcap", "x", x));
  if (!(cap > 0.0f && std::isfinite(cap))) {
    return absl::InvalidArgumentError(
        absl::StrCat("Softcap: cap must be positive and finite, got ", cap));
  }
  return absl::OkStatus();
}

absl::Status CheckBiasAdd(const TensorView& x, const TensorView& bias) {
  RETURN_IF_ERROR(CheckF32("BiasAdd", "x", x));
  RETURN_IF_ERROR(CheckF32("BiasAdd", "bias", bias));
  if (x.shape().rank() != 2 || bias.shape() != Shape({x.shape()[1]})) {
    return ShapeError("BiasAdd", "x [T, N] needs bias [N]", x.shape(),
                      bias.shape());
  }
  return absl::OkStatus();
}

absl::Status CheckSiluMul(const TensorView& gate, const TensorView& up,
                          const TensorView& out) {
  RETURN_IF_ERROR(CheckF32("SiluMul", "gate", gate));
  RETURN_IF_ERROR(CheckF32("SiluMul", "up", up));
  RETURN_IF_ERROR(CheckF32("SiluMul", "out", out));
  if (gate.shape() != up.shape() || gate.shape() != out.shape()) {
    return ShapeError("SiluMul", "gate, up and out must match", gate.shape(),
                      up.shape());
  }
  return absl::OkStatus();
}

absl::Status CheckKvCache(const OpSupport& support, absl::string_view op,
                          const KvCacheLayer& cache) {
  const Shape& ks = cache.k.shape();
  const Shape& vs = cache.v.shape();
  if (ks.rank() != 3 || vs.rank() != 3 || ks[0] != vs[0] || ks[1] != vs[1] ||
      ks[1] <= 0) {
    return ShapeError(op,
                      "cache k [S, kv_heads, D] and v [S, kv_heads, Dv] "
                      "disagree",
                      ks, vs);
  }
  if (cache.k.dtype() != cache.v.dtype() ||
      !Contains(support.kv_cache, cache.k.dtype())) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": cache k and v must both be ",
        JoinOr(support.kv_cache, "both ", &CacheDTypeName), ", got ",
        DTypeName(cache.k.dtype()), " and ", DTypeName(cache.v.dtype())));
  }
  RETURN_IF_ERROR(CheckStorage(op, "cache k", cache.k));
  RETURN_IF_ERROR(CheckStorage(op, "cache v", cache.v));
  if (cache.quantized()) {
    const absl::string_view kind =
        cache.per_slot_scales() ? "an int8" : "an fp8";
    if (IsAbsent(cache.k_scale) || IsAbsent(cache.v_scale)) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": ", kind, " cache needs k_scale and v_scale"));
    }
    RETURN_IF_ERROR(CheckF32(op, "cache k_scale", cache.k_scale));
    RETURN_IF_ERROR(CheckF32(op, "cache v_scale", cache.v_scale));
    // int8: one scale per (slot, head); fp8: one per head for the layer.
    const Shape want =
        cache.per_slot_scales() ? Shape({ks[0], ks[1]}) : Shape({ks[1]});
    if (cache.k_scale.shape() != want || cache.v_scale.shape() != want) {
      return ShapeError(op,
                        cache.per_slot_scales()
                            ? "int8 cache scales must be [S, kv_heads]"
                            : "fp8 cache scales must be [kv_heads]",
                        cache.k_scale.shape(), cache.v_scale.shape());
    }
  } else if (!IsAbsent(cache.k_scale) || !IsAbsent(cache.v_scale)) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, cache.k.dtype() == DType::kF32 ? ": an " : ": a ",
        DTypeName(cache.k.dtype()), " cache takes no k_scale / v_scale"));
  }
  return absl::OkStatus();
}

absl::Status CheckStoreKvCache(const OpSupport& support, const TensorView& k,
                               const TensorView& v,
                               const TensorView& slot_mapping,
                               const KvCacheLayer& cache) {
  constexpr absl::string_view kOp = "StoreKvCache";
  RETURN_IF_ERROR(CheckF32(kOp, "k", k));
  RETURN_IF_ERROR(CheckF32(kOp, "v", v));
  RETURN_IF_ERROR(
      CheckStepArray(kOp, "slot_mapping", slot_mapping, DType::kI64));
  RETURN_IF_ERROR(CheckKvCache(support, kOp, cache));
  const int64_t kv_heads = cache.k.shape()[1];
  const int64_t dim = cache.k.shape()[2];
  const int64_t dim_v = cache.v.shape()[2];
  const int64_t tokens = slot_mapping.shape()[0];
  if (k.shape() != Shape({tokens, kv_heads, dim}) ||
      v.shape() != Shape({tokens, kv_heads, dim_v})) {
    return absl::InvalidArgumentError(absl::StrCat(
        kOp, ": k ", k.shape().ToString(), " and v ", v.shape().ToString(),
        " must be [", tokens, ", ", kv_heads, ", ", dim, "] and [", tokens,
        ", ", kv_heads, ", ", dim_v, "]"));
  }
  return absl::OkStatus();
}

absl::Status CheckStoreKvCacheValues(const TensorView& slot_mapping,
                                     const KvCacheLayer& cache) {
  const int64_t num_slots = cache.k.shape()[0];
  const absl::Span<const int64_t> slots = Host<int64_t>(slot_mapping);
  for (size_t t = 0; t < slots.size(); ++t) {
    if (slots[t] < 0 || slots[t] >= num_slots) {
      return absl::InvalidArgumentError(
          absl::StrCat("StoreKvCache: slot ", slots[t], " of token ", t,
                       " is outside [0, ", num_slots, ")"));
    }
  }
  return absl::OkStatus();
}

namespace {

// Whether two views' bytes overlap (empty views overlap nothing).
bool Overlap(const TensorView& a, const TensorView& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  const char* a0 = static_cast<const char*>(a.data());
  const char* b0 = static_cast<const char*>(b.data());
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

}  // namespace

absl::Status CheckGatedActivation(const TensorView& gate_up,
                                  const TensorView& out) {
  constexpr absl::string_view kOp = "GatedActivation";
  RETURN_IF_ERROR(CheckF32(kOp, "gate_up", gate_up));
  RETURN_IF_ERROR(CheckF32(kOp, "out", out));
  const Shape& g = gate_up.shape();
  const Shape& o = out.shape();
  if (g.rank() != 2 || o.rank() != 2 || g[0] != o[0] || g[1] != 2 * o[1]) {
    return ShapeError(kOp, "gate_up [T, 2I] and out [T, I] disagree", g, o);
  }
  if (Overlap(gate_up, out)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": out overlaps gate_up"));
  }
  return absl::OkStatus();
}

absl::Status CheckGatedLinear(const OpSupport& support, const TensorView& x,
                              const WeightView& gate_up, const TensorView* bias,
                              const TensorView& gate_up_scratch,
                              const TensorView& out) {
  RETURN_IF_ERROR(CheckLinear(support, x, gate_up, bias, gate_up_scratch));
  RETURN_IF_ERROR(CheckGatedActivation(gate_up_scratch, out));
  if (Overlap(x, out) || Overlap(x, gate_up_scratch)) {
    return absl::InvalidArgumentError(
        "GatedLinear: out or gate_up_scratch overlaps x");
  }
  return absl::OkStatus();
}

absl::Status CheckMoeRoute(const TensorView& logits, const TensorView& ids,
                           const TensorView& weights) {
  constexpr absl::string_view kOp = "MoeRoute";
  RETURN_IF_ERROR(CheckF32(kOp, "logits", logits));
  RETURN_IF_ERROR(CheckDType(kOp, "topk_ids", ids, DType::kI32));
  RETURN_IF_ERROR(CheckF32(kOp, "topk_weights", weights));
  const Shape& l = logits.shape();
  const Shape& i = ids.shape();
  if (l.rank() != 2 || i.rank() != 2 || weights.shape() != i || l[0] != i[0]) {
    return ShapeError(kOp,
                      "logits [T, E], topk_ids and topk_weights [T, k] "
                      "disagree",
                      l, i);
  }
  if (i[1] < 1 || i[1] > l[1] || i[1] > kMaxMoeTopK) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": k = ", i[1], " must be in [1, min(E = ", l[1],
                     ", ", kMaxMoeTopK, ")]"));
  }
  if (Overlap(logits, ids) || Overlap(logits, weights) ||
      Overlap(ids, weights)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": topk_ids, topk_weights and logits overlap"));
  }
  return absl::OkStatus();
}

absl::Status CheckMoeExperts(const OpSupport& support, const MoeExpertsArgs& a,
                             int64_t scratch_bytes) {
  constexpr absl::string_view kOp = "MoeExperts";
  RETURN_IF_ERROR(CheckF32(kOp, "x", a.x));
  RETURN_IF_ERROR(CheckF32(kOp, "out", a.out));
  RETURN_IF_ERROR(CheckDType(kOp, "topk_ids", a.topk_ids, DType::kI32));
  RETURN_IF_ERROR(CheckF32(kOp, "topk_weights", a.topk_weights));
  RETURN_IF_ERROR(
      CheckDTypeIn(kOp, "gate_up", a.gate_up.data, support.weights));
  RETURN_IF_ERROR(CheckDType(kOp, "down", a.down.data, a.gate_up.dtype()));
  RETURN_IF_ERROR(CheckStorage(kOp, "scratch", a.scratch));
  if (a.gate_up.has_scale() || a.down.has_scale()) {
    return absl::UnimplementedError(
        absl::StrCat(kOp, ": fp8 expert weights are not supported yet"));
  }
  const Shape& x = a.x.shape();
  const Shape& ids = a.topk_ids.shape();
  const Shape& gu = a.gate_up.data.shape();
  const Shape& dn = a.down.data.shape();
  if (x.rank() != 2 || a.out.shape() != x || ids.rank() != 2 ||
      ids[0] != x[0] || a.topk_weights.shape() != ids) {
    return ShapeError(kOp,
                      "x and out [T, H], topk_ids and topk_weights "
                      "[T, k] disagree",
                      x, ids);
  }
  if (gu.rank() != 3 || dn.rank() != 3 || gu[0] != dn[0] || gu[2] != x[1] ||
      gu[1] % 2 != 0 || dn[1] != x[1] || dn[2] != gu[1] / 2) {
    return ShapeError(kOp, "gate_up [E, 2I, H] and down [E, H, I] disagree", gu,
                      dn);
  }
  if (ids[1] < 1 || ids[1] > kMaxMoeTopK) {
    return absl::InvalidArgumentError(absl::StrCat(
        kOp, ": k = ", ids[1], " must be in [1, ", kMaxMoeTopK, "]"));
  }
  if (a.first_expert < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": first_expert ", a.first_expert, " is negative"));
  }
  if (static_cast<int64_t>(a.scratch.nbytes()) < scratch_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": the scratch holds ", a.scratch.nbytes(),
                     " bytes, this call needs ", scratch_bytes));
  }
  if (Overlap(a.out, a.x) || Overlap(a.out, a.scratch) ||
      Overlap(a.scratch, a.x) || Overlap(a.scratch, a.topk_ids) ||
      Overlap(a.scratch, a.topk_weights)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": out, scratch and the inputs overlap"));
  }
  return absl::OkStatus();
}

namespace {

// QkvRopeStoreArgs::rope and the metadata it reads (ops.h RopeOptions).
absl::Status CheckRopeOptions(const QkvRopeStoreArgs& a, int64_t tokens) {
  constexpr absl::string_view kOp = "QkvRopeStore";
  const RopeOptions& r = a.rope;
  if (!std::isfinite(r.cos_sin_scale)) {
    return absl::InvalidArgumentError(absl::StrCat(
        kOp, ": cos_sin_scale ", r.cos_sin_scale, " is not finite"));
  }
  if (r.length_scaling == RopeLengthScaling::kNone) return absl::OkStatus();
  if (r.original_max_len <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp,
                     ": length-scaled RoPE needs original_max_len > 0, "
                     "got ",
                     r.original_max_len));
  }
  if (a.metadata == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        kOp, ": length-scaled RoPE needs the step's attention metadata"));
  }
  const AttentionMetadata& m = *a.metadata;
  const int64_t n = m.num_seqs;
  if (m.num_tokens != tokens || n < 0 ||
      !CheckDType(kOp, "", m.query_start_loc, DType::kI32).ok() ||
      !CheckDType(kOp, "", m.seq_lens, DType::kI32).ok() ||
      m.query_start_loc.shape() != Shape({n + 1}) ||
      m.seq_lens.shape() != Shape({n})) {
    return absl::InvalidArgumentError(absl::StrCat(
        kOp, ": the metadata (", m.num_tokens, " tokens, ", n,
        " sequences, query_start_loc ", m.query_start_loc.shape().ToString(),
        ", seq_lens ", m.seq_lens.shape().ToString(), ") does not describe ",
        tokens, " tokens"));
  }
  if (r.length_scaling == RopeLengthScaling::kLongRope) {
    RETURN_IF_ERROR(CheckF32(kOp, "long_inv_freq", r.long_inv_freq));
    if (r.long_inv_freq.shape() != a.inv_freq.shape()) {
      return ShapeError(kOp, "long_inv_freq must have inv_freq's shape",
                        r.long_inv_freq.shape(), a.inv_freq.shape());
    }
    return absl::OkStatus();
  }
  // kDynamicNtk: R > 2 (the exponent R / (R - 2)), a positive base.
  if (a.inv_freq.shape()[0] < 2 || !(r.base > 0.0f) || !std::isfinite(r.base) ||
      !std::isfinite(r.factor) || !std::isfinite(r.factor_minus_one) ||
      !std::isfinite(r.exponent)) {
    return absl::InvalidArgumentError(absl::StrCat(
        kOp, ": dynamic NTK needs R > 2 and finite constants (R = ",
        2 * a.inv_freq.shape()[0], ", base ", r.base, ", factor ", r.factor,
        ")"));
  }
  return absl::OkStatus();
}
}  // namespace

absl::Status CheckSigmoidGatedAdd(const TensorView& gate, const TensorView& x,
                                  const TensorView& out) {
  constexpr absl::string_view kOp = "SigmoidGatedAdd";
  RETURN_IF_ERROR(CheckF32(kOp, "gate", gate));
  RETURN_IF_ERROR(CheckF32(kOp, "x", x));
  RETURN_IF_ERROR(CheckF32(kOp, "out", out));
  const Shape& g = gate.shape();
  if (x.shape().rank() != 2 || out.shape() != x.shape() || g.rank() != 2 ||
      g[1] != 1 || g[0] != x.shape()[0]) {
    return ShapeError(kOp, "gate [T, 1], x and out [T, N] disagree", g,
                      x.shape());
  }
  if (Overlap(out, x) || Overlap(out, gate)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": out overlaps x or gate"));
  }
  return absl::OkStatus();
}

absl::Status CheckQkvRopeStore(const OpSupport& support,
                               const QkvRopeStoreArgs& a) {
  constexpr absl::string_view kOp = "QkvRopeStore";
  RETURN_IF_ERROR(CheckF32(kOp, "qkv", a.qkv));
  RETURN_IF_ERROR(CheckF32(kOp, "q_out", a.q_out));
  RETURN_IF_ERROR(CheckF32(kOp, "inv_freq", a.inv_freq));
  RETURN_IF_ERROR(CheckStepArray(kOp, "positions", a.positions, DType::kI32));
  RETURN_IF_ERROR(
      CheckStepArray(kOp, "slot_mapping", a.slot_mapping, DType::kI64));
  RETURN_IF_ERROR(CheckKvCache(support, kOp, a.cache));
  const int64_t kv_heads = a.cache.k.shape()[1];
  const int64_t dim = a.cache.k.shape()[2];
  if (a.cache.v.shape()[2] != dim || dim % 2 != 0) {
    return ShapeError(kOp, "the cache's k and v head dims must be one even D",
                      a.cache.k.shape(), a.cache.v.shape());
  }
  const Shape& qs = a.q_out.shape();
  if (qs.rank() != 3 || qs[2] != dim || qs[1] <= 0) {
    return ShapeError(kOp, "q_out must be [T, H, D] with the cache's D", qs,
                      a.cache.k.shape());
  }
  const int64_t tokens = qs[0];
  const int64_t heads = qs[1];
  if (a.qkv.shape() != Shape({tokens, (heads + 2 * kv_heads) * dim})) {
    return ShapeError(kOp, "qkv must be [T, (H + 2 Hkv) * D] for q_out",
                      a.qkv.shape(), qs);
  }
  if (a.positions.shape()[0] != tokens || a.slot_mapping.shape()[0] != tokens) {
    return ShapeError(kOp, "positions and slot_mapping need T entries",
                      a.positions.shape(), a.slot_mapping.shape());
  }
  // inv_freq [R/2]: the first R dims of each head rotate, the rest pass.
  if (a.inv_freq.shape().rank() != 1 || a.inv_freq.shape()[0] < 1 ||
      a.inv_freq.shape()[0] > dim / 2) {
    return ShapeError(kOp, "inv_freq must be [R/2] with 2 <= R <= D",
                      a.inv_freq.shape(), qs);
  }
  RETURN_IF_ERROR(CheckRopeOptions(a, tokens));
  for (const TensorView* norm : {a.q_norm, a.k_norm}) {
    if (norm == nullptr) continue;
    RETURN_IF_ERROR(
        CheckF32(kOp, norm == a.q_norm ? "q_norm" : "k_norm", *norm));
    if (norm->shape() != Shape({dim})) {
      return ShapeError(kOp, "a q/k norm weight must be [D]", norm->shape(),
                        qs);
    }
  }
  if (Overlap(a.qkv, a.q_out)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": q_out overlaps qkv"));
  }
  return absl::OkStatus();
}

absl::Status CheckQkvRopeStoreValues(const QkvRopeStoreArgs& a) {
  const int64_t num_slots = a.cache.k.shape()[0];
  const absl::Span<const int64_t> slots = Host<int64_t>(a.slot_mapping);
  for (size_t t = 0; t < slots.size(); ++t) {
    if (slots[t] < -1 || slots[t] >= num_slots) {
      return absl::InvalidArgumentError(
          absl::StrCat("QkvRopeStore: slot ", slots[t], " of token ", t,
                       " is neither -1 nor in [0, ", num_slots, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckSample(const OpSupport& support, const TensorView& logits,
                         absl::Span<const SampleRow> rows,
                         const std::vector<SampleResult>* out) {
  if (out == nullptr) return absl::InvalidArgumentError("Sample: no output");
  const int64_t n = static_cast<int64_t>(rows.size());
  if (logits.dtype() != DType::kF32 || logits.shape().rank() != 2 ||
      logits.shape()[0] != n || logits.shape()[1] <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Sample: logits must be f32 [", n, ", V > 0], got ",
        DTypeName(logits.dtype()), " ", logits.shape().ToString()));
  }
  if (n > 0) RETURN_IF_ERROR(CheckStorage("Sample", "logits", logits));
  for (int64_t i = 0; i < n; ++i) {
    const SampleRow& r = rows[i];
    if (r.params == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("Sample: row ", i, " has no sampling parameters"));
    }
    if (absl::Status valid = r.params->Validate(); !valid.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("Sample: row ", i, ": ", valid.message()));
    }
    const int64_t words = (logits.shape()[1] + 31) / 32;
    if (!r.allowed.empty() && static_cast<int64_t>(r.allowed.size()) != words) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Sample: row ", i, "'s allowed-token mask has ", r.allowed.size(),
          " words; ", words, " cover the ", logits.shape()[1], " logits"));
    }
    if (r.top_logprobs < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Sample: row ", i, " asks for ", r.top_logprobs, " top logprobs"));
    }
    if (r.top_logprobs > support.max_top_logprobs) {
      return absl::InvalidArgumentError(
          absl::StrCat("Sample: row ", i, " asks for ", r.top_logprobs,
                       " top logprobs; this backend ranks at most ",
                       support.max_top_logprobs));
    }
  }
  return absl::OkStatus();
}

absl::string_view AttentionOpName(AttentionKind kind) {
  switch (kind) {
    case AttentionKind::kPrefill:
      return "PrefillAttention";
    case AttentionKind::kDecode:
      return "DecodeAttention";
    case AttentionKind::kStatic:
      return "StaticAttention";
  }
  return "Attention";
}

absl::Status CheckPagedAttention(const OpSupport& support, AttentionKind kind,
                                 const PagedAttentionArgs& args) {
  const absl::string_view op = AttentionOpName(kind);
  if (args.metadata == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": no metadata"));
  }
  const AttentionMetadata& m = *args.metadata;
  const int64_t n = m.num_seqs;
  const bool arrays_ok =
      CheckDType(op, "", m.query_start_loc, DType::kI32).ok() &&
      CheckDType(op, "", m.context_lens, DType::kI32).ok() &&
      CheckDType(op, "", m.seq_lens, DType::kI32).ok() &&
      CheckDType(op, "", m.block_tables, DType::kI32).ok() &&
      m.query_start_loc.shape() == Shape({n + 1}) &&
      m.context_lens.shape() == Shape({n}) &&
      m.seq_lens.shape() == Shape({n}) &&
      m.block_tables.shape() == Shape({n, int64_t{m.max_blocks_per_seq}});
  if (m.block_size <= 0 || m.num_seqs < 0 || m.max_blocks_per_seq < 0 ||
      m.num_decode_seqs < 0 || m.num_decode_seqs > m.num_seqs || !arrays_ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": malformed metadata (block_size ", m.block_size, ", ", m.num_seqs,
        " sequences, ", m.num_decode_seqs, " decodes, query_start_loc ",
        m.query_start_loc.shape().ToString(), " ",
        DTypeName(m.query_start_loc.dtype()), ", block_tables ",
        m.block_tables.shape().ToString(), " ",
        DTypeName(m.block_tables.dtype()), ")"));
  }
  if (args.first_seq < 0 || args.first_seq > args.end_seq ||
      args.end_seq > m.num_seqs) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": sequences [", args.first_seq, ", ", args.end_seq,
                     ") outside [0, ", m.num_seqs, "]"));
  }
  if (kind == AttentionKind::kDecode && args.end_seq > m.num_decode_seqs) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": sequences [", args.first_seq, ", ", args.end_seq,
                     ") go beyond the ", m.num_decode_seqs,
                     " leading decodes; the decode kernel needs query_len 1"));
  }
  RETURN_IF_ERROR(CheckF32(op, "q", args.q));
  RETURN_IF_ERROR(CheckF32(op, "out", args.out));
  RETURN_IF_ERROR(CheckKvCache(support, op, args.cache));
  const int64_t kv_heads = args.cache.k.shape()[1];
  const int64_t dim = args.cache.k.shape()[2];
  const int64_t dim_v = args.cache.v.shape()[2];
  const Shape& qs = args.q.shape();
  const Shape& os = args.out.shape();
  if (qs.rank() != 3 || os.rank() != 3 || qs[0] != m.num_tokens ||
      os[0] != m.num_tokens || qs[1] != os[1] || qs[2] != dim ||
      os[2] != dim_v) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": q ", qs.ToString(), " and out ", os.ToString(),
                     " must be [num_tokens = ", m.num_tokens, ", heads, ", dim,
                     "] and [num_tokens, heads, ", dim_v, "]"));
  }
  if (qs[1] <= 0 || qs[1] % kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", qs[1], " query heads are not a multiple of ",
                     kv_heads, " kv heads"));
  }
  if (args.q.data() == args.out.data() && args.out.numel() > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": out must not alias q"));
  }
  if (args.sliding_window < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": negative sliding window ", args.sliding_window));
  }
  // 0 is no cap; a negative, infinite or NaN one has no meaning (and NaN
  // would slip past a "> 0" test in a kernel).
  if (!(args.softcap == 0.0f ||
        (args.softcap > 0.0f && std::isfinite(args.softcap)))) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": softcap must be 0 (none) or positive and finite, got ",
        args.softcap));
  }
  // The values were checked once for the step (PackAttentionMetadata): here
  // only that they were, against a pool that fits this cache.
  if (m.num_seqs > 0 && m.num_blocks <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op,
                     ": the metadata's arrays were not checked "
                     "(PackAttentionMetadata)"));
  }
  const int64_t num_slots = args.cache.k.shape()[0];
  if (m.num_blocks > num_slots / m.block_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": block ids were checked against ", m.num_blocks, " blocks of ",
        m.block_size, ", outside the cache of ", num_slots, " slots"));
  }
  if (kind == AttentionKind::kStatic && m.max_seq_len > m.block_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": a sequence of ", m.max_seq_len,
        " positions does not fit its static block of ", m.block_size));
  }
  return absl::OkStatus();
}

}  // namespace tessera
