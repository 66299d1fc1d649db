// tessera: the command-line front end (see DESIGN.md, "Command line").
//
//   tessera generate --model DIR (--prompt TEXT | --prompt-ids 1,2,3 |
//   --prompts-file F.jsonl)
//                    [--max-tokens N] [--temperature T] [--top-k K] [--top-p P]
//                    [--seed S] [--min-tokens N]
//                    [--ignore-eos] [--output text|json] [--chat]
//                    [--tp N] [--pp M] [--pp-layers 3,2] [--weights
//                    rank0|local]
//   (under mpirun -np tp*pp: rank 0 prints, every rank runs its shard)
//   tessera bench    --model DIR --batch-size B --input-len I --output-len O
//   [--iterations N] [--json] [--profile-ops]
//   [--guided-json F | --guided-regex RE | --guided-grammar F]
//   [--compare-unconstrained]  (fresh prompts, no prefix
//   cache; decode-step and TTFT p50/p99, the memory breakdown; per-op device
//   time)
//   engine flags (both): --device cpu|cuda --dtype auto|bfloat16|float32
//   --max-num-seqs --max-num-batched-tokens --block-size
//   --num-kv-blocks --kv-cache-memory --kv-cache-fraction --kv-dtype
//   --attention paged|static --no-prefix-cache --no-graphs --max-model-len N
//   --generation-config auto|vllm|none|DIR --random-weights
//   tessera serve    --model DIR [--port 8000] [--api-key KEY]
//   [--allowed-origins LIST] [--log-stats-interval S] [--access-log] ...
//
// Every failure prints one line, "tessera: <what went wrong>", on stderr and
// exits non-zero.
#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "launch/commands.h"
#include "launch/flag_parser.h"
#include "launch/loadgen.h"
#include "parallel/coordinator.h"
#include "parallel/fault_monitor.h"
#include "parallel/mpi_world.h"
#include "runtime/core/status.h"
#include "runtime/serve/version.h"

