#include "lib/swarm/file_range.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>

namespace shoal::swarm {

Result<std::shared_ptr<BlobFile>> BlobFile::Open(const std::string& path, bool writable) {
  int fd = ::open(path.c_str(), (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    return MakeError(ErrorCode::kIo, "cannot open " + path + ": " + std::strerror(err));
  }
  return std::shared_ptr<BlobFile>(new BlobFile(fd));
}

Result<std::shared_ptr<BlobFile>> BlobFile::Adopt(int fd) {
  if (fd < 0) return MakeError(ErrorCode::kInvalidArgument, "blob file descriptor is negative");
  return std::shared_ptr<BlobFile>(new BlobFile(fd));
}

BlobFile::~BlobFile() {
  if (fd_ >= 0) ::close(fd_);
}

Status ValidateFileRange(const FileRange& range) {
  if (!range.file) return MakeError(ErrorCode::kInvalidArgument, "file range has no file");
  if (range.length == 0) return MakeError(ErrorCode::kInvalidArgument, "file range is empty");
  constexpr uint64_t kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  if (range.offset > kMax || range.length > kMax - range.offset) {
    return MakeError(ErrorCode::kInvalidArgument, "file range offset " +
                                                      std::to_string(range.offset) + " + length " +
                                                      std::to_string(range.length) + " overflows");
  }
  return Ok();
}

Status FileRangeRegistry::Register(const Sha1& info_hash, FileRange range) {
  auto valid = ValidateFileRange(range);
  if (!valid) return valid;
  std::lock_guard<std::mutex> lock(mu_);
  if (!ranges_.emplace(info_hash, std::move(range)).second) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "a file range is already registered for info-hash " + Sha1Hex(info_hash));
  }
  return Ok();
}

void FileRangeRegistry::Unregister(const Sha1& info_hash) {
  std::lock_guard<std::mutex> lock(mu_);
  ranges_.erase(info_hash);
}

std::optional<FileRange> FileRangeRegistry::Find(const Sha1& info_hash) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = ranges_.find(info_hash);
  if (it == ranges_.end()) return std::nullopt;
  return it->second;
}

size_t FileRangeRegistry::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ranges_.size();
}

void FileRangeRegistry::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  ranges_.clear();
}

Result<uint64_t> MapPieceRequest(const FileRange& range, uint32_t piece_length, int64_t piece,
                                 int64_t start, int64_t length) {
  if (piece < 0 || piece > std::numeric_limits<int32_t>::max() || start < 0 || length <= 0 ||
      piece_length == 0 || start >= static_cast<int64_t>(piece_length)) {
    return MakeError(ErrorCode::kInvalidArgument, "bad request: piece " + std::to_string(piece) +
                                                      " start " + std::to_string(start) +
                                                      " length " + std::to_string(length));
  }
  // piece < 2^31 and piece_length < 2^32, so this cannot overflow 64 bits.
  uint64_t in_chunk = static_cast<uint64_t>(piece) * piece_length + static_cast<uint64_t>(start);
  if (in_chunk >= range.length || static_cast<uint64_t>(length) > range.length - in_chunk) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "request piece " + std::to_string(piece) + " start " + std::to_string(start) +
                         " length " + std::to_string(length) + " is past the chunk's " +
                         std::to_string(range.length) + " bytes");
  }
  return range.offset + in_chunk;
}

}  // namespace shoal::swarm
