// Prints a populated ServingMetrics in text format 0.0.4 to stdout, for
// metrics_promtool_test.sh (`promtool check metrics`): every family, after a
// request of each finished reason, a few steps and tokens, an HTTP request of
// each outcome and one engine snapshot.
#include <iostream>

#include "runtime/serve/metrics.h"

namespace tessera {
namespace {

int Main() {
  ServingMetrics m("stories260K", 512);
  for (int i = 0; i < 4; ++i) m.OnStep(i == 0 ? 300 : 4);
  m.ObserveRequestN(1);
  m.ObserveRequestN(3);
  const char* reasons[] = {"stop", "length", "abort", "error"};
  for (int i = 0; i < 4; ++i) {
    m.OnFirstToken(20 + i, 0.012 * (i + 1));
    for (int t = 0; t < 10; ++t) m.OnNextToken(0.004 * (t + 1));
    RequestEnd end;
    end.finish_reason = reasons[i];
    end.has_phases = i < 3;
    end.prompt_tokens = 20 + i;
    end.generation_tokens = 11;
    end.max_tokens = 16;
    end.e2e_seconds = 0.5 + i;
    end.queue_seconds = 0.01;
    end.prefill_seconds = 0.02;
    end.decode_seconds = 0.4;
    m.OnRequestEnd(end);
  }
  m.CountHttpRequest(ServingMetrics::HttpOutcome::kOk);
  m.CountHttpRequest(ServingMetrics::HttpOutcome::kError);
  m.CountHttpRequest(ServingMetrics::HttpOutcome::kRejected);
  ServingSnapshot s;
  s.running = 3;
  s.waiting = 1;
  s.kv_used_blocks = 96;
  s.kv_free_blocks = 160;
  s.prefix_queried_tokens = 4096;
  s.prefix_hit_tokens = 1536;
  s.preemptions = 2;
  s.steps = 4;
  s.step_seconds = 0.25;
  s.http_refused = 1;
  s.http_connections = 5;
  s.http_threads = 6;
  m.Update(s);
  std::cout << m.Render();
  std::cout.flush();
  return std::cout.good() ? 0 : 1;
}

}  // namespace
}  // namespace tessera

int main() { return tessera::Main(); }
