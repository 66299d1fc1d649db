#include "runtime/core/fatal_hook.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tessera {
namespace {

// One process, one run: RunFatalHook runs the innermost installed hook once.
TEST(FatalHookTest, RunsTheInnermostHookOnce) {
  std::vector<std::string> outer_calls, inner_calls;
  ScopedFatalHook outer(
      [&](absl::string_view why) { outer_calls.emplace_back(why); });
  {
    ScopedFatalHook inner(
        [&](absl::string_view why) { inner_calls.emplace_back(why); });
  }
  // The inner scope ended: the outer hook is back.
  RunFatalHook("rank 1 stopped responding");
  RunFatalHook("again");
  ASSERT_EQ(outer_calls.size(), 1u);
  EXPECT_EQ(outer_calls[0], "rank 1 stopped responding");
  EXPECT_TRUE(inner_calls.empty());
}

}  // namespace
}  // namespace tessera
