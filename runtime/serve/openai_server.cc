#include "runtime/serve/openai_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/serve/openai_protocol.h"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;
using serve::ApiError;
using serve::Choice;
using serve::CompletionRequest;
using serve::Endpoint;

void SendError(httplib::Response& res, const ApiError& error) {
  res.status = error.http_status;
  res.set_content(serve::ErrorBody(error), "application/json");
}

// A submission failure: a full queue is 429, a draining server 503, anything
// else the request's own fault.
ApiError SubmitError(const absl::Status& status) {
  ApiError e = serve::ApiErrorFromStatus(status);
  if (absl::IsResourceExhausted(status)) {
    e.http_status = 429;
    e.type = "rate_limit_error";
  } else if (absl::IsUnavailable(status)) {
    e.http_status = 503;
    e.type = "service_unavailable";
  }
  return e;
}

// One engine request of an HTTP request: a (prompt, choice) pair.
struct Part {
  int index = 0;
  std::vector<int32_t> prompt_ids;
  std::string prompt_text;  // For echo.
  std::shared_ptr<RequestStream> stream;
  Clock::time_point last_event;
  bool started = false;
  bool finished = false;
  int64_t generated = 0;
  int64_t text_offset = 0;
  int32_t last_token = -1;  // The token before the next one (logprob text).
};

}  // namespace

OpenAiServer::OpenAiServer(ServerOptions options, AsyncEngine* engine,
                           const ModelConfig& config,
                           const Tokenizer* tokenizer,
                           std::optional<ChatTemplate> chat_template)
    : options_(std::move(options)),
      engine_(engine),
      config_(config),
      tokenizer_(tokenizer),
      chat_template_(std::move(chat_template)),
      http_(std::make_unique<httplib::Server>()),
      created_(std::chrono::duration_cast<std::chrono::seconds>(
                   std::chrono::system_clock::now().time_since_epoch())
                   .count()) {
  RegisterMetrics();
}

OpenAiServer::~OpenAiServer() { Stop(); }

void OpenAiServer::RegisterMetrics() {
  auto gauge = [&](const char* name, const char* help) {
    return *metrics_.AddGauge(name, help);
  };
  auto counter = [&](const char* name, const char* help,
                     MetricLabels labels = {}) {
    return *metrics_.AddCounter(name, help, std::move(labels));
  };
  running_ = gauge("tessera_requests_running",
                   "Sequences holding KV cache blocks now.");
  waiting_ = gauge("tessera_requests_waiting",
                   "Sequences queued for admission (new or preempted).");
  kv_used_ = gauge("tessera_kv_blocks_used", "KV cache blocks in use.");
  kv_free_ = gauge("tessera_kv_blocks_free",
                   "KV cache blocks free (including cached ones).");
  prefix_hits_ = counter("tessera_prefix_cache_hit_tokens_total",
                         "Prompt tokens served from the prefix cache.");
  prefix_queries_ = counter("tessera_prefix_cache_queried_tokens_total",
                            "Prompt tokens looked up in the prefix cache.");
  preemptions_ = counter("tessera_preemptions_total",
                         "Sequences preempted (to be recomputed).");
  prompt_tokens_ =
      counter("tessera_prompt_tokens_total", "Prompt tokens received.");
  generation_tokens_ =
      counter("tessera_generation_tokens_total", "Tokens generated.");
  steps_ = counter("tessera_engine_steps_total", "Engine steps run.");
  step_seconds_ = counter("tessera_engine_step_seconds_total",
                          "Wall time spent inside engine steps.");
  requests_ok_ = counter("tessera_requests_total", "Finished HTTP requests.",
                         {{"status", "ok"}});
  requests_error_ = counter("tessera_requests_total", "Finished HTTP requests.",
                            {{"status", "error"}});
  requests_rejected_ =
      counter("tessera_requests_total", "Finished HTTP requests.",
              {{"status", "rejected"}});
  ttft_ = *metrics_.AddHistogram("tessera_time_to_first_token_seconds",
                                 "From request arrival to its first token.",
                                 DefaultTimeToFirstTokenBuckets());
  itl_ = *metrics_.AddHistogram("tessera_inter_token_latency_seconds",
                                "Between consecutive tokens of a request.",
                                DefaultInterTokenLatencyBuckets());
}

