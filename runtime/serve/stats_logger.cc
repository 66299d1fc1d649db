#include "runtime/serve/stats_logger.h"

#include <algorithm>
#include <iostream>
#include <utility>

#include "absl/strings/str_format.h"

namespace tessera {

StatsSample SampleOf(const Engine::Stats& stats, int64_t queued,
                     std::chrono::steady_clock::time_point at) {
  StatsSample s;
  s.at = at;
  s.prompt_tokens = stats.prompt_tokens;
  s.generation_tokens = stats.generation_tokens;
  s.prefix_hit_tokens = stats.blocks.hit_tokens;
  s.prefix_queried_tokens = stats.blocks.queried_tokens;
  s.running = stats.running;
  s.waiting = stats.waiting + queued;
  s.kv_used_blocks = stats.blocks.num_used_blocks;
  s.kv_total_blocks =
      stats.blocks.num_used_blocks + stats.blocks.num_free_blocks;
  return s;
}

std::optional<std::string> StatsLineMaker::Next(const StatsSample& s) {
  const StatsSample prev = std::exchange(prev_, s);
  const int64_t prompt = s.prompt_tokens - prev.prompt_tokens;
  const int64_t generated = s.generation_tokens - prev.generation_tokens;
  const bool active =
      prompt > 0 || generated > 0 || s.running > 0 || s.waiting > 0;
  const bool was_active = std::exchange(was_active_, active);
  if (!active && !was_active) return std::nullopt;
  const double seconds =
      std::max(std::chrono::duration<double>(s.at - prev.at).count(), 1e-9);
  const int64_t queried = s.prefix_queried_tokens - prev.prefix_queried_tokens;
  const int64_t hits = s.prefix_hit_tokens - prev.prefix_hit_tokens;
  double hit_rate = 0.0;
  if (queried > 0) {
    hit_rate = static_cast<double>(hits) / static_cast<double>(queried);
  } else if (s.prefix_queried_tokens > 0) {
    hit_rate = static_cast<double>(s.prefix_hit_tokens) /
               static_cast<double>(s.prefix_queried_tokens);
  }
  const double usage = s.kv_total_blocks > 0
                           ? static_cast<double>(s.kv_used_blocks) /
                                 static_cast<double>(s.kv_total_blocks)
                           : 0.0;
  return absl::StrFormat(
      "[tessera] stats: Avg prompt throughput: %.1f tokens/s, Avg generation "
      "throughput: %.1f tokens/s, Running: %d reqs, Waiting: %d reqs, KV "
      "cache usage: %.1f%%, Prefix cache hit rate: %.1f%%",
      static_cast<double>(prompt) / seconds,
      static_cast<double>(generated) / seconds, s.running, s.waiting,
      usage * 100.0, hit_rate * 100.0);
}

StatsLogger::StatsLogger(const AsyncEngine* engine,
                         std::chrono::milliseconds interval,
                         std::function<void(const std::string&)> log)
    : engine_(engine), interval_(interval), log_(std::move(log)) {
  thread_ = std::thread([this] {
    using Clock = std::chrono::steady_clock;
    auto sample = [this] {
      return SampleOf(engine_->engine_stats(), engine_->stats().waiting,
                      Clock::now());
    };
    StatsLineMaker maker(sample());
    std::unique_lock<std::mutex> lock(mu_);
    Clock::time_point next = Clock::now() + interval_;
    while (!cv_.wait_until(lock, next, [this] { return stop_; })) {
      next += interval_;
      std::optional<std::string> line = maker.Next(sample());
      if (!line) continue;
      if (log_) {
        log_(*line);
      } else {
        std::cerr << *line + "\n";
      }
    }
  });
}

StatsLogger::~StatsLogger() { Stop(); }

void StatsLogger::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

}  // namespace tessera
