// The op set every backend implements. The model is written against this
// interface alone, so the same forward pass runs on the CPU reference
// (kernels/cpu) and on CUDA (kernels/cuda).
//
// Conventions (all ops):
//  - Tensors are dense, row-major TensorViews in the backend's memory; the op
//    checks dtypes and shapes and returns InvalidArgument naming the op and
//    the mismatch — it never guesses. The checks are the same code on every
//    backend (op_checks.h), run once by the public op (see class Ops).
//  - "T" is the number of tokens in the step, "H" the hidden size, "D" a head
//    dimension.
//  - Outputs may alias inputs only where an op says so.
//  - Step arrays (token ids, logit rows, positions, slots, the attention
//    metadata's arrays) are TensorViews in the backend's memory too: device
//    memory on a GPU, written once per step by runtime/executor/step_inputs.h,
//    which checks their values against the model, the KV pool and the step
//    before they are copied. The shared checks take their dtypes and shapes
//    (and the metadata's host scalars); their values are checked again only
//    where the backend's memory is host memory (Device::host_memory(): the
//    CPU reference). No op looks up a device copy of host data, so a step's
//    ops can be captured in a CUDA graph.
#ifndef TESSERA_KERNELS_OPS_H_
#define TESSERA_KERNELS_OPS_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/attention_metadata.h"
#include "kernels/device.h"
#include "kernels/op_timer.h"
#include "runtime/core/tensor.h"
#include "runtime/sampler/sampling_params.h"

