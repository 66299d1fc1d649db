// UploadBuffer: a fixed-size buffer in a backend's memory that the host
// rewrites before every step (the step inputs: token ids, positions, slot
// mapping, block tables, ...; see runtime/executor/step_inputs.h).
//
// Its backend-memory address never changes, so work captured in a CUDA graph
// may read it; each step's contents arrive through ONE copy of a packed host
// staging block (page-locked on a GPU, so the copy is asynchronous), ordered on
// the backend's stream before every op enqueued after it. On a backend whose
// memory is host memory (the CPU) the staging IS the buffer and Upload copies
// nothing.
//
// Use: p = BeginWrite(); pack into p; Upload(bytes packed); enqueue ops that
// read device(). BeginWrite waits until the previous Upload's copy has read
// the staging, so the host never overwrites bytes still in flight. Not
// thread-safe.
#ifndef TESSERA_KERNELS_UPLOAD_BUFFER_H_
#define TESSERA_KERNELS_UPLOAD_BUFFER_H_

#include <cstddef>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tessera {

class UploadBuffer {
 public:
  virtual ~UploadBuffer() = default;
  UploadBuffer(const UploadBuffer&) = delete;
  UploadBuffer& operator=(const UploadBuffer&) = delete;

  size_t bytes() const { return bytes_; }
  // The buffer in the backend's memory (fixed for the buffer's lifetime).
  void* device() const { return device_; }

  // The host staging to pack the next contents into (bytes() bytes).
  virtual absl::StatusOr<void*> BeginWrite() = 0;
  // Makes the first `bytes` bytes of the staging the contents of device():
  // one host-to-device copy enqueued on the backend's stream (none where the
  // staging is the buffer). InvalidArgument when bytes > bytes().
  virtual absl::Status Upload(size_t bytes) = 0;

 protected:
  UploadBuffer(void* device, size_t bytes) : device_(device), bytes_(bytes) {}

 private:
  void* device_;
  size_t bytes_;
};

// The host-memory form (the CPU backend): staging and buffer are one block of
// 64-byte-aligned host memory owned by the object; Upload only checks `bytes`.
absl::StatusOr<std::unique_ptr<UploadBuffer>> NewHostUploadBuffer(size_t bytes);

}  // namespace tessera

#endif  // TESSERA_KERNELS_UPLOAD_BUFFER_H_
