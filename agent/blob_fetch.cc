#include "agent/blob_fetch.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <spdlog/spdlog.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>

#include "lib/core/log.h"

namespace shoal::agent {
namespace asio = boost::asio;
using asio::awaitable;

namespace {
// After the first bytes, readers are woken at most once per this many new bytes (and at the
// end), so that a fast upstream does not resume every waiting coroutine on every socket read.
constexpr uint64_t kNotifyStep = 1 << 20;
constexpr size_t kHashChunk = 1 << 20;
}  // namespace

BlobFetch::BlobFetch(asio::io_context& ioc, asio::thread_pool& pool, store::BlobStore& store,
                     Digest digest, std::function<void(bool)> on_end)
    : ioc_(ioc),
      pool_(pool),
      store_(store),
      digest_(std::move(digest)),
      on_end_(std::move(on_end)),
      notifier_(ioc.get_executor()),
      sha_(digest_.algorithm()) {}

int BlobFetch::fd() const { return writer_ ? writer_->fd() : -1; }

Status BlobFetch::Open(uint64_t size) {
  if (start_status_) return MakeError(ErrorCode::kInternal, "blob fetch opened twice");
  auto writer = store_.Create(digest_, size);
  if (!writer) {
    Fail(writer.error());
    return writer.error();
  }
  writer_ = std::move(writer.value());
  size_ = size;
  start_status_ = Ok();
  hash_buffer_.resize(kHashChunk);
  notifier_.NotifyAll();
  MaybeHash();  // an empty blob is verified at once
  return Ok();
}

awaitable<Status> BlobFetch::WaitStarted() {
  auto self = shared_from_this();
  while (!start_status_) co_await notifier_.Wait();
  co_return *start_status_;
}

Status BlobFetch::Write(const char* data, size_t size, uint64_t offset) {
  if (error_) return *error_;
  if (!writer_ || offset > size_ || size > size_ - offset) {
    return MakeError(ErrorCode::kInvalidArgument, "write of " + std::to_string(size) +
                                                      " bytes at " + std::to_string(offset) +
                                                      " is outside blob " + digest_.str());
  }
  if (auto st = writer_->PWrite(data, size, offset); !st) {
    Fail(st.error());
    return st;
  }
  Filled(offset, offset + size);
  return Ok();
}

void BlobFetch::Filled(uint64_t begin, uint64_t end) {
  if (error_ || complete_ || begin >= end) return;
  end = std::min(end, size_);
  // Merge [begin, end) with every range it touches; count only bytes not filled before.
  const uint64_t b0 = begin, e0 = end;
  auto it = filled_.upper_bound(begin);
  if (it != filled_.begin() && std::prev(it)->second >= begin) --it;
  uint64_t covered = 0;
  while (it != filled_.end() && it->first <= e0) {
    uint64_t lo = std::max(b0, it->first), hi = std::min(e0, it->second);
    if (hi > lo) covered += hi - lo;
    begin = std::min(begin, it->first);
    end = std::max(end, it->second);
    it = filled_.erase(it);
  }
  filled_bytes_ += (e0 - b0) - covered;
  filled_.emplace(begin, end);
  AdvanceContiguous();
}

void BlobFetch::AdvanceContiguous() {
  contiguous_ = (!filled_.empty() && filled_.begin()->first == 0) ? filled_.begin()->second : 0;
  if (contiguous_ == size_ && filled_at_ == std::chrono::steady_clock::time_point{})
    filled_at_ = std::chrono::steady_clock::now();
  // Readers wake for the first bytes at once (a client's time to first byte: waiting for a
  // full step held them back until the whole first chunk had arrived), then every step, and at
  // the end.
  const bool first_bytes = notified_at_ == 0 && contiguous_ > 0;
  if (first_bytes || contiguous_ - notified_at_ >= kNotifyStep || contiguous_ == size_) {
    notified_at_ = contiguous_;
    notifier_.NotifyAll();
  }
  MaybeHash();
}

// Hashes [hashed_, contiguous_) on the pool, one job at a time, then continues or verifies.
void BlobFetch::MaybeHash() {
  if (hashing_ || error_ || complete_) return;
  if (hashed_ == size_ && contiguous_ == size_) {
    Verify();
    return;
  }
  if (hashed_ >= contiguous_) return;
  hashing_ = true;
  uint64_t from = hashed_, to = contiguous_;
  int fd = writer_->fd();
  asio::post(pool_, [self = shared_from_this(), fd, from, to] {
    std::optional<Error> err;
    for (uint64_t off = from; off < to && !err;) {
      size_t want = static_cast<size_t>(std::min<uint64_t>(to - off, self->hash_buffer_.size()));
      ssize_t n = ::pread(fd, self->hash_buffer_.data(), want, static_cast<off_t>(off));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        err = MakeError(ErrorCode::kIo, "read back " + self->writer_->temp_path() + ": " +
                                            (n < 0 ? std::strerror(errno) : "unexpected end"));
        break;
      }
      self->sha_.Update(self->hash_buffer_.data(), static_cast<size_t>(n));
      off += static_cast<uint64_t>(n);
    }
    // The hashed prefix is final: start writing it to disk now rather than all in the commit.
    if (!err) self->writer_->StartWriteback(from, to - from);
    asio::post(self->ioc_, [self, to, err] {
      self->hashing_ = false;
      if (err) {
        self->Fail(*err);
        return;
      }
      self->hashed_ = to;
      self->MaybeHash();
    });
  });
}

