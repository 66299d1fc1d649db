#include "runtime/model/quantized_weights.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "runtime/core/status.h"

namespace tessera {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::string ScaleName(const QuantConfig& q, absl::string_view module) {
  return absl::StrCat(module, ".", q.scale_suffix);
}
std::string InputScaleName(absl::string_view module) {
  return absl::StrCat(module, ".input_scale");
}

// The scale of `w` (an fp8 matrix spec [N, K]) split as `w` is: per channel
// [N] by w's rows, per block [ceil(N/br), ceil(K/bc)] by w's block rows or
// block columns, per tensor the one value repeated for w's local rows.
WeightSpec ScaleSpecFor(const QuantConfig& q, const WeightSpec& w,
                        std::string name) {
  const int64_t N = w.full[0], K = w.full[1];
  WeightSpec s;
  switch (q.weight_scale) {
    case Fp8WeightScale::kPerTensor:
      s = Replicated(std::move(name), {1}, w.part);
      s.broadcast = w.local_shape()[0];
      break;
    case Fp8WeightScale::kPerChannel:
      switch (w.split) {
        case WeightSplit::kRows:
          s = RowSplit(std::move(name), {N}, w.begin, w.end, w.part);
          break;
        case WeightSplit::kRowRanges:
          s = RowRangesSplit(std::move(name), {N}, w.row_ranges, w.part);
          break;
        default:  // Whole rows on every rank (replicated, column split).
          s = Replicated(std::move(name), {N}, w.part);
          break;
      }
      break;
    case Fp8WeightScale::kBlock: {
      const int64_t br = q.block_rows, bc = q.block_cols;
      const Shape full({CeilDiv(N, br), CeilDiv(K, bc)});
      switch (w.split) {
        case WeightSplit::kRows:
          s = RowSplit(std::move(name), full, w.begin / br, CeilDiv(w.end, br),
                       w.part);
          break;
        case WeightSplit::kColumns:
          s = ColumnSplit(std::move(name), full, w.begin / bc,
                          CeilDiv(w.end, bc), w.part);
          break;
        default:
          s = Replicated(std::move(name), full, w.part);
          break;
      }
      break;
    }
  }
  s.any_shape = true;
  return s;
}

absl::Status CheckBlockAligned(absl::string_view what, int64_t rows,
                               int64_t block) {
  if (rows % block == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "this rank's ", what, " (", rows,
      ") is not a multiple of the fp8 checkpoint's ", block,
      "-wide scale blocks; use a tensor-parallel size that splits it on "
      "block boundaries"));
}

// Host f32 copies of a backend tensor (f32 or bf16) and back.
absl::StatusOr<std::vector<float>> ToHostF32(Device* device, const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  if (t.numel() == 0) return out;
  if (t.dtype() == DType::kF32) {
    RETURN_IF_ERROR(device->CopyToHost(t.view(), out.data()));
    return out;
  }
  std::vector<char> raw(t.nbytes());
  RETURN_IF_ERROR(device->CopyToHost(t.view(), raw.data()));
  RETURN_IF_ERROR(ConvertToF32(t.dtype(), raw.data(),
                               static_cast<size_t>(t.numel()), out.data()));
  return out;
}

// data * scale, in f32, as the data's dtype: the dequantized matrix.
absl::StatusOr<Tensor> Dequantize(Device* device, Weight w) {
  const Shape& shape = w.data.shape();
  const int64_t N = shape[0], K = shape[1];
  ASSIGN_OR_RETURN(std::vector<float> scale, ToHostF32(device, *w.scale));
  auto scale_of = [&](int64_t n, int64_t k) {
    if (w.scale_kind == WeightScaleKind::kPerChannel) return scale[n];
    const int64_t blocks_per_row = CeilDiv(K, w.block);
    return scale[(n / w.block) * blocks_per_row + k / w.block];
  };
  if (device->host_memory() && w.data.dtype() == DType::kF32) {
    // In place: the widened values are this tensor's own.
    Tensor out = std::move(w.data);
    float* v = out.data_as<float>();
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t k = 0; k < K; ++k) v[n * K + k] *= scale_of(n, k);
    }
    return out;
  }
  ASSIGN_OR_RETURN(std::vector<float> values, ToHostF32(device, w.data));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) values[n * K + k] *= scale_of(n, k);
  }
  return device->Upload(TensorView(values.data(), DType::kF32, shape),
                        w.data.dtype());
}

}  // namespace

