#include "launch/commands.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "launch/drain_timeout.h"
#include "launch/startup_summary.h"
#include "runtime/core/fatal_hook.h"
#include "runtime/core/json_limits.h"
#include "runtime/core/model_file.h"
#include "runtime/core/status.h"
#include "runtime/core/trace_ring.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/generation_defaults.h"
#include "runtime/engine/generator.h"
#include "runtime/executor/local_executor.h"
#include "runtime/grammar/grammar.h"
#include "runtime/grammar/matcher.h"
#include "runtime/grammar/structured_output.h"
#include "runtime/grammar/token_vocabulary.h"
#include "runtime/serve/access.h"
#include "runtime/serve/async_engine.h"
#include "runtime/serve/openai_server.h"
#include "runtime/serve/parsers/reasoning_parser.h"
#include "runtime/serve/parsers/tool_parser.h"
#include "runtime/serve/stats_logger.h"
#include "runtime/serve/version.h"
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
    // Before parsing: copies, dumps and template conversions of the value
    // recurse once per level.
    if (absl::Status deep = CheckJsonNesting(line); !deep.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", deep.message()));
    }
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
      // output). The line was parsed, so it is valid UTF-8 and at most
      // kMaxJsonDepth deep: the dump and the parse cannot fail or recurse far.
      p.messages = nlohmann::ordered_json::parse(
          it->dump(-1, ' ', false, json::error_handler_t::replace), nullptr,
          /*allow_exceptions=*/false);
      if (p.messages->is_discarded()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": \"messages\" is not valid JSON"));
      }
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

}  // namespace

namespace {

// The model folder with everything loaded once: the engine over the caller's
// executor (a parallel job) or over a rank built in this process.
struct LoadedModel {
  // The trace (--trace) goes to its file however the command ends: whole
  // from FinishTrace, or (a command that failed) this process's events only,
  // since the other ranks may be gone.
  ~LoadedModel() {
    if (trace != nullptr && !trace_written) {
      (void)WriteTrace({}, "the command failed: this process's events only");
    }
  }

  absl::Status WriteTrace(const std::vector<TraceEvent>& remote,
                          const std::string& note) {
    trace_written = true;
    std::vector<TraceEvent> events = trace->Snapshot();
    events.insert(events.end(), remote.begin(), remote.end());
    std::vector<std::string> names;
    for (int32_t r = 0; r < executor->trace_processes(); ++r) {
      names.push_back(absl::StrCat("rank ", r));
    }
    const absl::Status written = WriteChromeTrace(trace_file, events, names);
    if (!written.ok()) {
      std::cerr << "[tessera] " << written.message() << "\n";
      return written;
    }
    std::cerr << "[tessera] trace: " << events.size() << " events of "
              << names.size() << (names.size() == 1 ? " rank" : " ranks")
              << " in " << trace_file << " (this process: " << trace->dropped()
              << " dropped, "
              << (trace->recorded() > trace->capacity()
                      ? trace->recorded() - trace->capacity()
                      : 0)
              << " overwritten)" << (note.empty() ? "" : "; ") << note << "\n";
    return absl::OkStatus();
  }

  bool trace_written = false;
  // Declared first, destroyed last: the engine and executor point at it.
  std::unique_ptr<TraceRing> trace;
  std::string trace_file;
  std::unique_ptr<StepExecutor> local;
  StepExecutor* executor = nullptr;
  std::unique_ptr<Tokenizer> tokenizer;  // Null when the folder has none.
  std::unique_ptr<Engine> engine;
  // What --generation-config selects (empty with vllm/none, or a folder
  // without sampling fields): the values requests that leave a field unset
  // take.
  GenerationDefaults generation_defaults;
};

// Writes the trace of a command that ran to its end: this process's events
// and every other rank's (collected over the control plane). Nothing
// without --trace.
absl::Status FinishTrace(LoadedModel& m) {
  if (m.trace == nullptr) return absl::OkStatus();
  ASSIGN_OR_RETURN(const std::vector<TraceEvent> remote,
                   m.executor->CollectRemoteTrace());
  return m.WriteTrace(remote, "");
}

// Sets the sampling fields of `o` that the user left unset from the model's
// defaults.
void ApplyGenerationDefaults(const GenerationDefaults& d, GenerateOptions* o) {
  const GenerateOptions::Unset& unset = o->unset;
  if (unset.temperature && d.temperature)
    o->sampling.temperature = *d.temperature;
  if (unset.top_p && d.top_p) o->sampling.top_p = *d.top_p;
  if (unset.top_k && d.top_k) o->sampling.top_k = *d.top_k;
  if (unset.min_p && d.min_p) o->sampling.min_p = *d.min_p;
  if (unset.repetition_penalty && d.repetition_penalty) {
    o->sampling.repetition_penalty = *d.repetition_penalty;
  }
  if (unset.max_tokens && d.max_tokens) o->max_tokens = *d.max_tokens;
}

// What every command says once the model is loaded (startup_summary.h), on
// stderr; this runs on rank 0 only (the other ranks of a job serve steps).
void PrintStartupSummary(const EngineFlags& flags, const RankSpec& spec,
                         const StepExecutor& executor) {
  StartupFacts f;
  f.device = flags.device;
  absl::StatusOr<RankSpec> resolved = ResolveRankSpec(spec);
  f.weight_dtype = resolved.ok() ? resolved->weight_dtype : flags.dtype;
  f.kv_dtype = resolved.ok() ? resolved->kv_dtype : flags.kv_dtype;
  f.ranks = executor.trace_processes();
  const MemoryBreakdown memory = executor.memory_breakdown();
  f.weight_bytes = memory.weights_bytes;
  f.kv_bytes = memory.kv_bytes;
  const KvLayout layout = executor.kv_layout();
  f.num_kv_blocks = layout.num_blocks;
  f.block_size = layout.block_size;
  f.static_layout = layout.static_layout;
  f.max_model_len = executor.config().max_position_embeddings;
  const QuantConfig& quant = executor.config().quant;
  f.kv_checkpoint_scales = quant.kv_cache_scales;
  if (quant.quantized()) {
    f.quantization =
        f.weight_dtype == "bfloat16"
            ? absl::StrCat("fp8 (", quant.method, ")")
            : absl::StrCat("dequantized from fp8 (", quant.method, ")");
  }
  f.graph_buckets = executor.decode_graph_buckets();
  if (f.graph_buckets.empty()) {
    f.no_graphs_reason = flags.device != "cuda"
                             ? "CPU: decode steps run eagerly"
                         : flags.no_graphs             ? "--no-graphs"
                         : flags.attention == "static" ? "static attention"
                         : f.ranks > 1 ? "parallel ranks run eagerly"
                                       : "";
  }
  for (const std::string& line : StartupSummaryLines(f)) {
    std::cerr << line << "\n";
  }
}

// `announce_defaults`: print the generation_config.json defaults in force
// (commands whose requests take them).
absl::StatusOr<std::unique_ptr<LoadedModel>> LoadModel(
    const std::string& model_dir, const EngineFlags& flags, bool need_tokenizer,
    StepExecutor* executor, bool announce_defaults = true) {
  if (model_dir.empty())
    return absl::InvalidArgumentError("--model DIR is required");
  EngineOptions engine_options;
  RankSpec spec;
  RETURN_IF_ERROR(ResolveEngineFlags(flags, &engine_options, &spec));
  if (!flags.trace_file.empty()) {
    // Before the weights: an unwritable trace file costs no load.
    std::ofstream probe(flags.trace_file, std::ios::app);
    if (!probe) {
      return absl::InvalidArgumentError(
          absl::StrCat("--trace: cannot write ", flags.trace_file));
    }
  }
  auto loaded = std::make_unique<LoadedModel>();
  // Before the weights: a bad file or flag costs no load.
  ASSIGN_OR_RETURN(loaded->generation_defaults,
                   LoadGenerationDefaults(model_dir, flags.generation_config));
  if (announce_defaults && !loaded->generation_defaults.empty()) {
    std::cerr << "[tessera] generation_config.json defaults"
              << (flags.generation_config == "auto"
                      ? std::string()
                      : absl::StrCat(" from ", flags.generation_config))
              << ": " << loaded->generation_defaults.Describe()
              << " (--generation-config vllm turns them off)\n";
  }
  if (executor != nullptr) {
    loaded->executor = executor;
  } else {
    spec.model_dir = model_dir;
    // A bar for people at a terminal; logs of one process need none.
    spec.show_progress = isatty(STDERR_FILENO);
    ASSIGN_OR_RETURN(loaded->local, LocalExecutor::Build(spec));
    loaded->executor = loaded->local.get();
  }
  auto tokenizer = LoadTokenizer(
      flags.tokenizer_dir.empty() ? model_dir : flags.tokenizer_dir,
      loaded->executor->config().bos_token_id);
  if (tokenizer.ok()) {
    loaded->tokenizer = *std::move(tokenizer);
  } else if (need_tokenizer) {
    return tokenizer.status();
  }
  ASSIGN_OR_RETURN(loaded->engine,
                   Engine::Create(loaded->executor, engine_options,
                                  loaded->tokenizer.get()));
  PrintStartupSummary(flags, spec, *loaded->executor);
  if (!flags.trace_file.empty()) {
    loaded->trace = std::make_unique<TraceRing>(kTraceEvents);
    loaded->trace_file = flags.trace_file;
    RETURN_IF_ERROR(loaded->executor->SetTrace(loaded->trace.get()));
    loaded->engine->set_trace(loaded->trace.get(), 0);
  }
  return loaded;
}

// One finished prompt as json mode prints it.
nlohmann::ordered_json ResultJson(const std::vector<int32_t>& prompt_ids,
                                  const GenerationResult& r, bool logprobs) {
  nlohmann::ordered_json line = {
      {"prompt_ids", prompt_ids},
      {"output_ids", r.output_ids},
      {"text", r.text ? json(*r.text) : json(nullptr)},
      {"finish_reason", std::string(FinishReasonName(r.finish_reason))}};
  if (logprobs) {
    nlohmann::ordered_json steps = nlohmann::ordered_json::array();
    for (size_t i = 0; i < r.output_ids.size(); ++i) {
      nlohmann::ordered_json top = nlohmann::ordered_json::array();
      if (i < r.top_logprobs.size()) {
        for (const auto& [id, lp] : r.top_logprobs[i]) top.push_back({id, lp});
      }
      steps.push_back(
          {{"id", r.output_ids[i]}, {"logprob", r.logprobs[i]}, {"top", top}});
    }
    line["logprobs"] = steps;
  }
  return line;
}

}  // namespace

