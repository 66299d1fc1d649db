// The cost of recording on the serving hot path (the loop thread observes one
// inter-token latency per generated token), with prometheus-cpp's core:
//   bazel run -c opt //runtime/serve:metrics_benchmark
#include <benchmark/benchmark.h>
#include <prometheus/counter.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <memory>
#include <vector>

#include "runtime/serve/metrics.h"

namespace tessera {
namespace {

// vLLM's inter-token latency layout (19 bounds), with values that land all
// over it.
void BM_HistogramObserve(benchmark::State& state) {
  static prometheus::Registry* registry = new prometheus::Registry();
  static prometheus::Histogram* h =
      &prometheus::BuildHistogram()
           .Name("bench_seconds")
           .Register(*registry)
           .Add({}, prometheus::Histogram::BucketBoundaries(
                        InterTokenLatencyBuckets()));
  double v = 0.0;
  for (auto _ : state) {
    h->Observe(v);
    v = v > 90.0 ? 0.0 : v + 0.37;
  }
}
BENCHMARK(BM_HistogramObserve)->ThreadRange(1, 2);

void BM_CounterIncrement(benchmark::State& state) {
  static prometheus::Registry* registry = new prometheus::Registry();
  static prometheus::Counter* c = &prometheus::BuildCounter()
                                       .Name("bench_total")
                                       .Register(*registry)
                                       .Add({});
  for (auto _ : state) c->Increment();
}
BENCHMARK(BM_CounterIncrement)->ThreadRange(1, 2);

}  // namespace
}  // namespace tessera
