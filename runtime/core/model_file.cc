#include "runtime/core/model_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tessera {
namespace {

const char* FileKind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a plain file";
}

}  // namespace

absl::Status ErrnoError(int err, absl::string_view what) {
  const std::string message = absl::StrCat(what, ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    default:
      return absl::InternalError(message);
  }
}

ScopedFd& ScopedFd::operator=(ScopedFd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.release();
  }
  return *this;
}

ScopedFd::~ScopedFd() {
  if (fd_ >= 0) ::close(fd_);
}

absl::StatusOr<ScopedFd> OpenRegularFile(const std::string& path,
                                         uint64_t* size) {
  // O_NONBLOCK: opening a FIFO with no writer returns at once instead of
  // waiting for one; the fstat below then refuses it.
  ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (fd.get() < 0) {
    return ErrnoError(errno, absl::StrCat("cannot open ", path));
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) {
    return ErrnoError(errno, absl::StrCat("cannot stat ", path));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, " is ", FileKind(st.st_mode), ", not a regular file"));
  }
  // Reads of a regular file never return EAGAIN, but restore blocking mode so
  // that nothing downstream has to know.
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK) != 0) {
    return ErrnoError(errno, absl::StrCat("cannot set flags of ", path));
  }
  if (size != nullptr) *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

absl::StatusOr<std::string> ReadRegularFile(const std::string& path,
                                            uint64_t max_bytes) {
  uint64_t size = 0;
  absl::StatusOr<ScopedFd> fd = OpenRegularFile(path, &size);
  if (!fd.ok()) return fd.status();
  if (size > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, " is ", size, " bytes, more than the ", max_bytes, " accepted"));
  }
  // One read into a buffer of the file's size; a file that grows meanwhile is
  // read to its end (bounded by max_bytes).
  std::string data(static_cast<size_t>(size), '\0');
  size_t filled = 0;
  while (true) {
    if (filled == data.size()) {
      if (data.size() >= max_bytes) break;
      data.resize(std::min<uint64_t>(max_bytes, data.size() + (1 << 16)));
    }
    const ssize_t n =
        ::read(fd->get(), data.data() + filled, data.size() - filled);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::DataLossError(
          absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
    }
    if (n == 0) break;
    filled += static_cast<size_t>(n);
  }
  data.resize(filled);
  return data;
}

}  // namespace tessera
