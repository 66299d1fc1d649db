// Prometheus metrics for the OpenAI server's `GET /metrics`, on
// prometheus-cpp's core (Debian's prometheus-cpp-dev: Registry, families,
// TextSerializer). /metrics itself is served by our cpp-httplib server
// (openai_server.cc), not by prometheus-cpp's civetweb exposer.
//
// Names. The families operators alert on carry vLLM's names and meanings
// (`vllm:` prefix, vllm/v1/metrics/loggers.py, with its bucket boundaries),
// so that dashboards and alerts written for vLLM read Tessera unchanged
// (docs/grafana/tessera-dashboard.json is one). Tessera's old `tessera_`
// families that duplicated one of them are gone (no series is exposed
// twice); those vLLM has no equivalent for stay under `tessera_` names. Every
// family but process_* carries model_name="<served model name>". Counters
// are named with their `_total` suffix, as vLLM's Python client exposes them.
//
//   vllm:num_requests_running             gauge  sequences holding KV now
//   vllm:num_requests_waiting             gauge  queued (engine + admission)
//   vllm:kv_cache_usage_perc              gauge  used KV blocks / all (0..1)
//   vllm:prefix_cache_queries_total       counter prompt tokens looked up
//   vllm:prefix_cache_hits_total          counter prompt tokens found cached
//   vllm:num_preemptions_total            counter sequences preempted
//   vllm:prompt_tokens_total              counter prompt tokens (at first
//   token) vllm:generation_tokens_total          counter tokens generated
//   vllm:request_success_total{finished_reason=stop|length|abort|error}
//   histograms (engine_observer.h defines the phases):
//   vllm:e2e_request_latency_seconds, vllm:request_queue_time_seconds,
//   vllm:request_prefill_time_seconds, vllm:request_decode_time_seconds,
//   vllm:request_inference_time_seconds  0.3 .. 7680 s (21 bounds)
//   vllm:time_to_first_token_seconds     0.001 .. 2560 s (22 bounds)
//   vllm:inter_token_latency_seconds     0.01 .. 80 s (19 bounds)
//   vllm:request_prompt_tokens, vllm:request_generation_tokens,
//   vllm:request_params_max_tokens       1-2-5 up to max_model_len
//   vllm:iteration_tokens_total          1 .. 16384 (tokens per engine step)
//   vllm:request_params_n                1, 2, 5, 10, 20 (per HTTP request)
//   tessera_kv_blocks_used / tessera_kv_blocks_free,
//   tessera_engine_steps_total, tessera_engine_step_seconds_total,
//   tessera_requests_total{status=ok|error| rejected} (HTTP requests),
//   tessera_http_connections, tessera_http_threads,
//   tessera_http_connections_refused_total
//   process_cpu_seconds_total, process_resident_memory_bytes,
//   process_virtual_memory_bytes, process_start_time_seconds,
//   process_open_fds, process_max_fds (ProcessCollector, below)
//
// promtool's linter objects to two things in vLLM's naming that dashboards
// need: the ':' in every vllm: name (reserved for recording rules) and a
// histogram named "_total" (vllm:iteration_tokens_total). Those are the only
// complaints metrics_promtool_test.sh accepts; the rest of the output must
// lint clean (it also lints a copy with ':' replaced, so nothing else hides).
//
// Why prometheus-cpp and not the hand-written registry it replaced: the cost
// on the hot path was measured (Google Benchmark, -O2, this 2-core VM shared
// with other builds; metrics_benchmark measures prometheus-cpp alone): a
// histogram Observe costs 26-44 ns with prometheus-cpp (a mutex per
// histogram) against 17-19 ns for the old lock-free atomics, 41-72 ns against
// 69-91 ns with two threads contending; a counter increment 14-16 ns in both.
// Per generated token the loop thread records one ITL observation and one
// counter increment (~60 ns): at batch 64 that is ~4 us per step, 0.4% of a
// 1 ms decode step (the old registry: ~2 us, 0.2%). A difference of 0.2% of
// the fastest steps is not a measured reason to keep our own registry, so it
// is gone.
// prometheus-cpp 1.0.1's TextSerializer writes HELP text unescaped and NaN as
// "Nan": the help texts here contain no backslash or newline, and no value
// here is ever NaN (metrics_test checks both).
//
// Thread safety: everything. Updates are atomic (histograms take their own
// mutex); Update() and Render() serialize on a mutex of their own.
#ifndef TESSERA_RUNTIME_SERVE_METRICS_H_
#define TESSERA_RUNTIME_SERVE_METRICS_H_

#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/serve/engine_observer.h"