namespace tessera {

// One layer's KV cache in slot form (see attention_metadata.h for how
// positions map to slots): k [num_slots, kv_heads, D], v [num_slots, kv_heads,
// Dv]. k and v always share their dtype, one of:
//  - f32 (and bf16 on CUDA): k and v hold the values; k_scale and v_scale are
//    empty views (no data).
//  - int8: k_scale, v_scale f32 [num_slots, kv_heads]: element i of (slot,
//    head) stands for k[slot, head, i] * k_scale[slot, head] (symmetric, one
//    scale per slot and head, computed when the token is written, so writing
//    a token never rescales another).
//  - fp8 (f8_e4m3, OCP e4m3fn): k_scale, v_scale f32 [kv_heads], one per
//    head for the whole layer, fixed while the cache is in use: element i
//    stands for k[slot, head, i] * k_scale[head]. A write stores
//    F32ToFp8E4M3(x / k_scale[head]) (runtime/core/dtype.h: round to nearest
//    even, saturating), so a value beyond ±448 * scale is stored as ±448 *
//    scale. The pool starts every scale at 1 (vLLM's default for a
//    checkpoint without kv scales); KvPool::SetLayerScales takes a
//    checkpoint's. With no per-slot scales the cache is half of bf16's bytes.
// For both scaled forms the kernels read the stored values and apply the
// scales inside the dot products (the q·k sum by k's, the p·v terms by v's);
// nothing dequantizes the cache.
struct KvCacheLayer {
  TensorView k;
  TensorView v;
  TensorView k_scale;
  TensorView v_scale;
  // Whether the values carry scales (int8 and fp8).
  bool quantized() const {
    return k.dtype() == DType::kI8 || k.dtype() == DType::kF8E4M3;
  }
  // int8's scales are per (slot, head); fp8's are per head.
  bool per_slot_scales() const { return k.dtype() == DType::kI8; }
};

// Attention of the step's sequences [first_seq, end_seq) over a KV cache that
// already holds their new keys and values (StoreKvCache ran first).
//
//  q:   [num_tokens, num_heads, D], the whole step (metadata order).
//  out: [num_tokens, num_heads, Dv]; only the rows of the chosen sequences are
//       written. It must not alias q.
// The query at row query_start_loc[s] + i sits at position context_lens[s] + i
// and sees keys at positions max(0, p - window + 1) .. p of its own sequence
// (causal; window = 0: all). Query head h reads KV head h / (num_heads /
// num_kv_heads) (GQA; MQA when num_kv_heads = 1). A key's score is
// s = scale * (q · k), then, with a soft cap, s = softcap * tanh(s / softcap)
// (Gemma 2's attention logit soft-capping: the scaled score divided, tanh,
// multiplied, as transformers computes it), then the softmax over the visible
// keys.
struct PagedAttentionArgs {
  TensorView q;
  KvCacheLayer cache;
  const AttentionMetadata* metadata = nullptr;
  int32_t first_seq = 0;
  int32_t end_seq = 0;
  TensorView out;
  int64_t sliding_window = 0;
  float scale = 1.0f;  // Usually 1 / sqrt(D).
  // 0: none; otherwise > 0 and finite (the checks refuse anything else).
  float softcap = 0.0f;
};

// How QkvRopeStore's frequencies follow each sequence's length, as
// transformers' dynamic_rope_update does at batch 1: every token of sequence
// s rotates with the frequencies for L = metadata.seq_lens[s], the
// sequence's length after this step (transformers' max(position_ids) + 1);
// keys written to the cache earlier keep the rotation they were written with.
// Where Tessera's keys differ from transformers' (which prefills a prompt
// whole): a prompt prefilled in several chunks rotates each chunk for the
// length at its end; a preempted sequence recomputed rotates its earlier
// output for the recomputed length; a prefix-cache hit reuses keys written
// for the length of the request that wrote them.
enum class RopeLengthScaling {
  kNone,        // inv_freq for every token.
  kDynamicNtk,  // L <= original_max_len: inv_freq. Beyond: inv_freq[i] =
                // 1 / b^(2i / R), b = base * (factor * L / original_max_len -
                // (factor - 1))^(R / (R - 2)), each operation in f32 as
                // transformers computes it from a tensor length.
  kLongRope,    // L <= original_max_len: inv_freq (LongRoPE's short
                // factors). Beyond: long_inv_freq.
};

// What QkvRopeStore applies beyond one inv_freq table; the defaults are
// plain RoPE.
struct RopeOptions {
  RopeLengthScaling length_scaling = RopeLengthScaling::kNone;
  int32_t original_max_len = 0;  // > 0 when length_scaling is set.
  TensorView long_inv_freq;      // kLongRope: f32, inv_freq's shape.
  // kDynamicNtk, rounded to f32 from the double values transformers starts
  // from: base = rope_theta, factor, factor_minus_one = factor - 1,
  // exponent = R / (R - 2).
  float base = 0.0f;
  float factor = 1.0f;
  float factor_minus_one = 0.0f;
  float exponent = 1.0f;
  // Multiplies cos and sin (transformers' attention_scaling), for a model
  // whose attention scale cannot carry it (partial rotary: the pass-through
  // dims are not scaled). Finite.
  float cos_sin_scale = 1.0f;
};

// The attention block's fused prologue (Ops::QkvRopeStore): the output of
// the one q/k/v projection split into heads, normed (Qwen3), rotated, q kept
// and k, v written to the cache.
//
//  qkv:       f32 [T, (H + 2 Hkv) * D], each row q's H heads, then k's Hkv,
//             then v's Hkv (the concatenated projection's output).
//  q_norm, k_norm: f32 [D] per-head RMSNorm weights, or null (none).
//  positions: kI32 [T] (a step array); inv_freq f32 [R/2] with R even,
//             2 <= R <= D: dims [0, R) of each head are rotated (pairs i,
//             i + R/2), dims [R, D) pass through (partial rotary).
//  rope:      per-sequence frequencies and a cos/sin factor (RopeOptions);
//             with length scaling, `metadata` (query_start_loc and seq_lens,
//             device arrays) gives each token's sequence and length.
//  slot_mapping: kI64 [T] (a step array): every slot in [0, num_slots) or -1
//             (a padded token: its k and v are not written).
//  cache:     Hkv kv heads, D = the cache's k and v head dims.
//  q_out:     f32 [T, H, D], dense; must not overlap qkv.
// Per head the order is the unfused one's: RmsNorm (when its weight is
// given), then Rope ("rotate half"), then for k and v StoreKvCache's write
// (an int8 or fp8 cache quantizes each (token, head) row exactly as
// StoreKvCache).
struct QkvRopeStoreArgs {
  TensorView qkv;
  const TensorView* q_norm = nullptr;
  const TensorView* k_norm = nullptr;
  float eps = 1e-6f;
  TensorView positions;
  TensorView inv_freq;
  RopeOptions rope;
  // Required when rope.length_scaling != kNone (num_tokens == T).
  const AttentionMetadata* metadata = nullptr;
  TensorView slot_mapping;
  KvCacheLayer cache;
  TensorView q_out;
};

// The activation of a gated MLP (Ops::GatedActivation): out = act(gate) * up.
enum class GatedActivationKind {
  // SwiGLU: act(g) = g / (1 + exp(-g)) (SiluMul's expression).
  kSilu,
  // GeGLU with the tanh approximation of GELU (Gemma's gelu_pytorch_tanh):
  // act(g) = 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))), in f32 in
  // PyTorch's order (g * g * g; kBeta * (g + kKappa * g^3); 0.5 * g * (1 +
  // tanh(inner))).
  kGeluTanh,
};

// One row of Ops::Sample: the sequence's SamplingParams (the one struct; not
// owned, must outlive the call) and the state of this draw.
struct SampleRow {
  const SamplingParams* params = nullptr;  // Validated by Sample.
  // The sequence's stream (params->seed, or the random one it was given when
  // it started) and its draw number: the uniform is PhiloxUniform(seed, step)
  // (kernels/philox.h), so (seed, step) fixes the token on either backend.
  uint64_t seed = 0;
  uint64_t step = 0;
  // The penalties' view: the prompt (repetition only) and the output so far.
  absl::Span<const int32_t> prompt;
  absl::Span<const int32_t> output;
  // Ids whose logits are -inf for this draw, after the penalties (min_tokens
  // masks EOS and stop ids); ids outside the vocabulary are ignored.
  absl::Span<const int32_t> masked;
  // Structured output (runtime/grammar): a bitmask of the ids this draw may
  // take (bit id % 32 of word id / 32; (V + 31) / 32 words for V logits); the
  // others' logits are -inf, after the penalties. Empty: every id.
  absl::Span<const uint32_t> allowed;
  // How many alternatives to report: >= 0; a backend may refuse more than it
  // can rank (CUDA: 20, cuda::kMaxTopLogprobs), as vLLM's --max-logprobs.
  int32_t top_logprobs = 0;
};

// The largest step a rank will run, known when the rank is built: a backend
// sizes its own step scratch (a GEMM input conversion, the split-K decode
// attention workspace, the sampler's buffers) for it once in
// ReserveStepScratch, so that no op of a step allocates.
struct StepLimits {
  int64_t max_tokens = 0;     // Rows of a step's activations.
  int64_t max_seqs = 0;       // Sequences in one step (and rows sampled).
  int64_t max_seq_len = 0;    // Positions of one sequence (the context).
  int32_t max_heads = 0;      // Query heads of one attention call.
  int32_t max_head_dim = 0;   // Largest head dimension of q, k or v.
  int64_t max_linear_in = 0;  // Largest K of a Linear ([T, K] inputs).
  int64_t vocab_size = 0;     // Columns of the logits sampled.
};

struct SampleResult {
  int32_t token = 0;
  float logprob = 0.0f;  // Under the unmodified logits.
  // The min(top_logprobs, V) most likely ids under the unmodified logits,
  // best first (ties by lower id, NaN last), with their log-probabilities.
  std::vector<std::pair<int32_t, float>> top;
};

// How a weight's scale turns its stored values into real numbers.
enum class WeightScaleKind {
  kNone,        // The values are the weights (f32, bf16).
  kPerChannel,  // w[n, k] = data[n, k] * scale[n]; scale f32 [N]. A
                // checkpoint's per-tensor scale is held as N copies.
  kBlock,       // w[n, k] = data[n, k] * scale[n / B, k / B]; scale f32
                // [ceil(N / B), ceil(K / B)], B = block (128: DeepSeek and
                // Qwen3 FP8's weight_block_size).
};

// How an fp8 product may quantize its activations (a backend that computes
// in fp8, CUDA's tensor-core path, follows it; a weight-only path, which
// widens the weights instead, ignores it).
enum class ActivationScaleKind {
  kDynamicPerToken,  // Each row x[t] by its own max |x[t]| / 448.
  kStatic,           // Every row by input_scale (the checkpoint's).
  kDynamicPerBlock,  // Each 1×B slice of a row by its own max / 448 (block
                     // weights: what DeepSeek's recipe computes).
};

// A weight matrix as Linear reads it: its stored values in `data` (whose
// dtype is the weight's dtype) and, for fp8 (kF8E4M3) data, the scale that
// turns them into real numbers. Converts implicitly from a TensorView or a
// Tensor (an unscaled weight), so a call site passes a weight as it passes
// any tensor.
struct WeightView {
  WeightView() = default;
  WeightView(const TensorView& values) : data(values) {}  // NOLINT: implicit.
  WeightView(const Tensor& values) : data(values.view()) {}  // NOLINT

