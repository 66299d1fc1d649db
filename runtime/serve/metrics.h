// Prometheus metrics for the OpenAI server's `GET /metrics`.
//
// A MetricsRegistry owns metric families (counters, gauges, histograms) and
// renders them in the Prometheus text exposition format, version 0.0.4
// (Content-Type: text/plain; version=0.0.4; charset=utf-8):
//
//   # HELP tessera_generation_tokens_total Tokens generated.
//   # TYPE tessera_generation_tokens_total counter
//   tessera_generation_tokens_total 1234
//   # HELP tessera_time_to_first_token_seconds Time to first token.
//   # TYPE tessera_time_to_first_token_seconds histogram
//   tessera_time_to_first_token_seconds_bucket{le="0.001"} 0
//   ...
//   tessera_time_to_first_token_seconds_bucket{le="+Inf"} 7
//   tessera_time_to_first_token_seconds_sum 1.25
//   tessera_time_to_first_token_seconds_count 7
//
// Families. A family is one metric name with one type, one help text and one
// set of label names; each distinct set of label values is a child of the
// family (one HELP/TYPE block, one sample per child). Families render in
// registration order, children in registration order within their family.
// Labels are constant per child: register one child per label value you need
// (e.g. one Counter* per finish_reason) and keep the pointers.
//
// Registration rules (Add* return absl::StatusOr):
//   - Metric names match [a-zA-Z_:][a-zA-Z0-9_:]*; label names match
//     [a-zA-Z_][a-zA-Z0-9_]* and must not start with "__"; a label name may
//     appear once per child; histograms may not use the label "le". Help texts
//     and label values must be valid UTF-8. Violations: InvalidArgument.
//   - Counter names must end in "_total"; gauge and histogram names must not
//     (promtool flags both). Gauge names must not end in "_bucket", "_sum" or
//     "_count" (reserved for histograms). Violations: InvalidArgument.
//   - Histogram bounds must be strictly increasing and not NaN; a trailing
//     +Inf is dropped (the +Inf bucket is always implicit). Violations:
//     InvalidArgument.
//   - Registering an existing name again with the same type, help, label
//     names (and, for histograms, bounds) adds a child, or returns the
//     existing child if the label values are equal too. A different type,
//     help text, label-name set or bucket layout is AlreadyExists. So is a
//     name that collides with a sample name of another family (a gauge
//     "x_count" next to a histogram "x").
//
// Handles. The returned Counter*/Gauge*/Histogram* are owned by the registry
// and stay valid (and at the same address) for the registry's lifetime.
//
// Thread safety. Everything is thread-safe. Updates (Increment, Set, Add,
// Observe) are lock-free: values are std::atomic<double> (lock-free on
// x86-64 and aarch64; additions use a compare-exchange loop, so concurrent
// increments never lose an update) and histogram buckets are
// std::atomic<uint64_t>; all with relaxed ordering. Registration and Render
// take the registry's mutex (they only contend with each other). A Render
// concurrent with updates sees each value atomically; a histogram's buckets,
// _count and _sum are read one by one, so a scrape racing an Observe may
// count the observation in _sum but not in the buckets or vice versa. _count
// is always computed from the buckets, so it always equals the +Inf bucket.
//
// Numbers. Integral values with magnitude below 2^53 print as integers
// ("1234567"); other values print as the shortest decimal that round-trips
// to the same double, in the style of Go's strconv.FormatFloat(v, 'g', -1, 64)
// (what the official Go client writes: "0.005", "2.5", "1e+06", "1e-05");
// NaN, +Inf and -Inf print as "NaN", "+Inf", "-Inf". Bucket bounds in `le`
// always use the Go style ("1", "0.005", "2560", "1e+06", "+Inf").
#ifndef TESSERA_RUNTIME_SERVE_METRICS_H_
#define TESSERA_RUNTIME_SERVE_METRICS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace tessera {

// Constant labels of one child: (name, value) pairs in any order (they are
// rendered sorted by name).
using MetricLabels = std::vector<std::pair<std::string, std::string>>;

// A monotonically increasing value. Name must end in "_total".
class Counter {
 public:
  Counter(const Counter&) = delete;
  Counter& operator=(const Counter&) = delete;

  // Adds `v`. A negative or NaN `v` would break monotonicity: it is ignored
  // and Increment returns false (no crash, also in debug builds); otherwise
  // returns true. +Inf is accepted.
  bool Increment(double v = 1.0);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  friend class MetricsRegistry;
  Counter() = default;
  std::atomic<double> value_{0.0};
};