void OpenAiServer::RefreshEngineMetrics() {
  const Engine::Stats s = engine_->engine_stats();
  running_->Set(static_cast<double>(s.running));
  waiting_->Set(static_cast<double>(s.waiting + engine_->stats().waiting));
  kv_used_->Set(s.blocks.num_used_blocks);
  kv_free_->Set(s.blocks.num_free_blocks);
  std::lock_guard<std::mutex> lock(metrics_mu_);
  prefix_hits_->Increment(
      static_cast<double>(s.blocks.hit_tokens - seen_hits_));
  prefix_queries_->Increment(
      static_cast<double>(s.blocks.queried_tokens - seen_queries_));
  preemptions_->Increment(
      static_cast<double>(s.scheduler.preemptions - seen_preemptions_));
  const AsyncEngine::Stats a = engine_->stats();
  steps_->Increment(static_cast<double>(a.steps - seen_steps_));
  step_seconds_->Increment(a.step_seconds - seen_step_seconds_);
  seen_steps_ = a.steps;
  seen_step_seconds_ = a.step_seconds;
  seen_hits_ = s.blocks.hit_tokens;
  seen_queries_ = s.blocks.queried_tokens;
  seen_preemptions_ = s.scheduler.preemptions;
}

struct OpenAiServer::Handlers {
  OpenAiServer* server;

  // Token ids of each prompt of the request (chat: the rendered template).
  std::variant<std::vector<std::pair<std::vector<int32_t>, std::string>>,
               ApiError>
  Prompts(const CompletionRequest& r) const {
    std::vector<std::pair<std::vector<int32_t>, std::string>> out;
    const Tokenizer* tok = server->tokenizer_;
    if (r.endpoint == Endpoint::kChat) {
      if (!server->chat_template_) {
        return serve::InvalidRequest(
            "the model has no chat template; use /v1/completions", "messages");
      }
      nlohmann::ordered_json extra = nlohmann::ordered_json::object();
      if (!r.tools.is_null()) extra["tools"] = r.tools;
      if (r.chat_template_kwargs.is_object()) {
        for (auto it = r.chat_template_kwargs.begin();
             it != r.chat_template_kwargs.end(); ++it) {
          extra[it.key()] = it.value();
        }
      }
      absl::StatusOr<std::string> text = server->chat_template_->Render(
          r.messages, /*add_generation_prompt=*/true, extra);
      if (!text.ok()) return serve::ApiErrorFromStatus(text.status());
      absl::StatusOr<std::vector<int32_t>> ids = tok->Encode(*text);
      if (!ids.ok()) return serve::ApiErrorFromStatus(ids.status());
      out.emplace_back(*std::move(ids), std::string());
      return out;
    }
    for (const serve::Prompt& p : r.prompts) {
      if (const auto* ids = std::get_if<std::vector<int32_t>>(&p)) {
        absl::StatusOr<std::string> text =
            tok->Decode(*ids, /*skip_special_tokens=*/false);
        out.emplace_back(*ids, text.ok() ? *text : std::string());
        continue;
      }
      const std::string& text = std::get<std::string>(p);
      absl::StatusOr<std::vector<int32_t>> ids = tok->Encode(text);
      if (!ids.ok()) return serve::ApiErrorFromStatus(ids.status());
      std::vector<int32_t> all;
      if (tok->add_bos()) {
        const int64_t bos = server->config_.bos_token_id;
        all.push_back(bos >= 0 ? static_cast<int32_t>(bos) : tok->bos_id());
      }
      all.insert(all.end(), ids->begin(), ids->end());
      out.emplace_back(std::move(all), text);
    }
    return out;
  }

  // The text a token adds after `previous` (-1: none), so SentencePiece's
  // word-boundary space shows (" there", as OpenAI and vLLM report it).
  std::string TokenText(int32_t previous, int32_t id) const {
    absl::StatusOr<std::string> text =
        previous >= 0 ? server->tokenizer_->DecodeSuffix(
                            {previous, id}, 1, /*skip_special_tokens=*/false)
                      : server->tokenizer_->Decode({id}, false);
    return text.ok() ? *text : std::string();
  }

  std::vector<serve::TokenLogprob> Logprobs(
      int32_t last_prompt_token, const std::vector<int32_t>& ids,
      const std::vector<float>& logprobs,
      const std::vector<std::vector<std::pair<int32_t, float>>>& top) const {
    std::vector<serve::TokenLogprob> out;
    for (size_t i = 0; i < ids.size(); ++i) {
      const int32_t previous = i > 0 ? ids[i - 1] : last_prompt_token;
      serve::TokenLogprob t;
      t.token = TokenText(previous, ids[i]);
      t.logprob = i < logprobs.size() ? logprobs[i] : 0.0f;
      if (i < top.size()) {
        for (const auto& [id, lp] : top[i]) {
          t.top.push_back({TokenText(previous, id), lp});
        }
      }
      out.push_back(std::move(t));
    }
    return out;
  }