absl::Status ResolveEngineFlags(const EngineFlags& f, EngineOptions* engine,
                                RankSpec* rank) {
  if (f.max_num_seqs < 1 || f.max_num_seqs > (1 << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-num-seqs must be in [1, 2^20], got ", f.max_num_seqs));
  }
  if (f.max_num_batched_tokens < 1 || f.max_num_batched_tokens > (1 << 24)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-num-batched-tokens must be in [1, 2^24], got ",
                     f.max_num_batched_tokens));
  }
  if (f.block_size < 1 || f.block_size > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("--block-size must be in [1, 4096], got ", f.block_size));
  }
  if (f.gpus_per_node < 0 || f.gpus_per_node > 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--gpus-per-node must be in [0, 1024] (0: every visible GPU), got ",
        f.gpus_per_node));
  }
  if (f.num_kv_blocks < 0 || f.kv_cache_memory < 0) {
    return absl::InvalidArgumentError(
        "--num-kv-blocks and --kv-cache-memory must be >= 0");
  }
  if (!(f.kv_cache_fraction > 0.0 && f.kv_cache_fraction <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--kv-cache-fraction must be in (0, 1], got ", f.kv_cache_fraction));
  }
  if (f.max_model_len < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-model-len must be >= 1 (or 0: the model's context), got ",
        f.max_model_len));
  }
  if (!(f.step_timeout >= 0.0 && f.step_timeout <= 86400.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--step-timeout must be in [0, 86400] seconds (0: off), got ",
        f.step_timeout));
  }
  if (!(f.startup_timeout >= 0.0 && f.startup_timeout <= 86400.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--startup-timeout must be in [0, 86400] seconds (0: off), got ",
        f.startup_timeout));
  }
  if (f.generation_config.empty()) {
    return absl::InvalidArgumentError(
        "--generation-config must be auto, vllm, none or a folder");
  }
  engine->scheduler.max_num_seqs = static_cast<int>(f.max_num_seqs);
  engine->scheduler.max_num_batched_tokens = f.max_num_batched_tokens;
  engine->enable_prefix_caching = !f.no_prefix_cache;
  rank->device = f.device;
  rank->gpus_per_node = static_cast<int>(f.gpus_per_node);
  rank->max_num_seqs = f.max_num_seqs;
  rank->max_num_batched_tokens = f.max_num_batched_tokens;
  rank->block_size = f.block_size;
  rank->num_kv_blocks = f.num_kv_blocks;
  rank->kv_cache_memory = f.kv_cache_memory;
  rank->kv_cache_fraction = f.kv_cache_fraction;
  rank->kv_dtype = f.kv_dtype;
  rank->attention = f.attention;
  rank->weight_dtype = f.dtype;
  rank->quantization = f.quantization == "none" ? "" : f.quantization;
  rank->max_model_len = f.max_model_len;
  rank->cuda_graphs = !f.no_graphs;
  rank->random_weights = f.random_weights;
  rank->step_timeout_seconds = f.step_timeout;
  rank->startup_timeout_seconds = f.startup_timeout;
  // --device, --dtype, --kv-dtype, --attention: checked by the rank's rules.
  return CheckRankSpec(*rank);
}

namespace {

// The flag checks RunGenerate makes, before and again after the model's
// defaults are applied (`final`: the defaults are in; before, max_tokens may
// still change).
absl::Status CheckGenerateOptions(const GenerateOptions& o, bool final) {
  if (o.max_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-tokens must be >= 1, got ", o.max_tokens));
  }
  if (o.min_tokens < 0 ||
      ((final || !o.unset.max_tokens) && o.min_tokens > o.max_tokens)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--min-tokens must be in [0, --max-tokens = ", o.max_tokens, "], got ",
        o.min_tokens));
  }
  return o.sampling.Validate();
}

}  // namespace

