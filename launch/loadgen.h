// `tessera loadgen`: drives an OpenAI-compatible server (tessera serve, vLLM,
// ...) with streaming /v1/completions requests at a fixed concurrency and
// measures what a user sees: request throughput, output tokens/s, time to
// first token and time per output token (p50/p99).
//
// Token counts are the server's own (each request asks for
// stream_options.include_usage), not a count of events. The client is C++ so
// that, when it shares the server's CPUs, it takes as little of them as it
// can: the numbers should describe the server, not the client.
#ifndef TESSERA_LAUNCH_LOADGEN_H_
#define TESSERA_LAUNCH_LOADGEN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tessera {

struct LoadgenOptions {
  std::string url = "http://127.0.0.1:8000";  // scheme://host:port
  std::string model;                          // The "model" of each request.
  int64_t concurrency = 1;                    // Requests in flight at once.
  int64_t requests = 32;                      // Requests in all.
  int64_t max_tokens = 128;  // Per request; EOS is ignored, so all are made.
  std::string prompt = "Once upon a time";
};

struct LoadgenSummary {
  int64_t concurrency = 0;
  int64_t requests = 0;  // Completed.
  std::vector<std::string> errors;
  double seconds = 0;
  int64_t output_tokens = 0;
  double requests_per_s = 0;
  double output_tokens_per_s = 0;
  double ttft_p50_ms = 0, ttft_p99_ms = 0;  // NaN when nothing completed.
  double tpot_p50_ms = 0, tpot_p99_ms = 0;  // Over requests of 2+ tokens.

  std::string ToText() const;  // One line, for people.
  std::string ToJson() const;  // One JSON object, for scripts.
};

// Runs the load and returns what it measured; failed requests are counted in
// `errors` (with the server's message), not returned as a status.
// InvalidArgument for bad options (an unparsable URL, concurrency < 1, ...).
absl::StatusOr<LoadgenSummary> RunLoadgen(const LoadgenOptions& options);

}  // namespace tessera

#endif  // TESSERA_LAUNCH_LOADGEN_H_
