// Reading Hugging Face safetensors checkpoints (single file or sharded),
// memory-mapped.
//
// Format: 8-byte little-endian header length N, N bytes of JSON
// {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]},
// "__metadata__": {...}}, then the data region; offsets are relative to the
// data region's start.
//
// Every header is validated on open: the file is a regular file (a FIFO or
// directory is refused, never waited on), the length fits the file, the JSON
// object fills the header exactly (trailing space padding only), each entry
// has a known dtype, non-negative dims, begin <= end within the data region,
// end - begin equals numel * dtype size, and the tensors, sorted by offset,
// cover the data region exactly: no overlap, no gap, nothing after the last.
// (A length field a few bytes off would otherwise shift every tensor.) A
// sharded checkpoint (model.safetensors.index.json) must map every tensor to a
// shard that exists and contains it.
//
// Thread safety: const methods may be called concurrently. Pointers into the
// mapping stay valid for the lifetime of the Checkpoint.
#ifndef TESSERA_RUNTIME_MODEL_SAFETENSORS_H_
#define TESSERA_RUNTIME_MODEL_SAFETENSORS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/core/dtype.h"
#include "runtime/core/shape.h"
#include "runtime/core/tensor.h"

namespace tessera {

// One tensor of a checkpoint, pointing into the mapped file.
struct TensorInfo {
  std::string name;
  DType dtype;
  Shape shape;
  const void* data = nullptr;  // Inside the mapping; not necessarily aligned.
  size_t nbytes = 0;
  std::string file;  // The shard file it lives in (for messages).
};

class SafetensorsFile;  // One mmapped, validated file (defined in
                        // safetensors.cc).

class Checkpoint {
 public:
  // Opens `<dir>/model.safetensors.index.json` when present (sharded),
  // otherwise
  // `<dir>/model.safetensors`, otherwise all `*.safetensors` in the directory.
  // NotFound when the directory or any weights file is missing; InvalidArgument
  // (naming the file) on any validation failure.
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(
      const std::string& dir);

  // Opens one file directly.
  static absl::StatusOr<std::unique_ptr<Checkpoint>> OpenFile(
      const std::string& path);

  ~Checkpoint();

  bool Has(absl::string_view name) const;
  // NotFound naming the tensor when absent.
  absl::StatusOr<TensorInfo> Get(absl::string_view name) const;
  // All tensor names, sorted.
  std::vector<std::string> Names() const;

  // Reads a floating-point tensor widened to f32 after checking its shape:
  // InvalidArgument "tensor <name>: expected shape [a, b], found [c, d]" on
  // mismatch.
  absl::StatusOr<Tensor> LoadF32(absl::string_view name,
                                 const Shape& expected) const;

 private:
  Checkpoint();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_MODEL_SAFETENSORS_H_
