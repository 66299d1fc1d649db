// ServingMetrics: vLLM's families, labels and buckets; what a request's
// lifecycle records (driven by hand, and through a real AsyncEngine on the
// demo checkpoint); engine snapshots as counter increments; the process
// collector; and text that stays within what prometheus-cpp serializes
// correctly (no escapes in HELP, no NaN).
#include "runtime/serve/metrics.h"

#include <fcntl.h>
#include <prometheus/client_metric.h>
#include <prometheus/metric_family.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "runtime/executor/local_executor.h"
#include "runtime/serve/async_engine.h"
#include "tests/test_paths.h"

namespace tessera {
namespace {

// The family `name` of `m`'s registry; fails the test when absent.
prometheus::MetricFamily Family(ServingMetrics& m, const std::string& name) {
  for (prometheus::MetricFamily& f : m.registry().Collect()) {
    if (f.name == name) return f;
  }
  ADD_FAILURE() << "no family " << name;
  return {};
}

std::string Label(const prometheus::ClientMetric& c, const std::string& name) {
  for (const prometheus::ClientMetric::Label& l : c.label) {
    if (l.name == name) return l.value;
  }
  return "<none>";
}

// The one sample of a family without variable labels.
prometheus::ClientMetric One(ServingMetrics& m, const std::string& name) {
  prometheus::MetricFamily f = Family(m, name);
  EXPECT_EQ(f.metric.size(), 1u) << name;
  return f.metric.empty() ? prometheus::ClientMetric() : f.metric[0];
}

double Success(ServingMetrics& m, const std::string& reason) {
  for (const auto& c : Family(m, "vllm:request_success_total").metric) {
    if (Label(c, "finished_reason") == reason) return c.counter.value;
  }
  ADD_FAILURE() << "no finished_reason " << reason;
  return -1;
}

// The cumulative count of the bucket with upper bound `le`.
uint64_t Bucket(const prometheus::ClientMetric& c, double le) {
  for (const auto& b : c.histogram.bucket) {
    if (b.upper_bound == le) return b.cumulative_count;
  }
  ADD_FAILURE() << "no bucket le=" << le;
  return 0;
}

TEST(Buckets, AreVllms) {
  const std::vector<double> ttft = TimeToFirstTokenBuckets();
  ASSERT_EQ(ttft.size(), 22u);
  EXPECT_EQ(ttft.front(), 0.001);
  EXPECT_EQ(ttft[8], 0.25);
  EXPECT_EQ(ttft.back(), 2560.0);
  const std::vector<double> itl = InterTokenLatencyBuckets();
  ASSERT_EQ(itl.size(), 19u);
  EXPECT_EQ(itl.front(), 0.01);
  EXPECT_EQ(itl.back(), 80.0);
  const std::vector<double> e2e = RequestLatencyBuckets();
  ASSERT_EQ(e2e.size(), 21u);
  EXPECT_EQ(e2e.front(), 0.3);
  EXPECT_EQ(e2e[19], 1920.0);
  EXPECT_EQ(e2e.back(), 7680.0);
  EXPECT_EQ(IterationTokensBuckets(),
            (std::vector<double>{1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048,
                                 4096, 8192, 16384}));
  EXPECT_EQ(RequestParamsNBuckets(), (std::vector<double>{1, 2, 5, 10, 20}));
  EXPECT_EQ(OneTwoFiveBuckets(100),
            (std::vector<double>{1, 2, 5, 10, 20, 50, 100}));
  EXPECT_EQ(OneTwoFiveBuckets(512),
            (std::vector<double>{1, 2, 5, 10, 20, 50, 100, 200, 500}));
  EXPECT_EQ(OneTwoFiveBuckets(1), (std::vector<double>{1}));
  EXPECT_TRUE(OneTwoFiveBuckets(0).empty());
  EXPECT_EQ(OneTwoFiveBuckets(131072).back(), 100000.0);
}

// Every family carries model_name, and the vLLM ones are all there.
TEST(ServingMetrics, EveryFamilyIsLabelledWithTheModel) {
  ServingMetrics m("my-model", 4096);
  int vllm = 0;
  for (const prometheus::MetricFamily& f : m.registry().Collect()) {
    vllm += absl::StartsWith(f.name, "vllm:");
    ASSERT_FALSE(f.metric.empty()) << f.name;
    for (const auto& c : f.metric) {
      EXPECT_EQ(Label(c, "model_name"), "my-model") << f.name;
    }
  }
  EXPECT_EQ(vllm, 21);
  const prometheus::ClientMetric len = One(m, "vllm:request_prompt_tokens");
  // 1-2-5 up to max_model_len, then +Inf.
  EXPECT_EQ(len.histogram.bucket.size(), 11u + 1u);
  EXPECT_EQ(len.histogram.bucket[10].upper_bound, 2000.0);
}

// One request driven by hand through its lifecycle, as the AsyncEngine
// reports it.
TEST(ServingMetrics, RequestLifecycleFillsVllmsHistograms) {
  ServingMetrics m("demo", 2048);
  m.ObserveRequestN(2);
  m.OnStep(12);
  m.OnFirstToken(/*prompt_tokens=*/12, /*ttft_seconds=*/0.05);
  for (int i = 0; i < 3; ++i) {
    m.OnStep(1);
    m.OnNextToken(0.02);
  }
  RequestEnd end;
  end.finish_reason = "stop";
  end.has_phases = true;
  end.prompt_tokens = 12;
  end.generation_tokens = 4;
  end.max_tokens = 16;
  end.e2e_seconds = 0.9;
  end.queue_seconds = 0.1;
  end.prefill_seconds = 0.3;
  end.decode_seconds = 0.5;
  m.OnRequestEnd(end);

  EXPECT_EQ(One(m, "vllm:prompt_tokens_total").counter.value, 12);
  EXPECT_EQ(One(m, "vllm:generation_tokens_total").counter.value, 4);
  EXPECT_EQ(Success(m, "stop"), 1);
  EXPECT_EQ(Success(m, "length"), 0);
  EXPECT_EQ(Success(m, "abort"), 0);
  EXPECT_EQ(Success(m, "error"), 0);

  const prometheus::ClientMetric ttft =
      One(m, "vllm:time_to_first_token_seconds");
  EXPECT_EQ(ttft.histogram.sample_count, 1u);
  EXPECT_DOUBLE_EQ(ttft.histogram.sample_sum, 0.05);
  EXPECT_EQ(Bucket(ttft, 0.04), 0u);
  EXPECT_EQ(Bucket(ttft, 0.06), 1u);
  const prometheus::ClientMetric itl =
      One(m, "vllm:inter_token_latency_seconds");
  EXPECT_EQ(itl.histogram.sample_count, 3u);
  EXPECT_DOUBLE_EQ(itl.histogram.sample_sum, 0.06);
  EXPECT_EQ(Bucket(itl, 0.01), 0u);
  EXPECT_EQ(Bucket(itl, 0.025), 3u);

  struct Want {
    const char* name;
    double sum;
    double empty_below;  // The largest bound whose bucket is still empty.
    double full_at;      // The smallest bound whose bucket has it.
  };
  for (const Want& w :
       {Want{"vllm:e2e_request_latency_seconds", 0.9, 0.8, 1.0},
        Want{"vllm:request_queue_time_seconds", 0.1, 0, 0.3},
        Want{"vllm:request_prefill_time_seconds", 0.3, 0, 0.3},
        Want{"vllm:request_decode_time_seconds", 0.5, 0.3, 0.5},
        Want{"vllm:request_inference_time_seconds", 0.8, 0.5, 0.8}}) {
    const prometheus::ClientMetric h = One(m, w.name);
    EXPECT_EQ(h.histogram.sample_count, 1u) << w.name;
    EXPECT_NEAR(h.histogram.sample_sum, w.sum, 1e-12) << w.name;
    if (w.empty_below > 0) {
      EXPECT_EQ(Bucket(h, w.empty_below), 0u) << w.name;
    }
    // Upper bounds are inclusive (le): 0.3 is in le="0.3".
    EXPECT_EQ(Bucket(h, w.full_at), 1u) << w.name;
  }
  const prometheus::ClientMetric prompt = One(m, "vllm:request_prompt_tokens");
  EXPECT_EQ(prompt.histogram.sample_count, 1u);
  EXPECT_EQ(prompt.histogram.sample_sum, 12);
  EXPECT_EQ(Bucket(prompt, 10), 0u);
  EXPECT_EQ(Bucket(prompt, 20), 1u);
  EXPECT_EQ(One(m, "vllm:request_generation_tokens").histogram.sample_sum, 4);
  EXPECT_EQ(One(m, "vllm:request_params_max_tokens").histogram.sample_sum, 16);
  const prometheus::ClientMetric n = One(m, "vllm:request_params_n");
  EXPECT_EQ(n.histogram.sample_count, 1u);
  EXPECT_EQ(Bucket(n, 1), 0u);
  EXPECT_EQ(Bucket(n, 2), 1u);
  const prometheus::ClientMetric it = One(m, "vllm:iteration_tokens_total");
  EXPECT_EQ(it.histogram.sample_count, 4u);
  EXPECT_EQ(it.histogram.sample_sum, 15);
  EXPECT_EQ(Bucket(it, 1), 3u);
  EXPECT_EQ(Bucket(it, 16), 4u);

  // A failed request: counted, its e2e and lengths recorded, no phases.
  RequestEnd failed;
  failed.finish_reason = "error";
  failed.e2e_seconds = 2.0;
  m.OnRequestEnd(failed);
  EXPECT_EQ(Success(m, "error"), 1);
  EXPECT_EQ(One(m, "vllm:e2e_request_latency_seconds").histogram.sample_count,
            2u);
  EXPECT_EQ(One(m, "vllm:request_queue_time_seconds").histogram.sample_count,
            1u);
  EXPECT_EQ(One(m, "vllm:request_params_max_tokens").histogram.sample_count,
            1u);
}

TEST(ServingMetrics, SnapshotsSetGaugesAndAdvanceCounters) {
  ServingMetrics m("demo", 2048);
  ServingSnapshot s;
  s.running = 3;
  s.waiting = 2;
  s.kv_used_blocks = 96;
  s.kv_free_blocks = 160;
  s.prefix_queried_tokens = 100;
  s.prefix_hit_tokens = 40;
  s.preemptions = 1;
  s.steps = 10;
  s.step_seconds = 0.5;
  s.http_refused = 2;
  s.http_connections = 4;
  s.http_threads = 5;
  m.Update(s);
  s.prefix_queried_tokens = 150;
  s.steps = 12;
  s.step_seconds = 0.75;
  m.Update(s);
  EXPECT_EQ(One(m, "vllm:num_requests_running").gauge.value, 3);
  EXPECT_EQ(One(m, "vllm:num_requests_waiting").gauge.value, 2);
  EXPECT_DOUBLE_EQ(One(m, "vllm:kv_cache_usage_perc").gauge.value, 0.375);
  EXPECT_EQ(One(m, "tessera_kv_blocks_used").gauge.value, 96);
  EXPECT_EQ(One(m, "tessera_kv_blocks_free").gauge.value, 160);
  EXPECT_EQ(One(m, "vllm:prefix_cache_queries_total").counter.value, 150);
  EXPECT_EQ(One(m, "vllm:prefix_cache_hits_total").counter.value, 40);
  EXPECT_EQ(One(m, "vllm:num_preemptions_total").counter.value, 1);
  EXPECT_EQ(One(m, "tessera_engine_steps_total").counter.value, 12);
  EXPECT_DOUBLE_EQ(One(m, "tessera_engine_step_seconds_total").counter.value,
                   0.75);
  EXPECT_EQ(One(m, "tessera_http_connections_refused_total").counter.value, 2);
  EXPECT_EQ(One(m, "tessera_http_connections").gauge.value, 4);
  EXPECT_EQ(One(m, "tessera_http_threads").gauge.value, 5);
  // A total that went down (a restarted engine) does not move the counter.
  s.steps = 3;
  m.Update(s);
  EXPECT_EQ(One(m, "tessera_engine_steps_total").counter.value, 12);
  // No blocks at all: usage 0, not NaN.
  m.Update(ServingSnapshot{});
  EXPECT_EQ(One(m, "vllm:kv_cache_usage_perc").gauge.value, 0);

  m.CountHttpRequest(ServingMetrics::HttpOutcome::kOk);
  m.CountHttpRequest(ServingMetrics::HttpOutcome::kOk);
  m.CountHttpRequest(ServingMetrics::HttpOutcome::kRejected);
  for (const auto& c : Family(m, "tessera_requests_total").metric) {
    const std::string status = Label(c, "status");
    EXPECT_EQ(c.counter.value, status == "ok"         ? 2
                               : status == "rejected" ? 1
                                                      : 0)
        << status;
  }
}

// What prometheus-cpp 1.0.1's serializer would get wrong never reaches it:
// HELP texts without '\' or a newline, and no NaN ("Nan" in its output).
TEST(ServingMetrics, RenderHasEveryFamilyAndNothingTheSerializerMangles) {
  ServingMetrics m("demo", 2048);
  m.Update(ServingSnapshot{});
  const std::string text = m.Render();
  int help = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, "# HELP ")) {
      ++help;
      EXPECT_FALSE(absl::StrContains(line, "\\")) << line;
    } else if (!line.empty()) {
      EXPECT_TRUE(absl::StartsWith(line, "# TYPE ") ||
                  absl::StrContains(line, " "))
          << "a HELP text spilled onto its own line: " << line;
      EXPECT_FALSE(absl::EndsWith(line, " Nan")) << line;
    }
  }
  EXPECT_EQ(help, 29 + 6);  // Our families and the process ones.
  EXPECT_TRUE(absl::StrContains(
      text, "vllm:num_requests_running{model_name=\"demo\"} 0\n"))
      << text;
  EXPECT_TRUE(
      absl::StrContains(text,
                        "vllm:request_success_total{model_name=\"demo\","
                        "finished_reason=\"abort\"} 0\n"));
  EXPECT_TRUE(
      absl::StrContains(text, "# TYPE process_cpu_seconds_total counter"));
  EXPECT_TRUE(absl::StrContains(text, "\nprocess_max_fds "));
  EXPECT_EQ(ServingMetrics::kContentType,
            "text/plain; version=0.0.4; charset=utf-8");
}