absl::Status RunGenerate(const GenerateOptions& options,
                         StepExecutor* executor_in, std::ostream& out) {
  GenerateOptions o = options;
  if (o.output != "text" && o.output != "json") {
    return absl::InvalidArgumentError(
        absl::StrCat("--output must be text or json, got \"", o.output, "\""));
  }
  if (o.logprobs > 20) {
    return absl::InvalidArgumentError(
        absl::StrCat("--logprobs must be at most 20, got ", o.logprobs));
  }
  // A value the user gave must be valid whatever the model's defaults are.
  RETURN_IF_ERROR(CheckGenerateOptions(o, /*final=*/false));
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
      !o.stop.empty() ||
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
  ASSIGN_OR_RETURN(
      std::unique_ptr<LoadedModel> loaded,
      LoadModel(o.model_dir, o.engine, need_tokenizer, executor_in));
  ApplyGenerationDefaults(loaded->generation_defaults, &o);
  {
    absl::Status checked = CheckGenerateOptions(o, /*final=*/true);
    if (!checked.ok()) {
      return Annotate(checked, "with the generation_config.json defaults");
    }
  }
  const auto& config = loaded->executor->config();
  const Tokenizer* tokenizer = loaded->tokenizer.get();
  Engine& engine = *loaded->engine;

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

  // Text mode with one prompt streams the continuation as it is generated:
  // the prompt first (a chat's rendered template is not echoed), then each
  // piece of text as soon as it is final. Otherwise each prompt is printed,
  // in order, once it is done.
  const bool stream =
      o.output == "text" && tokenizer != nullptr && prompts.size() == 1;
  std::string stream_prompt_text;
  if (stream && !prompts[0].messages) {
    ASSIGN_OR_RETURN(stream_prompt_text,
                     tokenizer->Decode(prompts[0].ids,
                                       /*skip_special_tokens=*/true));
  }
  bool stream_started = false;
  // The first decode step is the first time any request gets its second
  // token: from then on the allocator must not need its source again.
  int64_t allocations_at_first_decode = -1;
  std::vector<int> tokens_seen(prompts.size(), 0);
  std::vector<int64_t> ids(prompts.size());
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerationRequest request;
    request.prompt_ids = prompts[i].ids;
    request.max_tokens = o.max_tokens;
    request.min_tokens = o.min_tokens;
    request.sampling = o.sampling;
    request.ignore_eos = o.ignore_eos;
    request.stop_token_ids = stop_token_ids;
    request.stop = o.stop;
    request.top_logprobs =
        static_cast<int32_t>(std::max<int64_t>(0, o.logprobs));
    // Each prompt of a file gets its own stream, reproducible for a given seed.
    if (request.sampling.seed) *request.sampling.seed += i;
    auto on_token = [&, i](const TokenEvent& e) {
      if (++tokens_seen[i] == 2 && allocations_at_first_decode < 0) {
        allocations_at_first_decode =
            engine.memory_stats().underlying_allocations;
      }
      if (!stream) return;
      if (!stream_started) {  // Echo the prompt once generation has begun.
        out << stream_prompt_text;
        stream_started = true;
      }
      out << e.text;
      if (e.finished) out << "\n";
      out.flush();
    };
    absl::StatusOr<int64_t> id = engine.Submit(request, on_token);
    if (!id.ok()) {
      return Annotate(id.status(), prompts.size() > 1
                                       ? absl::StrCat("prompt ", i + 1)
                                       : "generate");
    }
    ids[i] = *id;
  }

  std::vector<std::optional<absl::StatusOr<GenerationResult>>> results(
      prompts.size());
  // The first prompt that failed alone (the others still run and print).
  absl::Status failed;
  size_t next_to_print = 0;
  int64_t generated = 0;
  double step_seconds = 0;  // Inside Engine::Step, to compare with serve.
  while (next_to_print < prompts.size()) {
    const auto step_start = std::chrono::steady_clock::now();
    const absl::Status step = engine.Step();
    step_seconds += std::chrono::duration<double>(
                        std::chrono::steady_clock::now() - step_start)
                        .count();
    if (!step.ok()) {
      if (stream_started) out << "\n";
      return Annotate(step, "generate");
    }
    for (size_t i = next_to_print; i < prompts.size(); ++i) {
      if (results[i]) continue;
      absl::StatusOr<GenerationResult> r = engine.TakeResult(ids[i]);
      if (!absl::IsNotFound(r.status())) results[i] = std::move(r);
    }
    // Print every finished prompt whose predecessors are printed.
    while (next_to_print < prompts.size() && results[next_to_print]) {
      const size_t i = next_to_print++;
      const Prompt& p = prompts[i];
      if (!results[i]->ok()) {
        const absl::Status& error = results[i]->status();
        if (o.output == "json") {
          nlohmann::ordered_json line = {
              {"prompt_ids", p.ids}, {"error", std::string(error.message())}};
          out << line.dump(-1, ' ', false,
                           nlohmann::ordered_json::error_handler_t::replace)
              << "\n";
          out.flush();
        }
        std::cerr << "[tessera] prompt " << i + 1
                  << " failed: " << error.message() << "\n";
        if (failed.ok()) {
          failed = Annotate(error, prompts.size() > 1
                                       ? absl::StrCat("prompt ", i + 1)
                                       : "generate");
        }
        continue;
      }
      const GenerationResult& r = **results[i];
      generated += static_cast<int64_t>(r.output_ids.size());
      if (o.output == "json") {
        out << ResultJson(p.ids, r, o.logprobs >= 0)
                   .dump(-1, ' ', false,
                         nlohmann::ordered_json::error_handler_t::replace)
            << "\n";
      } else if (tokenizer != nullptr && !stream) {
        std::string prompt_text;
        if (!p.messages) {
          ASSIGN_OR_RETURN(
              prompt_text,
              tokenizer->Decode(p.ids, /*skip_special_tokens=*/true));
        }
        out << prompt_text << r.text.value_or("") << "\n";
      } else if (tokenizer == nullptr) {
        out << "output_ids:";
        for (int32_t id : r.output_ids) out << " " << id;
        out << "\n";
      }
      out.flush();
      const double decode_tokens = static_cast<double>(r.output_ids.size()) - 1;
      std::cerr << absl::StrFormat(
          "[tessera] prompt %d tokens (%d cached), first token after %.2f ms; "
          "%d tokens generated, %.1f tokens/s decode (%s)\n",
          p.ids.size(), r.cached_prompt_tokens, r.prefill_seconds * 1e3,
          r.output_ids.size(),
          decode_tokens > 0 && r.decode_seconds > 0
              ? decode_tokens / r.decode_seconds
              : 0.0,
          FinishReasonName(r.finish_reason));
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  const Engine::Stats stats = engine.stats();
  if (prompts.size() > 1) {
    std::cerr << absl::StrFormat(
        "[tessera] %d prompts: %d tokens generated in %.3f s (%.1f tokens/s); "
        "%d steps (%.3f ms each in the engine), largest batch %d, %d "
        "preemptions, %d of %d prompt tokens from the prefix cache\n",
        prompts.size(), generated, seconds,
        seconds > 0 ? generated / seconds : 0.0, stats.scheduler.steps,
        stats.scheduler.steps > 0 ? step_seconds * 1e3 / stats.scheduler.steps
                                  : 0.0,
        stats.scheduler.max_batch, stats.scheduler.preemptions,
        stats.blocks.hit_tokens, stats.blocks.queried_tokens);
  }
  if (!failed.ok()) return failed;
  if (!o.stats_json.empty()) {
    const AllocatorStats mem = engine.memory_stats();
    nlohmann::ordered_json j;
    j["allocator"] = {
        {"underlying_allocations", mem.underlying_allocations},
        {"underlying_allocations_decode",
         allocations_at_first_decode < 0
             ? 0
             : mem.underlying_allocations - allocations_at_first_decode},
        {"underlying_frees", mem.underlying_frees},
        {"underlying_allocated_bytes", mem.underlying_allocated_bytes},
        {"reserved_bytes", mem.reserved_bytes},
        {"in_use_bytes", mem.in_use_bytes},
        {"peak_in_use_bytes", mem.peak_in_use_bytes},
        {"pinned_bytes", mem.pinned_bytes}};
    j["scheduler"] = {{"steps", stats.scheduler.steps},
                      {"preemptions", stats.scheduler.preemptions},
                      {"max_batch", stats.scheduler.max_batch}};
    j["prefix_cache"] = {{"hit_tokens", stats.blocks.hit_tokens},
                         {"queried_tokens", stats.blocks.queried_tokens}};
    const auto layout = loaded->executor->kv_layout();
    j["kv_cache"] = {{"num_blocks", layout.num_blocks},
                     {"block_size", layout.block_size}};
    std::ofstream file(o.stats_json);
    file << j.dump(2) << "\n";
    if (!file) {
      return absl::InternalError(
          absl::StrCat("cannot write --stats-json file ", o.stats_json));
    }
  }
  return FinishTrace(*loaded);
}

namespace {

// The p-th percentile (0..100) of `v` by the nearest-rank rule; 0 when empty.
double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const double rank = std::ceil(p / 100.0 * static_cast<double>(v.size()));
  const size_t i = static_cast<size_t>(std::max(1.0, rank)) - 1;
  return v[std::min(i, v.size() - 1)];
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One phase of bench --profile-ops: the op totals of its steps over the
// timed iterations and the steps' own wall time (the time between them, the
// profile's collection included, is not a step's).
struct PhaseProfile {
  OpTimeSums sums;
  double wall_us = 0.0;
};

// The rows of a phase's profile per `per` (steps or iterations; > 0), largest
// first.
struct ProfileRow {
  std::string label;
  double calls = 0.0;  // Per step or iteration.
  double us = 0.0;     // Per step or iteration.
  double share = 0.0;  // Of the phase's op time.
};
struct ProfileTable {
  std::vector<ProfileRow> rows;
  double op_us = 0.0;    // Per step or iteration.
  double wall_us = 0.0;  // Per step or iteration.
};

ProfileTable MakeProfileTable(PhaseProfile& phase, int64_t per) {
  ProfileTable table;
  if (per <= 0) return table;
  const std::vector<OpTimeTotal> totals = phase.sums.Take();
  double sum_us = 0.0;
  for (const OpTimeTotal& t : totals) sum_us += t.total_us;
  for (const OpTimeTotal& t : totals) {
    table.rows.push_back(ProfileRow{t.label, static_cast<double>(t.calls) / per,
                                    t.total_us / per,
                                    sum_us > 0 ? t.total_us / sum_us : 0.0});
  }
  table.op_us = sum_us / per;
  table.wall_us = phase.wall_us / per;
  return table;
}

// The text table: the top rows, the rest in one line, and the ops' time
// against the steps' wall time. `ms`: the times in ms (prefill, per
// iteration) rather than us (decode, per step).
void PrintProfileTable(const ProfileTable& table, const char* title,
                       const char* per, bool ms, bool other_ranks,
                       std::ostream& out) {
  constexpr size_t kTopRows = 25;
  const double unit = ms ? 1e-3 : 1.0;
  const char* unit_name = ms ? "ms" : "us";
  out << "op profile, " << title << " (per " << per << "):\n";
  if (table.rows.empty()) {
    out << "  (no ops timed)\n";
    return;
  }
  const std::string time_head = absl::StrCat(unit_name, "/", per);
  const std::string calls_head = absl::StrCat("calls/", per);
  const int time_width = std::max<int>(10, time_head.size());
  const int calls_width = std::max<int>(10, calls_head.size());
  out << absl::StrFormat("  %6s  %*s  %*s  %s\n", "share", time_width,
                         time_head, calls_width, calls_head, "op");
  double rest_us = 0.0;
  for (size_t i = 0; i < table.rows.size(); ++i) {
    const ProfileRow& r = table.rows[i];
    if (i >= kTopRows) {
      rest_us += r.us;
      continue;
    }
    out << absl::StrFormat("  %5.1f%%  %*.3f  %*.2f  %s\n", r.share * 100,
                           time_width, r.us * unit, calls_width, r.calls,
                           r.label);
  }
  if (table.rows.size() > kTopRows) {
    out << absl::StrFormat("  %5.1f%%  %*.3f  %*s  (%d more ops)\n",
                           table.op_us > 0 ? rest_us / table.op_us * 100 : 0.0,
                           time_width, rest_us * unit, calls_width, "",
                           table.rows.size() - kTopRows);
  }
  out << absl::StrFormat(
      "  ops %.3f %s of %.3f %s wall per %s (%.1f%%; the rest is host work "
      "and launch gaps%s)\n",
      table.op_us * unit, unit_name, table.wall_us * unit, unit_name, per,
      table.wall_us > 0 ? table.op_us / table.wall_us * 100 : 0.0,
      other_ranks ? ", and the other ranks' work" : "");
}

json ProfileRowsJson(const ProfileTable& table, const char* per, bool ms) {
  json rows = json::array();
  for (const ProfileRow& r : table.rows) {
    rows.push_back(
        {{"label", r.label},
         {absl::StrCat("calls_per_", per), r.calls},
         {ms ? absl::StrCat("ms_per_", per) : absl::StrCat("us_per_", per),
          ms ? r.us * 1e-3 : r.us},
         {"share", r.share}});
  }
  return rows;
}

// The constraint every request of a bench run carries.
struct BenchConstraint {
  std::string kind;  // "json_schema", "regex" or "grammar"; empty: none.
  std::string flag;  // The flag that gave it, for errors.
  grammar::StructuredOutput spec;
};

// Reads --guided-json / --guided-regex / --guided-grammar (at most one) into
// the spec the server would build from the same request field; files are
// bounded by the grammar's own size limit, so a huge file costs no parse.
absl::StatusOr<BenchConstraint> ResolveBenchConstraint(const BenchOptions& o) {
  const int given = static_cast<int>(!o.guided_json.empty()) +
                    static_cast<int>(!o.guided_regex.empty()) +
                    static_cast<int>(!o.guided_grammar.empty());
  if (given > 1) {
    return absl::InvalidArgumentError(
        "--guided-json, --guided-regex and --guided-grammar exclude each "
        "other: give at most one");
  }
  BenchConstraint c;
  if (given == 0) {
    if (o.compare_unconstrained) {
      return absl::InvalidArgumentError(
          "--compare-unconstrained needs a constraint (--guided-json, "
          "--guided-regex or --guided-grammar)");
    }
    return c;
  }
  const auto read = [](const std::string& flag,
                       const std::string& path) -> absl::StatusOr<std::string> {
    absl::StatusOr<std::string> text =
        ReadRegularFile(path, grammar::kMaxGrammarBytes);
    if (!text.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", flag, " ", path, ": ", text.status().message(),
          " (files of at most ", grammar::kMaxGrammarBytes, " bytes)"));
    }
    return text;
  };
  using Kind = grammar::StructuredOutput::Kind;
  if (!o.guided_json.empty()) {
    c.kind = "json_schema";
    c.flag = "--guided-json " + o.guided_json;
    ASSIGN_OR_RETURN(const std::string text,
                     read("guided-json", o.guided_json));
    // As the server reads a schema given as text (openai_protocol.cc).
    if (absl::Status nested = CheckJsonNesting(text); !nested.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(c.flag, ": ", nested.message()));
    }
    c.spec.kind = Kind::kJsonSchema;
    c.spec.schema = nlohmann::ordered_json::parse(text, nullptr,
                                                  /*allow_exceptions=*/false);
    if (c.spec.schema.is_discarded()) {
      return absl::InvalidArgumentError(
          absl::StrCat(c.flag, ": not a JSON schema (the text is not JSON)"));
    }
  } else if (!o.guided_regex.empty()) {
    c.kind = "regex";
    c.flag = "--guided-regex";
    c.spec.kind = Kind::kRegex;
    c.spec.text = o.guided_regex;
  } else {
    c.kind = "grammar";
    c.flag = "--guided-grammar " + o.guided_grammar;
    c.spec.kind = Kind::kGrammar;
    ASSIGN_OR_RETURN(c.spec.text, read("guided-grammar", o.guided_grammar));
  }
  return c;
}

