// Prints a populated MetricsRegistry in text format 0.0.4 to stdout, for
// metrics_promtool_test.sh (`promtool check metrics`). Exercises every metric
// kind, several children per family, label sorting and escaping, HELP
// escaping, special values (NaN, +-Inf) and the vLLM latency buckets.
#include <cstdlib>
#include <iostream>
#include <limits>

#include "absl/status/statusor.h"
#include "runtime/serve/metrics.h"

namespace tessera {
namespace {

template <typename T>
T* OrDie(absl::StatusOr<T*> v) {
  if (!v.ok()) {
    std::cerr << "metrics_dump: " << v.status() << "\n";
    std::exit(1);
  }
  return *v;
}

int Main() {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  MetricsRegistry r;

  Gauge* running =
      OrDie(r.AddGauge("tessera_num_requests_running",
                       "Number of requests in the running batch."));
  Gauge* waiting =
      OrDie(r.AddGauge("tessera_num_requests_waiting",
                       "Number of requests waiting to be scheduled."));
  running->Set(3);
  waiting->Set(0);

  Gauge* used =
      OrDie(r.AddGauge("tessera_kv_cache_blocks", "KV cache blocks by state.",
                       {{"state", "used"}}));
  Gauge* free_blocks =
      OrDie(r.AddGauge("tessera_kv_cache_blocks", "KV cache blocks by state.",
                       {{"state", "free"}}));
  used->Set(1200);
  free_blocks->Set(848);
  used->Add(-1);
  free_blocks->Increment();

  Counter* queries =
      OrDie(r.AddCounter("tessera_prefix_cache_queries_total",
                         "Prompt tokens looked up in the prefix cache."));
  Counter* hits =
      OrDie(r.AddCounter("tessera_prefix_cache_hits_total",
                         "Prompt tokens found in the prefix cache."));
  queries->Increment(4096);
  hits->Increment(1536);

  Counter* preemptions =
      OrDie(r.AddCounter("tessera_num_preemptions_total",
                         "Sequences preempted (recomputed later)."));
  preemptions->Increment(2);

  Counter* prompt = OrDie(
      r.AddCounter("tessera_prompt_tokens_total", "Prefill tokens processed."));
  Counter* generation = OrDie(
      r.AddCounter("tessera_generation_tokens_total", "Tokens generated."));
  prompt->Increment(123456789);
  generation->Increment(0.5);  // A non-integral counter value.

  for (const char* reason : {"stop", "length", "abort"}) {
    Counter* c = OrDie(
        r.AddCounter("tessera_request_success_total",
                     "Finished requests by finish reason.\nSecond line, with a "
                     "\\ backslash.",
                     {{"finish_reason", reason}, {"model", "stories260K"}}));
    c->Increment(reason[0] == 's' ? 10 : 1);
  }

  // Label values needing every escape, and label sorting (b before a given).
  Gauge* odd =
      OrDie(r.AddGauge("tessera_escape_check_info",
                       "Label escaping \"check\" (quotes kept in HELP).",
                       {{"zz_path", "C:\\models\\llama"},
                        {"a_quote", "say \"hi\""},
                        {"m_newline", "line1\nline2"},
                        {"utf8", "caf\xc3\xa9 \xe2\x82\xac"},
                        {"empty", ""}}));
  odd->Set(1);

  // Special gauge values.
  Gauge* nan = OrDie(r.AddGauge("tessera_special_value", "Special values.",
                                {{"kind", "nan"}}));
  Gauge* pinf = OrDie(r.AddGauge("tessera_special_value", "Special values.",
                                 {{"kind", "pos_inf"}}));
  Gauge* ninf = OrDie(r.AddGauge("tessera_special_value", "Special values.",
                                 {{"kind", "neg_inf"}}));
  Gauge* tiny = OrDie(r.AddGauge("tessera_special_value", "Special values.",
                                 {{"kind", "tiny"}}));
  nan->Set(std::numeric_limits<double>::quiet_NaN());
  pinf->Set(kInf);
  ninf->Set(-kInf);
  tiny->Set(1.5e-7);

  Histogram* ttft = OrDie(r.AddHistogram(
      "tessera_time_to_first_token_seconds",
      "Histogram of time to first token in seconds.",
      DefaultTimeToFirstTokenBuckets(), {{"model", "stories260K"}}));
  for (double v : {0.0004, 0.012, 0.012, 0.3, 2.0, 9000.0}) ttft->Observe(v);

  Histogram* itl = OrDie(r.AddHistogram(
      "tessera_inter_token_latency_seconds",
      "Histogram of inter-token latency in seconds.",
      DefaultInterTokenLatencyBuckets(), {{"model", "stories260K"}}));
  for (int i = 0; i < 100; ++i) itl->Observe(0.001 * i);

  Histogram* e2e = OrDie(
      r.AddHistogram("tessera_e2e_request_latency_seconds",
                     "Histogram of end-to-end request latency in seconds.",
                     DefaultRequestLatencyBuckets()));
  e2e->Observe(1.25);

  // Exponential buckets with bounds that print in exponent form, no labels,
  // two children of one histogram family, and one never observed.
  for (const char* phase : {"prefill", "decode"}) {
    Histogram* h =
        OrDie(r.AddHistogram("tessera_step_tokens", "Tokens per engine step.",
                             ExponentialBuckets(1, 10, 8), {{"phase", phase}}));
    if (phase[0] == 'p') {
      h->Observe(512);
      h->Observe(2e6);
      h->Observe(5e7);
    }
  }

  std::cout << r.Render();
  std::cout.flush();
  return std::cout.good() ? 0 : 1;
}

}  // namespace
}  // namespace tessera

int main() { return tessera::Main(); }
