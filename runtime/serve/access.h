// Access control and the access log of the OpenAI front end: pure functions,
// no HTTP (openai_server.cc applies them to every request).
//
//  - API keys (vLLM's --api-key; Tessera also reads TESSERA_API_KEY): the
//    routes NeedsApiKey names need "Authorization: Bearer KEY", compared in
//    constant time; a missing or wrong key is 401 with UnauthorizedBody()
//    and "WWW-Authenticate: Bearer" (RFC 6750). /health, /metrics and
//    /version stay open, as vLLM keeps them, for probes and scrapers; so do
//    CORS preflights (a browser sends them without credentials).
//  - CORS (vLLM's --allowed-origins, --allowed-methods, --allowed-headers,
//    --allow-credentials, answered as Starlette's CORSMiddleware, which vLLM
//    uses, answers): CorsPolicy. Without --allowed-origins no CORS header is
//    sent (vLLM allows "*" by default; Tessera does not open a server to
//    every web page unless asked).
//  - The access log: one line per request (AccessLogLine).
#ifndef TESSERA_RUNTIME_SERVE_ACCESS_H_
#define TESSERA_RUNTIME_SERVE_ACCESS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tessera {
namespace serve {

// Seconds a 429 (the server's --max-pending queue is full) tells clients to
// wait (Retry-After). A place frees when any open request finishes, which on
// a busy server is a matter of moments, so a long wait would only idle it;
// but clients retrying at once would turn a full queue into a busy loop of
// refusals. One second (what the connection cap's 503 says too) is what the
// official openai clients then wait, instead of their own backoff.
inline constexpr int kRetryAfterSeconds = 1;

// A flag's list: a JSON list of strings ('["*"]', as vLLM takes it) or a
// comma-separated list ("http://a.test, http://b.test"); items are trimmed
// and empty ones dropped. InvalidArgument naming `flag` for JSON that is not
// a list of strings.
absl::StatusOr<std::vector<std::string>> ParseListFlag(absl::string_view flag,
                                                       absl::string_view text);

// Whether a request for `path` needs the API key (when one is set): every
// /v1/* route, /tokenize and /detokenize (vLLM checks /v1 only; Tessera's
// tokenizer routes cost tokenizer time, so they are guarded too). /health,
// /metrics, /version and unknown paths outside /v1 do not.
bool NeedsApiKey(absl::string_view path);

// Whether `authorization` (the header's value) is "Bearer <key>" ("bearer"
// in any case, spaces after it skipped). The key is compared in time that
// depends only on the lengths, never on where the first difference is.
bool ApiKeyMatches(absl::string_view authorization, absl::string_view key);

// The 401's body: {"error": {"message": ..., "type": "invalid_request_error",
// "param": null, "code": "invalid_api_key"}} (OpenAI's shape and code).
// `given`: whether an Authorization header came (the message says which).
std::string UnauthorizedBody(bool given);

using Headers = std::vector<std::pair<std::string, std::string>>;

// What --allowed-origins and its companions ask for. "*" in a list allows
// every value.
struct CorsOptions {
  std::vector<std::string> allowed_origins;  // Empty: CORS off.
  std::vector<std::string> allowed_methods = {"*"};
  std::vector<std::string> allowed_headers = {"*"};
  bool allow_credentials = false;
};

class CorsPolicy {
 public:
  explicit CorsPolicy(CorsOptions options);

  bool enabled() const { return !options_.allowed_origins.empty(); }

  // Whether a request is a CORS preflight: OPTIONS with Origin and
  // Access-Control-Request-Method (what Starlette answers itself). Only
  // when enabled; otherwise OPTIONS goes to the routes (405).
  bool IsPreflight(absl::string_view method, absl::string_view origin,
                   absl::string_view request_method) const;

  struct Preflight {
    int status = 200;  // 200, or 400 when something asked is not allowed.
    std::string body;  // "OK", or "Disallowed CORS origin, method, headers".
    Headers headers;
  };
  // The answer to a preflight from `origin` for `request_method` and the
  // comma-separated `request_headers` (empty: none asked): Allow-Origin
  // ("*", or the origin itself with credentials or a list of origins, plus
  // "Vary: Origin"), Allow-Methods, Allow-Headers (the request's own when
  // every header is allowed), Max-Age 600, Allow-Credentials.
  Preflight AnswerPreflight(absl::string_view origin,
                            absl::string_view request_method,
                            absl::string_view request_headers) const;

  // The headers of any other response to a request with an Origin header
  // (none without one, or when the origin is not allowed): Allow-Origin as
  // above ("*" unless credentials, a list, or a request with cookies make
  // it the origin itself), Vary: Origin then, Allow-Credentials.
  Headers SimpleHeaders(absl::string_view origin, bool has_cookie) const;

 private:
  bool OriginAllowed(absl::string_view origin) const;

  CorsOptions options_;
  bool any_origin_ = false;
  bool any_method_ = false;
  bool any_header_ = false;
  std::vector<std::string> methods_;  // Upper case; "*" expanded.
  std::vector<std::string> headers_;  // Lower case, with the safelisted ones.
};

// One request as the access log records it.
struct AccessLogEntry {
  std::string remote_addr;  // IP address.
  int remote_port = 0;
  std::string method;
  std::string path;  // Without the query.
  int status = 0;
  double seconds = 0;  // From the request's head to the response's end.
  // Tokens of a completion (unset elsewhere, or when it did not get that
  // far).
  std::optional<int64_t> prompt_tokens;
  std::optional<int64_t> generation_tokens;
};

// `[tessera] access: 127.0.0.1:54321 "POST /v1/completions" 200 0.153s
// prompt_tokens=5 generation_tokens=16` (the token fields only when known;
// the path cut to 200 bytes, and bytes outside printable ASCII escaped as
// \xNN, so that a client cannot forge log lines).
std::string AccessLogLine(const AccessLogEntry& entry);

}  // namespace serve
}  // namespace tessera

#endif  // TESSERA_RUNTIME_SERVE_ACCESS_H_