// One mode's (constrained or not) samples over the timed iterations.
struct BenchRun {
  std::vector<double> prefill, decode, total;  // Seconds per iteration.
  // Each decode step in which every sequence has its first token and none
  // has ended (so both modes compare steps of the whole batch), and each
  // request's time to first token.
  std::vector<double> step_latency, ttft;
  int64_t decode_tokens = 0;  // Output tokens after each first one.
  int64_t output_tokens = 0;
  int64_t requests = 0;
  int64_t cached_tokens = 0;
};

struct BenchSummary {
  double prefill_s = 0, decode_s = 0, total_s = 0;  // Medians.
  double prefill_tps = 0, decode_tps = 0, output_tps = 0;
  double step_p50 = 0, step_p99 = 0, ttft_p50 = 0, ttft_p99 = 0;
  int64_t decode_steps = 0;
  double tokens_per_request = 0;  // Output tokens, on average.
};

// Rates from the tokens really produced (a constrained request may end
// early): the mean tokens of an iteration over its median time, which is
// exactly batch x tokens / median when every request runs to output_len.
BenchSummary Summarize(const BenchRun& run, const BenchOptions& o) {
  BenchSummary s;
  const double n = static_cast<double>(run.prefill.size());
  s.prefill_s = Median(run.prefill);
  s.decode_s = Median(run.decode);
  s.total_s = Median(run.total);
  s.prefill_tps = o.batch_size * o.input_len / s.prefill_s;
  s.decode_tps = run.decode_tokens > 0 && s.decode_s > 0
                     ? run.decode_tokens / n / s.decode_s
                     : 0.0;
  s.output_tps = run.output_tokens / n / s.total_s;
  s.step_p50 = Percentile(run.step_latency, 50);
  s.step_p99 = Percentile(run.step_latency, 99);
  s.ttft_p50 = Percentile(run.ttft, 50);
  s.ttft_p99 = Percentile(run.ttft, 99);
  s.decode_steps = static_cast<int64_t>(run.step_latency.size());
  s.tokens_per_request =
      run.requests > 0 ? static_cast<double>(run.output_tokens) / run.requests
                       : 0.0;
  return s;
}

json SummaryJson(const BenchSummary& s) {
  return {{"prefill_seconds", s.prefill_s},
          {"prefill_tokens_per_s", s.prefill_tps},
          {"decode_seconds", s.decode_s},
          {"decode_tokens_per_s", s.decode_tps},
          {"output_tokens_per_s", s.output_tps},
          {"decode_steps", s.decode_steps},
          {"decode_step_ms_p50", s.step_p50 * 1e3},
          {"decode_step_ms_p99", s.step_p99 * 1e3},
          {"ttft_ms_p50", s.ttft_p50 * 1e3},
          {"ttft_ms_p99", s.ttft_p99 * 1e3},
          {"output_tokens_per_request", s.tokens_per_request}};
}

// What a new grammar costs before and at its first step, on this process
// with the library the sampling rank uses (runtime/grammar).
struct CompileTimes {
  double vocabulary_ms = 0;         // TokenVocabulary, once per tokenizer.
  double ebnf_ms = 0;               // StructuredOutputEbnf: conversion + check.
  double parse_ms = 0;              // GrammarCache::Get, cold: the parse.
  double first_mask_ms = 0;         // A new matcher's first mask, cold classes.
  double cached_get_ms = 0;         // GrammarCache::Get again: a hit.
  double cached_first_mask_ms = 0;  // A new matcher's first mask, warm.
  double compile_ms() const { return ebnf_ms + parse_ms + first_mask_ms; }
  double cached_compile_ms() const {
    return cached_get_ms + cached_first_mask_ms;
  }
};

}  // namespace

