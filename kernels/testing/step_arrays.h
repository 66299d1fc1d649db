// Tests: a host vector as a step array (kernels/ops.h) of the CPU backend,
// or as the host side of one a test copies to a device itself.
#ifndef TESSERA_KERNELS_TESTING_STEP_ARRAYS_H_
#define TESSERA_KERNELS_TESTING_STEP_ARRAYS_H_

#include <cstdint>
#include <vector>

#include "runtime/core/tensor.h"

namespace tessera {

inline TensorView StepArray(const std::vector<int32_t>& v) {
  return TensorView(const_cast<int32_t*>(v.data()), DType::kI32,
                    {static_cast<int64_t>(v.size())});
}

inline TensorView StepArray(const std::vector<int64_t>& v) {
  return TensorView(const_cast<int64_t*>(v.data()), DType::kI64,
                    {static_cast<int64_t>(v.size())});
}

}  // namespace tessera

#endif  // TESSERA_KERNELS_TESTING_STEP_ARRAYS_H_
