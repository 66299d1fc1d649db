#include "runtime/serve/metrics.h"

#include <dirent.h>
#include <prometheus/client_metric.h>
#include <prometheus/metric_type.h>
#include <prometheus/text_serializer.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace tessera {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

}  // namespace

std::vector<double> TimeToFirstTokenBuckets() {
  return {0.001, 0.005, 0.01, 0.02,  0.04,  0.06,  0.08, 0.1,
          0.25,  0.5,   0.75, 1.0,   2.5,   5.0,   7.5,  10.0,
          20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
}

std::vector<double> InterTokenLatencyBuckets() {
  return {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
          0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
}

std::vector<double> RequestLatencyBuckets() {
  return {0.3,  0.5,   0.8,   1.0,   1.5,   2.0,    2.5,
          5.0,  10.0,  15.0,  20.0,  30.0,  40.0,   50.0,
          60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
}

std::vector<double> IterationTokensBuckets() {
  return {1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384};
}

std::vector<double> RequestParamsNBuckets() { return {1, 2, 5, 10, 20}; }

std::vector<double> OneTwoFiveBuckets(int64_t max_value) {
  std::vector<double> out;
  for (int64_t scale = 1; scale <= max_value; scale *= 10) {
    for (int64_t m : {1, 2, 5}) {
      if (m * scale > max_value) return out;
      out.push_back(static_cast<double>(m * scale));
    }
    if (scale > max_value / 10) break;  // The next scale would overflow.
  }
  return out;
}

// ---------------------------------------------------------------------------
// Process metrics.

absl::StatusOr<ProcStat> ParseProcStat(absl::string_view line) {
  const size_t close = line.rfind(')');
  if (close == absl::string_view::npos) {
    return absl::InvalidArgumentError("no ')' after the command name");
  }
  // Fields from 3 (state) on, after the command name.
  const std::vector<absl::string_view> f =
      absl::StrSplit(line.substr(close + 1), ' ', absl::SkipEmpty());
  // Field k (1-based, as proc(5) counts) is f[k - 3].
  auto field = [&](int k) -> absl::string_view {
    const size_t i = static_cast<size_t>(k - 3);
    return i < f.size() ? f[i] : absl::string_view();
  };
  ProcStat s;
  if (!absl::SimpleAtoi(field(14), &s.utime_ticks) ||
      !absl::SimpleAtoi(field(15), &s.stime_ticks) ||
      !absl::SimpleAtoi(field(22), &s.start_ticks) ||
      !absl::SimpleAtoi(field(23), &s.vsize_bytes) ||
      !absl::SimpleAtoi(absl::StripAsciiWhitespace(field(24)), &s.rss_pages)) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a /proc/<pid>/stat line: ", line.substr(0, 200)));
  }
  return s;
}

absl::StatusOr<ProcessStats> ReadProcessStats() {
  std::string line;
  {
    std::ifstream in("/proc/self/stat");
    if (!std::getline(in, line)) {
      return absl::UnavailableError("cannot read /proc/self/stat");
    }
  }
  absl::StatusOr<ProcStat> stat = ParseProcStat(line);
  if (!stat.ok()) return stat.status();
  // The boot time: starttime counts ticks from it.
  int64_t btime = -1;
  {
    std::ifstream in("/proc/stat");
    std::string l;
    while (std::getline(in, l)) {
      if (l.rfind("btime ", 0) == 0 &&
          absl::SimpleAtoi(absl::string_view(l).substr(6), &btime)) {
        break;
      }
    }
  }
  if (btime < 0) return absl::UnavailableError("no btime in /proc/stat");
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  ProcessStats p;
  p.cpu_seconds =
      static_cast<double>(stat->utime_ticks + stat->stime_ticks) / ticks;
  p.resident_bytes = static_cast<double>(stat->rss_pages) * page;
  p.virtual_bytes = static_cast<double>(stat->vsize_bytes);
  p.start_time_seconds = static_cast<double>(btime) +
                         static_cast<double>(stat->start_ticks) / ticks;
  // Open descriptors: the entries of /proc/self/fd, less ".", ".." and the
  // one opendir itself holds.
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr)
    return absl::UnavailableError("cannot list /proc/self/fd");
  int64_t entries = 0;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') ++entries;
  }
  closedir(dir);
  p.open_fds = static_cast<double>(std::max<int64_t>(0, entries - 1));
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) {
    return absl::UnavailableError("getrlimit(RLIMIT_NOFILE) failed");
  }
  p.max_fds = limit.rlim_cur == RLIM_INFINITY
                  ? 0.0
                  : static_cast<double>(limit.rlim_cur);
  return p;
}

