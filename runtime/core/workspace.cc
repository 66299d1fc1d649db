#include "runtime/core/workspace.h"

#include "absl/strings/str_cat.h"

namespace tessera {
namespace {

constexpr size_t kBufferAlignment = 256;

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

Workspace::~Workspace() {
  if (base_ != nullptr) allocator_->Free(base_).IgnoreError();
}

absl::Status Workspace::RegisterBuffer(absl::string_view name, size_t bytes) {
  if (bound()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "workspace buffer \"", name, "\" registered after binding"));
  }
  auto it = buffers_.find(name);
  if (it != buffers_.end()) {
    if (it->second.bytes != bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("workspace buffer \"", name, "\" registered with ",
                       it->second.bytes, " bytes and again with ", bytes));
    }
    return absl::OkStatus();
  }
  buffers_.emplace(std::string(name), Buffer{bytes, 0});
  return absl::OkStatus();
}

absl::Status Workspace::FinalizeAndBind(PinnableBlockAllocator* allocator) {
  if (bound()) return absl::FailedPreconditionError("workspace bound twice");
  size_t offset = 0;
  for (auto& [name, buffer] : buffers_) {
    buffer.offset = offset;
    offset += RoundUp(buffer.bytes, kBufferAlignment);
  }
  total_ = offset;
  if (total_ == 0)
    total_ = kBufferAlignment;  // An empty workspace still binds.
  absl::StatusOr<void*> block = allocator->Allocate(total_);
  if (!block.ok()) {
    return absl::Status(
        block.status().code(),
        absl::StrCat("binding the workspace (", buffers_.size(), " buffers, ",
                     total_, " bytes): ", block.status().message()));
  }
  allocator_ = allocator;
  base_ = static_cast<char*>(*block);
  return absl::OkStatus();
}

absl::StatusOr<TensorView> Workspace::View(absl::string_view name, DType dtype,
                                           Shape shape) const {
  if (!bound()) {
    return absl::FailedPreconditionError(
        absl::StrCat("workspace buffer \"", name, "\" viewed before binding"));
  }
  auto it = buffers_.find(name);
  if (it == buffers_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no workspace buffer \"", name, "\""));
  }
  const size_t bytes = static_cast<size_t>(shape.numel()) * DTypeSize(dtype);
  if (bytes > it->second.bytes) {
    return absl::OutOfRangeError(
        absl::StrCat("workspace buffer \"", name, "\" holds ", it->second.bytes,
                     " bytes; a view of ", shape.ToString(), " needs ", bytes));
  }
  return TensorView(base_ + it->second.offset, dtype, std::move(shape));
}

}  // namespace tessera