  DType dtype() const { return data.dtype(); }
  bool has_scale() const { return scale_kind != WeightScaleKind::kNone; }

  TensorView data;  // [N, K], the checkpoint's layout.
  WeightScaleKind scale_kind = WeightScaleKind::kNone;
  TensorView scale;   // f32, shaped by scale_kind (empty for kNone).
  int32_t block = 0;  // kBlock's B.
  ActivationScaleKind activations = ActivationScaleKind::kDynamicPerToken;
  TensorView input_scale;  // kStatic: f32 [1].
};

// A weight matrix as a model holds it: the tensors a WeightView points at.
// An unscaled weight is its data alone (scale_kind kNone).
struct Weight {
  Weight() = default;
  explicit Weight(Tensor values) : data(std::move(values)) {}

  WeightView view() const {
    WeightView v(data);
    v.scale_kind = scale_kind;
    if (scale.has_value()) v.scale = scale->view();
    v.block = block;
    v.activations = activations;
    if (input_scale.has_value()) v.input_scale = input_scale->view();
    return v;
  }
  operator WeightView() const { return view(); }  // NOLINT: implicit.
  const Shape& shape() const { return data.shape(); }
  DType dtype() const { return data.dtype(); }
  int64_t nbytes() const {
    return static_cast<int64_t>(data.nbytes()) +
           (scale.has_value() ? static_cast<int64_t>(scale->nbytes()) : 0) +
           (input_scale.has_value()
                ? static_cast<int64_t>(input_scale->nbytes())
                : 0);
  }

