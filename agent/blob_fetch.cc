#include "agent/blob_fetch.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <spdlog/spdlog.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>

namespace shoal::agent {
namespace asio = boost::asio;
using asio::awaitable;

namespace {
// Readers are woken at most once per this many new bytes (and at the end), so that a fast
// upstream does not resume every waiting coroutine on every socket read.
constexpr uint64_t kNotifyStep = 1 << 20;
constexpr size_t kHashChunk = 1 << 20;
}  // namespace

BlobFetch::BlobFetch(asio::io_context& ioc, asio::thread_pool& pool, store::BlobStore& store,
                     upstream::RegistryClient& client, upstream::RegistryEndpoint endpoint,
                     std::string repository, Digest digest, FetchOptions options,
                     FetchCounters counters)
    : ioc_(ioc),
      pool_(pool),
      store_(store),
      client_(client),
      endpoint_(std::move(endpoint)),
      repository_(std::move(repository)),
      digest_(std::move(digest)),
      options_(options),
      counters_(std::move(counters)),
      notifier_(ioc.get_executor()) {}

int BlobFetch::fd() const { return writer_ ? writer_->fd() : -1; }

awaitable<Status> BlobFetch::Start(std::function<void()> on_done) {
  on_done_ = std::move(on_done);
  auto self = shared_from_this();
  started_ = true;
  auto size = co_await client_.StatBlob(endpoint_, repository_, digest_);
  if (size) {
    auto writer = store_.Create(digest_);
    if (writer) {
      writer_ = std::move(writer.value());
      size_ = size.value();
    } else {
      size = writer.error();
    }
  }
  if (!size) {
    start_status_ = size.error();
    error_ = size.error();
    notifier_.NotifyAll();
    if (counters_.finished) counters_.finished("error");
    if (on_done_) on_done_();
    co_return size.error();
  }
  start_status_ = Ok();
  spdlog::info("fetching {} ({} bytes) from {} for {}", digest_.str(), size_, endpoint_.base.str(),
               repository_);
  for (uint64_t begin = 0; begin < size_; begin += options_.part_size) {
    parts_.push_back(Part{begin, std::min(size_, begin + options_.part_size), 0});
  }
  hash_buffer_.resize(kHashChunk);
  int streams = std::max(1, std::min<int>(options_.streams, static_cast<int>(parts_.size())));
  for (int i = 0; i < streams; ++i) asio::co_spawn(ioc_, Stream(), asio::detached);
  notifier_.NotifyAll();
  MaybeHash();  // an empty blob is verified at once
  co_return Ok();
}

awaitable<Status> BlobFetch::WaitStarted() {
  auto self = shared_from_this();
  while (!start_status_) co_await notifier_.Wait();
  co_return *start_status_;
}

awaitable<void> BlobFetch::Stream() {
  auto self = shared_from_this();
  while (!error_ && next_part_ < parts_.size()) {
    size_t index = next_part_++;
    const Part& part = parts_[index];
    upstream::BodySink sink = [this, index](const char* data, size_t size) {
      return OnBytes(index, data, size);
    };
    Status st = co_await client_.FetchBlob(endpoint_, repository_, digest_, part.begin,
                                           part.end - part.begin, std::move(sink));
    if (!st) {
      if (!error_) Fail(st.error());
      co_return;
    }
  }
}

Status BlobFetch::OnBytes(size_t index, const char* data, size_t size) {
  if (error_) return *error_;
  Part& part = parts_[index];
  if (part.done + size > part.end - part.begin) {
    return MakeError(ErrorCode::kProtocol,
                     "upstream sent more bytes than asked for " + digest_.str());
  }
  if (auto st = writer_->PWrite(data, size, part.begin + part.done); !st) {
    Fail(st.error());
    return st;
  }
  part.done += size;
  if (counters_.upstream_bytes) counters_.upstream_bytes(size);
  if (index == frontier_) AdvanceContiguous();
  return Ok();
}

void BlobFetch::AdvanceContiguous() {
  while (frontier_ < parts_.size() &&
         parts_[frontier_].done == parts_[frontier_].end - parts_[frontier_].begin) {
    ++frontier_;
  }
  contiguous_ =
      frontier_ < parts_.size() ? parts_[frontier_].begin + parts_[frontier_].done : size_;
  if (contiguous_ - notified_at_ >= kNotifyStep || contiguous_ == size_) {
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
    Fail(MakeError(ErrorCode::kDigestMismatch,
                   "upstream " + endpoint_.base.str() + " sent " + std::to_string(size_) +
                       " bytes for " + digest_.str() + " that hash to " + actual.str()));
    return;
  }
  hashing_ = true;  // no further hashing; keeps MaybeHash idle while committing
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
  spdlog::info("blob {} verified and cached ({} bytes)", digest_.str(), size_);
  notifier_.NotifyAll();
  if (counters_.finished) counters_.finished("ok");
  if (on_done_) on_done_();
}

void BlobFetch::Fail(Error error) {
  if (error_ || complete_) return;
  spdlog::error("fetch of {} from {} failed: {}", digest_.str(), endpoint_.base.str(),
                error.ToString());
  if (counters_.finished) {
    counters_.finished(error.code == ErrorCode::kDigestMismatch ? "digest_mismatch" : "error");
  }
  error_ = std::move(error);
  if (!start_status_) start_status_ = *error_;
  if (writer_) writer_->Abort();
  notifier_.NotifyAll();
  if (on_done_) on_done_();
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
