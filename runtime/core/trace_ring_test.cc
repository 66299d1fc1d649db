#include "runtime/core/trace_ring.h"

#include <set>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tessera {
namespace {

TraceEvent Event(const char* name, int32_t tid, int64_t arg) {
  TraceEvent e;
  e.name = name;
  e.category = "test";
  e.start_ns = arg * 10;
  e.duration_ns = arg + 1;
  e.pid = tid % 3;
  e.tid = tid;
  e.arg_name = "n";
  e.arg = arg;
  return e;
}

TEST(TraceRing, KeepsTheNewestCapacityEventsOldestFirst) {
  TraceRing ring(5);  // Rounded up to 8.
  EXPECT_EQ(ring.capacity(), 8u);
  for (int64_t i = 0; i < 20; ++i) ring.Record(Event("e", 1, i));
  const std::vector<TraceEvent> got = ring.Snapshot();
  ASSERT_EQ(got.size(), 8u);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].arg, static_cast<int64_t>(12 + i));
    EXPECT_EQ(got[i].duration_ns, got[i].arg + 1);
    EXPECT_STREQ(got[i].name, "e");
  }
  EXPECT_EQ(ring.recorded(), 20u);
  EXPECT_EQ(ring.dropped(), 0u);
}

// Many writers at once with wraparound while a reader snapshots: every
// snapshot event is whole (its fields agree with each other as one Record
// wrote them), and every writer's events appear in its own order. Run under
// TSan in CI (the ring's words are all atomics).
TEST(TraceRing, ConcurrentWritersAndSnapshotsSeeOnlyWholeEvents) {
  constexpr int kWriters = 8;
  constexpr int64_t kPerWriter = 12500;  // 100,000 writes in all.
  TraceRing ring(4096);
  std::atomic<bool> done{false};
  std::atomic<int64_t> checked{0};
  std::thread reader([&] {
    while (!done.load()) {
      for (const TraceEvent& e : ring.Snapshot()) {
        // Fields derived from one (writer, i): a torn event breaks them.
        const int64_t i = e.arg % kPerWriter;
        const int32_t writer = static_cast<int32_t>(e.arg / kPerWriter);
        ASSERT_EQ(e.tid, writer);
        ASSERT_EQ(e.pid, writer % 3);
        ASSERT_EQ(e.start_ns, e.arg * 10);
        ASSERT_EQ(e.duration_ns, e.arg + 1);
        ASSERT_GE(i, 0);
        checked.fetch_add(1);
      }
    }
  });
  std::vector<std::thread> writers;
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&ring, w] {
      for (int64_t i = 0; i < kPerWriter; ++i) {
        ring.Record(Event("w", w, w * kPerWriter + i));
      }
    });
  }
  for (std::thread& t : writers) t.join();
  done.store(true);
  reader.join();
  EXPECT_EQ(ring.recorded(), static_cast<uint64_t>(kWriters * kPerWriter));
  // After the writers: a full ring of whole events, each writer's in order.
  const std::vector<TraceEvent> last = ring.Snapshot();
  EXPECT_GE(last.size() + ring.dropped(), ring.capacity() - kWriters);
  std::vector<int64_t> previous(kWriters, -1);
  for (const TraceEvent& e : last) {
    ASSERT_GT(e.arg, previous[e.tid]);
    previous[e.tid] = e.arg;
  }
}

TEST(TraceRing, ScopedTraceRecordsACompleteEventAndNullRingNothing) {
  TraceRing ring(4);
  { ScopedTrace t(&ring, "step", "engine", 0, "tokens", 7); }
  { ScopedTrace t(nullptr, "step", "engine", 0); }
  const std::vector<TraceEvent> got = ring.Snapshot();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_STREQ(got[0].name, "step");
  EXPECT_GT(got[0].duration_ns, 0);
  EXPECT_EQ(got[0].arg, 7);
  EXPECT_EQ(got[0].tid, TraceThreadId());
}

TEST(TraceRing, ChromeTraceJsonIsWhatPerfettoReads) {
  std::vector<TraceEvent> events = {Event("forward", 2, 5)};
  events.push_back(Event("mark", 1, 3));
  events.back().duration_ns = 0;
  events.back().arg_name = nullptr;
  const nlohmann::json j =
      nlohmann::json::parse(ChromeTraceJson(events, {"rank 0", "rank 1"}));
  const auto& list = j.at("traceEvents");
  ASSERT_EQ(list.size(), 4u);
  EXPECT_EQ(list[0].at("ph"), "M");
  EXPECT_EQ(list[1].at("args").at("name"), "rank 1");
  EXPECT_EQ(list[2].at("name"), "forward");
  EXPECT_EQ(list[2].at("ph"), "X");
  EXPECT_DOUBLE_EQ(list[2].at("ts").get<double>(), 0.05);
  EXPECT_DOUBLE_EQ(list[2].at("dur").get<double>(), 0.006);
  EXPECT_EQ(list[2].at("args").at("n"), 5);
  EXPECT_EQ(list[3].at("ph"), "i");
  EXPECT_FALSE(list[3].contains("args"));
}

}  // namespace
}  // namespace tessera
