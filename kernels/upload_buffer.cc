#include "kernels/upload_buffer.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace tessera {
namespace {

constexpr size_t kAlign = 64;

class HostUploadBuffer final : public UploadBuffer {
 public:
  HostUploadBuffer(void* data, size_t bytes) : UploadBuffer(data, bytes) {}
  ~HostUploadBuffer() override { std::free(device()); }

  absl::StatusOr<void*> BeginWrite() override { return device(); }
  absl::Status Upload(size_t bytes) override {
    if (bytes > this->bytes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "upload of ", bytes, " bytes into a buffer of ", this->bytes()));
    }
    return absl::OkStatus();
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<UploadBuffer>> NewHostUploadBuffer(
    size_t bytes) {
  const size_t rounded =
      (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
  void* data = std::aligned_alloc(kAlign, rounded);
  if (data == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("allocating ", rounded, " bytes of host step buffers"));
  }
  return std::unique_ptr<UploadBuffer>(new HostUploadBuffer(data, bytes));
}

}  // namespace tessera