absl::Status RunBench(const BenchOptions& o, StepExecutor* executor,
                      std::ostream& out) {
  if (o.batch_size < 1 || o.input_len < 1 || o.output_len < 1 ||
      o.iterations < 1) {
    return absl::InvalidArgumentError(
        "--batch-size, --input-len, --output-len and --iterations must be >= "
        "1");
  }
  if (o.batch_size > (1 << 20) || o.input_len > (int64_t{1} << 24) ||
      o.output_len > (int64_t{1} << 24) || o.iterations > 100000) {
    return absl::InvalidArgumentError(
        "--batch-size must be at most 2^20, --input-len and --output-len at "
        "most 2^24, --iterations at most 100000");
  }
  using Clock = std::chrono::steady_clock;
  const auto seconds = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  };
  // The constraint, converted and checked before the weights load, as the
  // server converts the same request field (runtime/grammar).
  ASSIGN_OR_RETURN(const BenchConstraint constraint, ResolveBenchConstraint(o));
  const bool constrained = !constraint.kind.empty();
  std::string ebnf;
  CompileTimes compile;
  if (constrained) {
    const auto e0 = Clock::now();
    absl::StatusOr<std::string> converted =
        grammar::StructuredOutputEbnf(constraint.spec);
    compile.ebnf_ms = seconds(e0, Clock::now()) * 1e3;
    if (!converted.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(constraint.flag, ": ", converted.status().message()));
    }
    ebnf = *std::move(converted);
    // A tokenizer is what a grammar matches; look before the weights load.
    const std::string dir =
        o.engine.tokenizer_dir.empty() ? o.model_dir : o.engine.tokenizer_dir;
    if (absl::StatusOr<std::unique_ptr<Tokenizer>> t = LoadTokenizer(dir, -1);
        !t.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          constraint.flag, ": structured output needs a tokenizer (",
          t.status().message(), "); give one with --tokenizer DIR"));
    }
  }
  EngineFlags flags = o.engine;
  // Every sequence of the batch runs together.
  flags.max_num_seqs = std::max(flags.max_num_seqs, o.batch_size);
  // Nothing an iteration leaves behind may serve a later one: every
  // iteration's prompts are fresh, and the prefix cache is off (a parallel
  // job's engine runs here, on rank 0, so this holds for it too).
  flags.no_prefix_cache = true;
  // Op profiling times eager steps: a replayed graph records no op.
  if (o.profile_ops) {
    flags.no_graphs = true;
    if (flags.device == "cuda") {
      std::cerr << "[tessera] --profile-ops: decode CUDA graphs are off (the "
                   "ops are timed in eager steps)\n";
    }
  }
  // Greedy with EOS ignored: the model's sampling defaults do not apply.
  ASSIGN_OR_RETURN(std::unique_ptr<LoadedModel> loaded,
                   LoadModel(o.model_dir, flags, constrained, executor,
                             /*announce_defaults=*/false));
  const auto& config = loaded->executor->config();
  if (o.input_len + o.output_len - 1 > config.max_position_embeddings) {
    return absl::InvalidArgumentError(
        absl::StrCat("--input-len + --output-len exceeds the context of ",
                     config.max_position_embeddings));
  }
  if (constrained) {
    // The vocabulary as Engine::SendVocabulary gives it to the sampling rank
    // (every id of the logits; ids past the tokenizer's empty, special ones
    // excluded), then the grammar through a fresh cache as StepRunner
    // compiles it: cold, then the second lookup of the same text.
    const Tokenizer& tok = *loaded->tokenizer;
    const auto v0 = Clock::now();
    const int64_t vocab = config.vocab_size;
    std::vector<std::string> bytes(vocab);
    std::vector<bool> excluded(vocab, false);
    for (int64_t id = 0; id < vocab; ++id) {
      const int32_t i = static_cast<int32_t>(id);
      if (i >= tok.vocab_size()) continue;
      bytes[id] = tok.TokenBytes(i);
      excluded[id] = tok.IsSpecial(i);
    }
    ASSIGN_OR_RETURN(std::shared_ptr<const grammar::TokenVocabulary> v,
                     grammar::TokenVocabulary::Create(std::move(bytes),
                                                      std::move(excluded)));
    compile.vocabulary_ms = seconds(v0, Clock::now()) * 1e3;
    grammar::GrammarCache cache(v);
    std::vector<int32_t> end_ids;
    for (int64_t id : config.eos_token_ids) {
      if (id >= 0 && id < vocab) end_ids.push_back(static_cast<int32_t>(id));
    }
    std::vector<uint32_t> mask(v->mask_words());
    for (int pass = 0; pass < 2; ++pass) {
      const auto g0 = Clock::now();
      ASSIGN_OR_RETURN(std::shared_ptr<const grammar::CompiledGrammar> g,
                       cache.Get(ebnf));
      const auto g1 = Clock::now();
      grammar::GrammarMatcher matcher(g, end_ids);
      absl::Status filled = matcher.FillNextTokenMask(absl::MakeSpan(mask));
      const auto g2 = Clock::now();
      if (!filled.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            constraint.flag, ": the first token: ", filled.message()));
      }
      (pass == 0 ? compile.parse_ms : compile.cached_get_ms) =
          seconds(g0, g1) * 1e3;
      (pass == 0 ? compile.first_mask_ms : compile.cached_first_mask_ms) =
          seconds(g1, g2) * 1e3;
    }
  }
  // From the warm-up on, so that an executor that cannot profile says so
  // before anything is timed; the warm-up's profile is dropped.
  if (o.profile_ops) RETURN_IF_ERROR(loaded->executor->SetOpProfiling(true));
  PhaseProfile prefill_profile, decode_profile;
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> token(
      0, static_cast<int32_t>(config.vocab_size) - 1);

  Engine& engine = *loaded->engine;
  // `with_grammar`: the run carries the constraint; `timed`: past the
  // warm-up; `profile`: its ops go into the profile (the run the flags ask
  // for, not the comparison's).
  const auto run_iteration = [&](bool with_grammar, bool timed, bool profile,
                                 BenchRun* run) -> absl::Status {
    // Distinct random prompts, new every iteration: the warm-up's KV is of
    // no use to the timed runs.
    std::vector<GenerationRequest> requests(o.batch_size);
    for (GenerationRequest& request : requests) {
      request.prompt_ids.reserve(o.input_len);
      for (int64_t i = 0; i < o.input_len; ++i)
        request.prompt_ids.push_back(token(rng));
      request.max_tokens = o.output_len;
      request.sampling.temperature = 0.0f;
      request.ignore_eos = true;
      if (with_grammar) {
        request.grammar = ebnf;
        // The grammar allows EOS only once the output is complete; with EOS
        // ignored the engine would go on drawing EOS to output_len, steps
        // whose cheap masks would flatter the constrained rate. So EOS ends
        // it, and the rates count the tokens produced.
        request.ignore_eos = false;
      }
    }
    const auto t0 = Clock::now();
    std::vector<std::optional<Clock::time_point>> first(requests.size());
    int64_t first_tokens = 0, finished = 0;
    Clock::time_point prefilled = t0;
    std::vector<int64_t> ids;
    for (size_t i = 0; i < requests.size(); ++i) {
      auto on_token = [&, i](const TokenEvent& event) {
        if (!first[i]) {
          first[i] = Clock::now();
          ++first_tokens;
        }
        if (event.finished) ++finished;
      };
      ASSIGN_OR_RETURN(const int64_t id, engine.Submit(requests[i], on_token));
      ids.push_back(id);
    }
    std::vector<double> steps;
    while (engine.HasWork()) {
      const auto step_start = Clock::now();
      const bool decoding = first_tokens == o.batch_size;
      const bool whole_batch = finished == 0;
      RETURN_IF_ERROR(engine.Step());
      const auto step_end = Clock::now();
      if (decoding) {
        if (whole_batch) steps.push_back(seconds(step_start, step_end));
      } else if (first_tokens == o.batch_size) {
        prefilled = step_end;  // Prefill ends when every request has a token.
      }
      if (profile) {
        // Every step: the timer's events are few and reused, and its
        // collection (after the step's own clock) is not the step's time.
        ASSIGN_OR_RETURN(const std::vector<OpTimeTotal> step_ops,
                         loaded->executor->TakeOpProfile());
        // The phase's wall time runs to the end of the collection, which
        // waits for the device: a step that samples nothing (an earlier
        // prefill chunk) returns before its kernels finish, and its ops'
        // time would otherwise exceed the wall time it is compared with.
        const auto collected = Clock::now();
        if (timed) {
          PhaseProfile& phase = decoding ? decode_profile : prefill_profile;
          for (const OpTimeTotal& t : step_ops) phase.sums.Add(t);
          phase.wall_us += seconds(step_start, collected) * 1e6;
        }
      }
    }
    const auto t1 = Clock::now();
    int64_t decode_tokens = 0, output_tokens = 0, cached = 0;
    for (int64_t id : ids) {
      absl::StatusOr<GenerationResult> r = engine.TakeResult(id);
      if (!r.ok()) {
        // A grammar past the matcher's bounds fails its request: say so
        // rather than time a batch that lost sequences.
        return Annotate(r.status(), with_grammar
                                        ? "bench: a constrained request failed"
                                        : "bench: a request failed");
      }
      cached += r->cached_prompt_tokens;
      const int64_t n = static_cast<int64_t>(r->output_ids.size());
      output_tokens += n;
      decode_tokens += std::max<int64_t>(0, n - 1);
    }
    if (!timed) return absl::OkStatus();  // Warm-up: first touches.
    run->cached_tokens += cached;
    run->output_tokens += output_tokens;
    run->decode_tokens += decode_tokens;
    run->requests += o.batch_size;
    run->prefill.push_back(seconds(t0, prefilled));
    run->decode.push_back(seconds(prefilled, t1));
    run->total.push_back(seconds(t0, t1));
    run->step_latency.insert(run->step_latency.end(), steps.begin(),
                             steps.end());
    for (const auto& f : first) {
      if (f) run->ttft.push_back(seconds(t0, *f));
    }
    return absl::OkStatus();
  };
  BenchRun primary, baseline;  // Baseline: unconstrained, when compared.
  for (int64_t it = 0; it <= o.iterations; ++it) {
    const bool timed = it > 0;
    if (!o.compare_unconstrained) {
      RETURN_IF_ERROR(
          run_iteration(constrained, timed, o.profile_ops, &primary));
      continue;
    }
    // Back to back, the order alternating so that neither mode always runs
    // on a machine the other just warmed (or heated).
    for (int k = 0; k < 2; ++k) {
      const bool grammar_run = (k == 0) == (it % 2 == 0);
      RETURN_IF_ERROR(run_iteration(grammar_run, timed,
                                    o.profile_ops && grammar_run,
                                    grammar_run ? &primary : &baseline));
    }
  }
  const int64_t cached_tokens = primary.cached_tokens + baseline.cached_tokens;
  // The point of fresh prompts: a timed prefill that the cache served would
  // print a rate the model never ran at.
  if (cached_tokens > 0) {
    return absl::InternalError(absl::StrCat(
        "bench: ", cached_tokens,
        " prompt tokens came from the prefix cache; the prefill rate would "
        "be wrong"));
  }
  const BenchSummary s = Summarize(primary, o);
  const double prefill_s = s.prefill_s;
  const double decode_s = s.decode_s;
  const double total_s = s.total_s;
  const double prefill_tps = s.prefill_tps;
  const double decode_tps = s.decode_tps;
  const double output_tps = s.output_tps;
  const double step_p50 = s.step_p50;
  const double step_p99 = s.step_p99;
  const double ttft_p50 = s.ttft_p50;
  const double ttft_p99 = s.ttft_p99;
  const std::vector<double>& step_latency = primary.step_latency;
  const double decode_tokens_per_iteration =
      static_cast<double>(primary.decode_tokens) / o.iterations;
  BenchSummary u;
  if (o.compare_unconstrained) u = Summarize(baseline, o);
  const auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
  const MemoryBreakdown mem = loaded->executor->memory_breakdown();
  ProfileTable decode_ops, prefill_ops;
  if (o.profile_ops) {
    RETURN_IF_ERROR(loaded->executor->SetOpProfiling(false));
    decode_ops = MakeProfileTable(decode_profile,
                                  static_cast<int64_t>(step_latency.size()));
    prefill_ops = MakeProfileTable(prefill_profile, o.iterations);
  }
  const std::string profile_scope = loaded->executor->op_profile_scope();
  const std::string profile_clock =
      o.engine.device == "cuda"
          ? "CUDA events around each op in eager steps, which serialize the "
            "kernels: each op's own time, without overlap"
          : "the wall clock around each op";
  if (o.json) {
    json j = {{"model", o.model_dir},
              {"device", o.engine.device},
              {"random_weights", o.engine.random_weights},
              {"batch_size", o.batch_size},
              {"input_len", o.input_len},
              {"output_len", o.output_len},
              {"iterations", o.iterations},
              {"prefill_seconds", prefill_s},
              {"decode_seconds", decode_s},
              {"total_seconds", total_s},
              {"prefill_tokens_per_s", prefill_tps},
              {"decode_tokens_per_s", decode_tps},
              {"output_tokens_per_s", output_tps},
              {"decode_steps", step_latency.size()},
              {"decode_step_ms_p50", step_p50 * 1e3},
              {"decode_step_ms_p99", step_p99 * 1e3},
              {"ttft_ms_p50", ttft_p50 * 1e3},
              {"ttft_ms_p99", ttft_p99 * 1e3},
              {"cached_prompt_tokens", cached_tokens},
              {"memory",
               {{"weights_bytes", mem.weights_bytes},
                {"workspace_bytes", mem.workspace_bytes},
                {"graphs_bytes", mem.graphs_bytes},
                {"kv_bytes", mem.kv_bytes},
                {"total_bytes", mem.total_bytes()}}}};
    if (constrained) {
      json so = {{"kind", constraint.kind},
                 {"compile_ms", compile.compile_ms()},
                 {"cached_compile_ms", compile.cached_compile_ms()},
                 {"vocabulary_ms", compile.vocabulary_ms},
                 {"ebnf_ms", compile.ebnf_ms},
                 {"parse_ms", compile.parse_ms},
                 {"first_mask_ms", compile.first_mask_ms},
                 {"cached_get_ms", compile.cached_get_ms},
                 {"cached_first_mask_ms", compile.cached_first_mask_ms},
                 {"constrained", SummaryJson(s)}};
      if (o.compare_unconstrained) {
        so["unconstrained"] = SummaryJson(u);
        so["ratio"] = {
            {"decode_step_p50", ratio(s.step_p50, u.step_p50)},
            {"decode_step_p99", ratio(s.step_p99, u.step_p99)},
            {"decode_tokens_per_s", ratio(s.decode_tps, u.decode_tps)}};
      }
      j["structured_output"] = std::move(so);
    }
    if (o.profile_ops) {
      j["op_profile"] = {
          {"scope", profile_scope},
          {"clock", profile_clock},
          {"decode_steps", step_latency.size()},
          {"decode_op_us_per_step", decode_ops.op_us},
          {"decode_wall_us_per_step", decode_ops.wall_us},
          {"prefill_op_ms_per_iteration", prefill_ops.op_us * 1e-3},
          {"prefill_wall_ms_per_iteration", prefill_ops.wall_us * 1e-3},
          {"decode", ProfileRowsJson(decode_ops, "step", false)},
          {"prefill", ProfileRowsJson(prefill_ops, "iteration", true)}};
    }
    out << j.dump() << "\n";
  } else {
    constexpr double kMiB = 1024.0 * 1024.0;
    out << absl::StrFormat(
        "model %s, %s%s, batch %d, input %d, output %d (median of %d; fresh "
        "prompts, no prefix cache)\n"
        "prefill: %.3f ms, %.1f tokens/s; TTFT p50 %.3f ms, p99 %.3f ms\n"
        "decode:  %.3f ms/step, %.1f tokens/s; step p50 %.3f ms, p99 %.3f ms "
        "(%d steps)\n"
        "total:   %.3f ms, %.1f output tokens/s\n"
        "memory:  weights %.1f MiB, workspace %.1f MiB, graphs %.1f MiB, KV "
        "%.1f MiB (total %.1f MiB)\n",
        o.model_dir, o.engine.device,
        o.engine.random_weights ? " (random weights)" : "", o.batch_size,
        o.input_len, o.output_len, o.iterations, prefill_s * 1e3, prefill_tps,
        ttft_p50 * 1e3, ttft_p99 * 1e3,
        decode_tokens_per_iteration > 0
            ? decode_s * 1e3 / (decode_tokens_per_iteration / o.batch_size)
            : 0.0,
        decode_tps, step_p50 * 1e3, step_p99 * 1e3, step_latency.size(),
        total_s * 1e3, output_tps, mem.weights_bytes / kMiB,
        mem.workspace_bytes / kMiB, mem.graphs_bytes / kMiB,
        mem.kv_bytes / kMiB, mem.total_bytes() / kMiB);
    if (constrained) {
      out << absl::StrFormat(
          "structured output (%s): compile %.3f ms cold (EBNF %.3f, parse "
          "%.3f, first mask %.3f), %.3f ms cached; vocabulary %.3f ms once "
          "per tokenizer\n"
          "constrained: %.1f of %d tokens per request on average (EOS ends "
          "a request once its grammar is complete); step percentiles over "
          "steps of the whole batch\n",
          constraint.kind, compile.compile_ms(), compile.ebnf_ms,
          compile.parse_ms, compile.first_mask_ms, compile.cached_compile_ms(),
          compile.vocabulary_ms, s.tokens_per_request, o.output_len);
    }
    if (o.compare_unconstrained) {
      out << absl::StrFormat(
          "%-16s %14s %14s %8s\n"
          "%-16s %14.1f %14.1f %8.3f\n"
          "%-16s %14.3f %14.3f %8.3f\n"
          "%-16s %14.3f %14.3f %8.3f\n"
          "%-16s %14.3f %14.3f %8.3f\n"
          "%-16s %14.1f %14.1f\n",
          "", "unconstrained", "constrained", "ratio",  //
          "decode tok/s", u.decode_tps, s.decode_tps,
          ratio(s.decode_tps, u.decode_tps),  //
          "step p50 ms", u.step_p50 * 1e3, s.step_p50 * 1e3,
          ratio(s.step_p50, u.step_p50),  //
          "step p99 ms", u.step_p99 * 1e3, s.step_p99 * 1e3,
          ratio(s.step_p99, u.step_p99),  //
          "prefill ms", u.prefill_s * 1e3, s.prefill_s * 1e3,
          ratio(s.prefill_s, u.prefill_s),  //
          "tokens/request", u.tokens_per_request, s.tokens_per_request);
    }
    if (o.profile_ops) {
      out << "op profile: " << profile_scope << ", timed by " << profile_clock
          << "; the rates above include the profiling's cost\n";
      // Rank 0 of a parallel job waits for the other ranks inside a step.
      const bool other_ranks = absl::StartsWith(profile_scope, "rank 0");
      PrintProfileTable(decode_ops, "decode", "step", /*ms=*/false, other_ranks,
                        out);
      PrintProfileTable(prefill_ops, "prefill", "iteration", /*ms=*/true,
                        other_ranks, out);
    }
  }
  return FinishTrace(*loaded);
}

