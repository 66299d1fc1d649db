// CudaOpsFixture: a gtest fixture that owns one GPU's op set — CudaOps on
// device 0 over a CudaMemorySource and a PinnableBlockAllocator (the rank's
// arrangement) — and skips the test where there is no CUDA device. The tests
// that compare CudaOps with the CPU reference derive from it.
#ifndef TESSERA_KERNELS_CUDA_TESTING_CUDA_OPS_FIXTURE_H_
#define TESSERA_KERNELS_CUDA_TESTING_CUDA_OPS_FIXTURE_H_

#include <memory>
#include <utility>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_memory_source.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_status.h"
#include "runtime/core/memory.h"

namespace tessera {
namespace testing_cuda {

class CudaOpsFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    source_ = std::make_unique<CudaMemorySource>(0);
    allocator_ = std::make_unique<PinnableBlockAllocator>(source_.get());
    auto ops = CudaOps::Create(0, allocator_.get());
    ASSERT_TRUE(ops.ok()) << ops.status();
    gpu_ = *std::move(ops);
  }
  // The ops before the allocator they allocate from.
  void TearDown() override {
    gpu_.reset();
    allocator_.reset();
  }

  std::unique_ptr<CudaMemorySource> source_;
  std::unique_ptr<PinnableBlockAllocator> allocator_;
  std::unique_ptr<CudaOps> gpu_;
};

}  // namespace testing_cuda
}  // namespace tessera

#endif  // TESSERA_KERNELS_CUDA_TESTING_CUDA_OPS_FIXTURE_H_
