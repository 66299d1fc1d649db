#include "runtime/core/workspace.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace tessera {
namespace {

TEST(WorkspaceTest, OneAllocationForEveryBufferAndAlignedViews) {
  HostMemorySource source;
  PinnableBlockAllocator allocator(&source);
  {
    Workspace ws;
    ASSERT_TRUE(ws.RegisterBuffer("hidden", 1000).ok());
    ASSERT_TRUE(ws.RegisterBuffer("gate", 4096).ok());
    ASSERT_TRUE(
        ws.RegisterBuffer("hidden", 1000).ok());  // Shared: same size is fine.
    EXPECT_EQ(ws.RegisterBuffer("hidden", 999).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(ws.View("hidden", DType::kF32, {10}).status().code(),
              absl::StatusCode::kFailedPrecondition);
    ASSERT_TRUE(ws.FinalizeAndBind(&allocator).ok());
    EXPECT_EQ(allocator.stats().underlying_allocations, 1);
    EXPECT_EQ(ws.RegisterBuffer("late", 8).code(),
              absl::StatusCode::kFailedPrecondition);

    auto hidden = ws.View("hidden", DType::kF32, {250});
    auto gate = ws.View("gate", DType::kF32, {2, 512});
    ASSERT_TRUE(hidden.ok() && gate.ok());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(hidden->data()) % 256, 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(gate->data()) % 256, 0u);
    EXPECT_NE(hidden->data(), gate->data());
    // Buffers do not overlap: writing one leaves the other intact.
    for (int i = 0; i < 1024; ++i) gate->data_as<float>()[i] = 1.0f;
    for (int i = 0; i < 250; ++i) hidden->data_as<float>()[i] = 2.0f;
    for (int i = 0; i < 1024; ++i) ASSERT_EQ(gate->data_as<float>()[i], 1.0f);

    EXPECT_EQ(ws.View("hidden", DType::kF32, {251}).status().code(),
              absl::StatusCode::kOutOfRange);
    EXPECT_EQ(ws.View("nope", DType::kF32, {1}).status().code(),
              absl::StatusCode::kNotFound);
    // Views cost nothing: no allocation however many are taken.
    for (int i = 0; i < 100; ++i)
      ASSERT_TRUE(ws.View("gate", DType::kF32, {1024}).ok());
    EXPECT_EQ(allocator.stats().underlying_allocations, 1);
    EXPECT_GT(allocator.stats().in_use_bytes, 0);
  }
  EXPECT_EQ(allocator.stats().in_use_bytes,
            0);  // The block went back with the workspace.
}

}  // namespace
}  // namespace tessera
