// fp8 checkpoints in the weight table and in binding: which tensors a
// quantized linear module adds beside its `.weight` (its scale, a static
// input scale), how they split across tensor-parallel ranks like the matrix
// they scale, and how a model's Weight is made of them.
//
// The formats (ModelConfig::quant, parsed in config.cc) differ only in the
// scale's name, granularity and published shape: compressed-tensors, modelopt
// and fbgemm_fp8 write `<module>.weight_scale` ([N, 1] per channel, [1] or []
// per tensor), the "fp8" method (DeepSeek, Qwen3 FP8)
// `<module>.weight_scale_inv` [ceil(N/128), ceil(K/128)] per 128 × 128 block;
// static activation scales are `<module>.input_scale`. Every form is w = q *
// scale.
//
// Where a backend keeps fp8 (the GPU: StoredDType), a Weight holds the fp8
// data and its scale (per-tensor scales repeated per channel, so that q/k/v
// and gate/up stack into one matrix whose rows keep their own scale). Where
// it does not (the CPU, the GPU's f32 golden mode), the data was widened on
// load and the scale is multiplied in here: the model then runs the
// dequantized weights, exactly what transformers computes for these
// checkpoints.
//
// `--quantization fp8` (QuantConfig::online) quantizes an unquantized
// checkpoint's linear weights as they are bound (Ops::QuantizeWeightFp8:
// per-channel scales, dynamic per-token activations), on a backend with fp8
// products.
#ifndef TESSERA_RUNTIME_MODEL_QUANTIZED_WEIGHTS_H_
#define TESSERA_RUNTIME_MODEL_QUANTIZED_WEIGHTS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/ops.h"
#include "runtime/model/config.h"
#include "runtime/model/shard.h"
#include "runtime/model/weights.h"

namespace tessera {

// The module a weight belongs to: "model.layers.0.self_attn.q_proj" for
// "model.layers.0.self_attn.q_proj.weight".
absl::string_view ModuleOf(absl::string_view weight_name);

// --quantization fp8 on `config`: its linear weights are quantized as they
// bind (QuantConfig::online; the LM head and embedding stay). InvalidArgument
// for a checkpoint that is quantized already; Unimplemented for a mixture of
// experts (its expert products take no fp8 yet).
absl::Status QuantizeOnLoad(ModelConfig* config);

// Appends `weight` (a linear module's matrix spec) to `table`, and when the
// checkpoint quantizes that module (quant.quantized(), not online, and
// quant.Quantizes(module)), marks it fp8 and appends its scale spec (split as
// the matrix is) and, for static activations, its input scale.
void AddLinearSpec(const QuantConfig& quant, WeightSpec weight,
                   WeightTable* table);

// Whether this model and shard can hold the checkpoint's fp8 matrices:
// Unimplemented for the layouts not loaded yet (mixture-of-experts layers,
// Phi-3's fused projections), InvalidArgument when a rank's slice of a
// block-scaled matrix does not start and end on a block (its heads or
// intermediate slice are not multiples of 128 rows). Ok when unquantized or
// online.
absl::Status CheckQuantizedShard(const ModelConfig& config,
                                 const ShardSpec& shard);

// Takes the linear weight `weight_name` out of `set` as a Weight: the
// tensor, and for an fp8 spec its scale (kPerChannel or kBlock) and static
// input scale, with the activation scheme of `quant`. NotFound as
// WeightSet::Take.
absl::StatusOr<Weight> TakeLinearWeight(WeightSet* set,
                                        const QuantConfig& quant,
                                        const std::string& weight_name);

// The rows of `parts` stacked into one Weight (ConcatRows of the data and of
// the scales; the largest static input scale, which every part's input
// fits): parts of one dtype and one scale kind; block-scaled parts must each
// have a multiple of the block's rows, except the last. InvalidArgument
// otherwise.
absl::StatusOr<Weight> StackLinearWeights(Device* device,
                                          absl::Span<const Weight> parts,
                                          HostStaging* staging);

// The form a model computes with: an fp8 weight whose data was widened on
// load (not f8_e4m3 any more) has its scale multiplied in (in f32, then
// stored in the data's dtype), an online-quantized module is quantized
// (ops->QuantizeWeightFp8), anything else is returned as it is. `modules`
// names the weight's modules, for QuantConfig::Quantizes.
absl::StatusOr<Weight> FinishLinearWeight(Ops* ops, const QuantConfig& quant,
                                          absl::Span<const std::string> modules,
                                          Weight weight);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_MODEL_QUANTIZED_WEIGHTS_H_
