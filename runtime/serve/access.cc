#include "runtime/serve/access.h"

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "nlohmann/json.hpp"
#include "runtime/core/json_limits.h"

namespace tessera {
namespace serve {
namespace {

using Json = nlohmann::ordered_json;

constexpr size_t kMaxLoggedPathBytes = 200;

bool Contains(const std::vector<std::string>& list, absl::string_view value) {
  return std::find(list.begin(), list.end(), value) != list.end();
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ParseListFlag(absl::string_view flag,
                                                       absl::string_view text) {
  std::vector<std::string> out;
  const absl::string_view trimmed = absl::StripAsciiWhitespace(text);
  if (absl::StartsWith(trimmed, "[")) {
    if (!CheckJsonNesting(trimmed).ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": not a JSON list of strings"));
    }
    const Json list = Json::parse(trimmed.begin(), trimmed.end(), nullptr,
                                  /*allow_exceptions=*/false);
    if (list.is_discarded() || !list.is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": not a JSON list of strings: ", trimmed));
    }
    for (const Json& item : list) {
      if (!item.is_string()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--", flag, ": every item of the JSON list must be a string"));
      }
      const absl::string_view value =
          absl::StripAsciiWhitespace(item.get_ref<const std::string&>());
      if (!value.empty()) out.emplace_back(value);
    }
    return out;
  }
  for (absl::string_view piece : absl::StrSplit(trimmed, ',')) {
    piece = absl::StripAsciiWhitespace(piece);
    if (!piece.empty()) out.emplace_back(piece);
  }
  return out;
}

bool NeedsApiKey(absl::string_view path) {
  return path == "/v1" || absl::StartsWith(path, "/v1/") ||
         path == "/tokenize" || path == "/detokenize";
}

bool ApiKeyMatches(absl::string_view authorization, absl::string_view key) {
  constexpr absl::string_view kScheme = "bearer ";
  if (key.empty() || authorization.size() < kScheme.size() ||
      !absl::EqualsIgnoreCase(authorization.substr(0, kScheme.size()),
                              kScheme)) {
    return false;
  }
  absl::string_view given = authorization.substr(kScheme.size());
  while (!given.empty() && given.front() == ' ') given.remove_prefix(1);
  // Every byte of the longer one is looked at whatever differs, so the time
  // tells at most the lengths.
  const size_t n = std::max(given.size(), key.size());
  unsigned char diff = given.size() == key.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char a =
        i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
    const unsigned char b =
        i < key.size() ? static_cast<unsigned char>(key[i]) : 0;
    diff |= a ^ b;
  }
  // Read through a volatile so that the compiler cannot end the loop early.
  volatile unsigned char result = diff;
  return result == 0;
}

std::string UnauthorizedBody(bool given) {
  Json error = Json::object();
  error["message"] =
      given ? "Incorrect API key provided (the server's --api-key or "
              "TESSERA_API_KEY; send it as \"Authorization: Bearer KEY\")."
            : "You didn't provide an API key. Send it as \"Authorization: "
              "Bearer KEY\" (the server's --api-key or TESSERA_API_KEY).";
  error["type"] = "invalid_request_error";
  error["param"] = nullptr;
  error["code"] = "invalid_api_key";
  Json body = Json::object();
  body["error"] = std::move(error);
  return body.dump();
}

CorsPolicy::CorsPolicy(CorsOptions options) : options_(std::move(options)) {
  any_origin_ = Contains(options_.allowed_origins, "*");
  any_method_ = Contains(options_.allowed_methods, "*");
  any_header_ = Contains(options_.allowed_headers, "*");
  if (any_method_) {
    // Starlette's expansion of "*".
    methods_ = {"DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT"};
  } else {
    for (const std::string& m : options_.allowed_methods) {
      methods_.push_back(absl::AsciiStrToUpper(m));
    }
  }
  // The CORS-safelisted request headers are always allowed (Starlette's
  // rule); sorted and lower case, as Starlette lists them.
  headers_ = {"accept", "accept-language", "content-language", "content-type"};
  if (!any_header_) {
    for (const std::string& h : options_.allowed_headers) {
      const std::string lower = absl::AsciiStrToLower(h);
      if (!Contains(headers_, lower)) headers_.push_back(lower);
    }
  }
  std::sort(headers_.begin(), headers_.end());
}

bool CorsPolicy::OriginAllowed(absl::string_view origin) const {
  return any_origin_ || Contains(options_.allowed_origins, origin);
}

