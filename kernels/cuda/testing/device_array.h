// DeviceArray<T>: a test's device copy of a host vector (RAII), for checking
// raw CUDA launchers against the CPU. Failures are reported through gtest.
#ifndef TESSERA_KERNELS_CUDA_TESTING_DEVICE_ARRAY_H_
#define TESSERA_KERNELS_CUDA_TESTING_DEVICE_ARRAY_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_status.h"

namespace tessera {
namespace testing_cuda {

template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(const std::vector<T>& host) : count_(host.size()) {
    EXPECT_TRUE(
        CudaStatus(cudaMalloc(&ptr_, Bytes()), "cudaMalloc", "test").ok());
    if (count_ > 0) {
      EXPECT_TRUE(CudaStatus(cudaMemcpy(ptr_, host.data(), Bytes(),
                                        cudaMemcpyHostToDevice),
                             "cudaMemcpy", "uploading")
                      .ok());
    }
  }
  // `count` zero-initialised elements.
  explicit DeviceArray(size_t count) : DeviceArray(std::vector<T>(count)) {}
  ~DeviceArray() { cudaFree(ptr_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return static_cast<T*>(ptr_); }
  size_t size() const { return count_; }

  // Waits for the device, then copies the array back.
  std::vector<T> Download() const {
    std::vector<T> host(count_);
    EXPECT_TRUE(CudaStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize",
                           "waiting for the kernel")
                    .ok());
    if (count_ > 0) {
      EXPECT_TRUE(CudaStatus(cudaMemcpy(host.data(), ptr_, Bytes(),
                                        cudaMemcpyDeviceToHost),
                             "cudaMemcpy", "downloading")
                      .ok());
    }
    return host;
  }

 private:
  size_t Bytes() const { return (count_ > 0 ? count_ : 1) * sizeof(T); }
  void* ptr_ = nullptr;
  size_t count_;
};

}  // namespace testing_cuda
}  // namespace tessera

#endif  // TESSERA_KERNELS_CUDA_TESTING_DEVICE_ARRAY_H_
