#pragma once
// One blob being assembled in the cache while clients read it.
//
// Sources (agent/chunk_fetcher.h: upstream Range streams, libtorrent chunk torrents) put bytes
// anywhere in one temp file and report which ranges are filled. A hasher on the thread pool
// follows the contiguous prefix; when it reaches the end the digest is checked, then the file is
// fsynced and renamed into the store. Readers may send any byte of the contiguous prefix except
// the blob's last byte, which is released only after the digest matched (before the fsync +
// rename): a client never receives a complete body whose content is wrong.

#include <utility>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/thread_pool.hpp>

#include "agent/notifier.h"
#include "lib/core/content_hash.h"
#include "lib/core/digest.h"
#include "lib/store/blob_store.h"

namespace shoal::agent {

// Lives on the agent's single network thread (io_context); hashing and fsync run on pool.
class BlobFetch : public std::enable_shared_from_this<BlobFetch> {
 public:
  // on_end runs once on the network thread when the fetch ended: after the commit (ok = true) or
  // after a failure (ok = false, error() says why).
  BlobFetch(boost::asio::io_context& ioc, boost::asio::thread_pool& pool, store::BlobStore& store,
            Digest digest, std::function<void(bool ok)> on_end);

  // Creates the temp file for a blob of `size` bytes (or records why that failed, or why the
  // size could not be learned). Exactly one of Open/Fail starts the fetch; waiters then wake.
  Status Open(uint64_t size);
  // Waits until Open or Fail has been called.
  boost::asio::awaitable<Status> WaitStarted();

  // Writes bytes at offset and marks them filled. Errors: kIo (disk), kInvalidArgument (past
  // the end), or the fetch's error when it already failed.
  Status Write(const char* data, size_t size, uint64_t offset);
  // Marks [begin, end) filled by someone who wrote the file directly (libtorrent's storage).
  void Filled(uint64_t begin, uint64_t end);
  // Ends the fetch with an error: readers get it, the temp file is removed. Idempotent.
  void Fail(Error error);

  const Digest& digest() const { return digest_; }
  uint64_t size() const { return size_; }
  int fd() const;
  bool failed() const { return error_.has_value(); }
  bool ended() const { return complete_ || error_.has_value(); }
  const std::optional<Error>& error() const { return error_; }
  // Bytes filled so far (any order).
  uint64_t filled_bytes() const { return filled_bytes_; }
  // Bytes [0, contiguous()) are filled: where a streaming reader waits.
  uint64_t contiguous() const { return contiguous_; }
  // Wakes on every change worth a look (new bytes, end); for sources that wait on the blob.
  Notifier& changes() { return notifier_; }
  // See shim::BlobReader::WaitReadable.
  boost::asio::awaitable<Result<uint64_t>> WaitReadable(uint64_t offset);

 private:
  void AdvanceContiguous();
  void MaybeHash();
  void Verify();
  void Complete();
  uint64_t SafeEnd() const;

  boost::asio::io_context& ioc_;
  boost::asio::thread_pool& pool_;
  store::BlobStore& store_;
  Digest digest_;
  std::function<void(bool)> on_end_;
  Notifier notifier_;

  // All below: network thread only, except sha_ and hash_buffer_, which only the one hashing job
  // in flight (hashing_ == true) touches.
  std::optional<Status> start_status_;
  uint64_t size_ = 0;
  std::unique_ptr<store::BlobWriter> writer_;
  std::map<uint64_t, uint64_t> filled_;  // disjoint, non-adjacent [begin, end) ranges
  uint64_t filled_bytes_ = 0;
  uint64_t contiguous_ = 0;   // bytes [0, contiguous_) are filled
  uint64_t notified_at_ = 0;  // contiguous_ when readers were last woken
  uint64_t hashed_ = 0;
  bool hashing_ = false;
  // When the last byte arrived and when the digest matched (for the timings in the logs).
  std::chrono::steady_clock::time_point filled_at_, verified_at_;
  bool verified_ = false;  // the digest matched; all bytes may be sent (commit may be pending)
  bool complete_ = false;
  std::optional<Error> error_;
  ContentHash sha_;  // in digest_'s algorithm (sha256 or sha512)
  std::vector<char> hash_buffer_;
};

}  // namespace shoal::agent
