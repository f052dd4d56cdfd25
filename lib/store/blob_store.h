#pragma once
// The content-addressed blob cache on local disk (meant for the instance SSD).
//
// Layout under root: blobs/sha256/<2 hex>/<64 hex> holds complete, verified blobs; tmp/ holds
// blobs being written (never served as complete); meta/<64 hex>.json holds a manifest's media
// type. A blob appears under blobs/ only through BlobWriter::Commit, i.e. fsync + rename after
// its sha256 matched, so a crash can leave garbage in tmp/ but never a wrong blob.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "lib/core/digest.h"
#include "lib/core/error.h"

namespace shoal::store {

// A manifest as cached: its bytes plus the media type it was served with.
struct StoredManifest {
  std::string body;
  std::string media_type;
};

// Owns one temp file that will become a blob. Not thread-safe; PWrite may be called from any
// single thread at a time. Destroying an uncommitted writer removes the temp file.
class BlobWriter {
 public:
  ~BlobWriter();
  BlobWriter(const BlobWriter&) = delete;
  BlobWriter& operator=(const BlobWriter&) = delete;

  // The temp file's descriptor, readable and writable; stays valid (and keeps naming the same
  // inode) after Commit, until the writer is destroyed.
  int fd() const { return fd_; }
  const std::string& temp_path() const { return temp_path_; }

  // Writes all of [data, data+size) at offset. Errors: kIo (e.g. ENOSPC) naming the file.
  Status PWrite(const char* data, size_t size, uint64_t offset);
  // fsyncs and atomically renames the temp file to the blob's final path. The caller must have
  // verified the content hashes to the digest. Errors: kIo.
  Status Commit();
  // Removes the temp file now (the fd stays open for readers that still hold it).
  void Abort();

 private:
  friend class BlobStore;
  BlobWriter(int fd, std::string temp_path, std::string final_path);
  int fd_;
  std::string temp_path_;
  std::string final_path_;
  bool done_ = false;
};

// Thread-safe: all methods may be called concurrently (the file system is the only state).
class BlobStore {
 public:
  // Creates the directory layout if needed and deletes leftover temp files from an earlier run.
  // Errors: kIo naming the path.
  static Result<std::unique_ptr<BlobStore>> Open(std::string root);

  const std::string& root() const { return root_; }
  // Final path of a blob, whether or not it exists.
  std::string BlobPath(const Digest& digest) const;
  // Size of a complete blob, or nullopt when it is not cached.
  std::optional<uint64_t> Stat(const Digest& digest) const;
  // Opens a complete blob for reading; the caller owns the fd. Errors: kNotFound, kIo.
  Result<int> OpenBlob(const Digest& digest) const;
  // Starts writing a blob into a new temp file. Errors: kIo.
  Result<std::unique_ptr<BlobWriter>> Create(const Digest& digest);

  // Stores a small blob (a manifest) after checking that it hashes to digest, with its media
  // type. Errors: kDigestMismatch, kIo.
  Status PutManifest(const Digest& digest, std::string_view body, std::string_view media_type);
  // Reads a cached manifest back (re-verifying its digest). nullopt when absent or corrupt.
  std::optional<StoredManifest> GetManifest(const Digest& digest) const;

  // Number of leftover temp files removed by Open (for logs and tests).
  int cleaned_temp_files() const { return cleaned_temp_files_; }

 private:
  explicit BlobStore(std::string root) : root_(std::move(root)) {}
  std::string root_;
  int cleaned_temp_files_ = 0;
};

}  // namespace shoal::store
