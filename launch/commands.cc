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
#include "runtime/text/tokenizer.h"

namespace tessera {
namespace {

using json = nlohmann::json;

struct Prompt {
  std::optional<std::string> text;  // Set when the prompt came as text.
  std::vector<int32_t> ids;
};

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
    if (j.contains("prompt") && j.contains("prompt_ids")) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": give \"prompt\" or \"prompt_ids\", not both"));
    }
    if (auto it = j.find("prompt"); it != j.end()) {
      if (!it->is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": \"prompt\" must be a string"));
      }
      p.text = it->get<std::string>();
    } else if (auto it = j.find("prompt_ids"); it != j.end()) {
      if (!it->is_array()) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": \"prompt_ids\" must be a list of token ids"));
      }
      for (const json& id : *it) {
        if (!id.is_number_integer()) {
          return absl::InvalidArgumentError(absl::StrCat(
              where, ": \"prompt_ids\" must be a list of token ids"));
        }
        // get<int32_t>() would wrap 4294967622 around to 326: reject what int32
        // cannot hold.
        const bool fits = id.is_number_unsigned()
                              ? id.get<uint64_t>() <= INT32_MAX
                              : id.get<int64_t>() >= INT32_MIN &&
                                    id.get<int64_t>() <= INT32_MAX;
        if (!fits) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": \"prompt_ids\" holds ", id.dump(),
                           ", which is not a token id"));
        }
        p.ids.push_back(id.get<int32_t>());
      }
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": needs \"prompt\" or \"prompt_ids\""));
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

// The model folder with everything loaded once.
struct LoadedModel {
  CpuOps ops;
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<Tokenizer> tokenizer;  // Null when the folder has none.
};

absl::StatusOr<std::unique_ptr<LoadedModel>> LoadModel(
    const std::string& model_dir, bool need_tokenizer) {
  if (model_dir.empty())
    return absl::InvalidArgumentError("--model DIR is required");
  auto loaded = std::make_unique<LoadedModel>();
  ASSIGN_OR_RETURN(loaded->model, LlamaModel::Load(model_dir, &loaded->ops));
  auto tokenizer =
      LoadTokenizer(model_dir, loaded->model->config().bos_token_id);
  if (tokenizer.ok()) {
    loaded->tokenizer = *std::move(tokenizer);
  } else if (need_tokenizer) {
    return tokenizer.status();
  }
  return loaded;
}

}  // namespace

absl::Status RunGenerate(const GenerateOptions& o, std::ostream& out) {
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
  const bool need_tokenizer = std::any_of(
      prompts.begin(), prompts.end(), [](const Prompt& p) { return p.text; });
  ASSIGN_OR_RETURN(std::unique_ptr<LoadedModel> loaded,
                   LoadModel(o.model_dir, need_tokenizer));
  const ModelConfig& config = loaded->model->config();
  const Tokenizer* tokenizer = loaded->tokenizer.get();

  for (Prompt& p : prompts) {
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

  Generator generator(loaded->model.get(), config.eos_token_ids);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Prompt& p = prompts[i];
    GenerationRequest request;
    request.prompt_ids = p.ids;
    request.max_tokens = o.max_tokens;
    request.sampling = o.sampling;
    request.ignore_eos = o.ignore_eos;
    // Each prompt of a file gets its own stream, reproducible for a given seed.
    if (request.sampling.seed) *request.sampling.seed += i;
    auto result = generator.Generate(request);
    if (!result.ok()) {
      return Annotate(result.status(), prompts.size() > 1
                                           ? absl::StrCat("prompt ", i + 1)
                                           : "generate");
    }

    std::optional<std::string> continuation;
    std::string prompt_text;
    if (tokenizer != nullptr) {
      std::vector<int32_t> all = p.ids;
      all.insert(all.end(), result->output_ids.begin(),
                 result->output_ids.end());
      ASSIGN_OR_RETURN(continuation,
                       tokenizer->DecodeSuffix(all, p.ids.size(),
                                               /*skip_special_tokens=*/true));
      ASSIGN_OR_RETURN(prompt_text,
                       tokenizer->Decode(p.ids, /*skip_special_tokens=*/true));
    }
    if (o.output == "json") {
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
    } else if (continuation) {
      out << prompt_text << *continuation << "\n";
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
                   LoadModel(o.model_dir, false));
  const ModelConfig& config = loaded->model->config();
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

  Generator generator(loaded->model.get(), config.eos_token_ids);
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
        if (!id.is_number_integer() || id.get<int64_t>() < INT32_MIN ||
            id.get<int64_t>() > INT32_MAX) {
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
