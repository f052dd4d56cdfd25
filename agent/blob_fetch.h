#pragma once
// One blob being fetched from upstream into the cache while clients read it.
//
// The blob is split into parts fetched by a few parallel Range streams into one temp file.
// A hasher on the thread pool follows the contiguous prefix; when it reaches the end the digest
// is checked, then the file is fsynced and renamed into the store. Readers may send any byte of
// the contiguous prefix except the blob's last byte, which is released only after the digest
// matched (before the fsync + rename): a client never receives a complete body whose content is
// wrong.

#include <utility>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/thread_pool.hpp>

#include "agent/notifier.h"
#include "lib/core/digest.h"
#include "lib/core/sha256.h"
#include "lib/store/blob_store.h"
#include "lib/upstream/registry_client.h"

namespace shoal::agent {

struct FetchOptions {
  uint64_t part_size = 16ull << 20;  // bytes per Range request
  int streams = 4;                   // parallel Range requests per blob
};

// Counters the fetch reports into (owned by the caller, thread-safe).
struct FetchCounters {
  std::function<void(uint64_t)> upstream_bytes;
  std::function<void(std::string_view result)> finished;  // "ok", "digest_mismatch", "error"
};

// Lives on the agent's single network thread (io_context); hashing and fsync run on pool.
class BlobFetch : public std::enable_shared_from_this<BlobFetch> {
 public:
  BlobFetch(boost::asio::io_context& ioc, boost::asio::thread_pool& pool, store::BlobStore& store,
            upstream::RegistryClient& client, upstream::RegistryEndpoint endpoint,
            std::string repository, Digest digest, FetchOptions options, FetchCounters counters);

  // Learns the size from upstream, creates the temp file and starts the range streams. Runs
  // once; concurrent callers use WaitStarted. on_done runs (on the network thread) when the
  // fetch has ended either way, after a successful commit.
  boost::asio::awaitable<Status> Start(std::function<void()> on_done);
  // Waits until Start has learned the size (or failed).
  boost::asio::awaitable<Status> WaitStarted();

  const Digest& digest() const { return digest_; }
  uint64_t size() const { return size_; }
  int fd() const;
  // See shim::BlobReader::WaitReadable.
  boost::asio::awaitable<Result<uint64_t>> WaitReadable(uint64_t offset);

 private:
  struct Part {
    uint64_t begin = 0;
    uint64_t end = 0;
    uint64_t done = 0;  // bytes written from begin
  };

  boost::asio::awaitable<void> Stream();
  Status OnBytes(size_t part, const char* data, size_t size);
  void AdvanceContiguous();
  void MaybeHash();
  void Verify();
  void Complete();
  void Fail(Error error);
  uint64_t SafeEnd() const;

  boost::asio::io_context& ioc_;
  boost::asio::thread_pool& pool_;
  store::BlobStore& store_;
  upstream::RegistryClient& client_;
  upstream::RegistryEndpoint endpoint_;
  std::string repository_;
  Digest digest_;
  FetchOptions options_;
  FetchCounters counters_;
  Notifier notifier_;
  std::function<void()> on_done_;

  // All below: network thread only, except sha_ and hash_buffer_, which only the one hashing job
  // in flight (hashing_ == true) touches.
  bool started_ = false;
  std::optional<Status> start_status_;
  uint64_t size_ = 0;
  std::unique_ptr<store::BlobWriter> writer_;
  std::vector<Part> parts_;
  size_t next_part_ = 0;
  size_t frontier_ = 0;       // first part not fully written
  uint64_t contiguous_ = 0;   // bytes [0, contiguous_) are written
  uint64_t notified_at_ = 0;  // contiguous_ when readers were last woken
  uint64_t hashed_ = 0;
  bool hashing_ = false;
  bool verified_ = false;  // the digest matched; all bytes may be sent (commit may be pending)
  bool complete_ = false;
  std::optional<Error> error_;
  Sha256 sha_;
  std::vector<char> hash_buffer_;
};

}  // namespace shoal::agent
