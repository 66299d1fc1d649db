#include "runtime/serve/openai_server.h"

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iostream>
#include <optional>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "runtime/serve/access.h"
#include "runtime/serve/chat_output.h"
#include "runtime/serve/openai_protocol.h"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;
using serve::ApiError;
using serve::Choice;
using serve::CompletionRequest;
using serve::Endpoint;

constexpr ServingMetrics::HttpOutcome kHttpOk =
    ServingMetrics::HttpOutcome::kOk;
constexpr ServingMetrics::HttpOutcome kHttpError =
    ServingMetrics::HttpOutcome::kError;
constexpr ServingMetrics::HttpOutcome kHttpRejected =
    ServingMetrics::HttpOutcome::kRejected;

// How often a waiting HTTP thread looks at its connection.
constexpr std::chrono::milliseconds kPollInterval{50};

void SendError(httplib::Response& res, const ApiError& error) {
  res.status = error.http_status;
  // A full queue: when to come back (access.h says why this long).
  if (error.http_status == 429) {
    res.set_header("Retry-After", std::to_string(serve::kRetryAfterSeconds));
  }
  res.set_content(serve::ErrorBody(error), "application/json");
}

// What the access log line of the request this thread handles says beyond
// the request and response themselves: when its head was in, and its token
// counts once known. httplib calls the pre-routing handler, the handler, the
// content provider and the logger on the connection's thread, in that order.
struct AccessRecord {
  bool started = false;
  Clock::time_point start;
  std::optional<int64_t> prompt_tokens;
  std::optional<int64_t> generation_tokens;
};
thread_local AccessRecord t_access;

void RecordUsage(const serve::Usage& usage) {
  t_access.prompt_tokens = usage.prompt_tokens;
  t_access.generation_tokens = usage.completion_tokens;
}

// The client will not get the response (it went away); the connection
// closes after it.
void Abandon(httplib::Response& res) {
  res.status = 499;
  res.set_content("", "text/plain");
  if (Connection* c = HttpServer::CurrentConnection()) c->CloseAfterResponse();
}

// The body of this request was not (fully) read: the connection cannot carry
// another request, so it closes after this response.
void CloseAfter(httplib::Response& res) {
  res.set_header("Connection", "close");
  if (Connection* c = HttpServer::CurrentConnection()) c->CloseAfterResponse();
}

ApiError Error(int status, std::string message, std::string type,
               std::string code) {
  ApiError e;
  e.http_status = status;
  e.message = std::move(message);
  e.type = std::move(type);
  e.code = std::move(code);
  return e;
}

ApiError TooLarge(int64_t limit) {
  return Error(413,
               absl::StrCat("the request body is larger than ", limit,
                            " bytes (the server's --max-request-bytes)"),
               "invalid_request_error", "request_too_large");
}

