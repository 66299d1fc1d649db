#include "launch/loadgen.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "httplib.h"
#include "nlohmann/json.hpp"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

struct Measured {
  double ttft_s = 0;
  double total_s = 0;
  int64_t tokens = 0;
};

// Linear interpolation between the closest ranks (numpy's default).
double Percentile(std::vector<double> values, double q) {
  if (values.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(values.begin(), values.end());
  const double k = static_cast<double>(values.size() - 1) * q;
  const size_t lo = static_cast<size_t>(k);
  const size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (values[hi] - values[lo]) * (k - static_cast<double>(lo));
}

// The usage of the last data event, from a whole SSE body (events are
// separated by a blank line; the last data event before [DONE] carries it).
std::optional<int64_t> CompletionTokens(absl::string_view body) {
  std::vector<absl::string_view> events = absl::StrSplit(body, "\n\n");
  for (auto it = events.rbegin(); it != events.rend(); ++it) {
    absl::string_view event = absl::StripAsciiWhitespace(*it);
    if (!absl::ConsumePrefix(&event, "data: ")) continue;
    if (!absl::StartsWith(event, "{")) continue;  // [DONE]
    nlohmann::json data = nlohmann::json::parse(event, nullptr, false);
    if (data.is_discarded()) return std::nullopt;
    const auto usage = data.find("usage");
    if (usage == data.end() || !usage->is_object()) return std::nullopt;
    const auto tokens = usage->find("completion_tokens");
    if (tokens == usage->end() || !tokens->is_number_integer()) {
      return std::nullopt;
    }
    return tokens->get<int64_t>();
  }
  return std::nullopt;
}

// One streamed completion on `client` (kept alive between requests, as
// OpenAI's clients pool their connections).
absl::StatusOr<Measured> OneRequest(httplib::Client& client,
                                    const std::string& body) {
  std::string received;
  std::optional<Clock::time_point> first;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.headers = {{"Content-Type", "application/json"}};
  req.body = body;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (!first) first = Clock::now();
    received.append(data, n);
    return true;
  };
  const Clock::time_point start = Clock::now();
  httplib::Result result = client.send(req);
  const Clock::time_point end = Clock::now();
  if (!result) {
    return absl::UnavailableError(
        absl::StrCat("request failed: ", httplib::to_string(result.error())));
  }
  if (result->status != 200) {
    return absl::InternalError(
        absl::StrCat("HTTP ", result->status, ": ", received.substr(0, 300)));
  }
  const std::optional<int64_t> tokens = CompletionTokens(received);
  if (!tokens) {
    return absl::InternalError(
        absl::StrCat("the stream carried no usage: ", received.substr(0, 300)));
  }
  Measured m;
  m.total_s = std::chrono::duration<double>(end - start).count();
  m.ttft_s =
      first ? std::chrono::duration<double>(*first - start).count() : m.total_s;
  m.tokens = *tokens;
  return m;
}

}  // namespace

absl::StatusOr<LoadgenSummary> RunLoadgen(const LoadgenOptions& o) {
  if (o.concurrency < 1 || o.requests < 1 || o.max_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--concurrency (", o.concurrency, "), --requests (", o.requests,
        ") and --max-tokens (", o.max_tokens, ") must be at least 1"));
  }
  if (o.model.empty()) {
    return absl::InvalidArgumentError("--model is required");
  }
  if (!absl::StartsWith(o.url, "http://")) {
    return absl::InvalidArgumentError(
        absl::StrCat("--url \"", o.url, "\" must look like http://HOST:PORT"));
  }
  {
    httplib::Client probe(o.url);
    if (!probe.is_valid()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--url \"", o.url, "\" is not a valid server URL"));
    }
  }
  const std::string body =
      nlohmann::json{{"model", o.model},
                     {"prompt", o.prompt},
                     {"max_tokens", o.max_tokens},
                     {"temperature", 0},
                     {"ignore_eos", true},
                     {"stream", true},
                     {"stream_options", {{"include_usage", true}}}}
          .dump();

  std::mutex mu;
  int64_t remaining = o.requests;
  std::vector<Measured> done;
  std::vector<std::string> errors;
  const Clock::time_point start = Clock::now();
  std::vector<std::thread> workers;
  for (int64_t w = 0; w < std::min(o.concurrency, o.requests); ++w) {
    workers.emplace_back([&] {
      httplib::Client client(o.url);
      client.set_keep_alive(true);
      client.set_tcp_nodelay(true);  // The body must not wait for an ACK.
      client.set_read_timeout(600, 0);
      while (true) {
        {
          std::lock_guard<std::mutex> lock(mu);
          if (remaining == 0) return;
          --remaining;
        }
        absl::StatusOr<Measured> m = OneRequest(client, body);
        std::lock_guard<std::mutex> lock(mu);
        if (m.ok()) {
          done.push_back(*m);
        } else {
          errors.push_back(std::string(m.status().message()));
        }
      }
    });
  }
  for (std::thread& t : workers) t.join();

  LoadgenSummary s;
  s.concurrency = o.concurrency;
  s.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  s.requests = static_cast<int64_t>(done.size());
  s.errors = std::move(errors);
  std::vector<double> ttft, tpot;
  for (const Measured& m : done) {
    s.output_tokens += m.tokens;
    ttft.push_back(m.ttft_s);
    if (m.tokens > 1) {
      tpot.push_back((m.total_s - m.ttft_s) /
                     static_cast<double>(m.tokens - 1));
    }
  }
  s.requests_per_s = static_cast<double>(s.requests) / s.seconds;
  s.output_tokens_per_s = static_cast<double>(s.output_tokens) / s.seconds;
  s.ttft_p50_ms = Percentile(ttft, 0.5) * 1e3;
  s.ttft_p99_ms = Percentile(ttft, 0.99) * 1e3;
  s.tpot_p50_ms = Percentile(tpot, 0.5) * 1e3;
  s.tpot_p99_ms = Percentile(tpot, 0.99) * 1e3;
  return s;
}

std::string LoadgenSummary::ToText() const {
  std::string text = absl::StrFormat(
      "concurrency %d: %d requests in %.2f s (%.2f req/s), %d output tokens "
      "(%.1f tok/s); TTFT p50 %.2f ms p99 %.2f ms; TPOT p50 %.3f ms p99 %.3f "
      "ms",
      concurrency, requests, seconds, requests_per_s, output_tokens,
      output_tokens_per_s, ttft_p50_ms, ttft_p99_ms, tpot_p50_ms, tpot_p99_ms);
  if (!errors.empty()) {
    absl::StrAppend(&text, "; ", errors.size(),
                    " errors, the first: ", errors.front());
  }
  return text;
}

std::string LoadgenSummary::ToJson() const {
  // NaN is not JSON: a percentile of nothing is null.
  auto number = [](double v) {
    return std::isnan(v) ? nlohmann::json(nullptr) : nlohmann::json(v);
  };
  return nlohmann::json{{"concurrency", concurrency},
                        {"requests", requests},
                        {"errors", errors.size()},
                        {"first_error", errors.empty() ? "" : errors.front()},
                        {"seconds", seconds},
                        {"requests_per_s", requests_per_s},
                        {"output_tokens", output_tokens},
                        {"output_tokens_per_s", output_tokens_per_s},
                        {"ttft_p50_ms", number(ttft_p50_ms)},
                        {"ttft_p99_ms", number(ttft_p99_ms)},
                        {"tpot_p50_ms", number(tpot_p50_ms)},
                        {"tpot_p99_ms", number(tpot_p99_ms)}}
      .dump();
}

}  // namespace tessera
