#include "lib/core/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace shoal {
namespace {

Error IoError(std::string_view what, const std::string& path, int err) {
  return MakeError(ErrorCode::kIo, std::string(what) + " " + path + ": " + std::strerror(err));
}

// Closes fd, removes tmp and returns the error of `what` (errno err).
Error Abandon(int fd, const std::string& tmp, std::string_view what, int err) {
  if (fd >= 0) ::close(fd);
  ::unlink(tmp.c_str());
  return IoError(what, tmp, err);
}

}  // namespace

Status FsyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return IoError("open dir", dir, errno);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) return IoError("fsync dir", dir, err);
  return Ok();
}

Status WriteFileAtomic(const std::string& tmp_path, const std::string& path,
                       std::string_view content, unsigned mode) {
  int fd = ::open(tmp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC,
                  static_cast<mode_t>(mode));
  if (fd < 0) return IoError("create", tmp_path, errno);
  size_t done = 0;
  while (done < content.size()) {
    ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Abandon(fd, tmp_path, "write", errno);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) return Abandon(fd, tmp_path, "fsync", errno);
  ::close(fd);
  if (::rename(tmp_path.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp_path.c_str());
    return IoError("rename into", path, err);
  }
  size_t slash = path.rfind('/');
  return FsyncDir(slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash));
}

}  // namespace shoal
