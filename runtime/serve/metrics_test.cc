#include "runtime/serve/metrics.h"

#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

TEST(MetricsFormatTest, Values) {
  EXPECT_EQ(FormatMetricValue(0), "0");
  EXPECT_EQ(FormatMetricValue(-0.0), "0");
  EXPECT_EQ(FormatMetricValue(1), "1");
  EXPECT_EQ(FormatMetricValue(-7), "-7");
  EXPECT_EQ(FormatMetricValue(1234567), "1234567");
  EXPECT_EQ(FormatMetricValue(9007199254740991.0), "9007199254740991");
  EXPECT_EQ(FormatMetricValue(2.5), "2.5");
  EXPECT_EQ(FormatMetricValue(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(FormatMetricValue(1e300), "1e+300");
  EXPECT_EQ(FormatMetricValue(1.5e-7), "1.5e-07");
  EXPECT_EQ(FormatMetricValue(kNaN), "NaN");
  EXPECT_EQ(FormatMetricValue(kInf), "+Inf");
  EXPECT_EQ(FormatMetricValue(-kInf), "-Inf");
  // Every value round-trips.
  for (double v : {0.1, 1.0 / 3, 2.0 / 3 * 1e10, 123456.789, 5e-324, 1.7e308,
                   -0.005, 4503599627370496.5, 1e16}) {
    EXPECT_EQ(std::strtod(FormatMetricValue(v).c_str(), nullptr), v) << v;
  }
}

TEST(MetricsFormatTest, BucketBoundsLikeGo) {
  // strconv.FormatFloat(v, 'g', -1, 64).
  EXPECT_EQ(FormatBucketBound(0.005), "0.005");
  EXPECT_EQ(FormatBucketBound(0.001), "0.001");
  EXPECT_EQ(FormatBucketBound(0.0001), "0.0001");
  EXPECT_EQ(FormatBucketBound(0.00001), "1e-05");
  EXPECT_EQ(FormatBucketBound(1), "1");
  EXPECT_EQ(FormatBucketBound(2.5), "2.5");
  EXPECT_EQ(FormatBucketBound(10), "10");
  EXPECT_EQ(FormatBucketBound(2560), "2560");
  EXPECT_EQ(FormatBucketBound(100000), "100000");
  EXPECT_EQ(FormatBucketBound(123456.5), "123456.5");
  EXPECT_EQ(FormatBucketBound(1e6), "1e+06");
  EXPECT_EQ(FormatBucketBound(1234567), "1.234567e+06");
  EXPECT_EQ(FormatBucketBound(1e100), "1e+100");
  EXPECT_EQ(FormatBucketBound(-0.25), "-0.25");
  EXPECT_EQ(FormatBucketBound(0), "0");
  EXPECT_EQ(FormatBucketBound(kInf), "+Inf");
}

TEST(MetricsFormatTest, Escapes) {
  EXPECT_EQ(EscapeLabelValue("a\\b\"c\nd\te"), "a\\\\b\\\"c\\nd\te");
  EXPECT_EQ(EscapeHelp("a\\b\"c\nd"), "a\\\\b\"c\\nd");
}

TEST(MetricsRegistryTest, EmptyRendersNothing) {
  MetricsRegistry registry;
  EXPECT_EQ(registry.Render(), "");
}

TEST(MetricsRegistryTest, RendersExactText) {
  MetricsRegistry registry;
  Counter* stop =
      *registry.AddCounter("tessera_request_success_total",
                           "Finished requests.", {{"finish_reason", "stop"}});
  Gauge* running =
      *registry.AddGauge("tessera_num_requests_running", "Running requests.");
  Counter* length =
      *registry.AddCounter("tessera_request_success_total",
                           "Finished requests.", {{"finish_reason", "length"}});
  Histogram* ttft = *registry.AddHistogram("tessera_ttft_seconds",
                                           "Time to first token.\nSeconds.",
                                           {0.005, 0.5, 1}, {{"model", "m"}});
  stop->Increment(3);
  length->Increment();
  running->Set(2);
  ttft->Observe(0.001);
  ttft->Observe(0.5);
  ttft->Observe(0.75);
  ttft->Observe(30);
  EXPECT_EQ(registry.Render(),
            "# HELP tessera_request_success_total Finished requests.\n"
            "# TYPE tessera_request_success_total counter\n"
            "tessera_request_success_total{finish_reason=\"stop\"} 3\n"
            "tessera_request_success_total{finish_reason=\"length\"} 1\n"
            "# HELP tessera_num_requests_running Running requests.\n"
            "# TYPE tessera_num_requests_running gauge\n"
            "tessera_num_requests_running 2\n"
            "# HELP tessera_ttft_seconds Time to first token.\\nSeconds.\n"
            "# TYPE tessera_ttft_seconds histogram\n"
            "tessera_ttft_seconds_bucket{model=\"m\",le=\"0.005\"} 1\n"
            "tessera_ttft_seconds_bucket{model=\"m\",le=\"0.5\"} 2\n"
            "tessera_ttft_seconds_bucket{model=\"m\",le=\"1\"} 3\n"
            "tessera_ttft_seconds_bucket{model=\"m\",le=\"+Inf\"} 4\n"
            "tessera_ttft_seconds_sum{model=\"m\"} 31.251\n"
            "tessera_ttft_seconds_count{model=\"m\"} 4\n");
}

TEST(MetricsRegistryTest, HistogramWithoutLabelsAndEmptyBounds) {
  MetricsRegistry registry;
  Histogram* h = *registry.AddHistogram("x_seconds", "X.", {});
  h->Observe(1);
  h->Observe(2);
  EXPECT_EQ(registry.Render(),
            "# HELP x_seconds X.\n"
            "# TYPE x_seconds histogram\n"
            "x_seconds_bucket{le=\"+Inf\"} 2\n"
            "x_seconds_sum 3\n"
            "x_seconds_count 2\n");
}

TEST(MetricsRegistryTest, LabelsAreSortedAndEscaped) {
  MetricsRegistry registry;
  Gauge* g = *registry.AddGauge(
      "g", "Help with \\ backslash.",
      {{"zeta", "1"}, {"alpha", "quote \" back \\ nl \n end"}});
  g->Set(-1.5);
  EXPECT_EQ(registry.Render(),
            "# HELP g Help with \\\\ backslash.\n"
            "# TYPE g gauge\n"
            "g{alpha=\"quote \\\" back \\\\ nl \\n end\",zeta=\"1\"} -1.5\n");
}

TEST(MetricsRegistryTest, SpecialValues) {
  MetricsRegistry registry;
  Gauge* a = *registry.AddGauge("a", "A.", {{"k", "nan"}});
  Gauge* b = *registry.AddGauge("a", "A.", {{"k", "inf"}});
  Gauge* c = *registry.AddGauge("a", "A.", {{"k", "ninf"}});
  a->Set(kNaN);
  b->Set(kInf);
  c->Set(-kInf);
  EXPECT_EQ(registry.Render(),
            "# HELP a A.\n# TYPE a gauge\n"
            "a{k=\"nan\"} NaN\na{k=\"inf\"} +Inf\na{k=\"ninf\"} -Inf\n");
}

TEST(MetricsRegistryTest, CounterRejectsNegativeAndNaN) {
  MetricsRegistry registry;
  Counter* c = *registry.AddCounter("c_total", "C.");
  EXPECT_TRUE(c->Increment());
  EXPECT_TRUE(c->Increment(0.5));
  EXPECT_FALSE(c->Increment(-1));
  EXPECT_FALSE(c->Increment(kNaN));
  EXPECT_EQ(c->value(), 1.5);
}

TEST(MetricsRegistryTest, GaugeOperations) {
  MetricsRegistry registry;
  Gauge* g = *registry.AddGauge("g", "G.");
  g->Set(10);
  g->Add(2.5);
  g->Increment();
  g->Decrement();
  g->Decrement();
  g->Add(-0.5);
  EXPECT_EQ(g->value(), 11);
}

TEST(MetricsRegistryTest, HistogramCumulativeCounts) {
  MetricsRegistry registry;
  Histogram* h =
      *registry.AddHistogram("h_seconds", "H.", {0.1, 0.2, 0.4, kInf});
  EXPECT_EQ(h->bounds(),
            (std::vector<double>{0.1, 0.2, 0.4}));  // +Inf dropped.
  for (double v : {0.05, 0.1, 0.1000001, 0.2, 0.3, 0.4, 0.5, 100.0, -1.0}) {
    h->Observe(v);
  }
  h->Observe(kNaN);  // Ignored.
  HistogramSnapshot s = h->Snapshot();
  EXPECT_EQ(s.bounds, (std::vector<double>{0.1, 0.2, 0.4}));
  // <=0.1: 0.05, 0.1, -1; <=0.2: +0.1000001, 0.2; <=0.4: +0.3, 0.4; +Inf: all.
  EXPECT_EQ(s.cumulative, (std::vector<uint64_t>{3, 5, 7, 9}));
  EXPECT_EQ(s.count, 9u);
  EXPECT_DOUBLE_EQ(
      s.sum, 0.05 + 0.1 + 0.1000001 + 0.2 + 0.3 + 0.4 + 0.5 + 100.0 - 1.0);
  h->Observe(kInf);
  s = h->Snapshot();
  EXPECT_EQ(s.cumulative.back(), 10u);
  EXPECT_EQ(s.cumulative[2], 7u);
  EXPECT_EQ(s.sum, kInf);
}

TEST(MetricsRegistryTest, ConcurrentUpdatesSumExactly) {
  MetricsRegistry registry;
  Counter* c = *registry.AddCounter("c_total", "C.");
  Gauge* g = *registry.AddGauge("g", "G.");
  Histogram* h = *registry.AddHistogram("h", "H.", {0.5, 1.5});
  constexpr int kThreads = 8;
  constexpr int kPerThread = 100000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        c->Increment();
        g->Add(t % 2 == 0 ? 2 : -1);
        h->Observe(i % 2);  // 0 and 1, exact sums.
      }
    });
  }
  // Renders and registrations concurrently with the updates.
  std::thread scraper([&] {
    for (int i = 0; i < 50; ++i) {
      (void)registry.Render();
      ASSERT_TRUE(
          registry.AddGauge("g2", "G2.", {{"i", std::to_string(i)}}).ok());
    }
  });
  for (auto& t : threads) t.join();
  scraper.join();
  EXPECT_EQ(c->value(), kThreads * kPerThread);
  EXPECT_EQ(g->value(), kThreads / 2 * kPerThread);
  const HistogramSnapshot s = h->Snapshot();
  EXPECT_EQ(s.count, uint64_t{kThreads} * kPerThread);
  EXPECT_EQ(s.cumulative[0], uint64_t{kThreads} * kPerThread / 2);
  EXPECT_EQ(s.cumulative[1], uint64_t{kThreads} * kPerThread);
  EXPECT_EQ(s.sum, kThreads * kPerThread / 2);
}