  // Validates and submits every (prompt, choice) pair; on failure cancels
  // what was submitted and fills *error.
  std::vector<Part> Submit(const CompletionRequest& r,
                           std::optional<ApiError>* error) const {
    std::vector<Part> parts;
    auto prompts = Prompts(r);
    if (auto* e = std::get_if<ApiError>(&prompts)) {
      *error = *e;
      return {};
    }
    const auto& list = std::get<0>(prompts);
    const Clock::time_point now = Clock::now();
    for (size_t p = 0; p < list.size(); ++p) {
      for (int c = 0; c < r.n; ++c) {
        Part part;
        part.index = static_cast<int>(p) * r.n + c;
        part.prompt_ids = list[p].first;
        part.prompt_text = list[p].second;
        GenerationRequest request =
            serve::ToGenerationRequest(r, part.prompt_ids, c);
        // Checked here so that a bad request is a 400 before any streaming.
        const absl::Status valid = server->engine_->Check(request);
        absl::StatusOr<std::shared_ptr<RequestStream>> stream =
            valid.ok() ? server->engine_->Submit(std::move(request)) : valid;
        if (!stream.ok()) {
          for (Part& done : parts) server->engine_->Cancel(done.stream->id());
          *error = SubmitError(stream.status());
          if (absl::IsResourceExhausted(stream.status())) {
            server->requests_rejected_->Increment();
          }
          return {};
        }
        part.stream = *std::move(stream);
        part.last_event = now;
        part.last_token = part.prompt_ids.empty() ? -1 : part.prompt_ids.back();
        parts.push_back(std::move(part));
      }
    }
    return parts;
  }

  // Records a token made at `made_at` (the engine's time, not the time the
  // HTTP thread got it: tokens may be handed over several at once).
  void Observe(Part& part, Clock::time_point arrival,
               Clock::time_point made_at) const {
    const double since =
        std::chrono::duration<double>(
            made_at - (part.started ? part.last_event : arrival))
            .count();
    (part.started ? server->itl_ : server->ttft_)->Observe(since);
    part.started = true;
    part.last_event = made_at;
    ++part.generated;
  }