absl::string_view ModuleOf(absl::string_view weight_name) {
  absl::string_view module = weight_name;
  absl::ConsumeSuffix(&module, ".weight");
  return module;
}

absl::Status QuantizeOnLoad(ModelConfig* config) {
  if (config->quant.quantized()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--quantization fp8: the checkpoint is quantized already (",
        config->quant.method, "); it loads as it is without the flag"));
  }
  if (config->moe.enabled()) {
    return absl::UnimplementedError(
        "--quantization fp8 for a mixture of experts is not supported yet");
  }
  QuantConfig q;
  q.method = "fp8 (online)";
  q.online = true;
  q.weight_scale = Fp8WeightScale::kPerChannel;
  q.input_scale = Fp8InputScale::kDynamicPerToken;
  q.unquantized_modules = {"lm_head"};
  config->quant = std::move(q);
  return absl::OkStatus();
}

void AddLinearSpec(const QuantConfig& quant, WeightSpec weight,
                   WeightTable* table) {
  const std::string module(ModuleOf(weight.name));
  const bool fp8 = quant.quantized() && !quant.online &&
                   quant.Quantizes(module) && weight.full.rank() == 2;
  weight.fp8 = fp8;
  const WeightSpec matrix = weight;
  table->push_back(std::move(weight));
  if (!fp8) return;
  table->push_back(ScaleSpecFor(quant, matrix, ScaleName(quant, module)));
  if (quant.input_scale == Fp8InputScale::kStaticPerTensor) {
    WeightSpec input = Replicated(InputScaleName(module), {1}, matrix.part);
    input.any_shape = true;
    table->push_back(std::move(input));
  }
}

absl::Status CheckQuantizedShard(const ModelConfig& c, const ShardSpec& s) {
  const QuantConfig& q = c.quant;
  if (!q.quantized() || q.online) return absl::OkStatus();
  if (c.moe.enabled()) {
    return absl::UnimplementedError(
        absl::StrCat("fp8 (", q.method,
                     ") mixture-of-experts checkpoints are not supported yet"));
  }
  if (c.arch == Architecture::kPhi3) {
    return absl::UnimplementedError(absl::StrCat(
        "fp8 (", q.method,
        ") Phi-3 checkpoints (fused qkv_proj / gate_up_proj) are not "
        "supported yet"));
  }
  if (q.weight_scale != Fp8WeightScale::kBlock || s.tp_size == 1) {
    return absl::OkStatus();
  }
  const int64_t D = c.head_dim;
  RETURN_IF_ERROR(
      CheckBlockAligned("query rows", s.local_heads * D, q.block_rows));
  RETURN_IF_ERROR(
      CheckBlockAligned("key/value rows", s.local_kv_heads * D, q.block_rows));
  RETURN_IF_ERROR(CheckBlockAligned("first key/value row", s.first_kv_head * D,
                                    q.block_rows));
  RETURN_IF_ERROR(CheckBlockAligned("intermediate slice", s.local_intermediate,
                                    q.block_rows));
  // o_proj and down_proj split their columns the same way.
  RETURN_IF_ERROR(
      CheckBlockAligned("query columns", s.local_heads * D, q.block_cols));
  return CheckBlockAligned("intermediate columns", s.local_intermediate,
                           q.block_cols);
}

