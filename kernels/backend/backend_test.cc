#include "kernels/backend/backend.h"

#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(BackendTest, CpuIsAlwaysThere) {
  absl::StatusOr<Backend> b = CreateBackend("cpu", 3);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_FALSE(b->is_cuda());
  EXPECT_EQ(b->gpu, -1);
  EXPECT_NE(b->ops, nullptr);
  EXPECT_EQ(b->allocator, nullptr);
  EXPECT_EQ(b->FreeDeviceBytes(), -1);
}

TEST(BackendTest, RefusesUnknownDevicesAndNegativeGpuCounts) {
  absl::StatusOr<Backend> b = CreateBackend("tpu", 0);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(b.status().message()),
              HasSubstr("--device must be cpu or cuda, got \"tpu\""));
  b = CreateBackend("cpu", 0, -1);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(BackendTest, CudaWithoutTheToolkitSaysTheBuildHasNoCuda) {
  if (BuiltWithCuda()) {
    EXPECT_TRUE(CudaUnavailableError().ok());
    if (VisibleCudaDevices() > 0) GTEST_SKIP() << "a GPU is visible";
    absl::StatusOr<Backend> b = CreateBackend("cuda", 0);
    EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(b.status().message()),
                HasSubstr("no CUDA device is visible"));
    return;
  }
  EXPECT_EQ(VisibleCudaDevices(), 0);
  const absl::Status why = CudaUnavailableError();
  EXPECT_EQ(why.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(
      std::string(why.message()),
      StartsWith("--device cuda: this tessera was built without CUDA ("));
  EXPECT_THAT(std::string(why.message()), HasSubstr(" when it was built; "));
  EXPECT_THAT(std::string(why.message()), HasSubstr("and rebuild)"));
  absl::StatusOr<Backend> b = CreateBackend("cuda", 0, 8);
  EXPECT_EQ(b.status(), why);  // Not "no CUDA device" nor the GPU count.
}

}  // namespace
}  // namespace tessera