  void Complete(const CompletionRequest& r, httplib::Response& res,
                Clock::time_point arrival) const {
    std::optional<ApiError> error;
    std::vector<Part> parts = Submit(r, &error);
    if (error) {
      if (error->http_status != 429) server->requests_error_->Increment();
      return SendError(res, *error);
    }
    serve::ResponseHeader header;
    header.id = serve::RandomResponseId(
        r.endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-");
    header.created = server->created_;
    header.model = r.model;
    if (r.stream) return Stream(r, header, std::move(parts), res, arrival);
    // Not streamed: the JSON goes out once every choice is done. Until then a
    // space every second (JSON allows leading whitespace) shows whether the
    // client is still there; if it is not, its requests are cancelled.
    auto shared = std::make_shared<std::vector<Part>>(std::move(parts));
    OpenAiServer* s = server;
    const Handlers self = *this;
    res.set_chunked_content_provider(
        "application/json",
        [self, s, r, header, shared, arrival](size_t, httplib::DataSink& sink) {
          Clock::time_point last_write = Clock::now();
          for (Part& part : *shared) {
            while (!part.stream->done()) {
              Clock::time_point made_at;
              if (part.stream->Next(std::chrono::milliseconds(50), &made_at)) {
                self.Observe(part, arrival, made_at);
              }
              if (Clock::now() - last_write > std::chrono::seconds(1)) {
                if (!sink.write(" ", 1)) {
                  for (Part& p : *shared) s->engine_->Cancel(p.stream->id());
                  s->requests_error_->Increment();
                  return false;
                }
                last_write = Clock::now();
              }
            }
          }
          const std::string body = self.Body(r, header, *shared);
          sink.write(body.data(), body.size());
          sink.done();
          return true;
        },
        [shared, s](bool success) {
          if (success) return;
          for (Part& p : *shared) s->engine_->Cancel(p.stream->id());
        });
  }

  // The response of finished parts (or, if one failed, its error body).
  std::string Body(const CompletionRequest& r,
                   const serve::ResponseHeader& header,
                   std::vector<Part>& parts) const {
    std::vector<Choice> choices;
    serve::Usage usage;
    for (Part& part : parts) {
      absl::StatusOr<GenerationResult> result = part.stream->Wait();
      if (!result.ok()) {
        for (Part& p : parts) server->engine_->Cancel(p.stream->id());
        server->requests_error_->Increment();
        return serve::ErrorBody(serve::ApiErrorFromStatus(result.status()));
      }
      Choice choice;
      choice.index = part.index;
      choice.text = result->text.value_or("");
      if (r.echo) choice.text = part.prompt_text + choice.text;
      if (r.logprobs) {
        choice.logprobs = Logprobs(
            part.prompt_ids.empty() ? -1 : part.prompt_ids.back(),
            result->output_ids, result->logprobs, result->top_logprobs);
      }
      choice.finish_reason = result->finish_reason;
      choices.push_back(std::move(choice));
      if (part.index % r.n == 0) {
        usage.prompt_tokens += static_cast<int64_t>(part.prompt_ids.size());
      }
      usage.completion_tokens +=
          static_cast<int64_t>(result->output_ids.size());
    }
    server->prompt_tokens_->Increment(static_cast<double>(usage.prompt_tokens));
    server->generation_tokens_->Increment(
        static_cast<double>(usage.completion_tokens));
    server->requests_ok_->Increment();
    return r.endpoint == Endpoint::kChat
               ? serve::ChatResponse(header, choices, usage)
               : serve::CompletionResponse(header, choices, usage);
  }

  void Stream(const CompletionRequest& r, const serve::ResponseHeader& header,
              std::vector<Part> parts, httplib::Response& res,
              Clock::time_point arrival) const {
    auto shared = std::make_shared<std::vector<Part>>(std::move(parts));
    OpenAiServer* s = server;
    const Handlers self = *this;
    res.set_chunked_content_provider(
        "text/event-stream",
        [self, s, r, header, shared, arrival](size_t, httplib::DataSink& sink) {
          std::vector<Part>& parts = *shared;
          auto write = [&](const std::string& json) {
            const std::string event = serve::SseEvent(json);
            return sink.write(event.data(), event.size());
          };
          auto cancel_all = [&] {
            for (Part& p : parts) s->engine_->Cancel(p.stream->id());
          };
          serve::Usage usage;
          for (const Part& p : parts) {
            if (p.index % r.n == 0) {
              usage.prompt_tokens += static_cast<int64_t>(p.prompt_ids.size());
            }
          }
          size_t open = parts.size();
          bool failed = false;
          while (open > 0) {
            bool idle = true;
            for (Part& part : parts) {
              if (part.finished) continue;
              // One part waits on its stream; several are polled in turn
              // (a round with nothing new sleeps briefly below), so that
              // n = 128 choices do not add 128 waits to every round.
              Clock::time_point made_at;
              std::optional<TokenEvent> e = part.stream->Next(
                  std::chrono::milliseconds(parts.size() == 1 ? 50 : 0),
                  &made_at);
              if (!e) {
                if (!part.stream->done()) continue;
                // Ended without a final event: cancelled or failed.
                absl::StatusOr<GenerationResult> result = part.stream->Wait();
                part.finished = true;
                --open;
                if (!result.ok()) {
                  write(serve::ErrorBody(
                      serve::ApiErrorFromStatus(result.status())));
                  failed = true;
                }
                continue;
              }
              idle = false;
              // Every event that is already there goes out in one write.
              std::string pending;
              while (e) {
                self.Observe(part, arrival, made_at);
                Choice choice;
                choice.index = part.index;
                choice.first = part.generated == 1;
                choice.text = e->text;
                if (r.echo && choice.first) {
                  choice.text = part.prompt_text + choice.text;
                }
                if (r.logprobs) {
                  serve::TokenLogprob t;
                  t.token = self.TokenText(part.last_token, e->token);
                  t.logprob = e->logprob;
                  for (const auto& [id, lp] : e->top_logprobs) {
                    t.top.push_back({self.TokenText(part.last_token, id), lp});
                  }
                  choice.logprobs = std::vector<serve::TokenLogprob>{t};
                }
                part.last_token = e->token;
                choice.text_offset = part.text_offset;
                part.text_offset += static_cast<int64_t>(choice.text.size());
                if (e->finished) {
                  absl::StatusOr<GenerationResult> result = part.stream->Wait();
                  if (result.ok()) choice.finish_reason = result->finish_reason;
                  part.finished = true;
                  --open;
                }
                ++usage.completion_tokens;
                pending += serve::SseEvent(
                    r.endpoint == Endpoint::kChat
                        ? serve::ChatChunk(header, choice)
                        : serve::CompletionChunk(header, choice));
                if (part.finished) break;
                e = part.stream->Next(std::chrono::milliseconds(0), &made_at);
              }
              if (!sink.write(pending.data(), pending.size())) {
                // The client went away.
                cancel_all();
                s->requests_error_->Increment();
                return false;
              }
            }
            if (idle && !sink.is_writable()) {
              cancel_all();
              s->requests_error_->Increment();
              return false;
            }
            if (idle && parts.size() > 1) {
              std::this_thread::sleep_for(std::chrono::microseconds(500));
            }
          }
          if (r.include_usage) {
            write(serve::UsageChunk(r.endpoint, header, usage));
          }
          sink.write(serve::kSseDone.data(), serve::kSseDone.size());
          sink.done();
          s->prompt_tokens_->Increment(
              static_cast<double>(usage.prompt_tokens));
          s->generation_tokens_->Increment(
              static_cast<double>(usage.completion_tokens));
          (failed ? s->requests_error_ : s->requests_ok_)->Increment();
          return true;
        },
        [shared, s](bool success) {
          // Whatever is still open when the connection ends is cancelled.
          if (success) return;
          for (Part& p : *shared) s->engine_->Cancel(p.stream->id());
        });
  }
};

absl::Status OpenAiServer::Start() {
  Handlers handlers{this};
  // httplib owns the queue it gets from this factory (its API takes a raw
  // pointer).
  const int threads = std::max(1, options_.http_threads);
  http_->new_task_queue = [threads] {
    return new httplib::ThreadPool(threads);
  };
  http_->Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("", "text/plain");
  });
  http_->Get("/v1/models", [this](const httplib::Request&,
                                  httplib::Response& res) {
    res.set_content(serve::ModelsResponse(options_.served_model_name, created_),
                    "application/json");
  });
  http_->Get(
      "/metrics", [this](const httplib::Request&, httplib::Response& res) {
        RefreshEngineMetrics();
        res.set_content(metrics_.Render(),
                        std::string(MetricsRegistry::kContentType).c_str());
      });
  auto post = [this, handlers](Endpoint endpoint) {
    return [this, handlers, endpoint](const httplib::Request& req,
                                      httplib::Response& res) {
      const Clock::time_point arrival = Clock::now();
      serve::ParseResult parsed = endpoint == Endpoint::kChat
                                      ? serve::ParseChatRequest(req.body)
                                      : serve::ParseCompletionRequest(req.body);
      if (auto* e = std::get_if<ApiError>(&parsed)) {
        requests_error_->Increment();
        return SendError(res, *e);
      }
      const CompletionRequest& r = std::get<CompletionRequest>(parsed);
      if (r.model != options_.served_model_name) {
        requests_error_->Increment();
        return SendError(res, serve::ModelNotFound(r.model));
      }
      handlers.Complete(r, res, arrival);
    };
  };
  http_->Post("/v1/completions", post(Endpoint::kCompletions));
  http_->Post("/v1/chat/completions", post(Endpoint::kChat));

  // Debian's cpp-httplib listens with a backlog of 5, so a burst of clients
  // connecting at once would be reset. Keep the listening socket (the options
  // hook sees it before bind) and widen the backlog after the bind.
  // Tokens are small writes that must leave at once: no Nagle delay (accepted
  // sockets inherit the option from the listening one).
  http_->set_tcp_nodelay(true);
  http_->set_socket_options([this](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    listen_fd_ = sock;
  });
  if (options_.port == 0) {
    port_ = http_->bind_to_any_port(options_.host.c_str());
    if (port_ <= 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot bind ", options_.host, " to any port"));
    }
  } else {
    if (!http_->bind_to_port(options_.host.c_str(), options_.port)) {
      return absl::UnavailableError(
          absl::StrCat("cannot bind ", options_.host, ":", options_.port,
                       " (in use, or not an address of this host)"));
    }
    port_ = options_.port;
  }
  if (listen_fd_ >= 0 && ::listen(listen_fd_, SOMAXCONN) != 0) {
    return absl::InternalError(absl::StrCat(
        "listen(", SOMAXCONN, ") on ", options_.host, ":", port_, " failed"));
  }
  listener_ = std::thread([this] { http_->listen_after_bind(); });
  return absl::OkStatus();
}

void OpenAiServer::Stop() {
  if (http_) http_->stop();
  if (listener_.joinable()) listener_.join();
}

}  // namespace tessera
