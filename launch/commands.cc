#include "launch/commands.h"

#include <algorithm>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "kernels/cpu/cpu_ops.h"
#include "runtime/core/status.h"
#include "runtime/engine/generator.h"
#include "runtime/model/config.h"
#include "runtime/model/llama.h"
#include "runtime/text/chat_template.h"
#include "runtime/text/detokenizer.h"
#include "runtime/text/tokenizer.h"

namespace tessera {
namespace {

using json = nlohmann::json;

struct Prompt {
  std::optional<std::string> text;  // Set when the prompt came as text.
  std::optional<nlohmann::ordered_json>
      messages;  // Set for a chat conversation.
  std::vector<int32_t> ids;
};

// Whether a JSON integer is representable as an int32 token id (unsigned values
// above INT64_MAX must not wrap through get<int64_t>()).
bool FitsInt32(const json& id) {
  if (id.is_number_unsigned()) return id.get<uint64_t>() <= INT32_MAX;
  const int64_t v = id.get<int64_t>();
  return v >= INT32_MIN && v <= INT32_MAX;
}

absl::StatusOr<std::vector<int32_t>> ParseIdList(absl::string_view list) {
  std::vector<int32_t> ids;
  for (absl::string_view piece : absl::StrSplit(list, ',')) {
    piece = absl::StripAsciiWhitespace(piece);
    int32_t id;
    if (!absl::SimpleAtoi(piece, &id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--prompt-ids: \"", piece, "\" is not a token id"));
    }
    ids.push_back(id);
  }
  return ids;
}

absl::StatusOr<std::vector<Prompt>> ReadPromptsFile(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    return absl::NotFoundError(absl::StrCat("cannot open prompts file ", path));
  std::vector<Prompt> prompts;
  std::string line;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    const std::string where = absl::StrCat(path, ":", line_no);
    const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": not a JSON object"));
    }
    Prompt p;
    const int keys = j.contains("prompt") + j.contains("prompt_ids") +
                     j.contains("messages");
    if (keys == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": needs \"prompt\" or \"prompt_ids\" (or \"messages\")"));
    }
    if (keys > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          where,
          ": give only one of \"prompt\", \"prompt_ids\" and \"messages\""));
    }
    if (auto it = j.find("prompt"); it != j.end()) {
      if (!it->is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": \"prompt\" must be a string"));
      }
      p.text = it->get<std::string>();
    } else if (auto it = j.find("messages"); it != j.end()) {
      if (!it->is_array() || it->empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": \"messages\" must be a non-empty list of messages"));
      }
      for (const json& m : *it) {
        if (!m.is_object() || !m.contains("role")) {
          return absl::InvalidArgumentError(absl::StrCat(
              where, ": each message must be an object with a \"role\""));
        }
      }
      // Re-parse in order: templates see keys as the user wrote them (tojson
      // output).
      p.messages = nlohmann::ordered_json::parse(it->dump());
    } else {
      auto ids_it = j.find("prompt_ids");
      if (!ids_it->is_array()) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": \"prompt_ids\" must be a list of token ids"));
      }
      for (const json& id : *ids_it) {
        if (!id.is_number_integer()) {
          return absl::InvalidArgumentError(absl::StrCat(
              where, ": \"prompt_ids\" must be a list of token ids"));
        }
        if (!FitsInt32(id)) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": \"prompt_ids\" holds ", id.dump(),
                           ", which is not a token id"));
        }
        p.ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
      }
    }
    prompts.push_back(std::move(p));
  }
  if (prompts.empty())
    return absl::InvalidArgumentError(absl::StrCat(path, " has no prompts"));
  return prompts;
}

absl::StatusOr<std::vector<Prompt>> CollectPrompts(const GenerateOptions& o) {
  const int sources =
      !o.prompt.empty() + !o.prompt_ids.empty() + !o.prompts_file.empty();
  if (sources != 1) {
    return absl::InvalidArgumentError(
        "give exactly one of --prompt, --prompt-ids and --prompts-file");
  }
  if (!o.prompts_file.empty()) return ReadPromptsFile(o.prompts_file);
  Prompt p;
  if (!o.prompt.empty()) {
    p.text = o.prompt;
  } else {
    ASSIGN_OR_RETURN(p.ids, ParseIdList(o.prompt_ids));
  }
  return std::vector<Prompt>{std::move(p)};
}

