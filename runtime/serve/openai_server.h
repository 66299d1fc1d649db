// OpenAiServer: the OpenAI-compatible HTTP front end on rank 0 (cpp-httplib).
//
//   POST /v1/completions, POST /v1/chat/completions  ("stream": true gives
//        server-sent events ending in "data: [DONE]")
//   GET  /v1/models, /health, /metrics (Prometheus text)
//
// HTTP threads parse and validate a request (openai_protocol.h), tokenize it
// (chat: the model's chat template), submit one engine request per prompt
// and choice to the AsyncEngine, and read the tokens back from their
// streams; they never touch the engine, whose loop runs on the caller's
// thread (AsyncEngine::Loop). A client that goes away has its requests
// cancelled, which frees their KV blocks: a stream notices at its next event,
// a plain response at its next keep-alive (responses are chunked, and a space
// goes out every second until the JSON is ready). A full queue answers 429, a
// draining server 503.
#ifndef TESSERA_RUNTIME_SERVE_OPENAI_SERVER_H_
#define TESSERA_RUNTIME_SERVE_OPENAI_SERVER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/model/config.h"
#include "runtime/serve/async_engine.h"
#include "runtime/serve/metrics.h"
#include "runtime/text/chat_template.h"
#include "runtime/text/tokenizer.h"

namespace httplib {
class Server;
}

namespace tessera {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: any free port (see OpenAiServer::port()).
  std::string served_model_name;  // The "model" requests must name.
  // HTTP worker threads: each open connection (a streaming response holds
  // one for its whole life) takes one, so this bounds concurrent clients.
  int http_threads = 256;
};

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
  // the engine has drained, so in-flight responses finish).
  void Stop();

  MetricsRegistry& metrics() { return metrics_; }

 private:
  struct Handlers;
  void RegisterMetrics();
  // Updates the gauges and counters that mirror the engine's statistics.
  void RefreshEngineMetrics();

  ServerOptions options_;
  AsyncEngine* engine_;
  const ModelConfig& config_;
  const Tokenizer* tokenizer_;
  std::optional<ChatTemplate> chat_template_;
  std::unique_ptr<httplib::Server> http_;
  std::thread listener_;
  int port_ = 0;
  int listen_fd_ = -1;  // The listening socket (its backlog is widened).
  int64_t created_ = 0;

  MetricsRegistry metrics_;
  Gauge* running_ = nullptr;
  Gauge* waiting_ = nullptr;
  Gauge* kv_used_ = nullptr;
  Gauge* kv_free_ = nullptr;
  Counter* prefix_hits_ = nullptr;
  Counter* prefix_queries_ = nullptr;
  Counter* preemptions_ = nullptr;
  Counter* steps_ = nullptr;
  Counter* step_seconds_ = nullptr;
  Counter* prompt_tokens_ = nullptr;
  Counter* generation_tokens_ = nullptr;
  Counter* requests_ok_ = nullptr;
  Counter* requests_error_ = nullptr;
  Counter* requests_rejected_ = nullptr;
  Histogram* ttft_ = nullptr;
  Histogram* itl_ = nullptr;
  // Last engine totals mirrored into the counters above (under metrics_mu_).
  std::mutex metrics_mu_;
  int64_t seen_hits_ = 0, seen_queries_ = 0, seen_preemptions_ = 0;
  int64_t seen_steps_ = 0;
  double seen_step_seconds_ = 0;
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_SERVE_OPENAI_SERVER_H_