  Tensor data;
  WeightScaleKind scale_kind = WeightScaleKind::kNone;
  std::optional<Tensor> scale;
  int32_t block = 0;
  ActivationScaleKind activations = ActivationScaleKind::kDynamicPerToken;
  std::optional<Tensor> input_scale;
};

// The experts of a mixture-of-experts block over its routed tokens
// (Ops::MoeExperts): every expert a gated (SwiGLU) MLP, each token's top-k
// experts (MoeRoute's ids and weights) run on it, their outputs weighted and
// summed.
//
//  x:            f32 [T, H], the block's input.
//  topk_ids:     kI32 [T, k] (1 <= k <= kMaxMoeTopK): global expert ids.
//  topk_weights: f32 [T, k].
//  gate_up:      [E, 2I, H] in a weight dtype, unscaled: expert e's gate rows,
//                then its up rows (its GatedLinear weight).
//  down:         [E, H, I], gate_up's dtype, unscaled.
//  first_expert: the experts here are global ids [first_expert,
//                first_expert + E); a (token, j) whose id is outside them
//                contributes nothing (expert parallelism: another rank holds
//                that expert). Any id value is valid.
//  scratch:      >= MoeExpertsScratchBytes(T, k, E, H, I) bytes of the
//                backend's memory, any dtype; contents unspecified after.
//  out:          f32 [T, H]: out[t] = sum over j of topk_weights[t, j] *
//                down_e · (silu(gate_e · x[t]) * (up_e · x[t])) with e =
//                topk_ids[t, j] - first_expert, accumulated from 0 in
//                ascending expert id (ties by j), each term's product rounded
//                before its add — transformers' order (index_add_ expert by
//                expert). Products accumulate in f32. A token no expert here
//                takes gets zeros. out must not overlap x or scratch.
struct MoeExpertsArgs {
  TensorView x;
  TensorView topk_ids;
  TensorView topk_weights;
  WeightView gate_up;
  WeightView down;
  int64_t first_expert = 0;
  TensorView scratch;
  TensorView out;
};

// The most experts one token is routed to (MoeRoute, MoeExperts): the
// kernels keep a token's choices in registers.
inline constexpr int64_t kMaxMoeTopK = 32;

// Which dtypes a backend's kernels read; the shared checks refuse the rest
// with a message that lists these.
struct OpSupport {
  absl::Span<const DType> weights;   // Embedding tables, Linear weights.
  absl::Span<const DType> kv_cache;  // KvCacheLayer k and v.
  // The most alternatives Sample ranks per row (SampleRow::top_logprobs).
  // The engine refuses requests above it before they reach a step, since a
  // refused row would fail every sequence of that step.
  int32_t max_top_logprobs = std::numeric_limits<int32_t>::max();
};

// The op set. Every public op is non-virtual: it runs the argument checks
// shared by all backends (op_checks.h: dtypes, shapes, aliasing, ranges; an
// InvalidArgument naming the op) once, then calls the backend's protected
// Do<Op>, which may assume them. So the backends refuse the same inputs with
// the same messages, and a backend's Do* holds only what it computes.
class Ops : public Device {
 public:
  ~Ops() override = default;