// The model folder with everything loaded once. `generator` is either the
// caller's (a parallel job) or a Generator over `model` loaded here.
struct LoadedModel {
  CpuOps ops;
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<Generator> local;
  TokenGenerator* generator = nullptr;
  std::unique_ptr<Tokenizer> tokenizer;  // Null when the folder has none.
};

absl::StatusOr<std::unique_ptr<LoadedModel>> LoadModel(
    const std::string& model_dir, bool need_tokenizer,
    TokenGenerator* generator) {
  if (model_dir.empty())
    return absl::InvalidArgumentError("--model DIR is required");
  auto loaded = std::make_unique<LoadedModel>();
  if (generator != nullptr) {
    loaded->generator = generator;
  } else {
    ASSIGN_OR_RETURN(loaded->model, LlamaModel::Load(model_dir, &loaded->ops));
    loaded->local = std::make_unique<Generator>(
        loaded->model.get(), loaded->model->config().eos_token_ids);
    loaded->generator = loaded->local.get();
  }
  auto tokenizer =
      LoadTokenizer(model_dir, loaded->generator->config().bos_token_id);
  if (tokenizer.ok()) {
    loaded->tokenizer = *std::move(tokenizer);
  } else if (need_tokenizer) {
    return tokenizer.status();
  }
  return loaded;
}

}  // namespace