namespace {
// SIGTERM/SIGINT received while serving: the first drains, a second aborts
// the drain (a lock-free atomic: safe in a signal handler).
std::atomic<int> g_stop_signals{0};
std::atomic<int> g_first_stop_signal{0};  // Its number, for the clients.
extern "C" void StopServing(int signal) {
  int none = 0;
  g_first_stop_signal.compare_exchange_strong(none, signal);
  g_stop_signals.fetch_add(1);
}
static_assert(std::atomic<int>::is_always_lock_free);
}  // namespace

namespace {

// The chat template `serve` uses: --chat-template (a file, or else the
// template text itself, as vLLM takes it), or the tokenizer folder's (the
// model's unless --tokenizer), or none.
absl::StatusOr<std::optional<ChatTemplate>> LoadServeChatTemplate(
    const ServeOptions& o) {
  const std::string& dir =
      o.engine.tokenizer_dir.empty() ? o.model_dir : o.engine.tokenizer_dir;
  absl::StatusOr<ChatTemplate> folder = ChatTemplate::FromTokenizerConfig(dir);
  if (!folder.ok() && !absl::IsNotFound(folder.status())) {
    if (o.chat_template.empty()) return folder.status();
  }
  if (o.chat_template.empty()) {
    if (folder.ok()) return std::optional<ChatTemplate>(*std::move(folder));
    return std::optional<ChatTemplate>();
  }
  // Special tokens (bos_token, eos_token) still come from the folder.
  SpecialTokens tokens;
  if (folder.ok()) {
    tokens = folder->special_tokens();
  } else {
    // Not a plain open(): a FIFO in the folder must not hang serve.
    absl::StatusOr<std::string> config_text =
        ReadRegularFile(dir + "/tokenizer_config.json");
    if (config_text.ok()) {
      const nlohmann::ordered_json config = nlohmann::ordered_json::parse(
          config_text->begin(), config_text->end(), nullptr,
          /*allow_exceptions=*/false);
      if (!config.is_discarded()) tokens = SpecialTokensFromConfig(config);
    }
  }
  std::string source = o.chat_template;
  std::error_code ec;
  const bool is_file =
      o.chat_template.size() < 4096 &&
      o.chat_template.find_first_of("{%\n") == std::string::npos &&
      std::filesystem::is_regular_file(o.chat_template, ec);
  if (is_file) {
    std::ifstream file(o.chat_template, std::ios::binary);
    std::ostringstream text;
    text << file.rdbuf();
    if (!file) {
      return absl::InvalidArgumentError(
          absl::StrCat("--chat-template: cannot read ", o.chat_template));
    }
    source = text.str();
  } else if (source.find_first_of("{%") == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--chat-template: \"", o.chat_template,
                     "\" is neither a readable file nor template text"));
  }
  absl::StatusOr<ChatTemplate> parsed =
      ChatTemplate::FromString(std::move(source), std::move(tokens));
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--chat-template: ", parsed.status().message()));
  }
  return std::optional<ChatTemplate>(*std::move(parsed));
}

}  // namespace