// vLLM's answer to a prompt that does not fit the context, when tokenizing
// stopped early (EncodeAtMost): only a lower bound of its length is known.
ApiError PromptOverContext(Endpoint endpoint, int64_t max_model_len) {
  ApiError e = serve::PromptTooLong(endpoint, max_model_len, max_model_len);
  e.message = absl::StrCat(
      "This model's maximum context length is ", max_model_len,
      " tokens. However, you requested more than ", max_model_len,
      " tokens in the messages, Please reduce the length of the messages.");
  return e;
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

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The routes, for 404 and 405 answers (httplib itself only knows handlers).
struct Route {
  const char* path;
  bool prefix;         // Matches path + anything (GET /v1/models/{id}).
  const char* method;  // GET (HEAD too) or POST.
};
constexpr Route kRoutes[] = {
    {"/health", false, "GET"},
    {"/version", false, "GET"},
    {"/metrics", false, "GET"},
    {"/v1/models", false, "GET"},
    {"/v1/models/", true, "GET"},
    {"/v1/completions", false, "POST"},
    {"/v1/chat/completions", false, "POST"},
    {"/tokenize", false, "POST"},
    {"/detokenize", false, "POST"},
};

// Whether the request carries a body (that a refusal leaves unread).
bool HasBody(const httplib::Request& req) {
  if (req.has_header("Transfer-Encoding")) return true;
  const std::string length = req.get_header_value("Content-Length");
  return !length.empty() && length != "0";
}

// One engine request of an HTTP request: a (prompt, choice) pair.
struct Part {
  int index = 0;
  std::vector<int32_t> prompt_ids;
  std::string prompt_text;  // For echo.
  std::shared_ptr<RequestStream> stream;
  // Chat: the choice's text read as content, reasoning and tool calls.
  std::shared_ptr<serve::ChatOutput> output;
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
      cors_(options_.cors),
      http_(std::make_unique<HttpServer>(options_.http)),
      metrics_(std::make_shared<ServingMetrics>(
          options_.served_model_name, options_.max_model_len > 0
                                          ? options_.max_model_len
                                          : config.max_position_embeddings)) {
  engine_->set_observer(metrics_);
}

OpenAiServer::~OpenAiServer() {
  Stop();
  engine_->set_observer(nullptr);
}

void OpenAiServer::RefreshEngineMetrics() {
  const Engine::Stats s = engine_->engine_stats();
  const AsyncEngine::Stats a = engine_->stats();
  const ElasticTaskQueue::Stats q = http_->queue_stats();
  ServingSnapshot snap;
  snap.running = s.running;
  snap.waiting = s.waiting + a.waiting;
  snap.kv_used_blocks = s.blocks.num_used_blocks;
  snap.kv_free_blocks = s.blocks.num_free_blocks;
  snap.prefix_queried_tokens = s.blocks.queried_tokens;
  snap.prefix_hit_tokens = s.blocks.hit_tokens;
  snap.preemptions = s.scheduler.preemptions;
  snap.steps = a.steps;
  snap.step_seconds = a.step_seconds;
  snap.http_refused = q.refused;
  snap.http_connections = http_->open_connections();
  snap.http_threads = q.threads;
  metrics_->Update(snap);
}

struct OpenAiServer::Handlers {
  OpenAiServer* server;

  int64_t Context() const {
    return server->options_.max_model_len > 0
               ? server->options_.max_model_len
               : server->config_.max_position_embeddings;
  }
  const GenerationDefaults& Defaults() const {
    return server->options_.generation_defaults;
  }

  // The most parts (prompts x n) one request may have.
  int64_t MaxParts() const {
    const int64_t group = server->engine_->max_group_parts();
    const int64_t flag = server->options_.max_request_parts;
    return flag > 0 ? std::min(flag, group) : group;
  }

  // `ids` with BOS in front when the request asks for special tokens and the
  // tokenizer adds BOS.
  std::vector<int32_t> WithBos(const CompletionRequest& r,
                               std::vector<int32_t> ids) const {
    if (!r.add_special_tokens || !server->tokenizer_->add_bos()) return ids;
    const int64_t bos = server->config_.bos_token_id;
    ids.insert(ids.begin(), bos >= 0 ? static_cast<int32_t>(bos)
                                     : server->tokenizer_->bos_id());
    return ids;
  }

  // Text to ids, tokenizing no further than the context allows (a longer
  // text costs what a fitting one does).
  std::variant<std::vector<int32_t>, ApiError> Tokenize(
      const CompletionRequest& r, const std::string& text) const {
    const bool bos = r.add_special_tokens && server->tokenizer_->add_bos();
    absl::StatusOr<std::vector<int32_t>> ids =
        server->tokenizer_->EncodeAtMost(text, Context() - (bos ? 1 : 0));
    if (!ids.ok()) {
      if (absl::IsOutOfRange(ids.status())) {
        return PromptOverContext(r.endpoint, Context());
      }
      return serve::ApiErrorFromStatus(ids.status());
    }
    return WithBos(r, *std::move(ids));
  }

  // A chat request's messages through the chat template (with the
  // generation prompt, or cut for continue_final_message).
  std::variant<std::string, ApiError> RenderChat(
      const CompletionRequest& r) const {
    if (!server->chat_template_) {
      return serve::InvalidRequest(
          "the model has no chat template; use /v1/completions or start "
          "the server with --chat-template",
          "messages");
    }
    absl::StatusOr<std::string> text = server->chat_template_->Render(
        r.messages, r.add_generation_prompt, serve::ChatTemplateContext(r));
    if (text.ok() && r.continue_final_message) {
      text = serve::ContinueFinalMessage(*text, r.messages);
    }
    // Whatever the template's complaint (a raise_exception, a resource
    // limit), it is about this request: a 400, never a 429 that clients
    // would retry.
    if (!text.ok()) return serve::ApiErrorFromTemplateStatus(text.status());
    return *std::move(text);
  }

  // POST /tokenize: the ids the request's prompt (or rendered messages)
  // would be sent to the model as, counted up to a bound.
  void TokenizeEndpoint(const serve::TokenizeRequest& t,
                        httplib::Response& res) const {
    const CompletionRequest& r = t.request;
    if (!r.model.empty() && r.model != server->options_.served_model_name) {
      return SendError(res, serve::ModelNotFound(r.model));
    }
    std::string text;
    if (r.endpoint == Endpoint::kChat) {
      std::variant<std::string, ApiError> rendered = RenderChat(r);
      if (auto* e = std::get_if<ApiError>(&rendered)) {
        return SendError(res, *e);
      }
      text = std::get<std::string>(std::move(rendered));
    } else {
      text = std::get<std::string>(r.prompts.front());
    }
    const int64_t limit = std::max(Context(), kMaxTokenizeTokens);
    const bool bos = r.add_special_tokens && server->tokenizer_->add_bos();
    absl::StatusOr<std::vector<int32_t>> ids =
        server->tokenizer_->EncodeAtMost(text, limit - (bos ? 1 : 0));
    if (!ids.ok()) {
      if (absl::IsOutOfRange(ids.status())) {
        return SendError(
            res, serve::InvalidRequest(
                     absl::StrCat("the text has more than ", limit,
                                  " tokens, the most /tokenize counts"),
                     r.endpoint == Endpoint::kChat ? "messages" : "prompt",
                     "invalid_value"));
      }
      return SendError(res, serve::ApiErrorFromStatus(ids.status()));
    }
    std::vector<int32_t> tokens = WithBos(r, *std::move(ids));
    std::optional<std::vector<std::string>> strs;
    if (t.return_token_strs) {
      strs.emplace();
      strs->reserve(tokens.size());
      for (int32_t id : tokens) {
        strs->push_back(server->tokenizer_->IdToToken(id));
      }
    }
    t_access.prompt_tokens = static_cast<int64_t>(tokens.size());
    res.set_content(serve::TokenizeResponse(tokens, Context(), strs),
                    "application/json");
  }

  // POST /detokenize: the ids as text, special tokens included (Hugging
  // Face's decode, which vLLM's /detokenize calls).
  void DetokenizeEndpoint(const serve::DetokenizeRequest& d,
                          httplib::Response& res) const {
    if (!d.model.empty() && d.model != server->options_.served_model_name) {
      return SendError(res, serve::ModelNotFound(d.model));
    }
    DecodeOptions options;
    options.skip_special_tokens = false;
    options.spaces_between_special_tokens = true;
    absl::StatusOr<std::string> text =
        server->tokenizer_->Decode(d.tokens, options);
    if (!text.ok())
      return SendError(res, serve::ApiErrorFromStatus(text.status()));
    t_access.prompt_tokens = static_cast<int64_t>(d.tokens.size());
    res.set_content(serve::DetokenizeResponse(*text), "application/json");
  }

  // Token ids of each prompt of the request (chat: the rendered template)
  // and the text echo repeats, each checked against the context.
  std::variant<std::vector<std::pair<std::vector<int32_t>, std::string>>,
               ApiError>
  Prompts(const CompletionRequest& r, std::string* rendered = nullptr) const {
    std::vector<std::pair<std::vector<int32_t>, std::string>> out;
    const Tokenizer* tok = server->tokenizer_;
    auto checked = [&](std::vector<int32_t> ids,
                       std::string text) -> std::optional<ApiError> {
      if (std::optional<ApiError> e = serve::CheckContextLength(
              r, Defaults(), static_cast<int64_t>(ids.size()), Context())) {
        return e;
      }
      out.emplace_back(std::move(ids), std::move(text));
      return std::nullopt;
    };
    if (r.endpoint == Endpoint::kChat) {
      std::variant<std::string, ApiError> text = RenderChat(r);
      if (auto* e = std::get_if<ApiError>(&text)) return *e;
      auto ids = Tokenize(r, std::get<std::string>(text));
      if (auto* e = std::get_if<ApiError>(&ids)) return *e;
      if (auto e = checked(std::get<0>(std::move(ids)), r.echo_text)) {
        return *e;
      }
      if (rendered != nullptr)
        *rendered = std::get<std::string>(std::move(text));
      return out;
    }
    for (const serve::Prompt& p : r.prompts) {
      if (const auto* ids = std::get_if<std::vector<int32_t>>(&p)) {
        absl::StatusOr<std::string> text =
            tok->Decode(*ids, /*skip_special_tokens=*/false);
        if (auto e = checked(*ids, text.ok() ? *text : std::string())) {
          return *e;
        }
        continue;
      }
      const std::string& text = std::get<std::string>(p);
      auto ids = Tokenize(r, text);
      if (auto* e = std::get_if<ApiError>(&ids)) return *e;
      if (auto e = checked(std::get<0>(std::move(ids)), text)) return *e;
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

  void CancelAll(std::vector<Part>& parts) const {
    for (Part& p : parts) server->engine_->Cancel(p.stream->id());
  }

  // Validates every (prompt, choice) pair and submits them as one group; on
  // failure fills *error (nothing is left submitted).
  // `arrival`: when the HTTP request came (the metrics' e2e and TTFT start).
  std::vector<Part> Submit(const CompletionRequest& r,
                           Clock::time_point arrival,
                           std::optional<ApiError>* error) const {
    const int64_t prompts = r.endpoint == Endpoint::kChat
                                ? 1
                                : static_cast<int64_t>(r.prompts.size());
    const int64_t count = prompts * r.n;
    if (count > MaxParts()) {
      *error = serve::InvalidRequest(
          absl::StrCat("n x the number of prompts is ", r.n, " x ", prompts,
                       " = ", count, " completions, more than the ", MaxParts(),
                       " one request may ask for on this server"),
          r.n > 1 ? "n" : "prompt");
      return {};
    }
    std::string rendered;  // Chat: the prompt the template made.
    auto tokenized = Prompts(r, &rendered);
    if (auto* e = std::get_if<ApiError>(&tokenized)) {
      *error = *e;
      return {};
    }
    const auto& list = std::get<0>(tokenized);
    std::vector<Part> parts;
    std::vector<GenerationRequest> requests;
    for (size_t p = 0; p < list.size(); ++p) {
      for (int c = 0; c < r.n; ++c) {
        Part part;
        part.index = static_cast<int>(p) * r.n + c;
        part.prompt_ids = list[p].first;
        part.prompt_text = list[p].second;
        if (r.endpoint == Endpoint::kChat) {
          part.output = std::make_shared<serve::ChatOutput>(
              server->options_.output_formats, r, rendered);
        }
        GenerationRequest request =
            serve::ToGenerationRequest(r, part.prompt_ids, c, Defaults());
        // Checked here so that a bad request is a 400 before any streaming.
        const absl::Status valid = server->engine_->Check(request);
        if (!valid.ok()) {
          *error = SubmitError(valid);
          return {};
        }
        requests.push_back(std::move(request));
        parts.push_back(std::move(part));
      }
    }
    absl::StatusOr<std::vector<std::shared_ptr<RequestStream>>> streams =
        server->engine_->SubmitGroup(std::move(requests), arrival);
    if (!streams.ok()) {
      *error = SubmitError(streams.status());
      if (absl::IsResourceExhausted(streams.status())) {
        server->metrics_->CountHttpRequest(kHttpRejected);
      }
      return {};
    }
    server->metrics_->ObserveRequestN(r.n);
    const Clock::time_point now = Clock::now();
    for (size_t i = 0; i < parts.size(); ++i) {
      Part& part = parts[i];
      part.stream = (*streams)[i];
      part.last_event = now;
      part.last_token = part.prompt_ids.empty() ? -1 : part.prompt_ids.back();
    }
    return parts;
  }

  // Records a token made at `made_at` (the engine's time, not the time the
  // HTTP thread got it: tokens may be handed over several at once).
  // (TTFT and ITL are the AsyncEngine's to report: engine_observer.h.)
  void Observe(Part& part, Clock::time_point made_at) const {
    part.started = true;
    part.last_event = made_at;
    ++part.generated;
  }

  void Complete(const CompletionRequest& r, httplib::Response& res,
                Clock::time_point arrival) const {
    std::optional<ApiError> error;
    std::vector<Part> parts = Submit(r, arrival, &error);
    if (error) {
      if (error->http_status != 429)
        server->metrics_->CountHttpRequest(kHttpError);
      return SendError(res, *error);
    }
    // Counted until the response is written to its end (a stream: until its
    // provider is gone), so that a shutdown waits for the last words.
    auto in_flight = std::make_shared<InFlight>(server);
    serve::ResponseHeader header;
    header.id = serve::ResponseId(r);
    header.created = UnixSeconds();
    header.model = r.model;
    if (r.stream) {
      return Stream(r, header, std::move(parts), res, std::move(in_flight));
    }
    // Not streamed: nothing is sent until every choice is done, so that the
    // status says how the request ended. Meanwhile the connection is watched
    // (without writing): a client that goes away has its requests cancelled.
    Connection* connection = HttpServer::CurrentConnection();
    for (Part& part : parts) {
      while (!part.stream->done()) {
        Clock::time_point made_at;
        if (part.stream->Next(kPollInterval, &made_at)) {
          Observe(part, made_at);
        }
        if (connection != nullptr && connection->PeerClosed()) {
          CancelAll(parts);
          server->metrics_->CountHttpRequest(kHttpError);
          return Abandon(res);
        }
      }
    }
    std::optional<ApiError> failed;
    const std::string body = Body(r, header, parts, &failed);
    if (failed) return SendError(res, *failed);
    res.status = 200;
    res.set_content(body, "application/json");
  }

  // The response of finished parts; if one failed, *failed says how.
  std::string Body(const CompletionRequest& r,
                   const serve::ResponseHeader& header,
                   std::vector<Part>& parts,
                   std::optional<ApiError>* failed) const {
    std::vector<Choice> choices;
    serve::Usage usage;
    for (Part& part : parts) {
      absl::StatusOr<GenerationResult> result = part.stream->Wait();
      if (!result.ok()) {
        CancelAll(parts);
        server->metrics_->CountHttpRequest(kHttpError);
        *failed = serve::ApiErrorFromStatus(result.status());
        return std::string();
      }
      Choice choice;
      choice.index = part.index;
      choice.text = result->text.value_or("");
      if (part.output != nullptr) {
        serve::ChatOutputDelta out = part.output->All(choice.text);
        choice.text = std::move(out.content);
        choice.reasoning = std::move(out.reasoning);
        choice.tool_calls = std::move(out.tool_calls);
        choice.called_tools = part.output->finish_as_tool_calls();
      }
      if (r.echo) choice.text = part.prompt_text + choice.text;
      if (r.logprobs) {
        choice.logprobs = Logprobs(
            part.prompt_ids.empty() ? -1 : part.prompt_ids.back(),
            result->output_ids, result->logprobs, result->top_logprobs);
      }
      choice.finish_reason = result->finish_reason;
      choice.stop_reason = result->stop_reason;
      choices.push_back(std::move(choice));
      if (part.index % r.n == 0) {
        usage.prompt_tokens += static_cast<int64_t>(part.prompt_ids.size());
      }
      usage.completion_tokens +=
          static_cast<int64_t>(result->output_ids.size());
    }
    RecordUsage(usage);
    server->metrics_->CountHttpRequest(kHttpOk);
    return r.endpoint == Endpoint::kChat
               ? serve::ChatResponse(header, choices, usage)
               : serve::CompletionResponse(header, choices, usage);
  }

  // One response in flight (OpenAiServer::responses_in_flight) while alive.
  struct InFlight {
    explicit InFlight(OpenAiServer* server) : server(server) {
      server->responses_in_flight_.fetch_add(1);
    }
    ~InFlight() { server->responses_in_flight_.fetch_sub(1); }
    InFlight(const InFlight&) = delete;
    InFlight& operator=(const InFlight&) = delete;
    OpenAiServer* server;
  };

  void Stream(const CompletionRequest& r, const serve::ResponseHeader& header,
              std::vector<Part> parts, httplib::Response& res,
              std::shared_ptr<InFlight> in_flight) const {
    // The 200 goes out once every choice has its first token (or has ended):
    // a request the engine refuses as it enters still gets a real status.
    Connection* connection = HttpServer::CurrentConnection();
    for (Part& part : parts) {
      while (!part.stream->WaitReady(kPollInterval)) {
        if (connection != nullptr && connection->PeerClosed()) {
          CancelAll(parts);
          server->metrics_->CountHttpRequest(kHttpError);
          return Abandon(res);
        }
      }
    }
    for (Part& part : parts) {
      if (!part.stream->done()) continue;
      absl::StatusOr<GenerationResult> result = part.stream->Wait();
      if (!result.ok()) {
        CancelAll(parts);
        server->metrics_->CountHttpRequest(kHttpError);
        return SendError(res, serve::ApiErrorFromStatus(result.status()));
      }
    }
    auto shared = std::make_shared<std::vector<Part>>(std::move(parts));
    OpenAiServer* s = server;
    const Handlers self = *this;
    res.set_chunked_content_provider(
        "text/event-stream",
        [self, s, r, header, shared, in_flight](size_t,
                                                httplib::DataSink& sink) {
          std::vector<Part>& parts = *shared;
          Connection* connection = HttpServer::CurrentConnection();
          auto write = [&](const std::string& json) {
            const std::string event = serve::SseEvent(json);
            return sink.write(event.data(), event.size());
          };
          serve::Usage usage;
          for (const Part& p : parts) {
            if (p.index % r.n == 0) {
              usage.prompt_tokens += static_cast<int64_t>(p.prompt_ids.size());
            }
          }
          size_t open = parts.size();
          std::optional<absl::Status> failure;
          while (open > 0 && !failure) {
            bool idle = true;
            for (Part& part : parts) {
              if (part.finished) continue;
              // One part waits on its stream; several are polled in turn
              // (a round with nothing new sleeps briefly below), so that
              // n = 128 choices do not add 128 waits to every round.
              Clock::time_point made_at;
              std::optional<TokenEvent> e = part.stream->Next(
                  parts.size() == 1 ? kPollInterval
                                    : std::chrono::milliseconds(0),
                  &made_at);
              if (!e) {
                if (!part.stream->done()) continue;
                // Ended without a final event: failed.
                absl::StatusOr<GenerationResult> result = part.stream->Wait();
                part.finished = true;
                --open;
                if (!result.ok()) {
                  failure = result.status();
                  break;
                }
                continue;
              }
              idle = false;
              // Every event that is already there goes out in one write.
              std::string pending;
              while (e) {
                self.Observe(part, made_at);
                Choice choice;
                choice.index = part.index;
                choice.first = part.generated == 1;
                choice.text = e->text;
                if (part.output != nullptr) {
                  serve::ChatOutputDelta out = part.output->Feed(choice.text);
                  if (e->finished) {
                    serve::MergeChatOutput(part.output->Finish(), &out);
                    choice.called_tools = part.output->finish_as_tool_calls();
                  }
                  choice.text = std::move(out.content);
                  choice.reasoning = std::move(out.reasoning);
                  choice.tool_calls = std::move(out.tool_calls);
                }
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
                part.text_offset += serve::CountCodePoints(choice.text);
                if (e->finished) {
                  absl::StatusOr<GenerationResult> result = part.stream->Wait();
                  if (result.ok()) {
                    choice.finish_reason = result->finish_reason;
                    choice.stop_reason = result->stop_reason;
                  }
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
                // The client went away (or stopped reading).
                self.CancelAll(parts);
                s->metrics_->CountHttpRequest(kHttpError);
                return false;
              }
            }
            if (idle && connection != nullptr && connection->PeerClosed()) {
              self.CancelAll(parts);
              s->metrics_->CountHttpRequest(kHttpError);
              return false;
            }
            if (idle && parts.size() > 1) {
              std::this_thread::sleep_for(std::chrono::microseconds(500));
            }
          }
          if (failure) {
            // After the 200: an error event, then the end of the stream, as
            // vLLM sends them; the other choices are cancelled.
            self.CancelAll(parts);
            write(serve::ErrorBody(serve::ApiErrorFromStatus(*failure)));
          } else if (r.include_usage) {
            write(serve::UsageChunk(r.endpoint, header, usage));
          }
          sink.write(serve::kSseDone.data(), serve::kSseDone.size());
          sink.done();
          RecordUsage(usage);
          s->metrics_->CountHttpRequest(failure ? kHttpError : kHttpOk);
          return true;
        },
        [shared, s](bool success) {
          // Whatever is still open when the connection ends is cancelled.
          if (success) return;
          for (Part& p : *shared) s->engine_->Cancel(p.stream->id());
        });
  }
};

serve::ModelCard OpenAiServer::Card() const {
  serve::ModelCard card;
  card.id = options_.served_model_name;
  card.created = UnixSeconds();
  card.max_model_len = options_.max_model_len > 0
                           ? options_.max_model_len
                           : config_.max_position_embeddings;
  return card;
}

absl::Status OpenAiServer::Start() {
  Handlers handlers{this};
  const int64_t max_body = options_.max_request_bytes;

  // Before a handler: the head is complete (the body's allowance applies
  // from here), unknown routes are 404, wrong methods 405, and a declared
  // body over the limit is 413 before a byte of it is read.
  http_->set_pre_routing_handler([this, max_body](const httplib::Request& req,
                                                  httplib::Response& res) {
    if (Connection* c = HttpServer::CurrentConnection()) c->BodyStarted();
    t_access = AccessRecord{};
    t_access.started = true;
    t_access.start = Clock::now();
    // CORS first: a preflight is answered without the key (browsers send
    // none), and every other answer, a 401 too, carries the headers that
    // let the page read it.
    if (cors_.enabled()) {
      const std::string origin = req.get_header_value("Origin");
      if (cors_.IsPreflight(
              req.method, origin,
              req.get_header_value("Access-Control-Request-Method"))) {
        const serve::CorsPolicy::Preflight answer = cors_.AnswerPreflight(
            origin, req.get_header_value("Access-Control-Request-Method"),
            req.get_header_value("Access-Control-Request-Headers"));
        if (HasBody(req)) CloseAfter(res);
        for (const auto& [name, value] : answer.headers) {
          res.set_header(name.c_str(), value);
        }
        res.status = answer.status;
        res.set_content(answer.body, "text/plain; charset=utf-8");
        return httplib::Server::HandlerResponse::Handled;
      }
      for (const auto& [name, value] :
           cors_.SimpleHeaders(origin, req.has_header("Cookie"))) {
        res.set_header(name.c_str(), value);
      }
    }
    // The key, before routing (vLLM's middleware): without it, a guarded
    // path is 401 whether or not it exists.
    if (!options_.api_key.empty() && serve::NeedsApiKey(req.path) &&
        !serve::ApiKeyMatches(req.get_header_value("Authorization"),
                              options_.api_key)) {
      if (HasBody(req)) CloseAfter(res);
      res.status = 401;
      res.set_header("WWW-Authenticate", "Bearer");
      res.set_content(serve::UnauthorizedBody(req.has_header("Authorization")),
                      "application/json");
      return httplib::Server::HandlerResponse::Handled;
    }
    const std::string method = req.method == "HEAD" ? "GET" : req.method;
    const Route* route = nullptr;
    for (const Route& r : kRoutes) {
      const bool match = r.prefix ? absl::StartsWith(req.path, r.path) &&
                                        req.path.size() > std::strlen(r.path)
                                  : req.path == r.path;
      if (match) {
        route = &r;
        break;
      }
    }
    if (route == nullptr || method != route->method) {
      if (HasBody(req)) CloseAfter(res);
      if (route == nullptr) {
        SendError(res, serve::RouteNotFound(req.method, req.path));
      } else {
        res.set_header("Allow", route->method);
        SendError(res,
                  serve::MethodNotAllowed(req.method, req.path, route->method));
      }
      metrics_->CountHttpRequest(kHttpError);
      return httplib::Server::HandlerResponse::Handled;
    }
    const std::string length = req.get_header_value("Content-Length");
    if (!length.empty()) {
      uint64_t declared = 0;
      if (!absl::SimpleAtoi(length, &declared)) {
        CloseAfter(res);
        SendError(res, serve::InvalidRequest("the Content-Length header is "
                                             "not a number"));
        return httplib::Server::HandlerResponse::Handled;
      }
      if (declared > static_cast<uint64_t>(max_body)) {
        CloseAfter(res);
        SendError(res, TooLarge(max_body));
        metrics_->CountHttpRequest(kHttpError);
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  // "Expect: 100-continue" with a body over the limit: 413 instead of 100.
  http_->set_expect_100_continue_handler([max_body](const httplib::Request& req,
                                                    httplib::Response& res) {
    uint64_t declared = 0;
    if (absl::SimpleAtoi(req.get_header_value("Content-Length"), &declared) &&
        declared > static_cast<uint64_t>(max_body)) {
      CloseAfter(res);
      SendError(res, TooLarge(max_body));
      return 413;
    }
    return 100;
  });
  // httplib's own refusals (a malformed request line or header, a URI over
  // 8 KiB, ...) come without a body: give them an OpenAI-shaped one.
  http_->set_error_handler(httplib::Server::HandlerWithResponse(
      [](const httplib::Request&, httplib::Response& res) {
        if (!res.body.empty() || res.has_header("Content-Type")) {
          return httplib::Server::HandlerResponse::Unhandled;
        }
        SendError(res, Error(res.status,
                             absl::StrCat("the server could not take the "
                                          "request (HTTP ",
                                          res.status, ")"),
                             res.status >= 500 ? "server_error"
                                               : "invalid_request_error",
                             ""));
        return httplib::Server::HandlerResponse::Handled;
      }));

  http_->Get(
      "/health", [this](const httplib::Request&, httplib::Response& res) {
        switch (engine_->state()) {
          case AsyncEngine::State::kServing:
            res.set_content("", "text/plain");
            return;
          case AsyncEngine::State::kDraining:
            return SendError(res, Error(503, "the server is shutting down",
                                        "service_unavailable", ""));
          case AsyncEngine::State::kFailed:
            return SendError(
                res, Error(503, "the engine has failed", "server_error", ""));
        }
      });
  http_->Get("/version",
             [this](const httplib::Request&, httplib::Response& res) {
               res.set_content(serve::VersionResponse(options_.version),
                               "application/json");
             });
  http_->Get(
      "/v1/models", [this](const httplib::Request&, httplib::Response& res) {
        res.set_content(serve::ModelsResponse(Card()), "application/json");
      });
  http_->Get("/v1/models/(.+)", [this](const httplib::Request& req,
                                       httplib::Response& res) {
    const std::string id = req.matches.size() > 1 ? req.matches[1].str() : "";
    if (id != options_.served_model_name) {
      return SendError(res, serve::ModelNotFound(id));
    }
    res.set_content(serve::ModelResponse(Card()), "application/json");
  });
  http_->Get(
      "/metrics", [this](const httplib::Request&, httplib::Response& res) {
        RefreshEngineMetrics();
        res.set_content(metrics_->Render(),
                        std::string(ServingMetrics::kContentType).c_str());
      });
  auto post = [this, handlers, max_body](Endpoint endpoint) {
    return [this, handlers, endpoint, max_body](
               const httplib::Request&, httplib::Response& res,
               const httplib::ContentReader& reader) {
      const Clock::time_point arrival = Clock::now();
      // The body, decoded (chunked, gzip), within the limit as it comes.
      std::string body;
      bool too_large = false;
      const bool read = reader([&](const char* data, size_t n) {
        if (body.size() + n > static_cast<size_t>(max_body)) {
          too_large = true;
          return false;
        }
        body.append(data, n);
        return true;
      });
      if (too_large || !read) {
        CloseAfter(res);
        metrics_->CountHttpRequest(kHttpError);
        return SendError(
            res, too_large
                     ? TooLarge(max_body)
                     : serve::InvalidRequest(
                           "the request body could not be read (malformed "
                           "chunked or compressed data, too slow, or cut "
                           "short)"));
      }
      serve::ParseOptions parse_options;
      parse_options.max_logprobs = options_.max_logprobs;
      parse_options.auto_tool_choice =
          options_.output_formats.tool_calls != nullptr;
      serve::ParseResult parsed =
          endpoint == Endpoint::kChat
              ? serve::ParseChatRequest(body, parse_options)
              : serve::ParseCompletionRequest(body, parse_options);
      if (auto* e = std::get_if<ApiError>(&parsed)) {
        metrics_->CountHttpRequest(kHttpError);
        return SendError(res, *e);
      }
      CompletionRequest& r = std::get<CompletionRequest>(parsed);
      // Calls marked by special tokens (Mistral's [TOOL_CALLS]) must stay
      // in the text the parser reads (vLLM's adjust_request).
      if (r.tool_choice == serve::ToolChoice::kAuto &&
          options_.output_formats.tool_calls != nullptr &&
          options_.output_formats.tool_calls->needs_special_tokens()) {
        r.skip_special_tokens = false;
      }
      // Fields that have no effect are never dropped silently (vLLM logs
      // them the same way).
      if (const std::string warning = serve::IgnoredFieldsWarning(r);
          !warning.empty()) {
        std::cerr << "[tessera] warning: " << warning << "\n";
      }
      if (r.model != options_.served_model_name) {
        metrics_->CountHttpRequest(kHttpError);
        return SendError(res, serve::ModelNotFound(r.model));
      }
      handlers.Complete(r, res, arrival);
    };
  };
  http_->Post("/v1/completions", post(Endpoint::kCompletions));
  http_->Post("/v1/chat/completions", post(Endpoint::kChat));
  // vLLM's tokenizer endpoints. Nothing reaches the engine.
  auto tokenizer_post = [this, handlers, max_body](bool detokenize) {
    return [this, handlers, max_body, detokenize](
               const httplib::Request&, httplib::Response& res,
               const httplib::ContentReader& reader) {
      std::string body;
      bool too_large = false;
      const bool read = reader([&](const char* data, size_t n) {
        if (body.size() + n > static_cast<size_t>(max_body)) {
          too_large = true;
          return false;
        }
        body.append(data, n);
        return true;
      });
      if (too_large || !read) {
        CloseAfter(res);
        return SendError(
            res, too_large ? TooLarge(max_body)
                           : serve::InvalidRequest(
                                 "the request body could not be read "
                                 "(malformed chunked or compressed data, too "
                                 "slow, or cut short)"));
      }
      std::vector<std::string> ignored;
      if (detokenize) {
        const int64_t vocab =
            std::max<int64_t>(tokenizer_->vocab_size(), config_.vocab_size);
        serve::DetokenizeParseResult parsed =
            serve::ParseDetokenizeRequest(body, vocab);
        if (auto* e = std::get_if<ApiError>(&parsed)) return SendError(res, *e);
        const auto& d = std::get<serve::DetokenizeRequest>(parsed);
        ignored = d.ignored_fields;
        handlers.DetokenizeEndpoint(d, res);
      } else {
        serve::TokenizeParseResult parsed = serve::ParseTokenizeRequest(body);
        if (auto* e = std::get_if<ApiError>(&parsed)) return SendError(res, *e);
        const auto& t = std::get<serve::TokenizeRequest>(parsed);
        ignored = t.request.ignored_fields;
        handlers.TokenizeEndpoint(t, res);
      }
      if (!ignored.empty()) {
        CompletionRequest names;
        names.ignored_fields = std::move(ignored);
        std::cerr << "[tessera] warning: " << serve::IgnoredFieldsWarning(names)
                  << "\n";
      }
    };
  };
  http_->Post("/tokenize", tokenizer_post(/*detokenize=*/false));
  http_->Post("/detokenize", tokenizer_post(/*detokenize=*/true));
  if (options_.access_log) {
    http_->set_logger(
        [this](const httplib::Request& req, const httplib::Response& res) {
          serve::AccessLogEntry entry;
          entry.remote_addr = req.remote_addr;
          entry.remote_port = req.remote_port;
          entry.method = req.method;
          entry.path = req.path;
          entry.status = res.status;
          if (t_access.started) {
            entry.seconds =
                std::chrono::duration<double>(Clock::now() - t_access.start)
                    .count();
            entry.prompt_tokens = t_access.prompt_tokens;
            entry.generation_tokens = t_access.generation_tokens;
          }
          t_access = AccessRecord{};
          const std::string line = serve::AccessLogLine(entry) + "\n";
          if (options_.log) {
            options_.log(line);
          } else {
            std::cerr << line;
          }
        });
  }

  port_ = http_->Bind(options_.host, options_.port);
  if (port_ <= 0) {
    return absl::UnavailableError(
        options_.port == 0
            ? absl::StrCat("cannot bind ", options_.host, " to any port")
            : absl::StrCat("cannot bind ", options_.host, ":", options_.port,
                           " (in use, or not an address of this host)"));
  }
  listener_ = std::thread([this] { http_->listen_after_bind(); });
  return absl::OkStatus();
}

void OpenAiServer::Stop() {
  if (http_) http_->Stop();
  if (listener_.joinable()) listener_.join();
}

bool OpenAiServer::WaitForResponses(std::chrono::milliseconds timeout) const {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (responses_in_flight_.load() > 0) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

}  // namespace tessera
