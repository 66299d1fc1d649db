// A minimal safetensors writer for tests: builds checkpoints (or damaged copies
// of real ones) in memory and writes them in the layout
// runtime/model/safetensors.h reads.
#ifndef TESSERA_TESTS_TESTING_SAFETENSORS_WRITER_H_
#define TESSERA_TESTS_TESTING_SAFETENSORS_WRITER_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "runtime/core/dtype.h"
#include "runtime/core/shape.h"
#include "runtime/model/safetensors.h"

namespace tessera {

class SafetensorsWriter {
 public:
  // Adds a tensor from raw little-endian bytes, which must hold exactly
  // shape.numel() elements of `dtype` (checked by Write). Tensors are laid out
  // back to back in the order added; a name added twice replaces the first.
  void Add(absl::string_view name, DType dtype, const Shape& shape,
           std::string bytes);
  void AddF32(absl::string_view name, const Shape& shape,
              const std::vector<float>& values);
  // Copies `info` (e.g. from Checkpoint::Get), optionally under another shape
  // with the same number of elements.
  void AddCopy(const TensorInfo& info);
  void AddCopy(const TensorInfo& info, const Shape& shape);

  // Drops a tensor added before; returns whether it was there.
  bool Remove(absl::string_view name);

  // Writes the file: 8-byte little-endian header length, the JSON header
  // (padded with spaces to a multiple of 8 bytes), then the data.
  absl::Status Write(const std::string& path) const;

 private:
  struct Entry {
    std::string name;
    DType dtype;
    Shape shape;
    std::string bytes;
  };
  std::vector<Entry> entries_;
};

// Copies every tensor of `checkpoint` into a writer, in name order.
SafetensorsWriter CopyOf(const Checkpoint& checkpoint);

}  // namespace tessera

#endif  // TESSERA_TESTS_TESTING_SAFETENSORS_WRITER_H_