namespace {

constexpr char kUsage[] =
    "usage: tessera <command> [flags]\n"
    "commands:\n"
    "  generate  generate text from prompts (--model DIR --prompt TEXT ...)\n"
    "  bench     measure prefill and decode speed (--model DIR --input-len I "
    "--output-len O)\n"
    "  serve     OpenAI-compatible HTTP server (--model DIR [--port 8000])\n"
    "  loadgen   drive a server at a concurrency; throughput, TTFT, TPOT\n"
    "Run 'tessera <command> --help' for the flags.\n";

// The engine's flags, shared by generate and bench.
void AddEngineFlags(tessera::FlagParser& flags, tessera::EngineFlags* e) {
  flags.Add("device", &e->device, "cpu or cuda (one GPU per rank)");
  flags.Add("gpus-per-node", &e->gpus_per_node,
            "GPUs each node gives the job: rank uses GPU local_rank % this, "
            "more ranks per node is an error (0: every visible GPU)");
  flags.Add("dtype", &e->dtype,
            "weights on the GPU: auto (bfloat16), bfloat16 or float32");
  flags.Add("quantization", &e->quantization,
            "none, or fp8: quantize the checkpoint's linear weights to fp8 "
            "as they load (per channel, dynamic per-token activations; GPU). "
            "fp8 checkpoints need no flag");
  flags.Add("max-num-seqs", &e->max_num_seqs, "most sequences running at once");
  flags.Add("max-num-batched-tokens", &e->max_num_batched_tokens,
            "most tokens per step (prefills are chunked to fit)");
  flags.Add("block-size", &e->block_size, "tokens per KV cache block");
  flags.Add("num-kv-blocks", &e->num_kv_blocks,
            "KV cache blocks per rank (0: from the memory budget)");
  flags.Add("kv-cache-memory", &e->kv_cache_memory,
            "KV cache budget in bytes per rank (0: --kv-cache-fraction)");
  flags.Add("kv-cache-fraction", &e->kv_cache_fraction,
            "share of free memory for the KV cache");
  flags.Add("kv-dtype", &e->kv_dtype,
            "auto (the weights' dtype), float32, bfloat16 (GPU), int8 (per-"
            "token scales) or fp8 (e4m3, per-head scales of 1 until a "
            "checkpoint gives them: half of bfloat16's bytes)");
  flags.Add("attention", &e->attention,
            "paged, or static (contiguous per sequence)");
  flags.Add("no-prefix-cache", &e->no_prefix_cache,
            "do not reuse the KV of shared prompt prefixes");
  flags.Add("no-graphs", &e->no_graphs,
            "run decode steps eagerly, without CUDA graphs (GPU)");
  flags.Add("trace", &e->trace_file,
            "write a Chrome trace (Perfetto opens it) of every step, its "
            "phases and the rank's forward to FILE when the command ends");
  flags.Add("max-model-len", &e->max_model_len,
            "the context to serve, at most the model's max_position_embeddings "
            "(0: that)");
  flags.Add("random-weights", &e->random_weights,
            "make every weight up from config.json (deterministic, HF init "
            "scales, the config's dtype): no safetensors read");
  flags.Add("step-timeout", &e->step_timeout,
            "seconds a step of an MPI job may take (at least 4x the longest "
            "step seen) before the job ends naming the rank that stalled "
            "(0: off)");
  flags.Add("startup-timeout", &e->startup_timeout,
            "seconds an MPI job's startup (manifest, weight transfer or "
            "loading, communicator setup, the first plan) may go without "
            "progress on any rank (a weight chunk or layer, a setup phase) "
            "before the job ends naming the rank that stalled (0: off)");
  flags.Add("generation-config", &e->generation_config,
            "sampling defaults for unset fields: auto (the model folder's "
            "generation_config.json), vllm or none (off), or a folder");
}

// Parses `args` into `flags`; on --help prints the usage instead and returns
// false (the command has nothing else to do).
absl::StatusOr<bool> ParseOrPrintHelp(tessera::FlagParser& flags,
                                      const std::vector<std::string>& args) {
  RETURN_IF_ERROR(flags.Parse(args));
  if (flags.help_requested()) {
    std::cout << flags.Usage();
    return false;
  }
  return true;
}

// Whether this process was started by an MPI launcher (mpirun, srun) as part of
// a job of more than one rank.
bool LaunchedAsMultiRankJob() {
  for (const char* var :
       {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE", "SLURM_NTASKS"}) {
    const char* value = std::getenv(var);
    if (value != nullptr && std::atoi(value) > 1) return true;
  }
  return false;
}

// This process's rank as its launcher numbered it, before MPI starts (0 when
// not launched as a job). Errors found before MPI_Init (flags) are the same on
// every rank, so only rank 0 prints them: one line, as for a single process.
int LauncherRank() {
  for (const char* var :
       {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    const char* value = std::getenv(var);
    if (value != nullptr) return std::atoi(value);
  }
  return 0;
}

absl::StatusOr<std::vector<int64_t>> ParseLayerList(const std::string& text) {
  std::vector<int64_t> layers;
  if (text.empty()) return layers;
  for (absl::string_view piece : absl::StrSplit(text, ',')) {
    int64_t n;
    if (!absl::SimpleAtoi(piece, &n)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--pp-layers: \"", piece, "\" is not a layer count"));
    }
    layers.push_back(n);
  }
  return layers;
}

// Rank 0's account of the job once it is loaded: the grid and its nodes,
// where each rank runs and what it holds, and placements that cost speed.
void PrintStartupLog(const tessera::Coordinator& job,
                     const tessera::RankSpec& p) {
  const auto& reports = job.rank_reports();
  int nodes = 0;
  for (const auto& r : reports) nodes = std::max(nodes, r.node + 1);
  constexpr double kMiB = 1048576.0;
  std::cerr << absl::StrFormat(
      "[tessera] grid: tp %d x pp %d = %d ranks on %d node%s, %s; loaded in "
      "%.2f s\n",
      p.tp, p.pp, p.tp * p.pp, nodes, nodes == 1 ? "" : "s", p.device,
      job.load_seconds());
  for (const auto& l : job.layout()) {
    const tessera::RankReport& r = reports[l.rank()];
    const std::string gpu =
        r.gpu >= 0 ? absl::StrCat(", GPU ", r.gpu) : std::string();
    std::cerr << absl::StrFormat(
        "[tessera]   rank %d on %s (node %d, local rank %d of %d%s): tp %d, "
        "stage %d, layers %d-%d, %d heads, %d KV heads, vocab rows %d-%d; "
        "weights %.1f MiB, workspace %.1f MiB, graphs %.1f MiB, KV cache "
        "%.1f MiB\n",
        l.rank(), r.host, r.node, r.local_rank, r.local_size, gpu, l.tp_rank(),
        l.pp_stage(), l.first_layer(), l.end_layer() - 1, l.local_heads(),
        l.local_kv_heads(), l.first_vocab_id(),
        l.first_vocab_id() + l.vocab_rows() - 1, r.weight_bytes / kMiB,
        r.memory.workspace_bytes / kMiB, r.memory.graphs_bytes / kMiB,
        r.kv_cache_bytes / kMiB);
  }
  for (const std::string& warning : job.PlacementWarnings()) {
    std::cerr << "[tessera] warning: " << warning << "\n";
  }
}

// One rank of an MPI job: rank 0 runs `coordinator` over the job (the
// engine's StepExecutor) and prints; the others serve steps. Returns the
// process exit code; parallel/'s RunJob decides how a failure ends the job
// (printed once by rank 0 when every rank saw it alike, MPI_Abort when it is
// one rank's, so nothing hangs). `workers_ignore_signals`: SIGTERM/SIGINT are
// rank 0's to handle (a server drains, then shuts every rank down), so the
// other ranks ignore them.
int RunParallel(
    const tessera::RankSpec& spec,
    const std::function<absl::Status(tessera::StepExecutor*)>& coordinator,
    bool workers_ignore_signals = false) {
  // MPI_Init waits for every rank: a bounded wait until the fault monitor
  // takes over (parallel/fault_monitor.h). It shows no progress, and takes
  // seconds on a loaded machine, hence at least 10 s.
  tessera::StartupGuard guard(spec.step_timeout_seconds > 0 &&
                                      spec.startup_timeout_seconds > 0
                                  ? std::max(spec.startup_timeout_seconds, 10.0)
                                  : 0.0);
  auto world = tessera::MpiWorld::Init(nullptr, nullptr);
  if (!world.ok()) {
    std::cerr << "tessera: " << world.status().message() << "\n";
    return 1;
  }
  return tessera::RunJob(
      **world, spec,
      [&](tessera::Coordinator& job) {
        PrintStartupLog(job, spec);
        const absl::Status status = coordinator(&job);
        std::cout.flush();
        const auto& stats = job.control_stats();
        if (stats.steps > 0) {
          std::cerr << absl::StrFormat(
              "[tessera] control plane: %d steps, %.1f plan bytes/step, "
              "broadcast %.1f us/step, waiting for results %.1f us/step\n",
              stats.steps, static_cast<double>(stats.plan_bytes) / stats.steps,
              stats.broadcast_seconds * 1e6 / stats.steps,
              stats.result_seconds * 1e6 / stats.steps);
        }
        return status;
      },
      workers_ignore_signals);
}

// The parallel layout flags, shared by generate and bench.
struct ParallelFlags {
  int64_t tp = 1, pp = 1;
  std::string pp_layers, weights = "rank0";
  bool ep = false;