  // out[t, :] = table[ids[t], :]. table [V, H], ids kI32 [T] (a step array),
  // out [T, H]; every id must be in [0, V).
  absl::Status Embedding(const TensorView& table, const TensorView& ids,
                         const TensorView& out);

  // The vocabulary-parallel form: `table` [V_local, H] holds ids first_id ..
  // first_id + V_local - 1; rows of out for ids outside that range are zero
  // (another rank has them, and a sum across ranks completes the lookup). Ids
  // must still be >= 0.
  absl::Status EmbeddingShard(const TensorView& table, const TensorView& ids,
                              int64_t first_id, const TensorView& out);

  // Upload and CopyToHost: see device.h.

  // Step buffers: see NewUploadBuffer in device.h.

  // Sizes the backend's own step scratch for `limits`, once, when the rank is
  // built. Afterwards no op allocates: a step that needs more scratch than
  // reserved fails with FailedPrecondition instead of growing it (a captured
  // graph would keep reading the old buffer). Before it (unit tests of single
  // ops) a backend may grow its scratch on first use.
  virtual absl::Status ReserveStepScratch(const StepLimits& limits) {
    (void)limits;
    return absl::OkStatus();
  }

  // dst[i, :] = src[rows[i], :]: src [R, N], rows kI32 [n] (a step array),
  // dst [n, N], rows in [0, R).
  absl::Status GatherRows(const TensorView& src, const TensorView& rows,
                          const TensorView& dst);

  // out [n, V] = the first V columns of the concatenation, along columns, of
  // `shards` pieces [n, Vp] stacked in `gathered` [shards * n, Vp] (the
  // vocabulary-parallel head's all-gather).
  absl::Status ConcatShards(const TensorView& gathered, int64_t shards,
                            const TensorView& out);

  // Samples one token per row of `logits` [rows, V] (f32, this backend's
  // memory) into (*out)[row], with its log-probability and the top
  // alternatives, both under the unmodified logits (no penalty, temperature or
  // mask). Both backends draw the same token from the same logits, params and
  // (seed, step): the semantics and where that equality is exact are
  // kernels/cpu/cpu_sampling.h's. The checks (CheckSample): f32 logits
  // [rows, V > 0], every row's params set and valid, top_logprobs >= 0.
  absl::Status Sample(const TensorView& logits,
                      absl::Span<const SampleRow> rows,
                      std::vector<SampleResult>* out);

  // Root-mean-square norm over the last dimension: out = x / sqrt(mean(x^2) +
  // eps) * weight. x and out [R, N] (any R), weight [N]. out may alias x.
  absl::Status RmsNorm(const TensorView& x, const TensorView& weight, float eps,
                       const TensorView& out);

  // The residual step fused with the next norm: residual += x, then out =
  // RmsNorm(residual, weight, eps). residual, x and out [R, N]; out may alias
  // x, not residual.
  absl::Status AddRmsNorm(const TensorView& residual, const TensorView& x,
                          const TensorView& weight, float eps,
                          const TensorView& out);

  // out = a + b, same shapes. out may alias a or b.
  absl::Status Add(const TensorView& a, const TensorView& b,
                   const TensorView& out);

