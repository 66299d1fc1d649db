// Generator: runs one sequence from prompt to finish on a LlamaModel (single
// process, one request at a time; the continuous-batching scheduler replaces
// this loop for serving).
#ifndef TESSERA_RUNTIME_ENGINE_GENERATOR_H_
#define TESSERA_RUNTIME_ENGINE_GENERATOR_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/model/llama.h"
#include "runtime/sampler/sampler.h"

namespace tessera {

enum class FinishReason {
  kLength,  // max_tokens generated, or the context is full.
  kStop,    // An end-of-sequence token was generated (it is included in
            // output_ids).
};

absl::string_view FinishReasonName(FinishReason reason);  // "length" / "stop"

struct GenerationRequest {
  std::vector<int32_t> prompt_ids;  // Used as given: no BOS is added here.
  int64_t max_tokens = 256;         // >= 1.
  SamplingParams sampling;
  bool ignore_eos = false;
  // More ids that end the sequence like EOS (finish_reason "stop", the id
  // included in output_ids); they apply even with ignore_eos.
  std::vector<int32_t> stop_token_ids;  // Keep going after EOS (benchmarks).
};

struct GenerationResult {
  std::vector<int32_t> output_ids;
  FinishReason finish_reason = FinishReason::kLength;
  std::vector<float>
      prefill_logits;            // Next-token logits after the prompt [vocab].
  double prefill_seconds = 0.0;  // Prompt forward pass.
  double decode_seconds = 0.0;   // Every later forward pass.
};

// Something that turns a request into generated tokens: a model in this process
// (Generator) or a parallel job driven from rank 0 (parallel/'s coordinator).
class TokenGenerator {
 public:
  virtual ~TokenGenerator() = default;
  virtual const ModelConfig& config() const = 0;
  // The working-memory allocator's statistics (rank 0's in a parallel job).
  virtual AllocatorStats memory_stats() const = 0;
  // See Generator::Generate.
  virtual absl::StatusOr<GenerationResult> Generate(
      const GenerationRequest& request,
      const std::function<void(int32_t)>& on_token = {}) = 0;
};

// The checks every TokenGenerator makes before running a request: a non-empty
// prompt of ids inside the vocabulary that fits the context, max_tokens >= 1,
// valid sampling parameters.
absl::Status ValidateRequest(const ModelConfig& config,
                             const GenerationRequest& request);

// How many tokens the request may generate: max_tokens, capped by the context
// (the last sampled token needs no forward pass, so a full context still
// yields one).
int64_t MaxNewTokens(const ModelConfig& config,
                     const GenerationRequest& request);

// Whether `token` ends a sequence.
bool IsEos(const std::vector<int64_t>& eos_ids, int32_t token);

// Whether `token` ends `request`'s sequence: an EOS id (unless ignore_eos) or
// one of its stop_token_ids.
bool IsStopToken(const GenerationRequest& request,
                 const std::vector<int64_t>& eos_ids, int32_t token);

class Generator final : public TokenGenerator {
 public:
  // `model` must outlive the generator. `eos_ids` end a sequence (the config's
  // eos ids).
  Generator(LlamaModel* model, std::vector<int64_t> eos_ids);

  const ModelConfig& config() const override { return model_->config(); }
  AllocatorStats memory_stats() const override {
    return model_->memory_stats();
  }

  // InvalidArgument for an empty prompt, a token id outside the vocabulary, bad
  // sampling parameters or max_tokens < 1; OutOfRange for a prompt longer than
  // the context. `on_token`, when set, sees each generated token as soon as it
  // is sampled.
  absl::StatusOr<GenerationResult> Generate(
      const GenerationRequest& request,
      const std::function<void(int32_t)>& on_token = {}) override;

 private:
  LlamaModel* model_;
  std::vector<int64_t> eos_ids_;
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_ENGINE_GENERATOR_H_
