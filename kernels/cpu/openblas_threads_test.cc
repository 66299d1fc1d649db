// Run with OPENBLAS_NUM_THREADS=2 (see BUILD.bazel): a user who sets it gets
// OpenBLAS's own threads for large products, and one thread for small ones,
// as before the default moved large products onto OpenMP's threads.
#include <cblas.h>

#include <cstdlib>
#include <random>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"

namespace tessera {
namespace {

Tensor Random(Shape shape) {
  Tensor t = *Tensor::Empty(DType::kF32, std::move(shape));
  std::mt19937 rng(7);
  std::normal_distribution<float> dist;
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = dist(rng);
  return t;
}

TEST(OpenBlasThreadsTest, UserSettingWins) {
  const char* env = std::getenv("OPENBLAS_NUM_THREADS");
  ASSERT_NE(env, nullptr);
  ASSERT_STREQ(env, "2");
  CpuOps ops;
  Tensor w = Random({70001, 128});
  Tensor x = Random({1, 128});
  Tensor out = *Tensor::Empty(DType::kF32, {1, 70001});
  ASSERT_TRUE(ops.Linear(x.view(), w.view(), nullptr, out.view()).ok());
  EXPECT_EQ(openblas_get_num_threads(), 2);
  Tensor small_w = Random({64, 128});
  Tensor small_out = *Tensor::Empty(DType::kF32, {1, 64});
  ASSERT_TRUE(
      ops.Linear(x.view(), small_w.view(), nullptr, small_out.view()).ok());
  EXPECT_EQ(openblas_get_num_threads(), 1);
}

}  // namespace
}  // namespace tessera