TEST(MetricsRegistryTest, InvalidNames) {
  MetricsRegistry registry;
  for (const char* name :
       {"", "1abc_total", "a-b_total", "a b_total", "é_total", "a.b_total"}) {
    EXPECT_EQ(registry.AddCounter(name, "x").status().code(),
              absl::StatusCode::kInvalidArgument)
        << name;
  }
  EXPECT_TRUE(registry.AddCounter("_a:b_c9_total", "x").ok());
  EXPECT_TRUE(registry.AddGauge("vllm:num_requests_running", "x").ok());
  // Label names.
  for (const char* label : {"", "1a", "a:b", "__reserved", "a-b", "é"}) {
    EXPECT_EQ(registry.AddGauge("g", "x", {{label, "v"}}).status().code(),
              absl::StatusCode::kInvalidArgument)
        << label;
  }
  EXPECT_TRUE(registry.AddGauge("g", "x", {{"_a9", "v"}}).ok());
  EXPECT_EQ(
      registry.AddGauge("g2", "x", {{"a", "1"}, {"a", "2"}}).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.AddHistogram("h", "x", {1}, {{"le", "1"}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Invalid UTF-8 in help or in a label value.
  EXPECT_EQ(registry.AddGauge("g3", "bad \xff").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.AddGauge("g3", "x", {{"a", "\xc3"}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      registry.AddGauge("g3", "caf\xc3\xa9", {{"a", "\xe2\x82\xac"}}).ok());
}

TEST(MetricsRegistryTest, SuffixRules) {
  MetricsRegistry registry;
  EXPECT_EQ(registry.AddCounter("requests", "x").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.AddGauge("requests_total", "x").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.AddHistogram("latency_total", "x", {1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  for (const char* name : {"g_bucket", "g_sum", "g_count"}) {
    EXPECT_EQ(registry.AddGauge(name, "x").status().code(),
              absl::StatusCode::kInvalidArgument)
        << name;
  }
}

TEST(MetricsRegistryTest, InvalidBounds) {
  MetricsRegistry registry;
  EXPECT_EQ(registry.AddHistogram("h", "x", {1, 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.AddHistogram("h", "x", {2, 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.AddHistogram("h", "x", {1, kNaN}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.AddHistogram("h", "x", {-kInf, 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.AddHistogram("h", "x", {1, kInf, kInf}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(registry.AddHistogram("h", "x", {-1, 0, 1}).ok());
  EXPECT_EQ(registry.Render().find("# HELP h x\n"),
            0u);  // Failures left no trace.
}

TEST(MetricsRegistryTest, DuplicateRegistration) {
  MetricsRegistry registry;
  Counter* a = *registry.AddCounter("a_total", "A.", {{"k", "1"}});
  // Same name, type, help and labels: the same child.
  EXPECT_EQ(*registry.AddCounter("a_total", "A.", {{"k", "1"}}), a);
  // Other label values: another child of the same family.
  Counter* a2 = *registry.AddCounter("a_total", "A.", {{"k", "2"}});
  EXPECT_NE(a2, a);
  // Different type, help or label names.
  EXPECT_EQ(registry.AddGauge("a_total", "A.").status().code(),
            absl::StatusCode::kInvalidArgument);  // Gauge may not end _total.
  EXPECT_EQ(registry.AddHistogram("a_total", "A.", {1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.AddCounter("a_total", "Other help.", {{"k", "3"}})
                .status()
                .code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(registry.AddCounter("a_total", "A.").status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(registry.AddCounter("a_total", "A.", {{"k", "3"}, {"j", "1"}})
                .status()
                .code(),
            absl::StatusCode::kAlreadyExists);

  Gauge* g = *registry.AddGauge("g", "G.");
  EXPECT_EQ(*registry.AddGauge("g", "G."), g);
  EXPECT_EQ(registry.AddHistogram("g", "G.", {1}).status().code(),
            absl::StatusCode::kAlreadyExists);

  // Histograms: bounds must match too.
  Histogram* h = *registry.AddHistogram("h", "H.", {1, 2}, {{"k", "1"}});
  EXPECT_EQ(*registry.AddHistogram("h", "H.", {1, 2, kInf}, {{"k", "1"}}), h);
  EXPECT_TRUE(registry.AddHistogram("h", "H.", {1, 2}, {{"k", "2"}}).ok());
  EXPECT_EQ(
      registry.AddHistogram("h", "H.", {1, 3}, {{"k", "3"}}).status().code(),
      absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(registry.AddGauge("h", "H.").status().code(),
            absl::StatusCode::kAlreadyExists);

  // Sample names collide across families.
  EXPECT_TRUE(registry.AddHistogram("x", "X.", {1}).ok());
  EXPECT_EQ(registry.AddCounter("x_count_total", "X.").ok(), true);
  EXPECT_EQ(registry.AddHistogram("x_count", "X.", {1}).status().code(),
            absl::StatusCode::kAlreadyExists);  // x_count is x's sample.
  EXPECT_TRUE(registry.AddHistogram("y_seconds", "Y.", {1}).ok());
  EXPECT_EQ(registry.AddHistogram("y", "Y.", {1}).ok(), true);
  EXPECT_EQ(
      registry.AddHistogram("y_seconds_bucket", "Y.", {1}).status().code(),
      absl::StatusCode::kAlreadyExists);

  // One HELP/TYPE block per family, children in registration order.
  const std::string text = registry.Render();
  EXPECT_NE(text.find("# TYPE a_total counter\n"
                      "a_total{k=\"1\"} 0\n"
                      "a_total{k=\"2\"} 0\n"
                      "# HELP g G.\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("# HELP a_total"), text.rfind("# HELP a_total"));
}

TEST(MetricsRegistryTest, HandlesAreStable) {
  MetricsRegistry registry;
  Counter* first = *registry.AddCounter("c_total", "C.", {{"i", "0"}});
  first->Increment(7);
  for (int i = 1; i < 1000; ++i) {
    ASSERT_TRUE(
        registry.AddCounter("c_total", "C.", {{"i", std::to_string(i)}}).ok());
    ASSERT_TRUE(registry.AddGauge("g" + std::to_string(i), "G.").ok());
  }
  EXPECT_EQ(*registry.AddCounter("c_total", "C.", {{"i", "0"}}), first);
  EXPECT_EQ(first->value(), 7);
}

TEST(MetricsBucketsTest, Exponential) {
  EXPECT_EQ(ExponentialBuckets(1, 2, 4), (std::vector<double>{1, 2, 4, 8}));
  EXPECT_EQ(ExponentialBuckets(0.001, 2, 3),
            (std::vector<double>{0.001, 0.002, 0.004}));
  EXPECT_TRUE(ExponentialBuckets(1, 2, 0).empty());
  EXPECT_TRUE(ExponentialBuckets(0, 2, 3).empty());
  EXPECT_TRUE(ExponentialBuckets(1, 1, 3).empty());
  EXPECT_TRUE(ExponentialBuckets(kNaN, 2, 3).empty());
  EXPECT_EQ(LinearBuckets(0.5, 0.5, 3), (std::vector<double>{0.5, 1, 1.5}));
  EXPECT_TRUE(LinearBuckets(0, 0, 3).empty());
}

TEST(MetricsBucketsTest, VllmDefaults) {
  const std::vector<double> ttft = DefaultTimeToFirstTokenBuckets();
  ASSERT_EQ(ttft.size(), 22u);
  EXPECT_EQ(ttft.front(), 0.001);
  EXPECT_EQ(ttft.back(), 2560);
  const std::vector<double> itl = DefaultInterTokenLatencyBuckets();
  ASSERT_EQ(itl.size(), 19u);
  EXPECT_EQ(itl.front(), 0.01);
  EXPECT_EQ(itl.back(), 80);
  const std::vector<double> e2e = DefaultRequestLatencyBuckets();
  ASSERT_EQ(e2e.size(), 21u);
  EXPECT_EQ(e2e.front(), 0.3);
  EXPECT_EQ(e2e.back(), 7680);
  MetricsRegistry registry;
  EXPECT_TRUE(registry.AddHistogram("t", "T.", ttft).ok());
  EXPECT_TRUE(registry.AddHistogram("i", "I.", itl).ok());
  EXPECT_TRUE(registry.AddHistogram("e", "E.", e2e).ok());
}

}  // namespace
}  // namespace tessera