std::vector<prometheus::MetricFamily> ProcessCollector::Collect() const {
  absl::StatusOr<ProcessStats> p = ReadProcessStats();
  if (!p.ok()) return {};
  auto family = [](std::string name, std::string help,
                   prometheus::MetricType type, double value) {
    prometheus::MetricFamily f;
    f.name = std::move(name);
    f.help = std::move(help);
    f.type = type;
    prometheus::ClientMetric m;
    if (type == prometheus::MetricType::Counter) {
      m.counter.value = value;
    } else {
      m.gauge.value = value;
    }
    f.metric.push_back(std::move(m));
    return f;
  };
  using prometheus::MetricType;
  return {
      family("process_cpu_seconds_total",
             "Total user and system CPU time spent in seconds.",
             MetricType::Counter, p->cpu_seconds),
      family("process_resident_memory_bytes", "Resident memory size in bytes.",
             MetricType::Gauge, p->resident_bytes),
      family("process_virtual_memory_bytes", "Virtual memory size in bytes.",
             MetricType::Gauge, p->virtual_bytes),
      family("process_start_time_seconds",
             "Start time of the process since unix epoch in seconds.",
             MetricType::Gauge, p->start_time_seconds),
      family("process_open_fds", "Number of open file descriptors.",
             MetricType::Gauge, p->open_fds),
      family("process_max_fds", "Maximum number of open file descriptors.",
             MetricType::Gauge, p->max_fds),
  };
}

// ---------------------------------------------------------------------------
// ServingMetrics.

ServingMetrics::ServingMetrics(std::string model_name, int64_t max_model_len)
    : registry_(std::make_shared<prometheus::Registry>()) {
  prometheus::Registry& r = *registry_;
  const prometheus::Labels model = {{"model_name", model_name}};
  auto gauge = [&](const char* name, const char* help) {
    return &BuildGauge().Name(name).Help(help).Labels(model).Register(r).Add(
        {});
  };
  auto counter = [&](const char* name, const char* help) {
    return &BuildCounter().Name(name).Help(help).Labels(model).Register(r).Add(
        {});
  };
  auto histogram = [&](const char* name, const char* help,
                       std::vector<double> bounds) {
    return &BuildHistogram()
                .Name(name)
                .Help(help)
                .Labels(model)
                .Register(r)
                .Add({}, prometheus::Histogram::BucketBoundaries(
                             std::move(bounds)));
  };
  const std::vector<double> tokens = OneTwoFiveBuckets(max_model_len);

  running_ = gauge("vllm:num_requests_running",
                   "Number of requests in model execution batches.");
  waiting_ = gauge("vllm:num_requests_waiting",
                   "Number of requests waiting to be processed.");
  kv_usage_ = gauge("vllm:kv_cache_usage_perc",
                    "KV-cache usage. 1 means 100 percent usage.");
  prefix_queries_ =
      counter("vllm:prefix_cache_queries_total",
              "Prefix cache queries, in terms of number of queried tokens.");
  prefix_hits_ =
      counter("vllm:prefix_cache_hits_total",
              "Prefix cache hits, in terms of number of cached tokens.");
  preemptions_ = counter("vllm:num_preemptions_total",
                         "Cumulative number of preemption from the engine.");
  prompt_tokens_ = counter("vllm:prompt_tokens_total",
                           "Number of prefill tokens processed.");
  generation_tokens_ = counter("vllm:generation_tokens_total",
                               "Number of generation tokens processed.");
  auto& success = BuildCounter()
                      .Name("vllm:request_success_total")
                      .Help("Count of successfully processed requests.")
                      .Labels(model)
                      .Register(r);
  success_stop_ = &success.Add({{"finished_reason", "stop"}});
  success_length_ = &success.Add({{"finished_reason", "length"}});
  success_abort_ = &success.Add({{"finished_reason", "abort"}});
  success_error_ = &success.Add({{"finished_reason", "error"}});

  e2e_ = histogram("vllm:e2e_request_latency_seconds",
                   "Histogram of e2e request latency in seconds.",
                   RequestLatencyBuckets());
  queue_ = histogram("vllm:request_queue_time_seconds",
                     "Histogram of time spent in WAITING phase for request.",
                     RequestLatencyBuckets());
  prefill_ = histogram("vllm:request_prefill_time_seconds",
                       "Histogram of time spent in PREFILL phase for request.",
                       RequestLatencyBuckets());
  decode_ = histogram("vllm:request_decode_time_seconds",
                      "Histogram of time spent in DECODE phase for request.",
                      RequestLatencyBuckets());
  inference_ =
      histogram("vllm:request_inference_time_seconds",
                "Histogram of time spent in RUNNING phase for request.",
                RequestLatencyBuckets());
  ttft_ = histogram("vllm:time_to_first_token_seconds",
                    "Histogram of time to first token in seconds.",
                    TimeToFirstTokenBuckets());
  itl_ = histogram("vllm:inter_token_latency_seconds",
                   "Histogram of inter-token latency in seconds.",
                   InterTokenLatencyBuckets());
  prompt_len_ = histogram("vllm:request_prompt_tokens",
                          "Number of prefill tokens processed.", tokens);
  generation_len_ = histogram("vllm:request_generation_tokens",
                              "Number of generation tokens processed.", tokens);
  max_tokens_ =
      histogram("vllm:request_params_max_tokens",
                "Histogram of the max_tokens request parameter.", tokens);
  iteration_tokens_ =
      histogram("vllm:iteration_tokens_total",
                "Histogram of number of tokens per engine_step.",
                IterationTokensBuckets());
  params_n_ = histogram("vllm:request_params_n",
                        "Histogram of the n request parameter.",
                        RequestParamsNBuckets());

  kv_used_ = gauge("tessera_kv_blocks_used", "KV cache blocks in use.");
  kv_free_ = gauge("tessera_kv_blocks_free",
                   "KV cache blocks free (including cached ones).");
  steps_ = counter("tessera_engine_steps_total", "Engine steps run.");
  step_seconds_ = counter("tessera_engine_step_seconds_total",
                          "Wall time spent inside engine steps.");
  auto& http = BuildCounter()
                   .Name("tessera_requests_total")
                   .Help("Finished HTTP requests by outcome (rejected: 429).")
                   .Labels(model)
                   .Register(r);
  http_ok_ = &http.Add({{"status", "ok"}});
  http_error_ = &http.Add({{"status", "error"}});
  http_rejected_ = &http.Add({{"status", "rejected"}});
  http_connections_ =
      gauge("tessera_http_connections", "Open HTTP connections.");
  http_threads_ = gauge("tessera_http_threads",
                        "HTTP threads (one per busy connection, plus idle "
                        "ones not yet retired).");
  http_refused_ =
      counter("tessera_http_connections_refused_total",
              "Connections refused with 503 because too many were open.");
}