  void Add(tessera::FlagParser& flags) {
    flags.Add("tp", &tp,
              "tensor-parallel ranks (under mpirun: world = tp x pp)");
    flags.Add("pp", &pp, "pipeline-parallel stages");
    flags.Add("pp-layers", &pp_layers,
              "layers per stage, e.g. 3,2 (default: even split)");
    flags.Add("ep", &ep,
              "expert parallelism: a mixture of experts' tensor-parallel "
              "ranks each hold whole experts (experts / tp of them) instead "
              "of a slice of every expert");
    flags.Add("weights", &weights,
              "rank0 (rank 0 reads and sends each rank its shard) or local "
              "(each rank reads its own slices)");
  }

  // The job's rank spec (rank 0's: the grid and every rank's sizing);
  // *parallel says whether to run as an MPI job.
  absl::StatusOr<tessera::RankSpec> Resolve(const std::string& model_dir,
                                            const tessera::EngineFlags& engine,
                                            bool* parallel) const {
    if (tp < 1 || pp < 1 || tp > 4096 || pp > 4096) {
      return absl::InvalidArgumentError(
          "--tp and --pp must be between 1 and 4096");
    }
    if (weights != "rank0" && weights != "local") {
      return absl::InvalidArgumentError(absl::StrCat(
          "--weights must be rank0 or local, got \"", weights, "\""));
    }
    if (engine.random_weights && weights == "local") {
      return absl::InvalidArgumentError(
          "--random-weights: every rank makes its own weights; drop "
          "--weights local");
    }
    tessera::RankSpec p;
    p.model_dir = model_dir;
    p.tp = static_cast<int>(tp);
    p.pp = static_cast<int>(pp);
    ASSIGN_OR_RETURN(p.pp_layers, ParseLayerList(pp_layers));
    p.weights_local = weights == "local";
    p.expert_parallel = ep;
    tessera::EngineOptions engine_options;
    RETURN_IF_ERROR(tessera::ResolveEngineFlags(engine, &engine_options, &p));
    p.show_progress = true;
    *parallel = tp * pp > 1 || LaunchedAsMultiRankJob();
    if (!*parallel && !p.pp_layers.empty()) {
      return absl::InvalidArgumentError("--pp-layers needs --pp > 1");
    }
    return p;
  }
};

// Runs `command` over the executor the flags ask for: in this process (null
// executor), or, when launched as an MPI job or with tp x pp > 1, as rank 0 of
// a parallel job (the other ranks serve steps); *exit_code then carries the
// job's exit code.
absl::Status RunLocalOrParallel(
    const std::string& model_dir, const ParallelFlags& parallel_flags,
    const tessera::EngineFlags& engine,
    const std::function<absl::Status(tessera::StepExecutor*)>& command,
    int* exit_code, bool workers_ignore_signals = false) {
  bool parallel = false;
  ASSIGN_OR_RETURN(const tessera::RankSpec spec,
                   parallel_flags.Resolve(model_dir, engine, &parallel));
  if (!parallel) return command(nullptr);
  *exit_code = RunParallel(spec, command, workers_ignore_signals);
  return absl::OkStatus();
}

absl::Status Generate(const std::vector<std::string>& args, int* exit_code) {
  tessera::GenerateOptions o;
  double temperature = o.sampling.temperature, top_p = o.sampling.top_p;
  int64_t top_k = 0, seed = -1;
  ParallelFlags parallel_flags;
  tessera::FlagParser flags("generate");
  flags.Add("model", &o.model_dir,
            "model folder (config.json, *.safetensors, tokenizer)");
  flags.Add("prompt", &o.prompt,
            "prompt text (BOS added as the tokenizer says)");
  flags.Add("prompt-ids", &o.prompt_ids,
            "comma-separated prompt token ids, used as given");
  flags.Add("prompts-file", &o.prompts_file,
            "JSON lines: {\"prompt\": \"...\"} or {\"prompt_ids\": [...]}");
  flags.Add("max-tokens", &o.max_tokens, "most tokens to generate per prompt");
  flags.Add("min-tokens", &o.min_tokens,
            "EOS and stop ids cannot end a sequence before this many tokens");
  flags.Add("temperature", &temperature, "sampling temperature; 0 is greedy");
  flags.Add("top-k", &top_k, "keep the k most likely tokens (0: off)");
  flags.Add("top-p", &top_p, "nucleus sampling mass in (0, 1]");
  flags.Add("seed", &seed, "random seed (-1: nondeterministic)");
  double min_p = 0.0, repetition_penalty = 1.0, presence_penalty = 0.0,
         frequency_penalty = 0.0;
  flags.Add("min-p", &min_p, "drop tokens below min_p x the top probability");
  flags.Add("repetition-penalty", &repetition_penalty,
            "penalise tokens of the prompt and output (1: off)");
  flags.Add("presence-penalty", &presence_penalty,
            "OpenAI presence penalty, [-2, 2]");
  flags.Add("frequency-penalty", &frequency_penalty,
            "OpenAI frequency penalty, [-2, 2]");
  flags.Add(
      "stop-token-ids", &o.stop_token_ids,
      "comma-separated ids that also end a sequence (finish_reason stop)");
  flags.Add("stop", &o.stop, "a text that ends a sequence (cut from the text)");
  flags.Add("logprobs", &o.logprobs,
            "json output: each token's logprob and this many alternatives "
            "(-1: off)");
  AddEngineFlags(flags, &o.engine);
  flags.Add("ignore-eos", &o.ignore_eos,
            "keep generating after an end-of-sequence token");
  flags.Add("output", &o.output, "text, or json (one object per prompt)");
  flags.Add("stats-json", &o.stats_json,
            "write memory statistics to this JSON file");
  parallel_flags.Add(flags);
  flags.Add("chat", &o.chat,
            "send each text prompt as a user message through the model's chat "
            "template");
  ASSIGN_OR_RETURN(const bool run, ParseOrPrintHelp(flags, args));
  if (!run) return absl::OkStatus();
  // What the user did not set takes the model's generation_config.json value.
  o.unset.temperature = !flags.WasSet("temperature");
  o.unset.top_p = !flags.WasSet("top-p");
  o.unset.top_k = !flags.WasSet("top-k");
  o.unset.min_p = !flags.WasSet("min-p");
  o.unset.repetition_penalty = !flags.WasSet("repetition-penalty");
  o.unset.max_tokens = !flags.WasSet("max-tokens");
  o.sampling.temperature = static_cast<float>(temperature);
  o.sampling.top_p = static_cast<float>(top_p);
  o.sampling.min_p = static_cast<float>(min_p);
  o.sampling.repetition_penalty = static_cast<float>(repetition_penalty);
  o.sampling.presence_penalty = static_cast<float>(presence_penalty);
  o.sampling.frequency_penalty = static_cast<float>(frequency_penalty);
  if (top_k < 0 || top_k > INT32_MAX) {
    return absl::InvalidArgumentError("--top-k must be in [0, 2^31)");
  }
  o.sampling.top_k = static_cast<int32_t>(top_k);
  if (seed < -1)
    return absl::InvalidArgumentError("--seed must be >= 0 (or -1 for none)");
  if (seed >= 0) o.sampling.seed = static_cast<uint64_t>(seed);
  return RunLocalOrParallel(
      o.model_dir, parallel_flags, o.engine,
      [&](tessera::StepExecutor* job) {
        return tessera::RunGenerate(o, job, std::cout);
      },
      exit_code);
}

absl::Status Bench(const std::vector<std::string>& args, int* exit_code) {
  tessera::BenchOptions o;
  ParallelFlags parallel_flags;
  tessera::FlagParser flags("bench");
  flags.Add("model", &o.model_dir, "model folder");
  flags.Add("batch-size", &o.batch_size, "sequences per step");
  flags.Add("input-len", &o.input_len, "prompt tokens (random ids)");
  flags.Add("output-len", &o.output_len, "generated tokens (EOS ignored)");
  flags.Add("iterations", &o.iterations,
            "timed repetitions after one warm-up, each with new prompts (the "
            "prefix cache is off in bench); the median is reported");
  flags.Add("json", &o.json, "print one JSON object");
  flags.Add("profile-ops", &o.profile_ops,
            "also report each op's device time per label (decode per step, "
            "prefill per iteration; CUDA events, or the wall clock on the "
            "CPU). Decode steps run eagerly (no CUDA graphs), and the events "
            "between kernels serialize them: an op's own time, without "
            "overlap. Under mpirun: rank 0's ops");
  flags.Add("guided-json", &o.guided_json,
            "structured output: every request follows this JSON schema file "
            "(needs a tokenizer; at most one --guided-* flag)");
  flags.Add("guided-regex", &o.guided_regex,
            "structured output: every request matches this regex");
  flags.Add("guided-grammar", &o.guided_grammar,
            "structured output: every request follows this EBNF/GBNF grammar "
            "file (as the server's guided_grammar)");
  flags.Add("tokenizer", &o.engine.tokenizer_dir,
            "a folder with the tokenizer files to use instead of the model's "
            "(what a --guided-* constraint matches)");
  flags.Add("compare-unconstrained", &o.compare_unconstrained,
            "with a --guided-* flag: time the same workload unconstrained "
            "too, back to back each iteration, and report both and their "
            "ratio");
  AddEngineFlags(flags, &o.engine);
  parallel_flags.Add(flags);
  ASSIGN_OR_RETURN(const bool run, ParseOrPrintHelp(flags, args));
  if (!run) return absl::OkStatus();
  // Every sequence of the batch runs in the same steps.
  o.engine.max_num_seqs = std::max(o.engine.max_num_seqs, o.batch_size);
  // A parallel job is built from these flags before RunBench sees them: its
  // ranks must run eagerly too for their ops to be timed.
  if (o.profile_ops) o.engine.no_graphs = true;
  return RunLocalOrParallel(
      o.model_dir, parallel_flags, o.engine,
      [&](tessera::StepExecutor* job) {
        return tessera::RunBench(o, job, std::cout);
      },
      exit_code);
}

absl::Status Serve(const std::vector<std::string>& args, int* exit_code) {
  tessera::ServeOptions o;
  ParallelFlags parallel_flags;
  tessera::FlagParser flags("serve");
  flags.Add("model", &o.model_dir,
            "model folder (config.json, *.safetensors, tokenizer)");
  flags.Add("host", &o.host, "address to listen on");
  flags.Add("port", &o.port, "port to listen on (0: any free port)");
  flags.Add("served-model-name", &o.served_model_name,
            "the model name clients use (default: the folder's name)");
  flags.Add("stream-interval-ms", &o.stream_interval_ms,
            "a request's tokens that come faster than this go to its HTTP "
            "thread together (each still its own event; 0: one by one)");
  flags.Add("max-pending", &o.max_pending,
            "requests waiting or running before new ones get HTTP 429");
  flags.Add("max-request-parts", &o.max_request_parts,
            "the most completions (prompts x n) one request may ask for; 0: "
            "half of --max-pending (requests with several parts share that "
            "half, so single requests always find room)");
  flags.Add("max-connections", &o.max_connections,
            "open HTTP connections; one more gets 503 at once");
  flags.Add("max-request-bytes", &o.max_request_bytes,
            "the largest request body; beyond it: HTTP 413");
  flags.Add("request-timeout-s", &o.request_timeout_s,
            "seconds a client has to send a request's head and body");
  flags.Add("keep-alive-timeout-s", &o.keep_alive_timeout_s,
            "seconds an idle connection stays open");
  flags.Add("keep-alive-max-requests", &o.keep_alive_max_requests,
            "requests per connection before it closes");
  flags.Add("drain-timeout", &o.drain_timeout_s,
            "seconds requests in flight get to finish after SIGTERM/SIGINT "
            "before they are aborted, each client told (negative: auto, "
            "inside the launcher's kill timeout: mpirun's "
            "odls_base_sigkill_timeout - 0.5 s, Slurm 25 s, else 8 s)");
  flags.Add("max-logprobs", &o.max_logprobs,
            "the most log-probabilities per token a request may ask for");
  flags.Add("chat-template", &o.chat_template,
            "a Jinja chat template file, or the template text itself "
            "(default: the model's)");
  flags.Add("tokenizer", &o.engine.tokenizer_dir,
            "a folder with the tokenizer files (and chat template) to use "
            "instead of the model's");
  flags.Add("api-key", &o.api_key,
            "require \"Authorization: Bearer KEY\" on /v1/*, /tokenize and "
            "/detokenize (401 otherwise; /health, /metrics, /version stay "
            "open). Default: the TESSERA_API_KEY environment variable, which "
            "keeps the key out of the process list");
  flags.Add("allowed-origins", &o.allowed_origins,
            "CORS: origins browsers may call from, a comma list or a JSON "
            "list ('[\"*\"]' allows any); empty: no CORS headers");
  flags.Add("allowed-methods", &o.allowed_methods,
            "CORS: methods a preflight allows (comma or JSON list)");
  flags.Add("allowed-headers", &o.allowed_headers,
            "CORS: request headers a preflight allows (comma or JSON list)");
  flags.Add("allow-credentials", &o.allow_credentials,
            "CORS: allow credentialed requests (the origin is then echoed, "
            "never \"*\")");
  flags.Add("log-stats-interval", &o.log_stats_interval_s,
            "seconds between stats lines (throughput, running/waiting, KV "
            "cache usage, prefix cache hit rate) while requests are served; 0: "
            "off");
  flags.Add("disable-log-stats", &o.disable_log_stats,
            "no stats lines (vLLM's flag)");
  flags.Add("access-log", &o.access_log,
            "one stderr line per request: client, method, path, status, "
            "seconds, tokens. Off by default (vLLM's uvicorn logs access "
            "unless --disable-uvicorn-access-log): at serving rates a line per "
            "request drowns the startup, stats and error lines, and "
            "deployments behind a proxy have its access log already");
  flags.Add("reasoning-parser", &o.reasoning_parser,
            "split the model's thinking into reasoning_content on chat: "
            "qwen3 or deepseek_r1 (<think>...</think>); empty: none");
  flags.Add("tool-call-parser", &o.tool_call_parser,
            "parse tool calls out of chat output (tool_choice \"auto\", the "
            "default with tools): hermes (Qwen2.5/Qwen3 <tool_call>), "
            "llama3_json or mistral; empty: none (\"required\" and named "
            "tool_choice work without one)");
  flags.Add("enable-auto-tool-choice", &o.enable_auto_tool_choice,
            "vLLM's switch for tool_choice \"auto\": accepted, needs "
            "--tool-call-parser (which alone enables it here)");
  bool version = false;
  flags.Add("version", &version, "print the version and exit");
  AddEngineFlags(flags, &o.engine);
  parallel_flags.Add(flags);
  ASSIGN_OR_RETURN(const bool run, ParseOrPrintHelp(flags, args));
  if (!run) return absl::OkStatus();
  if (version) {
    std::cout << "tessera " << tessera::kTesseraVersion << "\n";
    return absl::OkStatus();
  }
  return RunLocalOrParallel(
      o.model_dir, parallel_flags, o.engine,
      [&](tessera::StepExecutor* job) { return tessera::RunServe(o, job); },
      exit_code, /*workers_ignore_signals=*/true);
}

absl::Status Tokenize(const std::vector<std::string>& args) {
  tessera::TokenizeOptions o;
  tessera::FlagParser flags("tokenize");
  flags.Add("model", &o.model_dir,
            "model folder, or a folder with only tokenizer files");
  flags.Add("decode", &o.decode,
            "read {\"ids\": [...]} lines and write {\"text\": ...}");
  flags.Add("skip-special-tokens", &o.skip_special_tokens,
            "with --decode: special tokens produce no text");
  ASSIGN_OR_RETURN(const bool run, ParseOrPrintHelp(flags, args));
  if (!run) return absl::OkStatus();
  return tessera::RunTokenize(o, std::cin, std::cout);
}

absl::Status Loadgen(const std::vector<std::string>& args) {
  tessera::LoadgenOptions o;
  bool json = false;
  tessera::FlagParser flags("loadgen");
  flags.Add("url", &o.url, "the server, http://HOST:PORT");
  flags.Add("model", &o.model, "the model name the server serves");
  flags.Add("concurrency", &o.concurrency, "requests in flight at once");
  flags.Add("requests", &o.requests, "requests in all");
  flags.Add("max-tokens", &o.max_tokens,
            "tokens per request (EOS ignored, so each makes them all)");
  flags.Add("prompt", &o.prompt, "the prompt of every request");
  flags.Add("json", &json, "print one JSON object instead of a line");
  ASSIGN_OR_RETURN(const bool run, ParseOrPrintHelp(flags, args));
  if (!run) return absl::OkStatus();
  ASSIGN_OR_RETURN(const tessera::LoadgenSummary summary,
                   tessera::RunLoadgen(o));
  std::cout << (json ? summary.ToJson() : summary.ToText()) << std::endl;
  if (!summary.errors.empty()) {
    return absl::UnavailableError(
        absl::StrCat(summary.errors.size(), " of ", o.requests,
                     " requests failed; the first: ", summary.errors.front()));
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "tessera: no command given (commands: generate, bench, "
                 "serve, tokenize, loadgen; see "
                 "tessera --help)\n";
    return 2;
  }
  if (std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::cout << kUsage;
    return 0;
  }
  if (std::string(argv[1]) == "--version") {
    std::cout << "tessera " << tessera::kTesseraVersion << "\n";
    return 0;
  }
  const std::string command = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  absl::Status status;
  if (command == "generate") {
    int exit_code = 0;
    status = Generate(args, &exit_code);
    if (status.ok() && exit_code != 0) return exit_code;
  } else if (command == "bench") {
    int exit_code = 0;
    status = Bench(args, &exit_code);
    if (status.ok() && exit_code != 0) return exit_code;
  } else if (command == "serve") {
    int exit_code = 0;
    status = Serve(args, &exit_code);
    if (status.ok() && exit_code != 0) return exit_code;
  } else if (command == "tokenize") {
    status = Tokenize(args);
  } else if (command == "loadgen") {
    status = Loadgen(args);
  } else {
    std::cerr << "tessera: unknown command \"" << command
              << "\" (commands: generate, bench, serve, tokenize, loadgen; see "
                 "tessera "
                 "--help)\n";
    return 2;
  }
  if (!status.ok()) {
    std::cout.flush();
    if (LauncherRank() == 0) {
      std::cerr << "tessera: " << status.message() << "\n";
    }
    return 1;
  }
  return 0;
}
