// OpenAiServer: the OpenAI-compatible HTTP front end on rank 0 (cpp-httplib
// under HttpServer, http_server.h).
//
//   POST /v1/completions, POST /v1/chat/completions  ("stream": true gives
//        server-sent events ending in "data: [DONE]")
//   GET  /v1/models, /v1/models/{id}, /health, /version, /metrics
//   POST /tokenize, /detokenize  (vLLM's; openai_protocol.h has the shapes)
//   anything else: a JSON 404 (unknown path) or 405 (known path, wrong
//   method, with an Allow header), OpenAI-shaped.
//
// HTTP threads parse and validate a request (openai_protocol.h), tokenize it
// (chat: the model's chat template), submit its engine requests (one per
// prompt and choice) to the AsyncEngine as one group, and read the tokens
// back from their streams; they never touch the engine, whose loop runs on
// the caller's thread (AsyncEngine::Loop).
//
// Costs are bounded before work: a body over max_request_bytes is a 413 (its
// Content-Length is checked before it is read, and the decoded bytes as they
// come); a text prompt is tokenized only up to the context
// (Tokenizer::EncodeAtMost), so an oversized one costs what a fitting one
// does (400 in vLLM's words); prompts x n above the per-request limit is a
// 400. Admission is AsyncEngine's (async_engine.h): a full server is 429, a
// draining one 503.
//
// Status codes tell the outcome: a plain response is sent, status and body
// together, once every choice has finished (an engine failure is then its
// own status, never a 200 with an error body); a stream's 200 goes out once
// every choice has its first token (a failure before it is a real status),
// and an error after it is an error event followed by "data: [DONE]"
// (vLLM's behaviour), never a silent cut. A client that goes away has its
// requests cancelled, which frees their KV blocks: the waiting thread polls
// the connection (Connection::PeerClosed) without writing anything.
//
// GET /health is 200 while serving and 503 while draining (after SIGTERM) or
// once the engine loop has failed.
//
// Access (access.h): with an API key, /v1/*, /tokenize and /detokenize need
// "Authorization: Bearer KEY" (401 otherwise, before routing, as vLLM's
// middleware); with allowed origins, CORS headers go on every response to a
// request with an Origin (streams too: they are set before the body), and
// preflights (OPTIONS with Access-Control-Request-Method) are answered
// before the key is checked. A 429 carries Retry-After (kRetryAfterSeconds).
// /tokenize counts at most max(the context, kMaxTokenizeTokens) tokens (a
// 400 beyond), so a body of the largest size costs a bounded reply.
#ifndef TESSERA_RUNTIME_SERVE_OPENAI_SERVER_H_
#define TESSERA_RUNTIME_SERVE_OPENAI_SERVER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/engine/generation_defaults.h"
#include "runtime/model/config.h"
#include "runtime/serve/access.h"
#include "runtime/serve/async_engine.h"
#include "runtime/serve/chat_output.h"
#include "runtime/serve/http_server.h"
#include "runtime/serve/metrics.h"
#include "runtime/serve/openai_protocol.h"
#include "runtime/text/chat_template.h"
#include "runtime/text/tokenizer.h"

namespace tessera {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: any free port (see OpenAiServer::port()).
  std::string served_model_name;  // The "model" requests must name.
  std::string version;            // GET /version.
  // Connections, timeouts and keep-alive (http_server.h).
  HttpLimits http;
  // The largest request body (decoded); beyond it: 413.
  int64_t max_request_bytes = int64_t{8} << 20;
  // The most engine requests (prompts x n) one HTTP request may make; 0: the
  // engine's group limit (AsyncEngine::max_group_parts). Beyond it: 400.
  int64_t max_request_parts = 0;
  // The context prompts and max_tokens are checked against; 0: the model's
  // max_position_embeddings.
  int64_t max_model_len = 0;
  // The most log-probabilities per token a request may ask for (vLLM's
  // --max-logprobs).
  int32_t max_logprobs = 20;
  // generation_config.json's sampling defaults for fields a request leaves
  // unset (empty: the API's own).
  GenerationDefaults generation_defaults;
  // Non-empty: the key /v1/*, /tokenize and /detokenize need (access.h).
  std::string api_key;
  // CORS (access.h); no allowed origins: no CORS headers.
  serve::CorsOptions cors;
  // One access log line per request (serve::AccessLogLine) to `log`, or to
  // stderr when `log` is unset.
  bool access_log = false;
  std::function<void(const std::string&)> log;
  // Chat output parsers: --reasoning-parser and --tool-call-parser
  // (chat_output.h); with a tool-call parser, tool_choice "auto" works.
  serve::ChatOutputFormats output_formats;
};

// The most tokens /tokenize counts when the context is smaller.
inline constexpr int64_t kMaxTokenizeTokens = int64_t{1} << 20;

class OpenAiServer {
 public:
  // `engine`, `tokenizer` and `config` must outlive the server. Without a
  // chat template the chat endpoint answers 400.
  OpenAiServer(ServerOptions options, AsyncEngine* engine,
               const ModelConfig& config, const Tokenizer* tokenizer,
               std::optional<ChatTemplate> chat_template);
  ~OpenAiServer();

  // Binds and starts serving on background threads. Unavailable when the
  // address cannot be bound.
  absl::Status Start();
  // The bound port (after Start).
  int port() const { return port_; }
  // Stops accepting connections and waits for the HTTP threads (call after
  // the engine has drained and WaitForResponses, so in-flight responses
  // finish).
  void Stop();

  // Any thread: responses being produced (submitted to the engine, and not
  // yet written to the end or abandoned by their client).
  int64_t responses_in_flight() const { return responses_in_flight_.load(); }
  // Any thread: waits up to `timeout` until no response is in flight; true
  // if none is. After the engine ends every request (drained, aborted or
  // failed), their last events and error bodies are written within moments:
  // a shutdown waits for that before the sockets close.
  bool WaitForResponses(std::chrono::milliseconds timeout) const;

  // GET /metrics' families (metrics.h); the AsyncEngine reports steps,
  // tokens and request ends to it while the server exists.
  ServingMetrics& metrics() { return *metrics_; }

 private:
  struct Handlers;
  // The served model's card (GET /v1/models, /v1/models/{id}).
  serve::ModelCard Card() const;
  // Updates the gauges and counters that mirror the engine's and the HTTP
  // server's statistics (at each scrape).
  void RefreshEngineMetrics();

  ServerOptions options_;
  AsyncEngine* engine_;
  const ModelConfig& config_;
  const Tokenizer* tokenizer_;
  std::optional<ChatTemplate> chat_template_;
  serve::CorsPolicy cors_;
  std::unique_ptr<HttpServer> http_;
  std::thread listener_;
  int port_ = 0;

  std::shared_ptr<ServingMetrics> metrics_;
  std::atomic<int64_t> responses_in_flight_{0};
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_SERVE_OPENAI_SERVER_H_