bool CorsPolicy::IsPreflight(absl::string_view method, absl::string_view origin,
                             absl::string_view request_method) const {
  return enabled() && method == "OPTIONS" && !origin.empty() &&
         !request_method.empty();
}

CorsPolicy::Preflight CorsPolicy::AnswerPreflight(
    absl::string_view origin, absl::string_view request_method,
    absl::string_view request_headers) const {
  Preflight out;
  std::vector<std::string> failures;
  // An explicit origin (not "*") when only some are allowed, or with
  // credentials (browsers refuse "*" then).
  const bool explicit_origin = !any_origin_ || options_.allow_credentials;
  if (OriginAllowed(origin)) {
    out.headers.emplace_back("Access-Control-Allow-Origin",
                             explicit_origin ? std::string(origin) : "*");
  } else {
    failures.push_back("origin");
  }
  if (explicit_origin) out.headers.emplace_back("Vary", "Origin");
  out.headers.emplace_back("Access-Control-Allow-Methods",
                           absl::StrJoin(methods_, ", "));
  out.headers.emplace_back("Access-Control-Max-Age", "600");
  if (options_.allow_credentials) {
    out.headers.emplace_back("Access-Control-Allow-Credentials", "true");
  }
  if (!Contains(methods_, request_method)) failures.push_back("method");
  const bool headers_asked =
      !absl::StripAsciiWhitespace(request_headers).empty();
  if (any_header_) {
    // Every header is allowed: the ones asked for are mirrored back.
    if (headers_asked) {
      out.headers.emplace_back("Access-Control-Allow-Headers",
                               std::string(request_headers));
    }
  } else {
    out.headers.emplace_back("Access-Control-Allow-Headers",
                             absl::StrJoin(headers_, ", "));
    if (headers_asked) {
      for (absl::string_view h : absl::StrSplit(request_headers, ',')) {
        h = absl::StripAsciiWhitespace(h);
        if (h.empty()) continue;
        if (!Contains(headers_, absl::AsciiStrToLower(h))) {
          failures.push_back("headers");
          break;
        }
      }
    }
  }
  if (failures.empty()) {
    out.status = 200;
    out.body = "OK";
  } else {
    out.status = 400;
    out.body = absl::StrCat("Disallowed CORS ", absl::StrJoin(failures, ", "));
  }
  return out;
}

Headers CorsPolicy::SimpleHeaders(absl::string_view origin,
                                  bool has_cookie) const {
  Headers out;
  if (!enabled() || origin.empty() || !OriginAllowed(origin)) return out;
  // A request with cookies must get its own origin back, not "*".
  if (any_origin_ && !options_.allow_credentials && !has_cookie) {
    out.emplace_back("Access-Control-Allow-Origin", "*");
  } else {
    out.emplace_back("Access-Control-Allow-Origin", std::string(origin));
    out.emplace_back("Vary", "Origin");
  }
  if (options_.allow_credentials) {
    out.emplace_back("Access-Control-Allow-Credentials", "true");
  }
  return out;
}

std::string AccessLogLine(const AccessLogEntry& e) {
  // The path is the client's: cut, and anything that is not printable ASCII
  // (a newline that would start a forged line, a quote) escaped.
  std::string path;
  const absl::string_view raw = e.path;
  size_t i = 0;
  for (; i < raw.size() && path.size() < kMaxLoggedPathBytes; ++i) {
    const unsigned char c = static_cast<unsigned char>(raw[i]);
    if (c < 0x20 || c >= 0x7f || c == '"' || c == '\\') {
      absl::StrAppendFormat(&path, "\\x%02x", c);
    } else {
      path += static_cast<char>(c);
    }
  }
  if (i < raw.size()) path += "...";
  std::string method;
  for (char c : e.method) {
    if (absl::ascii_isalpha(static_cast<unsigned char>(c))) method += c;
  }
  const bool v6 = e.remote_addr.find(':') != std::string::npos;
  std::string line =
      absl::StrFormat("[tessera] access: %s%s%s:%d \"%s %s\" %d %.3fs",
                      v6 ? "[" : "", e.remote_addr, v6 ? "]" : "",
                      e.remote_port, method, path, e.status, e.seconds);
  if (e.prompt_tokens)
    absl::StrAppend(&line, " prompt_tokens=", *e.prompt_tokens);
  if (e.generation_tokens) {
    absl::StrAppend(&line, " generation_tokens=", *e.generation_tokens);
  }
  return line;
}

}  // namespace serve
}  // namespace tessera
