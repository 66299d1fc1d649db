// Opening the files of a model folder (config.json, tokenizer files, chat
// templates, safetensors shards) so that no name in it can hang the process.
//
// A plain open() of a FIFO blocks until a writer appears, and reading a
// directory or a character device either fails late or never ends. Every file
// a model folder provides is opened here with O_NONBLOCK (which makes opening
// a FIFO return at once), checked with fstat to be a regular file, and only
// then read. Anything else is refused with one error naming the file and what
// it is ("... is a FIFO, not a regular file").
#ifndef TESSERA_RUNTIME_CORE_MODEL_FILE_H_
#define TESSERA_RUNTIME_CORE_MODEL_FILE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tessera {

// An errno as a Status: NotFound (ENOENT, ENOTDIR), PermissionDenied (EACCES,
// EPERM), else Internal; the message is "<what>: <strerror>".
absl::Status ErrnoError(int err, absl::string_view what);

// An open file descriptor, closed on destruction.
class ScopedFd {
 public:
  ScopedFd() = default;
  explicit ScopedFd(int fd) : fd_(fd) {}
  ScopedFd(ScopedFd&& other) noexcept : fd_(other.release()) {}
  ScopedFd& operator=(ScopedFd&& other) noexcept;
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  ~ScopedFd();

  int get() const { return fd_; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
};

// `path` opened read-only (close-on-exec, blocking mode restored) when it is a
// regular file (symlinks followed). NotFound when it does not exist,
// PermissionDenied when it cannot be read, InvalidArgument naming the file
// type when it is not a regular file; `*size` (when given) is its size.
absl::StatusOr<ScopedFd> OpenRegularFile(const std::string& path,
                                         uint64_t* size = nullptr);

// The whole contents of the regular file `path` (errors as OpenRegularFile;
// InvalidArgument when it is larger than `max_bytes`; DataLoss on a read
// error).
absl::StatusOr<std::string> ReadRegularFile(const std::string& path,
                                            uint64_t max_bytes = uint64_t{1}
                                                                 << 32);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_CORE_MODEL_FILE_H_