absl::Status RunGenerate(const GenerateOptions& o, TokenGenerator* generator_in,
                         std::ostream& out) {
  if (o.output != "text" && o.output != "json") {
    return absl::InvalidArgumentError(
        absl::StrCat("--output must be text or json, got \"", o.output, "\""));
  }
  if (o.max_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-tokens must be >= 1, got ", o.max_tokens));
  }
  RETURN_IF_ERROR(o.sampling.Validate());
  ASSIGN_OR_RETURN(std::vector<Prompt> prompts, CollectPrompts(o));
  std::vector<int32_t> stop_token_ids;
  if (!o.stop_token_ids.empty()) {
    absl::StatusOr<std::vector<int32_t>> ids = ParseIdList(o.stop_token_ids);
    if (!ids.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--stop-token-ids: \"", o.stop_token_ids, "\" is not a list of ids"));
    }
    stop_token_ids = *std::move(ids);
  }
  const bool need_tokenizer =
      std::any_of(prompts.begin(), prompts.end(),
                  [](const Prompt& p) { return p.text || p.messages; });
  if (o.chat) {
    for (Prompt& p : prompts) {
      if (p.text) {
        p.messages = nlohmann::ordered_json::array(
            {{{"role", "user"}, {"content", *p.text}}});
        p.text.reset();
      }
    }
  }
  const bool need_template =
      std::any_of(prompts.begin(), prompts.end(),
                  [](const Prompt& p) { return p.messages; });
  ASSIGN_OR_RETURN(std::unique_ptr<LoadedModel> loaded,
                   LoadModel(o.model_dir, need_tokenizer, generator_in));
  const ModelConfig& config = loaded->generator->config();
  const Tokenizer* tokenizer = loaded->tokenizer.get();

  std::optional<ChatTemplate> chat_template;
  if (need_template) {
    ASSIGN_OR_RETURN(chat_template,
                     ChatTemplate::FromTokenizerConfig(o.model_dir));
  }
  for (Prompt& p : prompts) {
    if (p.messages) {
      // The template writes BOS and every other marker itself, as transformers'
      // apply_chat_template(tokenize=True) encodes without adding special
      // tokens.
      ASSIGN_OR_RETURN(
          const std::string rendered,
          chat_template->Render(*p.messages, /*add_generation_prompt=*/true));
      ASSIGN_OR_RETURN(p.ids, tokenizer->Encode(rendered));
      p.text = rendered;
      continue;
    }
    if (p.text) {
      ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer->Encode(*p.text));
      if (tokenizer->add_bos()) {
        const int32_t bos = config.bos_token_id >= 0
                                ? static_cast<int32_t>(config.bos_token_id)
                                : tokenizer->bos_id();
        p.ids.push_back(bos);
      }
      p.ids.insert(p.ids.end(), ids.begin(), ids.end());
    }
  }

  TokenGenerator& generator = *loaded->generator;
  int64_t decode_allocations = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Prompt& p = prompts[i];
    GenerationRequest request;
    request.prompt_ids = p.ids;
    request.max_tokens = o.max_tokens;
    request.sampling = o.sampling;
    request.ignore_eos = o.ignore_eos;
    request.stop_token_ids = stop_token_ids;
    // Each prompt of a file gets its own stream, reproducible for a given seed.
    if (request.sampling.seed) *request.sampling.seed += i;
    // Text mode streams the continuation as it is generated: the prompt first
    // (a chat's rendered template is not echoed), then each piece of text as
    // soon as it is final.
    const bool stream = o.output == "text" && tokenizer != nullptr;
    std::optional<IncrementalDetokenizer> detokenizer;
    std::string prompt_text;
    absl::Status stream_status;
    if (stream) {
      if (!p.messages) {
        ASSIGN_OR_RETURN(prompt_text, tokenizer->Decode(
                                          p.ids, /*skip_special_tokens=*/true));
      }
      detokenizer.emplace(tokenizer, p.ids, /*skip_special_tokens=*/true);
    }
    bool started = false;
    // The second token is sampled right after the first decode step: from then
    // on the allocator must not need its source again.
    int tokens_seen = 0;
    int64_t allocations_at_first_decode = -1;
    auto on_token = [&](int32_t token) {
      if (++tokens_seen == 2) {
        allocations_at_first_decode =
            generator.memory_stats().underlying_allocations;
      }
      if (!detokenizer || !stream_status.ok()) return;
      if (!started) {  // Echo the prompt only once generation has really begun.
        out << prompt_text;
        started = true;
      }
      absl::StatusOr<std::string> piece = detokenizer->Append(token);
      if (!piece.ok()) {
        stream_status = piece.status();
        return;
      }
      out << *piece;
      out.flush();
    };
    auto result = generator.Generate(request, on_token);
    if (!result.ok()) {
      if (started) out << "\n";
      return Annotate(result.status(), prompts.size() > 1
                                           ? absl::StrCat("prompt ", i + 1)
                                           : "generate");
    }
    RETURN_IF_ERROR(stream_status);
    if (allocations_at_first_decode >= 0) {
      decode_allocations += generator.memory_stats().underlying_allocations -
                            allocations_at_first_decode;
    }

    if (stream) {
      ASSIGN_OR_RETURN(const std::string rest, detokenizer->Finish());
      out << rest << "\n";
    } else if (o.output == "json") {
      std::optional<std::string> continuation;
      if (tokenizer != nullptr) {
        std::vector<int32_t> all = p.ids;
        all.insert(all.end(), result->output_ids.begin(),
                   result->output_ids.end());
        ASSIGN_OR_RETURN(continuation,
                         tokenizer->DecodeSuffix(all, p.ids.size(),
                                                 /*skip_special_tokens=*/true));
      }
      // Keys in the order of the command-line contract.
      nlohmann::ordered_json line = {
          {"prompt_ids", p.ids},
          {"output_ids", result->output_ids},
          {"text", continuation ? json(*continuation) : json(nullptr)},
          {"finish_reason",
           std::string(FinishReasonName(result->finish_reason))}};
      out << line.dump(-1, ' ', false,
                       nlohmann::ordered_json::error_handler_t::replace)
          << "\n";
    } else {
      out << "output_ids:";
      for (int32_t id : result->output_ids) out << " " << id;
      out << "\n";
    }
    out.flush();
    const double decode_tokens =
        static_cast<double>(result->output_ids.size()) - 1.0;
    std::cerr << absl::StrFormat(
        "[tessera] prompt %d tokens in %.2f ms; %d tokens generated, %.1f "
        "tokens/s decode (%s)\n",
        p.ids.size(), result->prefill_seconds * 1e3, result->output_ids.size(),
        decode_tokens > 0 && result->decode_seconds > 0
            ? decode_tokens / result->decode_seconds
            : 0.0,
        FinishReasonName(result->finish_reason));
  }
  if (!o.stats_json.empty()) {
    const AllocatorStats stats = generator.memory_stats();
    nlohmann::ordered_json j;
    j["allocator"] = {
        {"underlying_allocations", stats.underlying_allocations},
        {"underlying_allocations_decode", decode_allocations},
        {"underlying_frees", stats.underlying_frees},
        {"underlying_allocated_bytes", stats.underlying_allocated_bytes},
        {"reserved_bytes", stats.reserved_bytes},
        {"in_use_bytes", stats.in_use_bytes},
        {"peak_in_use_bytes", stats.peak_in_use_bytes},
        {"pinned_bytes", stats.pinned_bytes}};
    std::ofstream file(o.stats_json);
    file << j.dump(2) << "\n";
    if (!file) {
      return absl::InternalError(
          absl::StrCat("cannot write --stats-json file ", o.stats_json));
    }
  }
  return absl::OkStatus();
}

