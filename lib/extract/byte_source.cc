#include "lib/extract/byte_source.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace shoal::extract {
namespace {

Error IoError(const std::string& what, const std::string& path) {
  return MakeError(ErrorCode::kIo, what + " " + path + ": " + std::strerror(errno));
}

class FileSource : public ByteSource {
 public:
  FileSource(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~FileSource() override { ::close(fd_); }

  Result<size_t> Read(std::span<std::byte> out) override {
    for (;;) {
      ssize_t n = ::read(fd_, out.data(), out.size());
      if (n >= 0) return static_cast<size_t>(n);
      if (errno != EINTR) return IoError("read", path_);
    }
  }
  std::string Describe() const override { return "file " + path_; }

 private:
  int fd_;
  std::string path_;
};

class GrowingFileSource : public ByteSource {
 public:
  GrowingFileSource(int fd, std::string path, uint64_t total, WaitForPrefix wait)
      : fd_(fd), path_(std::move(path)), total_(total), wait_(std::move(wait)) {}
  ~GrowingFileSource() override { ::close(fd_); }

  Result<size_t> Read(std::span<std::byte> out) override {
    if (offset_ >= total_ || out.empty()) return size_t{0};
    if (final_ <= offset_) {
      auto got = wait_(offset_ + 1);
      if (!got) return got.error();
      final_ = std::min(got.value(), total_);
      if (final_ <= offset_) {
        return MakeError(ErrorCode::kInternal,
                         "wait for " + path_ + " returned no new bytes at offset " +
                             std::to_string(offset_));
      }
    }
    size_t want = static_cast<size_t>(std::min<uint64_t>(out.size(), final_ - offset_));
    for (;;) {
      ssize_t n = ::pread(fd_, out.data(), want, static_cast<off_t>(offset_));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return IoError("pread", path_);
      if (n == 0) {
        return MakeError(ErrorCode::kIo, "pread " + path_ + ": file shorter than its final " +
                                             std::to_string(final_) + " bytes");
      }
      offset_ += static_cast<uint64_t>(n);
      return static_cast<size_t>(n);
    }
  }
  std::string Describe() const override { return "growing file " + path_; }

 private:
  int fd_;
  std::string path_;
  uint64_t total_;
  WaitForPrefix wait_;
  uint64_t offset_ = 0;  // next byte to return
  uint64_t final_ = 0;   // bytes known to be final
};

class MemSource : public ByteSource {
 public:
  MemSource(std::span<const std::byte> data, std::string name)
      : data_(data), name_(std::move(name)) {}
  Result<size_t> Read(std::span<std::byte> out) override {
    size_t n = std::min(out.size(), data_.size() - pos_);
    std::memcpy(out.data(), data_.data() + pos_, n);
    pos_ += n;
    return n;
  }
  std::string Describe() const override { return name_; }

 private:
  std::span<const std::byte> data_;
  std::string name_;
  size_t pos_ = 0;
};

Result<int> OpenReadOnly(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return IoError("open", path);
  return fd;
}

}  // namespace

Result<std::unique_ptr<ByteSource>> OpenFileSource(const std::string& path) {
  auto fd = OpenReadOnly(path);
  if (!fd) return fd.error();
  return std::unique_ptr<ByteSource>(new FileSource(fd.value(), path));
}

Result<std::unique_ptr<ByteSource>> OpenGrowingFileSource(const std::string& path,
                                                          uint64_t total_size,
                                                          WaitForPrefix wait) {
  auto fd = OpenReadOnly(path);
  if (!fd) return fd.error();
  return std::unique_ptr<ByteSource>(
      new GrowingFileSource(fd.value(), path, total_size, std::move(wait)));
}

std::unique_ptr<ByteSource> MemorySource(std::span<const std::byte> data, std::string name) {
  return std::make_unique<MemSource>(data, std::move(name));
}

}  // namespace shoal::extract
