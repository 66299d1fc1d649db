#include "kernels/cpu/cpu_threads.h"

#include <atomic>
#include <chrono>
#include <set>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace tessera {
namespace {

TEST(CpuThreadsForTest, FollowsOmpNumThreadsElseTheCpus) {
  EXPECT_EQ(CpuThreadsFor(nullptr, 2), 2);
  EXPECT_EQ(CpuThreadsFor("1", 2), 1);
  EXPECT_EQ(CpuThreadsFor("3", 2), 3);
  EXPECT_EQ(CpuThreadsFor("4,2", 8), 4);  // Nested levels: the outer one.
  EXPECT_EQ(CpuThreadsFor("", 2), 2);
  EXPECT_EQ(CpuThreadsFor("0", 2), 2);
  EXPECT_EQ(CpuThreadsFor("-3", 2), 2);
  EXPECT_EQ(CpuThreadsFor("two", 2), 2);
  EXPECT_EQ(CpuThreadsFor("2x", 6), 6);
  EXPECT_EQ(CpuThreadsFor("99999999999", 2), 1024);
  EXPECT_EQ(CpuThreadsFor(nullptr, 0), 1);
}

TEST(CpuThreadPoolTest, RunsEveryTaskOnceOnEveryPoolSize) {
  for (int threads : {1, 2, 3, 8}) {
    CpuThreadPool pool(threads);
    EXPECT_EQ(pool.threads(), threads);
    for (int64_t n : {0, 1, 2, 7, 1000}) {
      // Many jobs back to back: workers spin, sleep and wake between them.
      for (int rep = 0; rep < 50; ++rep) {
        std::vector<std::atomic<int>> runs(n);
        pool.ParallelFor(n, [&](int64_t t) { runs[t].fetch_add(1); });
        for (int64_t t = 0; t < n; ++t) {
          ASSERT_EQ(runs[t].load(), 1) << threads << " threads, task " << t;
        }
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
}

TEST(CpuThreadPoolTest, SpreadsTasksOverItsThreads) {
  CpuThreadPool pool(2);
  // Each task waits until two different threads have started one, so it
  // ends only if a worker joins.
  std::atomic<int> started{0};
  std::mutex mu;
  std::set<std::thread::id> ids;
  pool.ParallelFor(2, [&](int64_t) {
    {
      std::lock_guard<std::mutex> lock(mu);
      ids.insert(std::this_thread::get_id());
    }
    started.fetch_add(1);
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (started.load() < 2 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::yield();
    }
  });
  EXPECT_EQ(ids.size(), 2u);
}

TEST(CpuThreadPoolTest, NestedAndConcurrentCallsComplete) {
  CpuThreadPool pool(3);
  std::atomic<int64_t> sum{0};
  auto job = [&] {
    for (int rep = 0; rep < 100; ++rep) {
      pool.ParallelFor(6, [&](int64_t i) {
        pool.ParallelFor(5, [&](int64_t j) { sum.fetch_add(i * 5 + j + 1); });
      });
    }
  };
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) callers.emplace_back(job);
  for (std::thread& t : callers) t.join();
  // 4 callers x 100 reps x (1 + ... + 30).
  EXPECT_EQ(sum.load(), 4 * 100 * (30 * 31 / 2));
}

TEST(CpuThreadPoolTest, CallerDoesNotWaitForABusyWorker) {
  // The worker is held inside a task of a first job; a second job from
  // another thread runs on its own thread rather than waiting.
  CpuThreadPool pool(2);
  std::atomic<bool> release{false};
  std::atomic<int> in_first{0};
  std::thread first([&] {
    pool.ParallelFor(2, [&](int64_t) {
      in_first.fetch_add(1);
      while (!release.load()) std::this_thread::yield();
    });
  });
  while (in_first.load() < 2) std::this_thread::yield();
  int runs = 0;
  pool.ParallelFor(3, [&](int64_t) { ++runs; });
  EXPECT_EQ(runs, 3);
  release.store(true);
  first.join();
}

TEST(CpuThreadPoolTest, DefaultPoolHasAtLeastOneThread) {
  EXPECT_GE(CpuThreadPool::Default().threads(), 1);
  EXPECT_EQ(&CpuThreadPool::Default(), &CpuThreadPool::Default());
}

}  // namespace
}  // namespace tessera
