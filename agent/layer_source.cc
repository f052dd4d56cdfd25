#include "agent/layer_source.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <future>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/post.hpp>

#include "lib/oci/reference.h"

namespace shoal::agent {
namespace asio = boost::asio;

namespace {

Result<shim::RepoRef> RepoOf(const std::string& image_ref) {
  auto ref = oci::ParseImageRef(image_ref);
  if (!ref) return ref.error();
  return shim::RepoRef{ref.value().registry, ref.value().repository};
}

// Runs the coroutine `make()` on ioc; its result arrives in the returned future. (co_spawn of
// an awaitable<Result<T>> needs a default-constructible result, which Result is not.)
template <typename T, typename F>
std::future<Result<T>> Spawn(asio::io_context& ioc, F make) {
  auto promise = std::make_shared<std::promise<Result<T>>>();
  std::future<Result<T>> future = promise->get_future();
  asio::co_spawn(
      ioc,
      [promise, make = std::move(make)]() -> asio::awaitable<void> {
        Result<T> r = co_await make();
        promise->set_value(std::move(r));
      },
      [promise](std::exception_ptr e) {
        if (e) promise->set_exception(e);
      });
  return future;
}

// Waits for a coroutine's result until the deadline, in slices, so that Stop() is seen.
template <typename T>
Result<T> Wait(std::future<Result<T>>& f, snapshotter::Deadline deadline,
               const std::atomic<bool>& stopped, const std::string& what) {
  for (;;) {
    if (stopped) return MakeError(ErrorCode::kCancelled, what + ": the agent is stopping");
    auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return MakeError(ErrorCode::kUnavailable, what + ": timed out");
    auto slice = std::min(deadline, now + std::chrono::milliseconds(100));
    if (f.wait_until(slice) == std::future_status::ready) {
      try {
        return f.get();
      } catch (const std::exception& e) {
        return MakeError(ErrorCode::kInternal, what + ": " + e.what());
      }
    }
  }
}

// Reads a blob as PullThrough's reader makes its bytes safe. Runs on a LayerPrep worker; the
// reader itself is only used (and released) on the network thread.
class StreamingBlob : public extract::ByteSource {
 public:
  StreamingBlob(asio::io_context& ioc, std::shared_ptr<shim::BlobReader> reader, uint64_t size,
                int fd, std::string what, snapshotter::Deadline deadline,
                const std::atomic<bool>& stopped)
      : ioc_(ioc),
        reader_(std::move(reader)),
        size_(size),
        fd_(fd),
        what_(std::move(what)),
        deadline_(deadline),
        stopped_(stopped) {}
  ~StreamingBlob() override {
    asio::post(ioc_, [r = std::move(reader_)]() mutable { r.reset(); });
  }

  Result<size_t> Read(std::span<std::byte> out) override {
    if (out.empty() || pos_ >= size_) return size_t{0};
    if (pos_ >= safe_) {
      auto future = Spawn<uint64_t>(
          ioc_, [r = reader_, p = pos_]() -> asio::awaitable<Result<uint64_t>> {
            auto end = co_await r->WaitReadable(p);
            co_return end;
          });
      auto end = Wait(future, deadline_, stopped_, what_);
      if (!end) return end.error();
      safe_ = std::min(end.value(), size_);
      if (safe_ <= pos_) {
        return MakeError(ErrorCode::kInternal, what_ + ": no bytes readable at " +
                                                   std::to_string(pos_));
      }
    }
    const size_t want = static_cast<size_t>(std::min<uint64_t>(out.size(), safe_ - pos_));
    for (;;) {
      ssize_t n = ::pread(fd_, out.data(), want, static_cast<off_t>(pos_));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        return MakeError(ErrorCode::kIo, what_ + ": read at " + std::to_string(pos_) + ": " +
                                             std::strerror(errno));
      }
      if (n == 0) {
        return MakeError(ErrorCode::kIo, what_ + ": file ends at " + std::to_string(pos_));
      }
      pos_ += static_cast<uint64_t>(n);
      return static_cast<size_t>(n);
    }
  }
  std::string Describe() const override { return what_; }

