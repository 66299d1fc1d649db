#include "runtime/core/fatal_hook.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace tessera {
namespace {

// One process, one run (RunFatalHook runs once per process, so this is the
// only test that runs it): the innermost installed hook runs once, and the
// scope that installed it waits for the run to end before it goes.
TEST(FatalHookTest, RunsTheInnermostHookOnceAndOutlivesItsScope) {
  std::vector<std::string> inner_calls;
  std::atomic<bool> started{false}, finished{false};
  std::string why;
  auto outer = std::make_unique<ScopedFatalHook>([&](absl::string_view w) {
    why = std::string(w);
    started = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    finished = true;
  });
  {
    ScopedFatalHook inner(
        [&](absl::string_view w) { inner_calls.emplace_back(w); });
  }
  // The inner scope ended: the outer hook is back.
  std::thread dying([] { RunFatalHook("rank 1 stopped responding"); });
  while (!started) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  outer.reset();  // Waits for the run under way.
  EXPECT_TRUE(finished);
  dying.join();
  RunFatalHook("again");  // Once per process: nothing runs.
  EXPECT_EQ(why, "rank 1 stopped responding");
  EXPECT_TRUE(inner_calls.empty());
}

}  // namespace
}  // namespace tessera
