// The pinnable allocator over real device memory (skips without a GPU): blocks
// are usable device memory, reuse makes no new cudaMalloc, trim returns memory
// to the driver, pinned blocks survive trim, and asking for more than the
// device has is a clear ResourceExhausted after the allocator trimmed and
// retried.
#include "kernels/cuda/cuda_memory_source.h"

#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_status.h"
#include "runtime/core/memory.h"

namespace tessera {
namespace {

class CudaMemorySourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(CudaMemorySourceTest, BlocksAreDeviceMemoryAndAreReused) {
  CudaMemorySource source(0);
  PinnableBlockAllocator allocator(&source);
  auto a = allocator.Allocate(3 << 20);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(cudaMemset(*a, 0x5a, 3 << 20), cudaSuccess);
  std::vector<unsigned char> host(16);
  ASSERT_EQ(cudaMemcpy(host.data(), *a, host.size(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(host[7], 0x5a);
  ASSERT_TRUE(allocator.Free(*a).ok());
  const int64_t underlying = allocator.stats().underlying_allocations;
  auto b = allocator.Allocate(
      3 << 20);  // Same large size: the cached block comes back.
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, *a);
  EXPECT_EQ(allocator.stats().underlying_allocations, underlying);
  ASSERT_TRUE(allocator.Free(*b).ok());
}

TEST_F(CudaMemorySourceTest, TrimKeepsPinnedBlocksAndReturnsTheRest) {
  CudaMemorySource source(0);
  PinnableBlockAllocator allocator(&source);
  ASSERT_TRUE(allocator.BeginCapture().ok());
  auto pinned = allocator.Allocate(8 << 20);
  ASSERT_TRUE(pinned.ok());
  auto lease = allocator.Commit();
  ASSERT_TRUE(lease.ok());
  auto loose = allocator.Allocate(16 << 20);
  ASSERT_TRUE(loose.ok());
  ASSERT_TRUE(allocator.Free(*pinned).ok());
  ASSERT_TRUE(allocator.Free(*loose).ok());
  EXPECT_EQ(allocator.Trim(), size_t{16} << 20);
  EXPECT_EQ(allocator.stats().pinned_bytes, int64_t{8} << 20);
  lease->Release();
  EXPECT_EQ(allocator.Trim(), size_t{8} << 20);
  EXPECT_EQ(allocator.stats().reserved_bytes, 0);
}

TEST_F(CudaMemorySourceTest, MoreThanTheDeviceHasIsAClearError) {
  CudaMemorySource source(0);
  PinnableBlockAllocator allocator(&source);
  auto huge = allocator.Allocate(size_t{1} << 50);  // 1 PiB.
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted)
      << huge.status();
  EXPECT_NE(huge.status().message().find("out of memory"),
            absl::string_view::npos)
      << huge.status();
  // The allocator still works afterwards.
  auto small = allocator.Allocate(4096);
  ASSERT_TRUE(small.ok()) << small.status();
  ASSERT_TRUE(allocator.Free(*small).ok());
}

}  // namespace
}  // namespace tessera