  // out = x · weightᵀ (+ bias): x [T, K], weight [N, K] (the checkpoint's
  // layout) in one of the backend's weight dtypes (OpSupport), bias [N] or
  // null, out [T, N]. Accumulates in f32. An fp8 weight (kF8E4M3 data with a
  // kPerChannel or kBlock scale; no other dtype takes a scale) is the real
  // matrix data * scale; the backend may round x to fp8 as weight.activations
  // says (its tensor-core path) or widen the weights and keep x in f32 (its
  // few-row path), so an fp8 product matches the f32 product of the widened
  // weights to fp8's precision, not bit for bit.
  absl::Status Linear(const TensorView& x, const WeightView& weight,
                      const TensorView* bias, const TensorView& out);

  // Online fp8 quantization of a weight (`--quantization fp8`): weight f32 or
  // bf16 [N, K] in this backend's memory -> a new Weight of f8_e4m3 data
  // [N, K] with a kPerChannel scale f32 [N], scale[n] = max |weight[n, :]| /
  // 448 (1 for an all-zero row) and data = F32ToFp8E4M3(weight / scale)
  // (runtime/core/dtype.h), activations kDynamicPerToken. The source may be
  // freed when this returns. InvalidArgument for any other dtype or rank;
  // Unimplemented on a backend without fp8 products (only CUDA has them).
  absl::StatusOr<Weight> QuantizeWeightFp8(const TensorView& weight);

  // Rotary position embedding in place, "rotate half" (GPT-NeoX / Hugging Face)
  // layout: for each head, element i pairs with i + D/2 and rotates by
  // positions[t] * inv_freq[i]. x [T, heads, D], positions kI32 [T] (a step
  // array), inv_freq [D/2].
  absl::Status Rope(const TensorView& x, const TensorView& positions,
                    const TensorView& inv_freq);

  // x[t, :] += bias for every row: x [T, N], bias [N].
  absl::Status BiasAdd(const TensorView& x, const TensorView& bias);

  // x *= factor in place, element by element (one f32 product each): x f32
  // of any shape, factor finite. Gemma's embedding normalizer.
  absl::Status Scale(const TensorView& x, float factor);

  // x = cap * tanh(x / cap) in place, element by element, in f32 and in that
  // order (a division, tanh, a product: transformers' logit soft-capping):
  // x f32 of any shape, cap > 0 and finite. Gemma 2's final logits.
  absl::Status Softcap(const TensorView& x, float cap);

  // out = silu(gate) * up, all [T, I]. out may alias gate or up.
  absl::Status SiluMul(const TensorView& gate, const TensorView& up,
                       const TensorView& out);

  // The gated MLP's activation over the one gate/up projection's output:
  // gate_up f32 [T, 2I] (each row the I gate columns, then the I up columns),
  // out f32 [T, I] = act(gate) * up with `kind`'s act (kSilu: as SiluMul
  // computes it element by element). out must not overlap gate_up.
  absl::Status GatedActivation(GatedActivationKind kind,
                               const TensorView& gate_up,
                               const TensorView& out);

  // The gated MLP's first half in one op: out [T, I] = act(x · gateᵀ + bg) *
  // (x · upᵀ + bu), where `gate_up` [2I, K] stacks the gate rows, then the up
  // rows, and bias [2I] (or null) likewise: what Linear into gate_up_scratch
  // [T, 2I] followed by GatedActivation computes, and bit for bit so on every
  // backend. A backend may fuse the two (CUDA does at decode sizes, so the
  // product never reaches memory); the scratch's contents afterwards are
  // unspecified. Neither out nor the scratch may overlap x or each other.
  absl::Status GatedLinear(GatedActivationKind kind, const TensorView& x,
                           const WeightView& gate_up, const TensorView* bias,
                           const TensorView& gate_up_scratch,
                           const TensorView& out);

  // Mixture-of-experts routing, as transformers' routers: per token, the
  // softmax of its router logits in f32, the k most probable experts (ties:
  // the lower id first; NaN ranks above every number) in descending order of
  // probability into topk_ids, their probabilities into topk_weights,
  // divided by their sum (added in that order) when `renormalize`.
  // logits f32 [T, E], topk_ids kI32 [T, k], topk_weights f32 [T, k],
  // 1 <= k <= min(E, kMaxMoeTopK); the outputs must not overlap logits. CUDA
  // runs it as one kernel.
  absl::Status MoeRoute(const TensorView& logits, bool renormalize,
                        const TensorView& topk_ids,
                        const TensorView& topk_weights);