absl::Status RunBench(const BenchOptions& o, std::ostream& out) {
  if (o.batch_size != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--batch-size ", o.batch_size,
        ": only 1 is supported until the continuous-batching scheduler lands"));
  }
  if (o.input_len < 1 || o.output_len < 1 || o.iterations < 1) {
    return absl::InvalidArgumentError(
        "--input-len, --output-len and --iterations must be >= 1");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<LoadedModel> loaded,
                   LoadModel(o.model_dir, false, nullptr));
  const ModelConfig& config = loaded->generator->config();
  if (o.input_len + o.output_len - 1 > config.max_position_embeddings) {
    return absl::InvalidArgumentError(
        absl::StrCat("--input-len + --output-len exceeds the context of ",
                     config.max_position_embeddings));
  }
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> token(
      0, static_cast<int32_t>(config.vocab_size) - 1);
  GenerationRequest request;
  for (int64_t i = 0; i < o.input_len; ++i)
    request.prompt_ids.push_back(token(rng));
  request.max_tokens = o.output_len;
  request.sampling.temperature = 0.0f;
  request.ignore_eos = true;

  TokenGenerator& generator = *loaded->generator;
  std::vector<double> prefill, decode;
  for (int64_t it = 0; it <= o.iterations; ++it) {
    ASSIGN_OR_RETURN(GenerationResult r, generator.Generate(request));
    if (it == 0) continue;  // Warm-up: first touches of weights and scratch.
    prefill.push_back(r.prefill_seconds);
    decode.push_back(r.decode_seconds);
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double prefill_s = median(prefill);
  const double decode_s = median(decode);
  const double prefill_tps = o.input_len / prefill_s;
  const double decode_tps =
      o.output_len > 1 ? (o.output_len - 1) / decode_s : 0.0;
  if (o.json) {
    json j = {{"model", o.model_dir},
              {"device", "cpu"},
              {"batch_size", o.batch_size},
              {"input_len", o.input_len},
              {"output_len", o.output_len},
              {"iterations", o.iterations},
              {"prefill_seconds", prefill_s},
              {"decode_seconds", decode_s},
              {"prefill_tokens_per_s", prefill_tps},
              {"decode_tokens_per_s", decode_tps}};
    out << j.dump() << "\n";
  } else {
    out << absl::StrFormat(
        "model %s, cpu, batch 1, input %d, output %d (median of %d)\n"
        "prefill: %.3f ms, %.1f tokens/s\n"
        "decode:  %.3f ms/token, %.1f tokens/s\n",
        o.model_dir, o.input_len, o.output_len, o.iterations, prefill_s * 1e3,
        prefill_tps,
        o.output_len > 1 ? decode_s * 1e3 / (o.output_len - 1) : 0.0,
        decode_tps);
  }
  return absl::OkStatus();
}

absl::Status RunTokenize(const TokenizeOptions& o, std::istream& in,
                         std::ostream& out) {
  if (o.model_dir.empty())
    return absl::InvalidArgumentError("--model DIR is required");
  ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer,
                   LoadTokenizer(o.model_dir, /*config_bos_id=*/-1));
  std::string line;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    auto bad = [&](absl::string_view what) {
      return absl::InvalidArgumentError(
          absl::StrCat("stdin line ", line_no, ": ", what));
    };
    const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
    nlohmann::ordered_json result;
    if (o.decode) {
      auto it = j.find("ids");
      if (it == j.end() || !it->is_array())
        return bad("needs \"ids\": [token ids]");
      std::vector<int32_t> ids;
      for (const json& id : *it) {
        if (!id.is_number_integer() || !FitsInt32(id)) {
          return bad("\"ids\" must hold integer token ids");
        }
        ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
      }
      auto text = tokenizer->Decode(ids, o.skip_special_tokens);
      if (!text.ok()) return bad(text.status().message());
      result["text"] = *text;
    } else {
      auto it = j.find("text");
      if (it == j.end() || !it->is_string())
        return bad("needs \"text\": \"...\"");
      auto ids = tokenizer->Encode(it->get<std::string>());
      if (!ids.ok()) return bad(ids.status().message());
      result["ids"] = *ids;
    }
    out << result.dump(-1, ' ', false,
                       nlohmann::ordered_json::error_handler_t::replace)
        << "\n";
    out.flush();
  }
  return absl::OkStatus();
}

}  // namespace tessera
