#include "tools/shoalctl/node_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace shoal::ctl {
namespace {

Error IoError(const std::string& what, const std::string& path) {
  return MakeError(ErrorCode::kIo, what + " " + path + ": " + std::strerror(errno));
}

}  // namespace

std::string UnderRoot(const std::string& root, const std::string& path) {
  std::string r = root;
  while (!r.empty() && r.back() == '/') r.pop_back();
  if (r.empty()) return path;
  return r + (path.empty() || path[0] != '/' ? "/" : "") + path;
}

Result<std::optional<std::string>> ReadIfExists(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (errno == ENOENT || errno == ENOTDIR) return std::optional<std::string>();
    return IoError("cannot read", path);
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  return std::optional<std::string>(ss.str());
}

Result<WriteOutcome> WriteAtomic(const std::string& path, const std::string& content,
                                 unsigned mode) {
  auto old = ReadIfExists(path);
  if (!old) return old.error();
  if (old.value() && *old.value() == content) return WriteOutcome::kUnchanged;
  std::filesystem::path p(path);
  std::error_code ec;
  std::filesystem::create_directories(p.parent_path(), ec);
  if (ec)
    return MakeError(ErrorCode::kIo,
                     "cannot create " + p.parent_path().string() + ": " + ec.message());
  struct stat st {};
  bool existed = ::stat(path.c_str(), &st) == 0;
  std::string tmp = path + ".shoal-tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
                  existed ? st.st_mode & 07777 : mode);
  if (fd < 0) return IoError("cannot create", tmp);
  size_t off = 0;
  while (off < content.size()) {
    ssize_t n = ::write(fd, content.data() + off, content.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      auto err = IoError("cannot write", tmp);
      ::close(fd);
      ::unlink(tmp.c_str());
      return err;
    }
    off += static_cast<size_t>(n);
  }
  if (existed) {
    (void)::fchown(fd, st.st_uid, st.st_gid);
    (void)::fchmod(fd, st.st_mode & 07777);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    auto err = IoError("cannot sync", tmp);
    ::unlink(tmp.c_str());
    return err;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    auto err = IoError("cannot rename onto", path);
    ::unlink(tmp.c_str());
    return err;
  }
  int dir = ::open(p.parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    (void)::fsync(dir);
    ::close(dir);
  }
  return existed ? WriteOutcome::kReplaced : WriteOutcome::kCreated;
}

Status RemoveIfExists(const std::string& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return IoError("cannot remove", path);
  return Ok();
}

}  // namespace shoal::ctl
