#include "runtime/serve/stats_logger.h"

#include <chrono>
#include <optional>
#include <string>

#include "gtest/gtest.h"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

StatsSample At(double seconds) {
  StatsSample s;
  s.at = Clock::time_point() +
         std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  s.kv_total_blocks = 200;
  return s;
}

TEST(StatsLineTest, VllmsLineOverTheInterval) {
  StatsSample a = At(0);
  a.prompt_tokens = 100;
  a.generation_tokens = 50;
  a.prefix_queried_tokens = 100;
  StatsLineMaker maker(a);
  StatsSample b = At(10);
  b.prompt_tokens = 100 + 8124;
  b.generation_tokens = 50 + 960;
  b.prefix_queried_tokens = 100 + 1000;
  b.prefix_hit_tokens = 400;
  b.running = 4;
  b.waiting = 1;
  b.kv_used_blocks = 25;
  const std::optional<std::string> line = maker.Next(b);
  ASSERT_TRUE(line);
  EXPECT_EQ(*line,
            "[tessera] stats: Avg prompt throughput: 812.4 tokens/s, Avg "
            "generation throughput: 96.0 tokens/s, Running: 4 reqs, Waiting: "
            "1 reqs, KV cache usage: 12.5%, Prefix cache hit rate: 40.0%");
}

TEST(StatsLineTest, AnIdleServerStaysQuietAfterOneClosingLine) {
  StatsLineMaker maker(At(0));
  EXPECT_FALSE(maker.Next(At(10)));  // Idle from the start: nothing.
  StatsSample busy = At(20);
  busy.generation_tokens = 100;
  ASSERT_TRUE(maker.Next(busy));
  // Work ended: one line of zeros says so, then silence.
  StatsSample idle = busy;
  idle.at = At(30).at;
  const std::optional<std::string> closing = maker.Next(idle);
  ASSERT_TRUE(closing);
  EXPECT_NE(closing->find("Avg generation throughput: 0.0 tokens/s, Running: "
                          "0 reqs, Waiting: 0 reqs"),
            std::string::npos)
      << *closing;
  idle.at = At(40).at;
  EXPECT_FALSE(maker.Next(idle));
  // A request that waits (nothing computed yet) is activity.
  StatsSample waiting = idle;
  waiting.at = At(50).at;
  waiting.waiting = 1;
  ASSERT_TRUE(maker.Next(waiting));
}

TEST(StatsLineTest, HitRateOverTheLifeWhenTheIntervalLookedUpNothing) {
  StatsSample a = At(0);
  a.prefix_queried_tokens = 200;
  a.prefix_hit_tokens = 50;
  StatsLineMaker maker(a);
  StatsSample b = a;
  b.at = At(5).at;
  b.running = 1;
  const std::optional<std::string> line = maker.Next(b);
  ASSERT_TRUE(line);
  EXPECT_NE(line->find("Prefix cache hit rate: 25.0%"), std::string::npos)
      << *line;
}

TEST(StatsSampleTest, FromEngineStats) {
  Engine::Stats e;
  e.prompt_tokens = 7;
  e.generation_tokens = 9;
  e.running = 2;
  e.waiting = 3;
  e.blocks.num_used_blocks = 10;
  e.blocks.num_free_blocks = 30;
  e.blocks.hit_tokens = 16;
  e.blocks.queried_tokens = 64;
  const StatsSample s = SampleOf(e, /*queued=*/4, Clock::time_point());
  EXPECT_EQ(s.prompt_tokens, 7);
  EXPECT_EQ(s.generation_tokens, 9);
  EXPECT_EQ(s.running, 2);
  EXPECT_EQ(s.waiting, 7);
  EXPECT_EQ(s.kv_used_blocks, 10);
  EXPECT_EQ(s.kv_total_blocks, 40);
  EXPECT_EQ(s.prefix_hit_tokens, 16);
  EXPECT_EQ(s.prefix_queried_tokens, 64);
}

}  // namespace
}  // namespace tessera