  // The routed experts of a mixture-of-experts block: see MoeExpertsArgs.
  // The checks: the shapes and dtypes there, k <= kMaxMoeTopK, first_expert
  // >= 0, the scratch's size, out overlapping neither x nor the scratch.
  absl::Status MoeExperts(const MoeExpertsArgs& args);

  // The scratch MoeExperts needs for `tokens` tokens of `top_k` experts each
  // over `experts` experts of hidden size `hidden` and intermediate size
  // `intermediate` (a model sizes its workspace with it, for its largest
  // step): this backend's own figure.
  virtual int64_t MoeExpertsScratchBytes(int64_t tokens, int64_t top_k,
                                         int64_t experts, int64_t hidden,
                                         int64_t intermediate) const;

  // out[t, :] += sigmoid(gate[t]) * x[t, :] (Qwen2-MoE's gated shared
  // expert): gate f32 [T, 1], x and out f32 [T, N]; out must not overlap x or
  // gate.
  absl::Status SigmoidGatedAdd(const TensorView& gate, const TensorView& x,
                               const TensorView& out);

  // RmsNorm (optional) + Rope + StoreKvCache of a fused q/k/v projection's
  // output in one op: see QkvRopeStoreArgs. On the CPU it is the unfused ops
  // in sequence (bit for bit their results); on CUDA one kernel.
  absl::Status QkvRopeStore(const QkvRopeStoreArgs& args);

  // Writes the keys and values of T tokens to their slots: k [T, kv_heads, D]
  // and v [T, kv_heads, Dv] f32, slot_mapping kI64 [T] (a step array) with
  // every slot in [0, num_slots). An int8 cache quantizes each (token, head)
  // row with scale max|x| / 127 (0 for an all-zero row) and rounds to nearest;
  // an fp8 cache stores F32ToFp8E4M3(x / scale[head]) with the layer's fixed
  // per-head scales (saturating at ±448; KvCacheLayer), bit for bit the same
  // bytes on every backend.
  absl::Status StoreKvCache(const TensorView& k, const TensorView& v,
                            const TensorView& slot_mapping,
                            const KvCacheLayer& cache);

  // Paged backends. PrefillAttention takes any query lengths (varlen, causal,
  // GQA); DecodeAttention requires query_len == 1 for every chosen sequence
  // (they must be among the metadata's num_decode_seqs leading decodes) and
  // parallelizes over sequences and heads (InvalidArgument otherwise).
  absl::Status PrefillAttention(const PagedAttentionArgs& args);
  absl::Status DecodeAttention(const PagedAttentionArgs& args);

  // Static backend: the cache is in the static layout (one block per
  // sequence, block_size = its capacity), so each sequence's keys are
  // contiguous slots and no block table is walked per position. Any query
  // lengths.
  absl::Status StaticAttention(const PagedAttentionArgs& args);

  // OpSupport::max_top_logprobs: the most alternatives Sample ranks per row.
  int32_t max_top_logprobs() const { return support_.max_top_logprobs; }

  // Op profiling (op_timer.h). While a timer is set, every op above that
  // does device work brackets its backend work (the Do<Op> call, not the
  // shared checks) with timer->Begin() and timer->End(label). The label is
  // the op's name and the static dimensions that tell its calls apart, never
  // the token count, so steps of any size add up: "Linear 6144x4096" (the
  // weight's N x K, "+bias" with one), "AddRmsNorm 4096",
  // "QkvRopeStore 32/8x128" (heads / KV heads x head dim), "DecodeAttention".
  // `timer` is not owned and must stay alive while set; nullptr (the
  // default) turns profiling off, which costs one branch per op. Set it
  // between steps only, from the thread that runs the ops.
  void set_op_timer(OpTimer* timer) { timer_ = timer; }
  OpTimer* op_timer() const { return timer_; }
  // A timer that measures this backend's ops (the CPU: the wall clock; CUDA:
  // events on the ops' stream). It may use the backend and must not outlive
  // it.
  virtual absl::StatusOr<std::unique_ptr<OpTimer>> NewOpTimer() = 0;

 protected:
  explicit Ops(OpSupport support) : support_(support) {}

  const OpSupport& support() const { return support_; }

