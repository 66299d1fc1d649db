// The serving stats line, vLLM's periodic log line in Tessera's log:
//
//   [tessera] stats: Avg prompt throughput: 812.4 tokens/s, Avg generation
//   throughput: 96.0 tokens/s, Running: 4 reqs, Waiting: 0 reqs, KV cache
//   usage: 12.5%, Prefix cache hit rate: 40.0%
//
// Throughputs are over the interval since the previous sample (prompt
// tokens the engine computed, not the prefix cache's hits; tokens sampled),
// Running and Waiting are now (waiting: queued in the engine and not yet
// admitted to it), KV cache usage is the share of blocks in use now, and the
// prefix cache hit rate is over the prompt tokens looked up in the interval
// (over the server's life when none were). An idle server stays quiet: a
// line is made while requests run or wait, or tokens were computed in the
// interval, and once more after that (the zeros that say it went idle), as
// vLLM logs.
#ifndef TESSERA_RUNTIME_SERVE_STATS_LOGGER_H_
#define TESSERA_RUNTIME_SERVE_STATS_LOGGER_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "runtime/engine/engine.h"
#include "runtime/serve/async_engine.h"

namespace tessera {

struct StatsSample {
  std::chrono::steady_clock::time_point at;
  int64_t prompt_tokens = 0;  // Totals.
  int64_t generation_tokens = 0;
  int64_t prefix_hit_tokens = 0;
  int64_t prefix_queried_tokens = 0;
  int64_t running = 0;  // Now.
  int64_t waiting = 0;
  int64_t kv_used_blocks = 0;
  int64_t kv_total_blocks = 0;
};

// The engine's statistics as a sample; `queued`: requests accepted but not
// yet in the engine (AsyncEngine::Stats::waiting).
StatsSample SampleOf(const Engine::Stats& stats, int64_t queued,
                     std::chrono::steady_clock::time_point at);

// Turns consecutive samples into lines (the rules above). Pure.
class StatsLineMaker {
 public:
  explicit StatsLineMaker(const StatsSample& first) : prev_(first) {}
  // The line for the interval since the previous sample, or nullopt when
  // the server is and was idle.
  std::optional<std::string> Next(const StatsSample& sample);

 private:
  StatsSample prev_;
  bool was_active_ = false;
};

// A thread that samples `engine` every `interval` and hands each line to
// `log` (stderr when unset). Stops (and joins) on destruction or Stop().
class StatsLogger {
 public:
  StatsLogger(const AsyncEngine* engine, std::chrono::milliseconds interval,
              std::function<void(const std::string&)> log = {});
  ~StatsLogger();
  StatsLogger(const StatsLogger&) = delete;
  StatsLogger& operator=(const StatsLogger&) = delete;

  void Stop();

 private:
  const AsyncEngine* engine_;
  const std::chrono::milliseconds interval_;
  std::function<void(const std::string&)> log_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_SERVE_STATS_LOGGER_H_
