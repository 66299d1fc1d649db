// Allocate+free pairs with N blocks already cached, for the allocator and for
// malloc. The allocator's cost should not depend on N: every free list is
// indexed and removal is swap-and-pop.
#include <cstdlib>
#include <vector>

#include "benchmark/benchmark.h"
#include "runtime/core/memory.h"

namespace tessera {
namespace {

// Sizes of the cached blocks cycle through the small classes, so N spreads
// over many free lists as well as growing the one the loop hits.
size_t CachedSize(int64_t i) { return 512 + (i % 8) * 256; }

constexpr size_t kLoopSize = 1024;

void BM_AllocatorAllocateFree(benchmark::State& state) {
  HostMemorySource source;
  PinnableBlockAllocator allocator(&source);
  const int64_t n = state.range(0);
  std::vector<void*> cached;
  cached.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    cached.push_back(*allocator.Allocate(CachedSize(i)));
  }
  for (void* ptr : cached) (void)allocator.Free(ptr);
  for (auto _ : state) {
    void* ptr = *allocator.Allocate(kLoopSize);
    benchmark::DoNotOptimize(ptr);
    (void)allocator.Free(ptr);
  }
  state.counters["cached_blocks"] =
      static_cast<double>(allocator.stats().cached_blocks);
}
BENCHMARK(BM_AllocatorAllocateFree)->Arg(10)->Arg(1000)->Arg(100000);

void BM_MallocFree(benchmark::State& state) {
  const int64_t n = state.range(0);
  std::vector<void*> cached;
  cached.reserve(n);
  for (int64_t i = 0; i < n; ++i) cached.push_back(std::malloc(CachedSize(i)));
  for (void* ptr : cached) std::free(ptr);
  for (auto _ : state) {
    void* ptr = std::malloc(kLoopSize);
    benchmark::DoNotOptimize(ptr);
    std::free(ptr);
  }
}
BENCHMARK(BM_MallocFree)->Arg(10)->Arg(1000)->Arg(100000);

}  // namespace
}  // namespace tessera