TEST(ProcessStats, ParsesAStatLineWhoseCommandHasSpacesAndParens) {
  // Fields 1..24 (proc(5)); the command is "a) (b c".
  const std::string line =
      "4242 (a) (b c) S 1 4242 4242 0 -1 4194560 100 0 0 0 "
      "250 50 0 0 20 0 7 0 123456 987654321 3000 18446744073709551615 1 1";
  absl::StatusOr<ProcStat> s = ParseProcStat(line);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->utime_ticks, 250u);
  EXPECT_EQ(s->stime_ticks, 50u);
  EXPECT_EQ(s->start_ticks, 123456u);
  EXPECT_EQ(s->vsize_bytes, 987654321u);
  EXPECT_EQ(s->rss_pages, 3000);
  EXPECT_FALSE(ParseProcStat("4242 (a) S 1 2 3").ok());
  EXPECT_FALSE(ParseProcStat("no parenthesis at all").ok());
}

TEST(ProcessStats, ReadsThisProcess) {
  absl::StatusOr<ProcessStats> a = ReadProcessStats();
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_GT(a->resident_bytes, 1 << 20);
  EXPECT_GE(a->virtual_bytes, a->resident_bytes);
  const double now = static_cast<double>(std::time(nullptr));
  EXPECT_LE(a->start_time_seconds, now + 1);
  EXPECT_GT(a->start_time_seconds, now - 3600);  // This test started it.
  rlimit limit{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &limit), 0);
  if (limit.rlim_cur != RLIM_INFINITY) {
    EXPECT_EQ(a->max_fds, static_cast<double>(limit.rlim_cur));
  }
  // Two more descriptors are seen as two more.
  const int f1 = open("/proc/self/stat", O_RDONLY);
  const int f2 = open("/proc/self/stat", O_RDONLY);
  ASSERT_GE(f1, 0);
  ASSERT_GE(f2, 0);
  absl::StatusOr<ProcessStats> b = ReadProcessStats();
  close(f1);
  close(f2);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->open_fds, a->open_fds + 2);
  // CPU time only grows, and a busy loop moves it.
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
  volatile double x = 0;
  while (std::chrono::steady_clock::now() < until) x = x + 1;
  absl::StatusOr<ProcessStats> c = ReadProcessStats();
  ASSERT_TRUE(c.ok());
  EXPECT_GT(c->cpu_seconds, a->cpu_seconds);
}

