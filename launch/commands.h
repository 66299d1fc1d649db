// The `tessera` subcommands as functions of plain options, so tests can call
// them directly.
#ifndef TESSERA_LAUNCH_COMMANDS_H_
#define TESSERA_LAUNCH_COMMANDS_H_

#include <cstdint>
#include <functional>
#include <istream>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/generator.h"
#include "runtime/executor/rank_spec.h"
#include "runtime/sampler/sampling_params.h"

namespace tessera {

// The serving engine's knobs, shared by generate and bench (vLLM's names).
struct EngineFlags {
  std::string device = "cpu";  // cpu or cuda.
  // GPUs per node for the job (> 0): a rank uses GPU local_rank % this, and
  // more ranks on a node than this is an error. 0: every visible GPU.
  int64_t gpus_per_node = 0;
  // Weights on the GPU: auto (bfloat16), bfloat16 or float32 (golden mode).
  // The CPU computes in float32 whatever the checkpoint holds.
  std::string dtype = "auto";
  // "none" or "fp8": quantize an unquantized checkpoint's linear weights to
  // fp8 as they load (vLLM's --quantization fp8).
  std::string quantization = "none";
  int64_t max_num_seqs = 256;             // Sequences holding KV at once.
  int64_t max_num_batched_tokens = 2048;  // Tokens per step.
  int64_t block_size = 16;                // Tokens per KV block.
  int64_t num_kv_blocks = 0;              // > 0: exactly this many blocks.
  int64_t kv_cache_memory = 0;            // > 0: KV budget in bytes per rank.
  double kv_cache_fraction = 0.5;         // Else this share of free memory.
  // auto (the weights' dtype on a GPU, float32 on the CPU), float32,
  // bfloat16 (GPU) or int8.
  std::string kv_dtype = "auto";
  std::string attention = "paged";  // paged or static.
  bool no_prefix_cache = false;
  // Decode steps run eagerly instead of replaying CUDA graphs (a GPU only;
  // runtime/executor/graph_runner.h).
  bool no_graphs = false;
  // > 0: the context the engine serves (request validation, KV sizing, the
  // most tokens a request may make); at most config.json's
  // max_position_embeddings. 0: that (vLLM's --max-model-len).
  int64_t max_model_len = 0;
  // Sampling defaults for requests that leave a field unset (vLLM's
  // --generation-config): "auto" the model folder's generation_config.json,
  // "vllm" or "none" no defaults, or a folder holding the file
  // (runtime/engine/generation_defaults.h).
  std::string generation_config = "auto";
  // Tokenizer files (and chat template) from this folder instead of the
  // model's (vLLM's --tokenizer).
  std::string tokenizer_dir;
  // Make every weight up from the model folder's config.json (deterministic,
  // Hugging Face's init scales, the config's torch_dtype;
  // runtime/model/random_weights.h): no safetensors needed, at any TP/PP.
  bool random_weights = false;
  // Non-empty: a Chrome trace (Perfetto opens it) of every step, its phases
  // and the rank's forward, written to this file when the command ends
  // (runtime/core/trace_ring.h: the newest 2^18 events).
  std::string trace_file;
  // Seconds a step of a parallel job may take before the job is ended and the
  // rank that stopped answering is named (parallel/fault_monitor.h; the
  // limit is max(this, 4 × the longest step seen)). 0: off.
  double step_timeout = 6.0;
  // Seconds a parallel job's startup may go without progress on any rank
  // (parallel/fault_monitor.h, "Startup"). 0: off.
  double startup_timeout = 60.0;
};

// Checks the flags and turns them into the engine's options and the rank's
// spec (runtime/executor/rank_spec.h: sizing, KV cache, dtypes, device; the
// model folder and the grid are the caller's). InvalidArgument naming the
// flag, before anything is read.
absl::Status ResolveEngineFlags(const EngineFlags& flags, EngineOptions* engine,
                                RankSpec* rank);

struct GenerateOptions {
  std::string model_dir;
  // Exactly one of the three prompt sources must be set.
  std::string prompt;      // Text.
  std::string prompt_ids;  // "1,2,3": used as given (no BOS).
  std::string
      prompts_file;  // JSON lines: {"prompt": ...} or {"prompt_ids": [...]}.
  int64_t max_tokens = 256;
  SamplingParams sampling;
  // EOS and stop ids cannot end a sequence before this many tokens
  // (GenerationRequest::min_tokens); 0 <= min_tokens <= max_tokens.
  int64_t min_tokens = 0;
  bool ignore_eos = false;
  std::string stop_token_ids;  // "7,42": more ids that end a sequence like EOS.
  std::vector<std::string> stop;  // Stop strings.
  // The fields the user left unset (tessera.cc: flags not given): these take
  // the model's generation_config.json value when it has one (see
  // EngineFlags::generation_config); the others keep the value above.
  struct Unset {
    bool temperature = false;
    bool top_p = false;
    bool top_k = false;
    bool min_p = false;
    bool repetition_penalty = false;
    bool max_tokens = false;
  } unset;
  int64_t logprobs = -1;  // >= 0: report logprobs (and this many top).
  EngineFlags engine;
  std::string output = "text";  // "text" or "json".
  // Wrap each text prompt as one user message and render it with the model's
  // chat template (tokenizer_config.json), with the generation prompt; the
  // template places any BOS itself. Prompts-file lines with "messages" are
  // always rendered this way.
  bool chat = false;
  // When set, a JSON file of memory statistics is written here at the end:
  // {"allocator": {"underlying_allocations", "underlying_allocations_decode",
  // "reserved_bytes",
  //  "peak_in_use_bytes", "pinned_bytes", ...}}, where
  //  underlying_allocations_decode counts the
  // source allocations made after the first decode step; plus
  // "scheduler": {"steps", "preemptions", "max_batch"} and
  // "prefix_cache": {"hit_tokens", "queried_tokens"}.
  std::string stats_json;
};

// Loads the model once, submits every prompt to the engine at once (the
// scheduler batches them) and writes to `out`, in prompt order: in text mode
// the prompt followed by its continuation (streamed as it is generated when
// there is one prompt); in json mode one object per prompt:
// {"prompt_ids": [...], "output_ids": [...], "text": "...", "finish_reason":
// "length"|"stop"} ("text" is the continuation, null when the folder has no
// tokenizer), plus "logprobs": [{"id", "logprob", "top": [[id, logprob],
// ...]}] with --logprobs. A prompt that fails alone during generation (its
// tokenizer cannot decode a token, ...) does not stop the others: json mode
// prints {"prompt_ids": [...], "error": "..."} in its place, and the command
// returns its error once every prompt is done. `executor` runs the steps (a
// parallel job on rank 0); null loads the model into this process.
absl::Status RunGenerate(const GenerateOptions& options, StepExecutor* executor,
                         std::ostream& out);

struct BenchOptions {
  std::string model_dir;
  int64_t batch_size = 1;
  int64_t input_len = 128;
  int64_t output_len = 128;
  int64_t iterations = 5;
  bool json = false;
  // Time every op of the timed iterations' steps on the device
  // (StepExecutor::SetOpProfiling; decode graphs are turned off for it) and
  // report the totals per op label for the decode phase (per step) and the
  // prefill phase (per iteration).
  bool profile_ops = false;
  // Structured output (at most one; each needs a tokenizer): every request
  // carries this constraint, converted as the server converts guided_json /
  // guided_regex / guided_grammar (runtime/grammar/structured_output.h).
  std::string guided_json;     // A JSON schema file.
  std::string guided_regex;    // A regex.
  std::string guided_grammar;  // An EBNF/GBNF grammar file.
  // With a constraint: time the same workload unconstrained too, each
  // iteration both ways back to back, and report them side by side.
  bool compare_unconstrained = false;
  EngineFlags engine;
};

// Times batch_size requests of random prompt ids submitted together (greedy,
// EOS ignored): prefill (until every request has its first token) and decode
// (the rest), the median over `iterations` runs after one warm-up. Every
// iteration (the warm-up too) draws new prompts and the prefix cache is off
// whatever the flags say, so no iteration reuses another's KV; a timed
// prompt token served from the cache anyway is an error, never a rate.
// Also reported: every decode step's latency (p50/p99 over the timed
// iterations' steps in which each sequence has its first token), each
// request's time to first token (p50/p99), and the executor's
// MemoryBreakdown (weights, workspace, graphs, KV). Text: a few lines; json:
// one object with prefill/decode/total seconds and tokens/s,
// decode_step_ms_p50/p99, ttft_ms_p50/p99, cached_prompt_tokens (0) and
// "memory": {weights_bytes, workspace_bytes, graphs_bytes, kv_bytes,
// total_bytes}. With profile_ops, decode steps run eagerly (no CUDA graphs)
// and the report adds the ops' device time per label: text, the 25 largest
// rows of "op profile, decode (per step):" and "op profile, prefill (per
// iteration):" (share, time, calls, label) and the ops' sum against the
// steps' wall time; json, "op_profile": {"decode": [{label, calls_per_step,
// us_per_step, share}], "prefill": [{label, calls_per_iteration,
// ms_per_iteration, share}], those sums, "scope", "clock"} with every row.
// Markers between the ops serialize the kernels, so an op's time is its own
// without overlap, and the rates include the profiling's cost. `executor`
// runs the steps (a parallel job on rank 0: rank 0's ops are profiled); null
// loads the model into this process.
//
// With a constraint (guided_json / guided_regex / guided_grammar), every
// request carries its grammar and EOS ends a request (the grammar allows it
// only once the output is complete), so the constrained rates come from the
// tokens really produced; decode step latencies count only the steps in which
// the whole batch still runs. The report adds "structured_output": {kind,
// compile_ms, cached_compile_ms, vocabulary_ms, ebnf_ms, first_mask_ms,
// cached_first_mask_ms, constrained{...}} (see RunBench in commands.cc for
// what each time covers), and with compare_unconstrained also
// unconstrained{...} and ratio{decode_step_p50, decode_step_p99,
// decode_tokens_per_s} (constrained / unconstrained). A bad flag, file,
// schema, regex or grammar, or a model folder without a tokenizer, is
// InvalidArgument before the weights load.
absl::Status RunBench(const BenchOptions& options, StepExecutor* executor,
                      std::ostream& out);

struct ServeOptions {
  std::string model_dir;
  std::string host = "127.0.0.1";
  int64_t port = 8000;            // 0: any free port.
  std::string served_model_name;  // Default: the model folder's name.
  int64_t max_pending = 1024;     // Waiting + running; beyond: HTTP 429.
  // Tokens of a request that come faster than this reach its HTTP thread
  // together (each still its own SSE event): waking a thread per token costs
  // more than a small model's decode step. 0: one wake-up per token.
  double stream_interval_ms = 1.0;
  // HTTP limits (runtime/serve/http_server.h, openai_server.h).
  int64_t max_connections = 4096;  // Open connections; beyond: 503.
  int64_t max_request_bytes = int64_t{8} << 20;  // Body; beyond: 413.
  // Prompts x n of one request; 0: half of --max-pending. Beyond: 400.
  int64_t max_request_parts = 0;
  double request_timeout_s = 30.0;    // A request's head and body.
  double keep_alive_timeout_s = 5.0;  // Idle connections close.
  int64_t keep_alive_max_requests = 1000;
  int64_t max_logprobs = 20;  // Per token a request may ask for (vLLM's).
  // Seconds requests in flight get to finish after SIGTERM/SIGINT before
  // they are aborted (each client told); negative: the launcher's default
  // (launch/drain_timeout.h).
  double drain_timeout_s = -1;
  // A Jinja file, or the template text itself (vLLM's --chat-template);
  // empty: the model's (or the --tokenizer folder's).
  std::string chat_template;
  // Access (runtime/serve/access.h). The key /v1/*, /tokenize and
  // /detokenize need; empty: the TESSERA_API_KEY environment variable's,
  // else none.
  std::string api_key;
  // CORS: a comma list or a JSON list (vLLM's '["*"]'); empty origins: no
  // CORS headers.
  std::string allowed_origins;
  std::string allowed_methods = "*";
  std::string allowed_headers = "*";
  bool allow_credentials = false;
  // Seconds between stats lines (runtime/serve/stats_logger.h); 0 or
  // disable_log_stats: none.
  double log_stats_interval_s = 10.0;
  bool disable_log_stats = false;
  // One line per request on stderr.
  bool access_log = false;
  // Chat output parsers (runtime/serve/chat_output.h), vLLM's flags: empty
  // is none. --enable-auto-tool-choice is accepted as vLLM spells it and
  // needs a --tool-call-parser, which alone enables tool_choice "auto".
  std::string reasoning_parser;
  std::string tool_call_parser;
  bool enable_auto_tool_choice = false;
  EngineFlags engine;
};

// Serves the OpenAI-compatible API (runtime/serve/openai_server.h) until
// SIGTERM or SIGINT: then it stops admitting (503), lets the requests in
// flight finish for up to the drain timeout, aborts the rest (each client
// gets an error: a 503 body, or an error event in its stream) and returns.
// A job that fails while serving ends every open request with a 500 error
// (the step's error, or the fatal hook's line) before it exits. `executor`: a
// parallel job on rank 0, or null to load the model here. `on_listening`, when
// set, is called with the bound port.
absl::Status RunServe(const ServeOptions& options, StepExecutor* executor,
                      const std::function<void(int)>& on_listening = {});

struct TokenizeOptions {
  std::string
      model_dir;  // A model folder, or a folder with only tokenizer files.
  bool decode = false;               // ids -> text instead of text -> ids.
  bool skip_special_tokens = false;  // --decode: drop special tokens' text.
};

// JSON lines on `in`: {"text": "..."} -> {"ids": [...]} (no special tokens
// added), or with decode {"ids": [...]} -> {"text": "..."}. One output line per
// input line, flushed as it is written. The first malformed line stops with an
// error naming its line number.
absl::Status RunTokenize(const TokenizeOptions& options, std::istream& in,
                         std::ostream& out);

}  // namespace tessera

#endif  // TESSERA_LAUNCH_COMMANDS_H_
