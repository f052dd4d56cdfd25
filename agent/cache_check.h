#pragma once
// Verification of cached blobs before they are served as complete. A blob was verified when it
// entered the cache, but the disk under it can change since (a flipped bit, a stray write, an
// operator's mistake): peers catch that by piece hash and ban the node, while the node itself
// would keep serving the bad bytes to its own runtime. So the first time a cached file is
// served by this process (and again whenever its inode, size, mtime or ctime changed) its
// digest (sha256 or sha512) is computed on the thread pool while the body streams out; the blob's last byte (and
// the last byte of a Range answer) waits for the match. A mismatch drops the blob from the
// cache and the swarm (the next request fetches it again), counts it and logs it.

#include <sys/stat.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>

#include <prometheus/counter.h>
#include <prometheus/registry.h>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/thread_pool.hpp>

#include "agent/notifier.h"
#include "lib/core/digest.h"
#include "lib/core/error.h"
#include "lib/store/blob_store.h"

namespace shoal::agent {

// One hash pass over a cached file, shared by every reader waiting for it.
struct CacheCheck {
  explicit CacheCheck(boost::asio::any_io_executor ex) : changed(std::move(ex)) {}
  Notifier changed;              // woken when result is set
  std::optional<Status> result;  // Ok (matched), kDigestMismatch or kIo
  // Waits for the result.
  boost::asio::awaitable<Status> Wait();
};

// Network thread only (hashing runs on the pool; results come back to the network thread).
class CacheVerifier {
 public:
  // A corrupt blob leaves the store through BlobStore::DropCorrupt (whose evict hook takes it
  // out of the swarm).
  CacheVerifier(boost::asio::io_context& ioc, boost::asio::thread_pool& pool,
                store::BlobStore& store, prometheus::Registry& metrics);

  // The check for a cached blob open as fd (size bytes): nullptr when this very file was
  // verified before (by a check or by NoteVerified), else the running or a new check.
  std::shared_ptr<CacheCheck> Check(const Digest& digest, int fd, uint64_t size);
  // Records that the blob's file in the store was just verified (a fetch committed it).
  void NoteVerified(const Digest& digest);
  // Blobs found corrupt on disk since start.
  uint64_t corrupt() const { return corrupt_count_; }

 private:
  // What identifies one version of a file's content without reading it.
  struct FileId {
    dev_t dev = 0;
    ino_t ino = 0;
    off_t size = 0;
    int64_t mtime_ns = 0;
    int64_t ctime_ns = 0;
    bool operator==(const FileId&) const = default;
  };
  static std::optional<FileId> IdOf(int fd);
  void Finish(const Digest& digest, const std::shared_ptr<CacheCheck>& check, FileId id,
              Status result);

  boost::asio::io_context& ioc_;
  boost::asio::thread_pool& pool_;
  store::BlobStore& store_;
  std::unordered_map<Digest, FileId> verified_;  // bounded: cleared when it grows past 100,000
  std::unordered_map<Digest, std::shared_ptr<CacheCheck>> running_;
  prometheus::Counter& corrupt_;         // shoal_cache_corrupt_blobs_total
  prometheus::Counter& verified_bytes_;  // shoal_cache_verified_bytes_total
  uint64_t corrupt_count_ = 0;
};

}  // namespace shoal::agent
