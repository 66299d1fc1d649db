#include "kernels/cuda/elementwise_kernels.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_status.h"

namespace tessera {
namespace {

// Device buffer holding a copy of a host vector (RAII).
class DeviceBuffer {
 public:
  explicit DeviceBuffer(const std::vector<float>& host) : count_(host.size()) {
    EXPECT_TRUE(CudaStatus(cudaMalloc(&ptr_, count_ * sizeof(float)),
                           "cudaMalloc", "test")
                    .ok());
    EXPECT_TRUE(CudaStatus(cudaMemcpy(ptr_, host.data(), count_ * sizeof(float),
                                      cudaMemcpyHostToDevice),
                           "cudaMemcpy", "uploading")
                    .ok());
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  float* get() const { return static_cast<float*>(ptr_); }
  std::vector<float> Download() const {
    std::vector<float> host(count_);
    EXPECT_TRUE(CudaStatus(cudaMemcpy(host.data(), ptr_, count_ * sizeof(float),
                                      cudaMemcpyDeviceToHost),
                           "cudaMemcpy", "downloading")
                    .ok());
    return host;
  }

 private:
  void* ptr_ = nullptr;
  size_t count_;
};

class CudaElementwiseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  }
  std::vector<float> Random(size_t n) {
    std::normal_distribution<float> dist(0.0f, 2.0f);
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng_);
    return v;
  }
  std::mt19937 rng_{std::random_device{}()};
  CpuOps cpu_;
};

TEST_F(CudaElementwiseTest, RmsNormMatchesCpu) {
  for (int64_t n : {7, 64, 1000, 4096}) {
    const int64_t rows = 5;
    std::vector<float> x = Random(rows * n), w = Random(n), want(rows * n);
    ASSERT_TRUE(cpu_.RmsNorm(TensorView(x.data(), DType::kF32, {rows, n}),
                             TensorView(w.data(), DType::kF32, {n}), 1e-6f,
                             TensorView(want.data(), DType::kF32, {rows, n}))
                    .ok());
    DeviceBuffer dx(x), dw(w), dout(std::vector<float>(rows * n, NAN));
    ASSERT_EQ(cuda::LaunchRmsNorm(dx.get(), dw.get(), 1e-6f, rows, n,
                                  dout.get(), nullptr),
              cudaSuccess);
    const std::vector<float> got = dout.Download();
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], 1e-5f * (1.0f + std::fabs(want[i])))
          << "n=" << n << " i=" << i;
    }
  }
}

TEST_F(CudaElementwiseTest, SiluMulMatchesCpu) {
  const int64_t count = 100003;
  std::vector<float> g = Random(count), u = Random(count), want(count);
  ASSERT_TRUE(cpu_.SiluMul(TensorView(g.data(), DType::kF32, {count}),
                           TensorView(u.data(), DType::kF32, {count}),
                           TensorView(want.data(), DType::kF32, {count}))
                  .ok());
  DeviceBuffer dg(g), du(u), dout(std::vector<float>(count, NAN));
  ASSERT_EQ(cuda::LaunchSiluMul(dg.get(), du.get(), count, dout.get(), nullptr),
            cudaSuccess);
  const std::vector<float> got = dout.Download();
  for (int64_t i = 0; i < count; ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-5f * (1.0f + std::fabs(want[i]))) << i;
  }
}

}  // namespace
}  // namespace tessera
