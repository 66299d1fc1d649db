#include "runtime/core/device_wait.h"

#include <string>
#include <thread>

#include "gtest/gtest.h"

namespace tessera {
namespace {

TEST(DeviceWaitTest, BlocksWithoutACheck) {
  int blocked = 0, polled = 0;
  EXPECT_TRUE(WaitForDevice(
                  [&]() -> absl::StatusOr<bool> {
                    ++polled;
                    return true;
                  },
                  [&] {
                    ++blocked;
                    return absl::OkStatus();
                  },
                  [] { return std::string("a stream"); })
                  .ok());
  EXPECT_EQ(blocked, 1);
  EXPECT_EQ(polled, 0);
}

TEST(DeviceWaitTest, PollsAndTheChecksErrorEndsTheWait) {
  int checks = 0;
  bool stalled = true;
  ScopedDeviceWaitCheck check(
      [&](absl::FunctionRef<std::string()> what) -> absl::Status {
        if (++checks < 3 || !stalled) return absl::OkStatus();
        return absl::DeadlineExceededError("step 4 ran past its limit in " +
                                           what());
      });
  const absl::Status never =
      WaitForDevice([]() -> absl::StatusOr<bool> { return false; },
                    [] { return absl::InternalError("must not block"); },
                    [] { return std::string("waiting for the GPU"); });
  EXPECT_EQ(never, absl::DeadlineExceededError(
                       "step 4 ran past its limit in waiting for the GPU"));
  EXPECT_EQ(checks, 3);
  stalled = false;

  // Ready after a few polls; a device error ends the wait too.
  int polls = 0;
  EXPECT_TRUE(
      WaitForDevice([&]() -> absl::StatusOr<bool> { return ++polls == 2; },
                    [] { return absl::InternalError("must not block"); },
                    [] { return std::string("x"); })
          .ok());
  EXPECT_EQ(WaitForDevice(
                []() -> absl::StatusOr<bool> {
                  return absl::InternalError("an illegal address");
                },
                [] { return absl::OkStatus(); }, [] { return std::string(); })
                .code(),
            absl::StatusCode::kInternal);

  // Another thread has no check: it blocks.
  std::thread other([] {
    bool blocked = false;
    EXPECT_TRUE(WaitForDevice([]() -> absl::StatusOr<bool> { return false; },
                              [&] {
                                blocked = true;
                                return absl::OkStatus();
                              },
                              [] { return std::string(); })
                    .ok());
    EXPECT_TRUE(blocked);
  });
  other.join();
}

TEST(DeviceWaitTest, ScopesNest) {
  int outer = 0, inner = 0;
  auto wait_once = [] {
    int polls = 0;
    return WaitForDevice([&]() -> absl::StatusOr<bool> { return ++polls == 2; },
                         [] { return absl::OkStatus(); },
                         [] { return std::string(); });
  };
  ScopedDeviceWaitCheck a([&](absl::FunctionRef<std::string()>) {
    ++outer;
    return absl::OkStatus();
  });
  {
    ScopedDeviceWaitCheck b([&](absl::FunctionRef<std::string()>) {
      ++inner;
      return absl::OkStatus();
    });
    EXPECT_TRUE(wait_once().ok());
  }
  EXPECT_TRUE(wait_once().ok());
  EXPECT_EQ(inner, 1);
  EXPECT_EQ(outer, 1);
}

}  // namespace
}  // namespace tessera
