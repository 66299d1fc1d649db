// Workspace: the scratch memory of a model, declared up front and bound once.
//
// Modules register each buffer they need with its size for the largest step
// (register_buffer), FinalizeAndBind allocates one block for all of them (each
// buffer aligned to 256 bytes), and every forward takes views into it. After
// binding, a forward performs no allocation at all: that is what makes
// steady-state decode allocation-free and lets a captured graph reuse the same
// addresses.
#ifndef TESSERA_RUNTIME_CORE_WORKSPACE_H_
#define TESSERA_RUNTIME_CORE_WORKSPACE_H_

#include <cstddef>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/core/memory.h"
#include "runtime/core/tensor.h"

namespace tessera {

class Workspace {
 public:
  Workspace() = default;
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  ~Workspace();

  // Declares a buffer. Registering the same name again with the same size is a
  // no-op (two modules may share one); with a different size it is
  // InvalidArgument. FailedPrecondition after binding.
  absl::Status RegisterBuffer(absl::string_view name, size_t bytes);

  // Allocates one block from `allocator` for every registered buffer. The
  // allocator must outlive the workspace (the block is returned to it on
  // destruction).
  absl::Status FinalizeAndBind(PinnableBlockAllocator* allocator);

  bool bound() const { return base_ != nullptr; }
  size_t total_bytes() const { return total_; }

  // A view of `shape` (dtype elements) at the start of buffer `name`. NotFound
  // for an unknown name, FailedPrecondition before binding, OutOfRange when the
  // view is larger than the registered size.
  absl::StatusOr<TensorView> View(absl::string_view name, DType dtype,
                                  Shape shape) const;

 private:
  struct Buffer {
    size_t bytes = 0;
    size_t offset = 0;
  };
  std::map<std::string, Buffer, std::less<>> buffers_;
  PinnableBlockAllocator* allocator_ = nullptr;
  char* base_ = nullptr;
  size_t total_ = 0;
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_CORE_WORKSPACE_H_