// The real thing: an AsyncEngine on the demo checkpoint reports to the
// metrics as it runs. Two requests run to max_tokens; a third is cancelled
// before the loop starts, so it ends in its first admission, never run.
TEST(ServingMetrics, AsyncEngineReportsEveryStepTokenAndEnd) {
  CpuOps ops;
  EngineOptions options;
  options.scheduler.max_num_seqs = 4;
  options.scheduler.max_num_batched_tokens = 256;
  KvCacheOptions kv;
  kv.memory_bytes = int64_t{32} << 20;
  auto local = LocalEngine::Load(DemoModelDir(), &ops, options, kv);
  ASSERT_TRUE(local.ok()) << local.status();
  AsyncEngine async(&(*local)->engine(), /*max_pending=*/8);
  auto metrics = std::make_shared<ServingMetrics>("demo", 512);
  async.set_observer(metrics);

  GenerationRequest r;
  r.prompt_ids = {1, 20, 30, 40, 50, 60, 70};
  r.max_tokens = 8;
  r.ignore_eos = true;
  r.sampling.temperature = 0.0f;
  const auto arrival =
      RequestStream::Clock::now() - std::chrono::milliseconds(200);
  std::vector<GenerationRequest> two = {r, r};
  auto streams = async.SubmitGroup(two, arrival);
  ASSERT_TRUE(streams.ok()) << streams.status();
  GenerationRequest long_one = r;
  long_one.max_tokens = 400;
  auto cancelled = async.Submit(long_one);
  ASSERT_TRUE(cancelled.ok());
  async.Cancel((*cancelled)->id());
  std::thread loop([&] { EXPECT_TRUE(async.Loop().ok()); });
  for (auto& s : *streams) ASSERT_TRUE(s->Wait().ok());
  auto result = (*cancelled)->Wait();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->finish_reason, FinishReason::kAbort);
  EXPECT_TRUE(result->output_ids.empty());
  async.Drain();
  loop.join();

  ServingMetrics& m = *metrics;
  EXPECT_EQ(Success(m, "length"), 2);
  EXPECT_EQ(Success(m, "abort"), 1);
  EXPECT_EQ(Success(m, "stop"), 0);
  EXPECT_EQ(Success(m, "error"), 0);
  // Prompt tokens count at the first token: the cancelled one had none.
  EXPECT_EQ(One(m, "vllm:prompt_tokens_total").counter.value, 2 * 7);
  EXPECT_EQ(One(m, "vllm:generation_tokens_total").counter.value, 16);
  const prometheus::ClientMetric ttft =
      One(m, "vllm:time_to_first_token_seconds");
  EXPECT_EQ(ttft.histogram.sample_count, 2u);
  // The given arrival counts: both waited 200 ms before submission.
  EXPECT_GT(ttft.histogram.sample_sum, 0.4);
  EXPECT_EQ(One(m, "vllm:inter_token_latency_seconds").histogram.sample_count,
            14u);
  const prometheus::ClientMetric e2e =
      One(m, "vllm:e2e_request_latency_seconds");
  EXPECT_EQ(e2e.histogram.sample_count, 3u);
  EXPECT_GT(e2e.histogram.sample_sum, 0.4);
  for (const char* phase :
       {"vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds",
        "vllm:request_inference_time_seconds"}) {
    const prometheus::ClientMetric h = One(m, phase);
    EXPECT_EQ(h.histogram.sample_count, 3u) << phase;
    EXPECT_GE(h.histogram.sample_sum, 0.0) << phase;
    // Each phase is a part of e2e, which also holds the 200 ms before
    // submission.
    EXPECT_LT(h.histogram.sample_sum, e2e.histogram.sample_sum - 0.4) << phase;
  }
  EXPECT_GT(One(m, "vllm:request_decode_time_seconds").histogram.sample_sum,
            0.0);
  const prometheus::ClientMetric gen = One(m, "vllm:request_generation_tokens");
  EXPECT_EQ(gen.histogram.sample_sum, 16);
  EXPECT_EQ(Bucket(gen, 5), 1u);  // The cancelled one's 0.
  EXPECT_EQ(Bucket(gen, 10), 3u);
  const prometheus::ClientMetric it = One(m, "vllm:iteration_tokens_total");
  // Each request ran its 7 prompt tokens and 7 decodes (the 8th token is
  // never run).
  EXPECT_GE(it.histogram.sample_count, 8u);
  EXPECT_EQ(it.histogram.sample_sum, 2 * (7 + 7));
  EXPECT_EQ(One(m, "vllm:request_params_max_tokens").histogram.sample_sum,
            8 + 8 + 400);
}

}  // namespace
}  // namespace tessera