// A value that goes up and down (anything, including NaN and +-Inf).
class Gauge {
 public:
  Gauge(const Gauge&) = delete;
  Gauge& operator=(const Gauge&) = delete;

  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Add(double v);
  void Increment() { Add(1.0); }
  void Decrement() { Add(-1.0); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  friend class MetricsRegistry;
  Gauge() = default;
  std::atomic<double> value_{0.0};
};

// A copy of a histogram's state, for tests and for Render.
struct HistogramSnapshot {
  std::vector<double> bounds;  // Finite upper bounds, without +Inf.
  // cumulative[i] = observations <= bounds[i]; one more entry at the end for
  // +Inf, equal to `count`.
  std::vector<uint64_t> cumulative;
  uint64_t count = 0;
  double sum = 0.0;
};

// Observations counted into fixed buckets (upper bounds, inclusive: a value v
// lands in the first bucket with v <= bound, else in +Inf).
class Histogram {
 public:
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  // Records `v`. NaN is ignored (it would turn _sum into NaN for good);
  // +-Inf are counted (-Inf in the first bucket, +Inf only in +Inf) and make
  // _sum infinite, as in the official clients.
  void Observe(double v);
  HistogramSnapshot Snapshot() const;
  const std::vector<double>& bounds() const { return bounds_; }

 private:
  friend class MetricsRegistry;
  explicit Histogram(std::vector<double> bounds);

  const std::vector<double> bounds_;
  // Non-cumulative counts; bounds_.size() + 1 entries (the last is +Inf).
  const std::unique_ptr<std::atomic<uint64_t>[]> buckets_;
  std::atomic<double> sum_{0.0};
};

class MetricsRegistry {
 public:
  MetricsRegistry();
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;
  ~MetricsRegistry();

  absl::StatusOr<Counter*> AddCounter(absl::string_view name,
                                      absl::string_view help,
                                      MetricLabels labels = {});
  absl::StatusOr<Gauge*> AddGauge(absl::string_view name,
                                  absl::string_view help,
                                  MetricLabels labels = {});
  absl::StatusOr<Histogram*> AddHistogram(absl::string_view name,
                                          absl::string_view help,
                                          std::vector<double> bounds,
                                          MetricLabels labels = {});

  // The whole registry in text format 0.0.4; every line ends in '\n'. An
  // empty registry renders as "".
  std::string Render() const;

  // The Content-Type header value for Render()'s output.
  static constexpr absl::string_view kContentType =
      "text/plain; version=0.0.4; charset=utf-8";

 private:
  enum class Type { kCounter, kGauge, kHistogram };
  struct Child;
  struct Family;

  // Validates, then finds or creates the family and the child (creating the
  // child's metric of `type`). `bounds` is only read for histograms.
  absl::StatusOr<Child*> AddChild(Type type, absl::string_view name,
                                  absl::string_view help,
                                  std::vector<double> bounds,
                                  MetricLabels labels);

  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<Family>> families_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Family*> by_name_ ABSL_GUARDED_BY(mu_);
  // Every family name and every sample name a family renders (x_bucket, ...).
  absl::flat_hash_set<std::string> taken_names_ ABSL_GUARDED_BY(mu_);
};

// `count` bounds start, start*factor, start*factor^2, ... Empty if count < 1,
// start <= 0 or factor <= 1 (or any argument is not finite).
std::vector<double> ExponentialBuckets(double start, double factor, int count);

// `count` bounds start, start+width, ... Empty if count < 1 or width <= 0.
std::vector<double> LinearBuckets(double start, double width, int count);

// vLLM's bucket bounds (seconds) for its latency histograms, so dashboards
// built for vLLM read Tessera's the same way.
// vllm:time_to_first_token_seconds: 0.001 .. 2560 (22 bounds).
std::vector<double> DefaultTimeToFirstTokenBuckets();
// vllm:inter_token_latency_seconds / time_per_output_token_seconds:
// 0.01 .. 80 (19 bounds).
std::vector<double> DefaultInterTokenLatencyBuckets();
// vllm:e2e_request_latency_seconds (and queue/prefill/decode times):
// 0.3 .. 7680 (21 bounds).
std::vector<double> DefaultRequestLatencyBuckets();

// Formatting helpers (exposed for tests and for other exporters).
// A sample value: integers exact, other doubles shortest round-trip.
std::string FormatMetricValue(double v);
// A bucket bound for `le`, like Go's strconv.FormatFloat(v, 'g', -1, 64).
std::string FormatBucketBound(double v);
// Escapes for a label value (\\, \", \n) and for HELP text (\\, \n).
std::string EscapeLabelValue(absl::string_view s);
std::string EscapeHelp(absl::string_view s);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_SERVE_METRICS_H_