void ServingMetrics::OnStep(int64_t tokens) {
  iteration_tokens_->Observe(static_cast<double>(tokens));
}

void ServingMetrics::OnFirstToken(int64_t prompt_tokens, double ttft_seconds) {
  ttft_->Observe(ttft_seconds);
  prompt_tokens_->Increment(static_cast<double>(prompt_tokens));
  generation_tokens_->Increment();
}

void ServingMetrics::OnNextToken(double itl_seconds) {
  itl_->Observe(itl_seconds);
  generation_tokens_->Increment();
}

void ServingMetrics::OnRequestEnd(const RequestEnd& end) {
  prometheus::Counter* success = success_error_;
  if (end.finish_reason == "stop") {
    success = success_stop_;
  } else if (end.finish_reason == "length") {
    success = success_length_;
  } else if (end.finish_reason == "abort") {
    success = success_abort_;
  }
  success->Increment();
  e2e_->Observe(end.e2e_seconds);
  prompt_len_->Observe(static_cast<double>(end.prompt_tokens));
  generation_len_->Observe(static_cast<double>(end.generation_tokens));
  if (end.max_tokens > 0) {
    max_tokens_->Observe(static_cast<double>(end.max_tokens));
  }
  if (!end.has_phases) return;
  queue_->Observe(end.queue_seconds);
  prefill_->Observe(end.prefill_seconds);
  decode_->Observe(end.decode_seconds);
  inference_->Observe(end.prefill_seconds + end.decode_seconds);
}

void ServingMetrics::ObserveRequestN(int64_t n) {
  params_n_->Observe(static_cast<double>(n));
}

void ServingMetrics::CountHttpRequest(HttpOutcome outcome) {
  switch (outcome) {
    case HttpOutcome::kOk:
      http_ok_->Increment();
      return;
    case HttpOutcome::kError:
      http_error_->Increment();
      return;
    case HttpOutcome::kRejected:
      http_rejected_->Increment();
      return;
  }
}

void ServingMetrics::Update(const ServingSnapshot& s) {
  std::lock_guard<std::mutex> lock(mu_);
  running_->Set(static_cast<double>(s.running));
  waiting_->Set(static_cast<double>(s.waiting));
  const int64_t blocks = s.kv_used_blocks + s.kv_free_blocks;
  kv_usage_->Set(blocks > 0 ? static_cast<double>(s.kv_used_blocks) /
                                  static_cast<double>(blocks)
                            : 0.0);
  kv_used_->Set(static_cast<double>(s.kv_used_blocks));
  kv_free_->Set(static_cast<double>(s.kv_free_blocks));
  http_connections_->Set(static_cast<double>(s.http_connections));
  http_threads_->Set(static_cast<double>(s.http_threads));
  auto advance = [](prometheus::Counter* c, double now, double seen) {
    if (now > seen) c->Increment(now - seen);
  };
  advance(prefix_queries_, static_cast<double>(s.prefix_queried_tokens),
          static_cast<double>(seen_.prefix_queried_tokens));
  advance(prefix_hits_, static_cast<double>(s.prefix_hit_tokens),
          static_cast<double>(seen_.prefix_hit_tokens));
  advance(preemptions_, static_cast<double>(s.preemptions),
          static_cast<double>(seen_.preemptions));
  advance(steps_, static_cast<double>(s.steps),
          static_cast<double>(seen_.steps));
  advance(step_seconds_, s.step_seconds, seen_.step_seconds);
  advance(http_refused_, static_cast<double>(s.http_refused),
          static_cast<double>(seen_.http_refused));
  seen_ = s;
}

std::string ServingMetrics::Render() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  std::vector<prometheus::MetricFamily> process = process_.Collect();
  families.insert(families.end(), std::make_move_iterator(process.begin()),
                  std::make_move_iterator(process.end()));
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace tessera