absl::Status RunServe(const ServeOptions& o, StepExecutor* executor,
                      const std::function<void(int)>& on_listening) {
  if (o.port < 0 || o.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--port must be in [0, 65535], got ", o.port));
  }
  if (!(o.stream_interval_ms >= 0.0 && o.stream_interval_ms <= 1000.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--stream-interval-ms must be in [0, 1000], got ",
                     o.stream_interval_ms));
  }
  if (!(o.drain_timeout_s <= 86400.0)) {  // NaN and infinity fail too.
    return absl::InvalidArgumentError(
        absl::StrCat("--drain-timeout must be at most 86400 s (negative: "
                     "auto), got ",
                     o.drain_timeout_s));
  }
  if (o.max_pending < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-pending must be >= 1, got ", o.max_pending));
  }
  if (o.max_connections < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-connections must be >= 1, got ", o.max_connections));
  }
  if (o.max_request_bytes < 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-request-bytes must be >= 1024, got ", o.max_request_bytes));
  }
  if (o.max_request_parts < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-request-parts must be >= 0, got ", o.max_request_parts));
  }
  if (!(o.request_timeout_s > 0 && o.request_timeout_s <= 3600) ||
      !(o.keep_alive_timeout_s > 0 && o.keep_alive_timeout_s <= 3600)) {
    return absl::InvalidArgumentError(
        "--request-timeout-s and --keep-alive-timeout-s must be in (0, 3600]");
  }
  if (o.max_logprobs < 0 || o.max_logprobs > (1 << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-logprobs must be in [0, 2^20], got ", o.max_logprobs));
  }
  if (o.keep_alive_max_requests < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--keep-alive-max-requests must be >= 1, got ",
                     o.keep_alive_max_requests));
  }
  if (!(o.log_stats_interval_s >= 0.0 && o.log_stats_interval_s <= 86400.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--log-stats-interval must be in [0, 86400] seconds (0: "
                     "off), got ",
                     o.log_stats_interval_s));
  }
  // Access control, checked before the model loads.
  std::string api_key = o.api_key;
  const char* api_key_from = "--api-key";
  if (api_key.empty()) {
    if (const char* env = std::getenv("TESSERA_API_KEY"); env != nullptr) {
      api_key = env;
      api_key_from = "TESSERA_API_KEY";
    }
  }
  for (char c : api_key) {
    // A header value cannot carry these: such a key could never match.
    if (static_cast<unsigned char>(c) < 0x21 ||
        static_cast<unsigned char>(c) == 0x7f) {
      return absl::InvalidArgumentError(
          absl::StrCat(api_key_from,
                       ": the API key must be printable ASCII without spaces"));
    }
  }
  serve::CorsOptions cors;
  ASSIGN_OR_RETURN(cors.allowed_origins,
                   serve::ParseListFlag("allowed-origins", o.allowed_origins));
  ASSIGN_OR_RETURN(cors.allowed_methods,
                   serve::ParseListFlag("allowed-methods", o.allowed_methods));
  ASSIGN_OR_RETURN(cors.allowed_headers,
                   serve::ParseListFlag("allowed-headers", o.allowed_headers));
  cors.allow_credentials = o.allow_credentials;
  if (cors.allow_credentials && cors.allowed_origins.empty()) {
    return absl::InvalidArgumentError(
        "--allow-credentials needs --allowed-origins");
  }
  serve::ChatOutputFormats output_formats;
  if (!o.reasoning_parser.empty()) {
    absl::StatusOr<const serve::ReasoningFormat*> format =
        serve::FindReasoningFormat(o.reasoning_parser);
    if (!format.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--reasoning-parser: ", format.status().message()));
    }
    output_formats.reasoning = *format;
  }
  if (!o.tool_call_parser.empty()) {
    absl::StatusOr<const serve::ToolCallFormat*> format =
        serve::FindToolCallFormat(o.tool_call_parser);
    if (!format.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tool-call-parser: ", format.status().message()));
    }
    output_formats.tool_calls = *format;
  } else if (o.enable_auto_tool_choice) {
    return absl::InvalidArgumentError(
        "--enable-auto-tool-choice needs --tool-call-parser (hermes, "
        "llama3_json or mistral)");
  }
  ASSIGN_OR_RETURN(
      std::unique_ptr<LoadedModel> loaded,
      LoadModel(o.model_dir, o.engine, /*need_tokenizer=*/true, executor));
  ASSIGN_OR_RETURN(std::optional<ChatTemplate> chat_template,
                   LoadServeChatTemplate(o));
  ServerOptions server_options;
  server_options.host = o.host;
  server_options.port = static_cast<int>(o.port);
  server_options.served_model_name = o.served_model_name;
  server_options.version = kTesseraVersion;
  // The engine's context (--max-model-len lowered the config's to it) and
  // the sampling defaults LoadModel announced.
  server_options.max_model_len =
      loaded->executor->config().max_position_embeddings;
  server_options.generation_defaults = loaded->generation_defaults;
  if (loaded->generation_defaults.empty()) {
    // LoadModel names the defaults when there are some; a server also says
    // when there are none, so its log always tells what unset fields become.
    std::cerr << "[tessera] sampling defaults: the API's own ("
              << (o.engine.generation_config == "auto"
                      ? "no sampling fields in generation_config.json"
                      : absl::StrCat("--generation-config ",
                                     o.engine.generation_config))
              << ")\n";
  }
  if (server_options.served_model_name.empty()) {
    std::string dir = o.model_dir;
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    server_options.served_model_name = dir.substr(dir.find_last_of('/') + 1);
  }
  // Every connection is a descriptor: allow as many as the hard limit does,
  // and keep the connection cap below it (with room for the model's files,
  // the listening socket and MPI).
  int64_t max_connections = o.max_connections;
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) == 0) {
    if (files.rlim_cur < files.rlim_max) {
      files.rlim_cur = files.rlim_max;
      setrlimit(RLIMIT_NOFILE, &files);
      getrlimit(RLIMIT_NOFILE, &files);
    }
    const int64_t usable = static_cast<int64_t>(files.rlim_cur) - 256;
    if (files.rlim_cur != RLIM_INFINITY && usable < max_connections) {
      max_connections = std::max<int64_t>(16, usable);
      std::cerr << absl::StrFormat(
          "[tessera] warning: at most %d open files, so at most %d "
          "connections (--max-connections %d)\n",
          static_cast<int64_t>(files.rlim_cur), max_connections,
          o.max_connections);
    }
  }
  server_options.http.max_connections = static_cast<int>(max_connections);
  server_options.http.request_timeout =
      std::chrono::milliseconds(std::llround(o.request_timeout_s * 1000.0));
  server_options.http.keep_alive_timeout =
      std::chrono::milliseconds(std::llround(o.keep_alive_timeout_s * 1000.0));
  server_options.http.keep_alive_max_requests =
      static_cast<int>(std::min<int64_t>(o.keep_alive_max_requests, 1 << 30));
  server_options.http.max_body_wire_bytes =
      std::max<int64_t>(o.max_request_bytes * 4, int64_t{1} << 20);
  server_options.max_request_bytes = o.max_request_bytes;
  server_options.max_request_parts = o.max_request_parts;
  if (o.max_logprobs > loaded->executor->max_top_logprobs()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-logprobs ", o.max_logprobs, " exceeds the ",
                     loaded->executor->max_top_logprobs(),
                     " top log-probabilities this device's sampler ranks"));
  }
  server_options.max_logprobs = static_cast<int32_t>(o.max_logprobs);
  server_options.api_key = api_key;
  server_options.cors = cors;
  server_options.access_log = o.access_log;
  server_options.output_formats = output_formats;
  AsyncEngine async(loaded->engine.get(), o.max_pending,
                    std::chrono::microseconds(static_cast<int64_t>(
                        std::llround(o.stream_interval_ms * 1000.0))));
  OpenAiServer server(server_options, &async, loaded->executor->config(),
                      loaded->tokenizer.get(), std::move(chat_template));
  RETURN_IF_ERROR(server.Start());
  std::cerr << absl::StrFormat(
      "[tessera] serving %s as \"%s\" on http://%s:%d (SIGTERM drains and "
      "stops)\n",
      o.model_dir, server_options.served_model_name, o.host, server.port());
  std::cerr << absl::StrFormat(
      "[tessera] limits: %d requests waiting or running (--max-pending; at "
      "most %d per request), %d connections, %d-byte bodies, %.0f s per "
      "request head and body\n",
      o.max_pending, async.max_group_parts(), max_connections,
      o.max_request_bytes, o.request_timeout_s);
  std::cerr << "[tessera] access: "
            << (api_key.empty()
                    ? std::string("no API key (--api-key or TESSERA_API_KEY "
                                  "to require one)")
                    : absl::StrCat("/v1/*, /tokenize and /detokenize need "
                                   "\"Authorization: Bearer\" with the key "
                                   "from ",
                                   api_key_from))
            << "; CORS "
            << (cors.allowed_origins.empty()
                    ? std::string("off")
                    : absl::StrCat("for ",
                                   absl::StrJoin(cors.allowed_origins, ", ")))
            << "; access log " << (o.access_log ? "on" : "off") << "\n";
  std::cerr << "[tessera] chat output: reasoning parser "
            << (o.reasoning_parser.empty() ? "none" : o.reasoning_parser)
            << ", tool-call parser "
            << (o.tool_call_parser.empty()
                    ? std::string("none (tool_choice \"auto\" is a 400)")
                    : o.tool_call_parser)
            << "\n";
  // The stats line while serving (quiet while idle).
  std::optional<StatsLogger> stats_logger;
  if (!o.disable_log_stats && o.log_stats_interval_s > 0) {
    stats_logger.emplace(
        &async, std::chrono::milliseconds(std::max<int64_t>(
                    1, std::llround(o.log_stats_interval_s * 1000.0))));
  }
  const DrainTimeout drain =
      ResolveDrainTimeout(o.drain_timeout_s, [](const char* name) {
        return static_cast<const char*>(std::getenv(name));
      });
  std::cerr << absl::StrFormat(
      "[tessera] on SIGTERM or SIGINT: new requests get 503, requests in "
      "flight get %.1f s to finish (%s), then are aborted with an error; a "
      "second signal aborts them at once\n",
      drain.seconds, drain.why);
  if (on_listening) on_listening(server.port());
  // A job that ends abnormally while serving (a stalled rank's fault round,
  // a stuck step: parallel/fault_monitor.h) tells every client first.
  ScopedFatalHook tell_clients([&async, &server](absl::string_view why) {
    async.Abort(absl::InternalError(absl::StrCat("the job failed: ", why)));
    server.WaitForResponses(std::chrono::milliseconds(500));
  });
  g_stop_signals.store(0);
  g_first_stop_signal.store(0);
  std::signal(SIGTERM, StopServing);
  std::signal(SIGINT, StopServing);
  std::atomic<bool> loop_ended{false};
  std::thread watcher([&] {
    using Clock = std::chrono::steady_clock;
    const auto tick = std::chrono::milliseconds(10);
    while (g_stop_signals.load() == 0 && !loop_ended.load()) {
      std::this_thread::sleep_for(tick);
    }
    if (loop_ended.load()) return;
    async.Drain();
    const char* signal_name =
        g_first_stop_signal.load() == SIGINT ? "SIGINT" : "SIGTERM";
    std::cerr << absl::StrFormat(
        "[tessera] %s: not accepting requests; %d in flight get %.1f s to "
        "finish\n",
        signal_name, async.open_requests(), drain.seconds);
    const Clock::time_point until =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(
                           std::chrono::duration<double>(drain.seconds));
    while (!loop_ended.load() && g_stop_signals.load() < 2 &&
           Clock::now() < until) {
      std::this_thread::sleep_for(tick);
    }
    if (loop_ended.load()) return;
    // Told from this thread: the loop may be blocked in a step (a rank that
    // died as the launcher ends the job) and cannot tell anyone.
    const bool second = g_stop_signals.load() >= 2;
    const int64_t aborted = async.Abort(absl::UnavailableError(absl::StrFormat(
        "the server is shutting down (%s) and aborted this request: %s",
        signal_name,
        second ? "a second SIGTERM/SIGINT ended the drain"
               : absl::StrFormat("it did not finish within the %.1f s drain "
                                 "timeout (--drain-timeout)",
                                 drain.seconds))));
    std::cerr << absl::StrFormat(
        "[tessera] %s: aborted %d requests in flight (each told so)\n",
        second ? "second signal" : "drain timeout", aborted);
  });
  const absl::Status looped = async.Loop();
  loop_ended.store(true);  // An engine failure ends the watcher too.
  watcher.join();
  if (stats_logger) stats_logger->Stop();
  // Every request has ended (finished, aborted or failed): their last
  // events and error bodies go out before the sockets close.
  if (!server.WaitForResponses(std::chrono::seconds(1))) {
    std::cerr << absl::StrFormat(
        "[tessera] %d responses were still being written after 1 s; closing "
        "their connections\n",
        server.responses_in_flight());
  }
  server.Stop();
  std::signal(SIGTERM, SIG_DFL);
  std::signal(SIGINT, SIG_DFL);
  const AsyncEngine::Stats served = async.stats();
  std::cerr << absl::StrFormat(
      "[tessera] drained and stopped: %d requests, %d engine steps, %.3f ms "
      "per step in the engine and %.3f ms between steps\n",
      served.accepted, served.steps,
      served.steps > 0 ? served.step_seconds * 1e3 / served.steps : 0.0,
      served.steps > 0 ? served.between_steps_seconds * 1e3 / served.steps
                       : 0.0);
  if (!looped.ok()) return looped;
  return FinishTrace(*loaded);
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
    if (absl::Status deep = CheckJsonNesting(line); !deep.ok()) {
      return bad(deep.message());
    }
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
