#pragma once
// Where a chunk torrent's bytes live: a byte range of one blob file. Every chunk of a blob shares
// one open file (first the temp file being filled, later the committed file in the store: an
// open descriptor stays valid across the rename). No libtorrent types here, so embedding code
// can use these without including libtorrent.

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "lib/core/error.h"
#include "lib/swarm/chunk_torrent.h"

namespace shoal::swarm {

// An open file descriptor, closed by the destructor. Share it with std::shared_ptr between the
// chunks of one blob. pread/pwrite on it are thread-safe.
class BlobFile {
 public:
  // Opens `path` read-write (writable) or read-only, without creating it. Errors: kIo naming the
  // path and the system error.
  static Result<std::shared_ptr<BlobFile>> Open(const std::string& path, bool writable);
  // Takes ownership of `fd` (closed by the destructor). Errors: kInvalidArgument if fd < 0.
  static Result<std::shared_ptr<BlobFile>> Adopt(int fd);

  ~BlobFile();
  BlobFile(const BlobFile&) = delete;
  BlobFile& operator=(const BlobFile&) = delete;

  int fd() const { return fd_; }

 private:
  explicit BlobFile(int fd) : fd_(fd) {}
  int fd_;
};

// Bytes [offset, offset + length) of `file` hold one chunk torrent's single file.
struct FileRange {
  std::shared_ptr<BlobFile> file;
  uint64_t offset = 0;
  uint64_t length = 0;
};

// Checks a range before it is registered: a file is set and offset + length does not overflow.
// Errors: kInvalidArgument saying which.
Status ValidateFileRange(const FileRange& range);

// Maps a chunk torrent's v1 info-hash to its FileRange. The disk I/O looks a torrent up here
// once, when libtorrent creates the torrent's storage (the storage then keeps its own reference
// to the file), so a range must be registered before the torrent is added. Thread-safe.
class FileRangeRegistry {
 public:
  // Errors: kInvalidArgument when the range is invalid (see ValidateFileRange) or the info-hash
  // is already registered.
  Status Register(const Sha1& info_hash, FileRange range);
  // No-op when absent.
  void Unregister(const Sha1& info_hash);
  std::optional<FileRange> Find(const Sha1& info_hash) const;
  size_t size() const;
  void Clear();

 private:
  mutable std::mutex mu_;
  std::map<Sha1, FileRange> ranges_;
};

// Where byte range [start, start + length) of piece `piece` of a chunk torrent with pieces of
// `piece_length` bytes lies in the blob file, given the chunk's FileRange. Errors:
// kInvalidArgument when the request is empty, negative or extends past the chunk's end.
Result<uint64_t> MapPieceRequest(const FileRange& range, uint32_t piece_length, int64_t piece,
                                 int64_t start, int64_t length);

}  // namespace shoal::swarm