void BlobFetch::Verify() {
  Digest actual = sha_.Final();
  if (actual != digest_) {
    Fail(MakeError(ErrorCode::kDigestMismatch, "the " + std::to_string(size_) +
                                                   " bytes received for " + digest_.str() +
                                                   " hash to " + actual.str()));
    return;
  }
  hashing_ = true;  // no further hashing; keeps MaybeHash idle while committing
  verified_at_ = std::chrono::steady_clock::now();
  spdlog::debug("blob {}: digest matched {} ms after its last byte arrived", digest_.str(),
                MillisSince(filled_at_));
  // The bytes are proven: release the last byte now rather than after fsync + rename (measured:
  // the fsync alone held clients 0.6-2 s per GiB). The fetch stays in the in-flight map until
  // the commit is done, so no second fetch can start in between.
  verified_ = true;
  notifier_.NotifyAll();
  asio::post(pool_, [self = shared_from_this()] {
    Status st = self->writer_->Commit();
    asio::post(self->ioc_, [self, st] {
      if (!st) {
        // The bytes are verified, so current readers may finish; they just won't be cached.
        spdlog::error("could not cache verified blob {}: {}", self->digest_.str(),
                      st.error().ToString());
      }
      self->Complete();
    });
  });
}

void BlobFetch::Complete() {
  complete_ = true;
  spdlog::info("blob {} verified and cached ({} bytes; fsync and rename took {} ms)", digest_.str(),
               size_, MillisSince(verified_at_));
  notifier_.NotifyAll();
  if (on_end_) on_end_(true);
}

void BlobFetch::Fail(Error error) {
  if (error_ || complete_) return;
  spdlog::error("fetch of {} failed: {}", digest_.str(), error.ToString());
  error_ = std::move(error);
  if (!start_status_) start_status_ = *error_;
  if (writer_) writer_->Abort();
  notifier_.NotifyAll();
  if (on_end_) on_end_(false);
}

uint64_t BlobFetch::SafeEnd() const {
  if (complete_ || verified_) return size_;
  // Withhold the final byte until the digest has matched.
  return contiguous_ >= size_ ? (size_ == 0 ? 0 : size_ - 1) : contiguous_;
}

awaitable<Result<uint64_t>> BlobFetch::WaitReadable(uint64_t offset) {
  auto self = shared_from_this();
  for (;;) {
    if (error_) co_return *error_;
    uint64_t end = SafeEnd();
    if (complete_ || verified_ || end > offset) co_return end;
    co_await notifier_.Wait();
  }
}

}  // namespace shoal::agent