absl::StatusOr<Weight> TakeLinearWeight(WeightSet* set,
                                        const QuantConfig& quant,
                                        const std::string& weight_name) {
  ASSIGN_OR_RETURN(Tensor data, set->Take(weight_name));
  Weight w(std::move(data));
  const absl::string_view module = ModuleOf(weight_name);
  const std::string scale_name = ScaleName(quant, module);
  if (!quant.quantized() || quant.online || !set->Has(scale_name)) return w;
  ASSIGN_OR_RETURN(Tensor scale, set->Take(scale_name));
  w.scale = std::move(scale);
  if (quant.weight_scale == Fp8WeightScale::kBlock) {
    w.scale_kind = WeightScaleKind::kBlock;
    w.block = static_cast<int32_t>(quant.block_rows);
  } else {
    w.scale_kind = WeightScaleKind::kPerChannel;
  }
  switch (quant.input_scale) {
    case Fp8InputScale::kDynamicPerToken:
      w.activations = ActivationScaleKind::kDynamicPerToken;
      break;
    case Fp8InputScale::kDynamicPerGroup:
      w.activations = ActivationScaleKind::kDynamicPerBlock;
      break;
    case Fp8InputScale::kStaticPerTensor: {
      w.activations = ActivationScaleKind::kStatic;
      ASSIGN_OR_RETURN(Tensor input, set->Take(InputScaleName(module)));
      w.input_scale = std::move(input);
      break;
    }
  }
  return w;
}

absl::StatusOr<Weight> StackLinearWeights(Device* device,
                                          absl::Span<const Weight> parts,
                                          HostStaging* staging) {
  if (parts.empty()) {
    return absl::InvalidArgumentError("StackLinearWeights: no parts");
  }
  const Weight& first = parts[0];
  std::vector<const Tensor*> data, scales;
  for (size_t i = 0; i < parts.size(); ++i) {
    const Weight& p = parts[i];
    if (p.scale_kind != first.scale_kind || p.block != first.block ||
        p.activations != first.activations ||
        p.scale.has_value() != first.scale.has_value() ||
        p.input_scale.has_value() != first.input_scale.has_value()) {
      return absl::InvalidArgumentError(
          "StackLinearWeights: the parts are quantized differently");
    }
    if (p.scale_kind == WeightScaleKind::kBlock && i + 1 < parts.size() &&
        p.shape()[0] % p.block != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("StackLinearWeights: a block-scaled part of ",
                       p.shape()[0], " rows is not a multiple of its ", p.block,
                       "-row blocks and cannot be stacked"));
    }
    data.push_back(&p.data);
    if (p.scale.has_value()) scales.push_back(&*p.scale);
  }
  ASSIGN_OR_RETURN(Tensor stacked, ConcatRows(device, data, staging));
  Weight out(std::move(stacked));
  out.scale_kind = first.scale_kind;
  out.block = first.block;
  out.activations = first.activations;
  if (!scales.empty()) {
    ASSIGN_OR_RETURN(Tensor scale, ConcatRows(device, scales, staging));
    out.scale = std::move(scale);
  }
  if (first.input_scale.has_value()) {
    // One input feeds every part: its largest scale keeps every part's
    // activations in range.
    float largest = 0.0f;
    for (const Weight& p : parts) {
      float v = 0.0f;
      RETURN_IF_ERROR(device->CopyToHost(p.input_scale->view(), &v));
      largest = std::max(largest, v);
    }
    ASSIGN_OR_RETURN(
        Tensor input,
        device->Upload(TensorView(&largest, DType::kF32, {1}), DType::kF32));
    out.input_scale = std::move(input);
  }
  return out;
}

absl::StatusOr<Weight> FinishLinearWeight(Ops* ops, const QuantConfig& quant,
                                          absl::Span<const std::string> modules,
                                          Weight weight) {
  if (weight.scale.has_value() && weight.dtype() != DType::kF8E4M3) {
    ASSIGN_OR_RETURN(Tensor dequantized, Dequantize(ops, std::move(weight)));
    return Weight(std::move(dequantized));
  }
  if (!quant.online || weight.scale.has_value()) return weight;
  for (const std::string& module : modules) {
    if (!quant.Quantizes(module)) return weight;
  }
  absl::StatusOr<Weight> quantized = ops->QuantizeWeightFp8(weight.data.view());
  if (!quantized.ok()) {
    return Annotate(
        quantized.status(),
        absl::StrCat("quantizing ", modules.empty() ? "" : modules[0],
                     " to fp8 (--quantization fp8)"));
  }
  return quantized;
}

}  // namespace tessera