  // The backends' ops, called only with arguments the public op has checked
  // (every contract above holds), so they check nothing of it again.
  virtual absl::Status DoEmbedding(const TensorView& table,
                                   const TensorView& ids,
                                   const TensorView& out) = 0;
  virtual absl::Status DoEmbeddingShard(const TensorView& table,
                                        const TensorView& ids, int64_t first_id,
                                        const TensorView& out) = 0;
  virtual absl::Status DoGatherRows(const TensorView& src,
                                    const TensorView& rows,
                                    const TensorView& dst) = 0;
  virtual absl::Status DoConcatShards(const TensorView& gathered,
                                      int64_t shards,
                                      const TensorView& out) = 0;
  virtual absl::Status DoRmsNorm(const TensorView& x, const TensorView& weight,
                                 float eps, const TensorView& out) = 0;
  // By default DoAdd into residual, then DoRmsNorm.
  virtual absl::Status DoAddRmsNorm(const TensorView& residual,
                                    const TensorView& x,
                                    const TensorView& weight, float eps,
                                    const TensorView& out);
  virtual absl::Status DoAdd(const TensorView& a, const TensorView& b,
                             const TensorView& out) = 0;
  virtual absl::Status DoLinear(const TensorView& x, const WeightView& weight,
                                const TensorView* bias,
                                const TensorView& out) = 0;
  // Unimplemented unless a backend has fp8 products.
  virtual absl::StatusOr<Weight> DoQuantizeWeightFp8(const TensorView& weight);
  virtual absl::Status DoRope(const TensorView& x, const TensorView& positions,
                              const TensorView& inv_freq) = 0;
  virtual absl::Status DoBiasAdd(const TensorView& x,
                                 const TensorView& bias) = 0;
  virtual absl::Status DoScale(const TensorView& x, float factor) = 0;
  virtual absl::Status DoSoftcap(const TensorView& x, float cap) = 0;
  virtual absl::Status DoSiluMul(const TensorView& gate, const TensorView& up,
                                 const TensorView& out) = 0;
  virtual absl::Status DoStoreKvCache(const TensorView& k, const TensorView& v,
                                      const TensorView& slot_mapping,
                                      const KvCacheLayer& cache) = 0;
  virtual absl::Status DoGatedActivation(GatedActivationKind kind,
                                         const TensorView& gate_up,
                                         const TensorView& out) = 0;
  // By default DoLinear into the scratch, then DoGatedActivation.
  virtual absl::Status DoGatedLinear(GatedActivationKind kind,
                                     const TensorView& x,
                                     const WeightView& gate_up,
                                     const TensorView* bias,
                                     const TensorView& gate_up_scratch,
                                     const TensorView& out);
  virtual absl::Status DoQkvRopeStore(const QkvRopeStoreArgs& args) = 0;
  virtual absl::Status DoPrefillAttention(const PagedAttentionArgs& args) = 0;
  virtual absl::Status DoDecodeAttention(const PagedAttentionArgs& args) = 0;
  virtual absl::Status DoStaticAttention(const PagedAttentionArgs& args) = 0;
  // Mixtures of experts; Unimplemented unless a backend has them.
  virtual absl::Status DoMoeRoute(const TensorView& logits, bool renormalize,
                                  const TensorView& topk_ids,
                                  const TensorView& topk_weights);
  virtual absl::Status DoMoeExperts(const MoeExpertsArgs& args);
  virtual absl::Status DoSigmoidGatedAdd(const TensorView& gate,
                                         const TensorView& x,
                                         const TensorView& out);
  // With out->size() == rows.size() > 0.
  virtual absl::Status DoSample(const TensorView& logits,
                                absl::Span<const SampleRow> rows,
                                std::vector<SampleResult>* out) = 0;

 private:
  // run() (the Do<Op> call) between the timer's Begin and End(label()) when
  // a timer is set; the label is made only then. Not nested: an op that a
  // backend runs inside another is the outer op's time.
  template <typename LabelFn, typename RunFn>
  absl::Status Timed(LabelFn&& label, RunFn&& run) {
    if (timer_ == nullptr || in_timed_op_) return run();
    in_timed_op_ = true;
    timer_->Begin();
    absl::Status status = run();
    timer_->End(label());
    in_timed_op_ = false;
    return status;
  }

  OpSupport support_;
  OpTimer* timer_ = nullptr;
  bool in_timed_op_ = false;
};

}  // namespace tessera

#endif  // TESSERA_KERNELS_OPS_H_
