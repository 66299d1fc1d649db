#include "runtime/executor/rank_spec.h"

#include "absl/strings/str_cat.h"
#include "kernels/backend/backend.h"
#include "runtime/core/status.h"
#include "runtime/executor/rank.h"
#include "runtime/kv/kv_layout.h"

namespace tessera {

absl::StatusOr<DType> RankWeightDType(const RankSpec& s) {
  if (s.device != "cpu" && s.device != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("--device must be cpu or cuda, got \"", s.device, "\""));
  }
  // A build without the CUDA backend refuses "cuda" here, before any load.
  if (s.device == "cuda") RETURN_IF_ERROR(CudaUnavailableError());
  const std::string& d = s.weight_dtype;
  if (d == "float32" || d == "f32") return DType::kF32;
  if (d != "auto" && d != "bfloat16" && d != "bf16") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--dtype must be auto, bfloat16 or float32, got \"", d, "\""));
  }
  if (s.device == "cpu" && d != "auto") {
    return absl::InvalidArgumentError(
        "--dtype bfloat16 needs --device cuda (the CPU computes in float32)");
  }
  return s.device == "cuda" ? DType::kBF16 : DType::kF32;
}

absl::StatusOr<DType> RankKvDType(const RankSpec& s, DType weights) {
  if (s.kv_dtype == "auto") return weights;
  ASSIGN_OR_RETURN(const DType kv, ParseKvDType(s.kv_dtype));
  if (kv == DType::kBF16 && s.device != "cuda") {
    return absl::InvalidArgumentError(
        "--kv-dtype bfloat16 needs --device cuda");
  }
  return kv;
}

absl::StatusOr<KvCacheOptions> RankKvOptions(const RankSpec& s, DType weights) {
  KvCacheOptions kv;
  kv.block_size = s.block_size;
  kv.num_blocks = s.num_kv_blocks;
  kv.memory_bytes = s.kv_cache_memory;
  kv.memory_fraction = s.kv_cache_fraction;
  ASSIGN_OR_RETURN(kv.dtype, RankKvDType(s, weights));
  ASSIGN_OR_RETURN(kv.backend, ParseAttentionBackend(s.attention));
  return kv;
}

absl::Status CheckRankSpec(const RankSpec& spec) {
  ASSIGN_OR_RETURN(const DType weights, RankWeightDType(spec));
  if (!spec.quantization.empty() && spec.quantization != "none") {
    if (spec.quantization != "fp8") {
      return absl::InvalidArgumentError(
          absl::StrCat("--quantization must be none or fp8, got \"",
                       spec.quantization, "\""));
    }
    if (spec.device != "cuda" || weights != DType::kBF16) {
      return absl::InvalidArgumentError(
          "--quantization fp8 needs --device cuda with bfloat16 matrices (the "
          "CPU and --dtype float32 compute with f32 weights)");
    }
  }
  return RankKvOptions(spec, weights).status();
}

namespace {
std::string DTypeFlagName(DType d) {
  switch (d) {
    case DType::kI8:
      return "int8";
    case DType::kBF16:
      return "bfloat16";
    case DType::kF8E4M3:
      return "fp8";  // ParseKvDType reads it back.
    default:
      return "float32";
  }
}
}  // namespace

absl::StatusOr<RankSpec> ResolveRankSpec(RankSpec spec) {
  ASSIGN_OR_RETURN(const DType weights, RankWeightDType(spec));
  ASSIGN_OR_RETURN(const KvCacheOptions kv, RankKvOptions(spec, weights));
  spec.weight_dtype = DTypeFlagName(weights);
  spec.kv_dtype = DTypeFlagName(kv.dtype);
  return spec;
}

}  // namespace tessera