 private:
  asio::io_context& ioc_;
  std::shared_ptr<shim::BlobReader> reader_;
  const uint64_t size_;
  const int fd_;  // the reader's; valid while it lives
  const std::string what_;
  const snapshotter::Deadline deadline_;
  const std::atomic<bool>& stopped_;
  uint64_t pos_ = 0;
  uint64_t safe_ = 0;  // bytes [0, safe_) may be read
};

}  // namespace

Result<std::unique_ptr<extract::ByteSource>> PullThroughLayerSource::OpenBlob(
    const std::string& image_ref, const Digest& digest, snapshotter::Deadline deadline) {
  auto repo = RepoOf(image_ref);
  if (!repo) return repo.error();
  struct Opened {
    std::shared_ptr<shim::BlobReader> reader;
    uint64_t size = 0;
    int fd = -1;
  };
  auto future = Spawn<Opened>(
      ioc_, [this, r = repo.value(), d = digest]() -> asio::awaitable<Result<Opened>> {
        if (auto st = backend_.CheckRegistry(r); !st) co_return st.error();
        if (!backend_.ServesWithoutClientCheck(r)) {
          co_return MakeError(ErrorCode::kRefused,
                              r.str() + " is served only to clients the agent checked");
        }
        auto reader = co_await backend_.OpenBlob(r, d);
        if (!reader) co_return reader.error();
        Opened o{reader.value(), reader.value()->size(), reader.value()->fd()};
        co_return o;
      });
  const std::string what = "blob " + digest.str() + " of " + image_ref;
  auto opened = Wait(future, deadline, stopped_, what);
  if (!opened) return opened.error();
  return std::unique_ptr<extract::ByteSource>(
      new StreamingBlob(ioc_, std::move(opened.value().reader), opened.value().size,
                        opened.value().fd, what, deadline, stopped_));
}

Result<snapshotter::LayerSource::ManifestBody> PullThroughLayerSource::Manifest(
    const std::string& image_ref, const Digest& digest, snapshotter::Deadline deadline) {
  auto repo = RepoOf(image_ref);
  if (!repo) return repo.error();
  auto future = Spawn<ManifestBody>(
      ioc_, [this, r = repo.value(), d = digest]() -> asio::awaitable<Result<ManifestBody>> {
        if (auto st = backend_.CheckRegistry(r); !st) co_return st.error();
        if (!backend_.ServesWithoutClientCheck(r)) {
          co_return MakeError(ErrorCode::kRefused,
                              r.str() + " is served only to clients the agent checked");
        }
        const std::vector<std::string> accept;
        const std::string reference = d.str();
        auto m = co_await backend_.GetManifest(r, reference, accept);
        if (!m) co_return m.error();
        co_return ManifestBody{m.value().body, m.value().media_type};
      });
  return Wait(future, deadline, stopped_, "manifest " + digest.str() + " of " + image_ref);
}

Result<std::string> PullThroughLayerSource::Blob(const std::string& image_ref,
                                                 const Digest& digest,
                                                 snapshotter::Deadline deadline) {
  auto repo = RepoOf(image_ref);
  if (!repo) return repo.error();
  auto future = Spawn<std::string>(
      ioc_, [this, r = repo.value(), d = digest]() -> asio::awaitable<Result<std::string>> {
        if (auto st = backend_.CheckRegistry(r); !st) co_return st.error();
        if (!backend_.ServesWithoutClientCheck(r)) {
          co_return MakeError(ErrorCode::kRefused,
                              r.str() + " is served only to clients the agent checked");
        }
        const std::function<void(uint64_t)> no_progress;
        Status st = co_await backend_.FetchToCache(r, d, no_progress);
        if (!st) co_return st.error();
        co_return store_.BlobPath(d);
      });
  return Wait(future, deadline, stopped_, "blob " + digest.str() + " of " + image_ref);
}

}  // namespace shoal::agent
