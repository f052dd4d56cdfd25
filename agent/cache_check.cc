#include "agent/cache_check.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include <spdlog/spdlog.h>
#include <boost/asio/post.hpp>

#include "lib/core/content_hash.h"

namespace shoal::agent {
namespace asio = boost::asio;
using asio::awaitable;

namespace {
constexpr size_t kHashChunk = 1 << 20;
constexpr size_t kMaxVerified = 100'000;
}  // namespace

awaitable<Status> CacheCheck::Wait() {
  while (!result) co_await changed.Wait();
  co_return *result;
}

CacheVerifier::CacheVerifier(asio::io_context& ioc, asio::thread_pool& pool,
                             store::BlobStore& store, prometheus::Registry& metrics)
    : ioc_(ioc),
      pool_(pool),
      store_(store),
      corrupt_(prometheus::BuildCounter()
                   .Name("shoal_cache_corrupt_blobs_total")
                   .Help("Cached blobs whose bytes on disk no longer matched their digest when "
                         "served; each was dropped and is fetched again")
                   .Register(metrics)
                   .Add({})),
      verified_bytes_(prometheus::BuildCounter()
                          .Name("shoal_cache_verified_bytes_total")
                          .Help("Bytes of cached blobs hashed again before being served")
                          .Register(metrics)
                          .Add({})) {}

std::optional<CacheVerifier::FileId> CacheVerifier::IdOf(int fd) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return std::nullopt;
  FileId id;
  id.dev = st.st_dev;
  id.ino = st.st_ino;
  id.size = st.st_size;
  id.mtime_ns = int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec;
  id.ctime_ns = int64_t{st.st_ctim.tv_sec} * 1'000'000'000 + st.st_ctim.tv_nsec;
  return id;
}

void CacheVerifier::NoteVerified(const Digest& digest) {
  auto fd = store_.OpenBlob(digest);
  if (!fd) return;
  if (auto id = IdOf(fd.value())) {
    if (verified_.size() >= kMaxVerified) verified_.clear();
    verified_.insert_or_assign(digest, *id);
  }
  ::close(fd.value());
}

std::shared_ptr<CacheCheck> CacheVerifier::Check(const Digest& digest, int fd, uint64_t size) {
  std::optional<FileId> id = IdOf(fd);
  if (id) {
    auto known = verified_.find(digest);
    if (known != verified_.end() && known->second == *id) return nullptr;
  }
  if (auto it = running_.find(digest); it != running_.end()) return it->second;
  auto check = std::make_shared<CacheCheck>(ioc_.get_executor());
  if (!id) {
    check->result = MakeError(
        ErrorCode::kIo, "cannot stat cached blob " + digest.str() + ": " + std::strerror(errno));
    return check;
  }
  int own = ::dup(fd);  // the job may outlive the reader that opened fd
  if (own < 0) {
    check->result = MakeError(ErrorCode::kIo, "dup for verifying " + digest.str() + " failed");
    return check;
  }
  running_.emplace(digest, check);
  asio::post(pool_, [this, digest, check, own, size, file = *id] {
    ContentHash sha(digest.algorithm());
    std::vector<char> buf(kHashChunk);
    std::optional<Error> err;
    uint64_t off = 0;
    while (off < size) {
      size_t want = static_cast<size_t>(std::min<uint64_t>(size - off, buf.size()));
      ssize_t n = ::pread(own, buf.data(), want, static_cast<off_t>(off));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        err = MakeError(ErrorCode::kIo, "read back cached blob " + digest.str() + " at " +
                                            std::to_string(off) + ": " +
                                            (n < 0 ? std::strerror(errno) : "ended early"));
        break;
      }
      sha.Update(buf.data(), static_cast<size_t>(n));
      off += static_cast<uint64_t>(n);
    }
    ::close(own);
    Status result = Ok();
    if (err) {
      result = *err;
    } else if (Digest actual = sha.Final(); actual != digest) {
      result = MakeError(ErrorCode::kDigestMismatch,
                         "cached blob " + digest.str() + " (" + std::to_string(size) +
                             " bytes) on disk hashes to " + actual.str());
    }
    asio::post(ioc_, [this, digest, check, file, result] { Finish(digest, check, file, result); });
  });
  return check;
}

void CacheVerifier::Finish(const Digest& digest, const std::shared_ptr<CacheCheck>& check,
                           FileId id, Status result) {
  running_.erase(digest);
  verified_bytes_.Increment(static_cast<double>(id.size));
  if (result) {
    if (verified_.size() >= kMaxVerified) verified_.clear();
    verified_.insert_or_assign(digest, id);
  } else if (result.error().code == ErrorCode::kDigestMismatch) {
    ++corrupt_count_;
    corrupt_.Increment();
    verified_.erase(digest);
    spdlog::error(
        "{}; dropping it from the cache and the swarm (it is fetched again on the next "
        "request)",
        result.error().message);
    store_.DropCorrupt(digest, static_cast<uint64_t>(id.ino));
  } else {
    spdlog::error("verifying {}: {}", digest.str(), result.error().ToString());
  }
  check->result = result;
  check->changed.NotifyAll();
}

}  // namespace shoal::agent
