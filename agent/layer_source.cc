#include "agent/layer_source.h"

#include <future>

#include <boost/asio/co_spawn.hpp>

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

}  // namespace

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