namespace tessera {

// vLLM's bucket boundaries (vllm/v1/metrics/loggers.py).
std::vector<double> TimeToFirstTokenBuckets();   // 0.001 .. 2560 s
std::vector<double> InterTokenLatencyBuckets();  // 0.01 .. 80 s
std::vector<double> RequestLatencyBuckets();     // 0.3 .. 7680 s
std::vector<double> IterationTokensBuckets();    // 1, 8, 16, .., 16384
std::vector<double> RequestParamsNBuckets();     // 1, 2, 5, 10, 20
// build_1_2_5_buckets: 1, 2, 5, 10, 20, 50, ... up to max_value (inclusive).
// Empty when max_value < 1.
std::vector<double> OneTwoFiveBuckets(int64_t max_value);

// The process_* families as Prometheus client libraries define them, from
// /proc/self (Linux).
struct ProcessStats {
  double cpu_seconds = 0;         // user + system time
  double resident_bytes = 0;      // RSS
  double virtual_bytes = 0;       // VSZ
  double start_time_seconds = 0;  // since the Unix epoch
  double open_fds = 0;
  double max_fds = 0;  // RLIMIT_NOFILE's soft limit
};

// The parts of /proc/self/stat the families need: utime and stime (fields 14
// and 15, in clock ticks), starttime (22, ticks since boot), vsize (23,
// bytes) and rss (24, pages). The command name (field 2) may hold spaces and
// parentheses: fields are counted after its last ')'. InvalidArgument for a
// line that does not have them.
struct ProcStat {
  uint64_t utime_ticks = 0, stime_ticks = 0, start_ticks = 0;
  uint64_t vsize_bytes = 0;
  int64_t rss_pages = 0;
};
absl::StatusOr<ProcStat> ParseProcStat(absl::string_view line);
// Reads /proc/self/stat, /proc/stat (btime), /proc/self/fd and the fd limit.
absl::StatusOr<ProcessStats> ReadProcessStats();

// A Collectable that reads ReadProcessStats() at every collection; nothing
// when it fails (a scrape never fails for it).
class ProcessCollector : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override;
};

// What the server mirrors from engine and HTTP statistics at each scrape:
// levels are set, running totals become counter increments.
struct ServingSnapshot {
  int64_t running = 0;
  int64_t waiting = 0;  // Engine queue plus AsyncEngine's admission queue.
  int64_t kv_used_blocks = 0;
  int64_t kv_free_blocks = 0;
  // Running totals since start.
  int64_t prefix_queried_tokens = 0;
  int64_t prefix_hit_tokens = 0;
  int64_t preemptions = 0;
  int64_t steps = 0;
  double step_seconds = 0;
  int64_t http_refused = 0;
  // Levels.
  int64_t http_connections = 0;
  int64_t http_threads = 0;
};

class ServingMetrics : public EngineObserver {
 public:
  // Families are labelled model_name=`model_name`; the token-count
  // histograms' buckets reach `max_model_len`.
  ServingMetrics(std::string model_name, int64_t max_model_len);
  ServingMetrics(const ServingMetrics&) = delete;
  ServingMetrics& operator=(const ServingMetrics&) = delete;

  // EngineObserver (engine_observer.h).
  void OnStep(int64_t tokens) override;
  void OnFirstToken(int64_t prompt_tokens, double ttft_seconds) override;
  void OnNextToken(double itl_seconds) override;
  void OnRequestEnd(const RequestEnd& end) override;

  // One HTTP request's `n` (vllm:request_params_n), once it is submitted.
  void ObserveRequestN(int64_t n);
  enum class HttpOutcome { kOk, kError, kRejected };
  void CountHttpRequest(HttpOutcome outcome);

  // Sets the gauges and advances the counters by how far the totals moved
  // since the last call (a total that went down is taken as a restart: the
  // counter is not moved).
  void Update(const ServingSnapshot& s);

  // Text exposition format 0.0.4, every family of the registry followed by
  // the process families.
  std::string Render() const;
  static constexpr absl::string_view kContentType =
      "text/plain; version=0.0.4; charset=utf-8";

  prometheus::Registry& registry() { return *registry_; }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  ProcessCollector process_;

  prometheus::Gauge* running_;
  prometheus::Gauge* waiting_;
  prometheus::Gauge* kv_usage_;
  prometheus::Counter* prefix_queries_;
  prometheus::Counter* prefix_hits_;
  prometheus::Counter* preemptions_;
  prometheus::Counter* prompt_tokens_;
  prometheus::Counter* generation_tokens_;
  prometheus::Counter* success_stop_;
  prometheus::Counter* success_length_;
  prometheus::Counter* success_abort_;
  prometheus::Counter* success_error_;
  prometheus::Histogram* e2e_;
  prometheus::Histogram* queue_;
  prometheus::Histogram* prefill_;
  prometheus::Histogram* decode_;
  prometheus::Histogram* inference_;
  prometheus::Histogram* ttft_;
  prometheus::Histogram* itl_;
  prometheus::Histogram* prompt_len_;
  prometheus::Histogram* generation_len_;
  prometheus::Histogram* max_tokens_;
  prometheus::Histogram* iteration_tokens_;
  prometheus::Histogram* params_n_;
  prometheus::Gauge* kv_used_;
  prometheus::Gauge* kv_free_;
  prometheus::Counter* steps_;
  prometheus::Counter* step_seconds_;
  prometheus::Counter* http_ok_;
  prometheus::Counter* http_error_;
  prometheus::Counter* http_rejected_;
  prometheus::Gauge* http_connections_;
  prometheus::Gauge* http_threads_;
  prometheus::Counter* http_refused_;

  mutable std::mutex mu_;  // Update and Render.
  ServingSnapshot seen_;   // The totals of the last Update (under mu_).
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_SERVE_METRICS_H_
