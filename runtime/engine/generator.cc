#include "runtime/engine/generator.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "runtime/core/status.h"

namespace tessera {

absl::string_view FinishReasonName(FinishReason reason) {
  return reason == FinishReason::kStop ? "stop" : "length";
}

Generator::Generator(LlamaModel* model, std::vector<int64_t> eos_ids)
    : model_(model), eos_ids_(std::move(eos_ids)) {}

absl::Status ValidateRequest(const ModelConfig& config,
                             const GenerationRequest& request) {
  const int64_t prompt_len = static_cast<int64_t>(request.prompt_ids.size());
  const int64_t context = config.max_position_embeddings;
  if (prompt_len == 0) return absl::InvalidArgumentError("the prompt is empty");
  if (prompt_len > context) {
    return absl::OutOfRangeError(
        absl::StrCat("the prompt has ", prompt_len,
                     " tokens, more than the model's context of ", context,
                     " (max_position_embeddings)"));
  }
  for (int32_t id : request.prompt_ids) {
    if (id < 0 || id >= config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "prompt token id ", id, " is outside the vocabulary [0, ",
          config.vocab_size, ")"));
    }
  }
  if (request.max_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_tokens must be >= 1, got ", request.max_tokens));
  }
  return request.sampling.Validate();
}

int64_t MaxNewTokens(const ModelConfig& config,
                     const GenerationRequest& request) {
  return std::min(request.max_tokens,
                  config.max_position_embeddings -
                      static_cast<int64_t>(request.prompt_ids.size()) + 1);
}

bool IsEos(const std::vector<int64_t>& eos_ids, int32_t token) {
  return std::find(eos_ids.begin(), eos_ids.end(),
                   static_cast<int64_t>(token)) != eos_ids.end();
}

bool IsStopToken(const GenerationRequest& request,
                 const std::vector<int64_t>& eos_ids, int32_t token) {
  if (!request.ignore_eos && IsEos(eos_ids, token)) return true;
  return std::find(request.stop_token_ids.begin(), request.stop_token_ids.end(),
                   token) != request.stop_token_ids.end();
}

absl::StatusOr<GenerationResult> Generator::Generate(
    const GenerationRequest& request,
    const std::function<void(int32_t)>& on_token) {
  const ModelConfig& config = model_->config();
  RETURN_IF_ERROR(ValidateRequest(config, request));
  const int64_t prompt_len = static_cast<int64_t>(request.prompt_ids.size());
  const int64_t context = config.max_position_embeddings;
  const int64_t max_new = MaxNewTokens(config, request);
  ASSIGN_OR_RETURN(KvCache cache, model_->NewKvCache(std::min(
                                      context, prompt_len + max_new - 1)));
  Sampler sampler(request.sampling);
  std::vector<float> logits(config.vocab_size);
  GenerationResult result;

  using Clock = std::chrono::steady_clock;
  auto t0 = Clock::now();
  RETURN_IF_ERROR(model_->Forward(request.prompt_ids, &cache, logits.data()));
  auto t1 = Clock::now();
  result.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  result.prefill_logits = logits;

  while (true) {
    ASSIGN_OR_RETURN(int32_t token, sampler.Sample(logits, request.prompt_ids,
                                                   result.output_ids));
    result.output_ids.push_back(token);
    if (on_token) on_token(token);
    if (IsStopToken(request, eos_ids_, token)) {
      result.finish_reason = FinishReason::kStop;
      break;
    }
    if (static_cast<int64_t>(result.output_ids.size()) >= max_new) {
      result.finish_reason = FinishReason::kLength;
      break;
    }
    const int32_t next[1] = {token};
    RETURN_IF_ERROR(model_->Forward(next, &cache, logits.data()));
  }
  result.decode_seconds =
      std::chrono::duration<double>(Clock::now() - t1).count();
  return result;
}

}  // namespace tessera
