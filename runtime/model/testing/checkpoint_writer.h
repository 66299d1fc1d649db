// Test helper: writes safetensors checkpoints (one file, tensors back to back)
// so tests can build checkpoints in any dtype and shape.
#ifndef TESSERA_RUNTIME_MODEL_TESTING_CHECKPOINT_WRITER_H_
#define TESSERA_RUNTIME_MODEL_TESTING_CHECKPOINT_WRITER_H_

#include <cstdint>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "runtime/core/dtype.h"
#include "runtime/core/shape.h"

namespace tessera {
namespace testing_util {

class CheckpointWriter {
 public:
  // Adds a tensor whose bytes are already in `dtype`.
  CheckpointWriter& Add(const std::string& name, DType dtype,
                        const Shape& shape, const std::string& bytes) {
    const size_t begin = data_.size();
    data_ += bytes;
    std::vector<int64_t> dims(shape.dims().begin(), shape.dims().end());
    header_[name] = {{"dtype", std::string(DTypeToSafetensors(dtype))},
                     {"shape", dims},
                     {"data_offsets", {begin, data_.size()}}};
    return *this;
  }
  // Adds f32 `values`, stored as `dtype` (f32, bf16 or f16).
  CheckpointWriter& AddFloats(const std::string& name, DType dtype,
                              const Shape& shape,
                              const std::vector<float>& values) {
    return Add(name, dtype, shape, Encode(dtype, values));
  }
  // Adds random values in [-1, 1) (deterministic per name and seed).
  CheckpointWriter& AddRandom(const std::string& name, DType dtype,
                              const Shape& shape, uint32_t seed = 1) {
    std::mt19937 rng(seed +
                     static_cast<uint32_t>(std::hash<std::string>()(name)));
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float> values(static_cast<size_t>(shape.numel()));
    for (float& v : values) v = dist(rng);
    return AddFloats(name, dtype, shape, values);
  }
  void Write(const std::string& path) const {
    const std::string header = header_.dump();
    std::string prefix(8, '\0');
    const uint64_t n = header.size();
    for (int i = 0; i < 8; ++i)
      prefix[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    std::ofstream out(path, std::ios::binary);
    out << prefix << header << data_;
  }

  static std::string Encode(DType dtype, const std::vector<float>& values) {
    const size_t size = DTypeSize(dtype);
    std::string out(values.size() * size, '\0');
    for (size_t i = 0; i < values.size(); ++i) {
      if (dtype == DType::kF32) {
        std::memcpy(&out[i * 4], &values[i], 4);
      } else {
        const uint16_t bits =
            dtype == DType::kBF16 ? F32ToBf16(values[i]) : F32ToF16(values[i]);
        std::memcpy(&out[i * 2], &bits, 2);
      }
    }
    return out;
  }

 private:
  nlohmann::json header_ = nlohmann::json::object();
  std::string data_;
};

}  // namespace testing_util
}  // namespace tessera

#endif  // TESSERA_RUNTIME_MODEL_TESTING_CHECKPOINT_WRITER_H_
