#include "runtime/engine/generator.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "runtime/core/status.h"

namespace tessera {

absl::string_view FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kAbort:
      return "abort";
    case FinishReason::kLength:
      break;
  }
  return "length";
}

absl::Status ValidateRequest(const ModelConfig& config,
                             const GenerationRequest& request) {
  const int64_t prompt_len = static_cast<int64_t>(request.prompt_ids.size());
  const int64_t context = config.max_position_embeddings;
  if (prompt_len == 0) return absl::InvalidArgumentError("the prompt is empty");
  if (prompt_len > context) {
    return absl::OutOfRangeError(
        absl::StrCat("the prompt has ", prompt_len,
                     " tokens, more than the model's context of ", context,
                     " (max_position_embeddings, or --max-model-len)"));
  }
  for (TokenId id : request.prompt_ids) {
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
  if (request.min_tokens < 0 || request.min_tokens > request.max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "min_tokens must be in [0, max_tokens = ", request.max_tokens,
        "], got ", request.min_tokens));
  }
  if (request.top_logprobs < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_logprobs must be >= 0, got ", request.top_logprobs));
  }
  if (request.stop_token_ids.size() > kMaxStopTokenIds) {
    return absl::InvalidArgumentError(
        absl::StrCat("stop_token_ids holds ", request.stop_token_ids.size(),
                     " ids; at most ", kMaxStopTokenIds, " are allowed"));
  }
  size_t stop_bytes = 0;
  for (const std::string& stop : request.stop) {
    if (stop.empty()) {
      return absl::InvalidArgumentError("a stop string must not be empty");
    }
    stop_bytes += stop.size();
  }
  if (stop_bytes > kMaxStopStringBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the stop strings hold ", stop_bytes, " bytes; at most ",
                     kMaxStopStringBytes,
                     " are allowed (each token is checked against all "
                     "of them)"));
  }
  return request.sampling.Validate();
}

int64_t MaxNewTokens(const ModelConfig& config,
                     const GenerationRequest& request) {
  return std::min(request.max_tokens,
                  config.max_position_embeddings -
                      static_cast<int64_t>(request.prompt_ids.size()) + 1);
}

bool IsEos(const std::vector<int64_t>& eos_ids, TokenId token) {
  return std::find(eos_ids.begin(), eos_ids.end(),
                   static_cast<int64_t>(token)) != eos_ids.end();
}

bool IsStopToken(const GenerationRequest& request,
                 const std::vector<int64_t>& eos_ids, TokenId token) {
  if (!request.ignore_eos && IsEos(eos_ids, token)) return true;
  return std::find(request.stop_token_ids.begin(), request.stop_token_ids.end(),
                   token) != request.stop_token_ids.end();
}

std::vector<TokenId> StopTokenIds(const GenerationRequest& request,
                                  const std::vector<int64_t>& eos_ids) {
  std::vector<TokenId> ids = request.stop_token_ids;
  if (!request.ignore_eos) {
    for (int64_t id : eos_ids) {
      if (id >= 0 && id <= INT32_MAX) ids.push_back(static_cast<TokenId>(id));
    }
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

}  // namespace tessera
