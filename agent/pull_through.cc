#include "agent/pull_through.h"

#include <unistd.h>

#include <spdlog/spdlog.h>

#include "lib/oci/manifest.h"
#include "lib/oci/media_types.h"
#include "lib/oci/reference.h"

namespace shoal::agent {
namespace asio = boost::asio;
using asio::awaitable;

namespace {

// A complete blob in the cache.
class CachedReader : public shim::BlobReader {
 public:
  CachedReader(int fd, uint64_t size) : fd_(fd), size_(size) {}
  ~CachedReader() override { ::close(fd_); }
  uint64_t size() const override { return size_; }
  int fd() const override { return fd_; }
  awaitable<Result<uint64_t>> WaitReadable(uint64_t) override { co_return size_; }
  std::string_view source() const override { return "cache"; }

 private:
  int fd_;
  uint64_t size_;
};

// A blob still arriving from upstream.
class InflightReader : public shim::BlobReader {
 public:
  explicit InflightReader(std::shared_ptr<BlobFetch> fetch) : fetch_(std::move(fetch)) {}
  uint64_t size() const override { return fetch_->size(); }
  int fd() const override { return fetch_->fd(); }
  awaitable<Result<uint64_t>> WaitReadable(uint64_t offset) override {
    co_return co_await fetch_->WaitReadable(offset);
  }
  std::string_view source() const override { return "upstream"; }

 private:
  std::shared_ptr<BlobFetch> fetch_;
};

bool Transient(const Error& e) {
  return e.code == ErrorCode::kUnavailable || e.code == ErrorCode::kTooManyRequests ||
         e.code == ErrorCode::kCancelled;
}

}  // namespace

PullThrough::PullThrough(asio::io_context& ioc, asio::thread_pool& pool, store::BlobStore& store,
                         upstream::RegistryClient& client, PullThroughOptions options,
                         prometheus::Registry& metrics)
    : ioc_(ioc),
      pool_(pool),
      store_(store),
      client_(client),
      options_(std::move(options)),
      cache_hits_(prometheus::BuildCounter()
                      .Name("shoal_cache_blob_hits_total")
                      .Help("Blob requests served from a complete cached blob")
                      .Register(metrics)
                      .Add({})),
      cache_misses_(prometheus::BuildCounter()
                        .Name("shoal_cache_blob_misses_total")
                        .Help("Blob requests that found no complete cached blob")
                        .Register(metrics)
                        .Add({})),
      upstream_bytes_(prometheus::BuildCounter()
                          .Name("shoal_upstream_blob_bytes_total")
                          .Help("Blob bytes received from upstream registries")
                          .Register(metrics)
                          .Add({})),
      fetches_(prometheus::BuildCounter()
                   .Name("shoal_upstream_blob_fetches_total")
                   .Help("Blob fetches from upstream, by result")
                   .Register(metrics)),
      manifest_upstream_(prometheus::BuildCounter()
                             .Name("shoal_manifest_requests_total")
                             .Help("Manifest resolutions, by where the answer came from")
                             .Register(metrics)
                             .Add({{"source", "upstream"}})),
      manifest_cache_(prometheus::BuildCounter()
                          .Name("shoal_manifest_requests_total")
                          .Help("Manifest resolutions, by where the answer came from")
                          .Register(metrics)
                          .Add({{"source", "cache"}})),
      manifest_stale_(prometheus::BuildCounter()
                          .Name("shoal_manifest_requests_total")
                          .Help("Manifest resolutions, by where the answer came from")
                          .Register(metrics)
                          .Add({{"source", "stale"}})),
      inflight_gauge_(prometheus::BuildGauge()
                          .Name("shoal_upstream_blob_fetches_inflight")
                          .Help("Blob fetches from upstream in progress")
                          .Register(metrics)
                          .Add({})) {}

Result<upstream::RegistryEndpoint> PullThrough::EndpointFor(const std::string& registry) const {
  if (auto it = options_.upstreams.find(registry); it != options_.upstreams.end())
    return it->second;
  if (!options_.allow_unmapped_registries) {
    return MakeError(ErrorCode::kNotFound,
                     "registry " + registry + " is not in this agent's upstream map (--upstream)");
  }
  auto url = http::Url::Parse("https://" + registry);
  if (!url) return url.error();
  return upstream::RegistryEndpoint{registry, url.value()};
}

awaitable<Result<shim::ManifestResult>> PullThrough::FetchManifest(
    const shim::RepoRef& repo, const upstream::RegistryEndpoint& ep, const std::string& reference) {
  const std::string accept = oci::UpstreamManifestAccept();
  auto got = co_await client_.GetManifest(ep, repo.repository, reference, accept);
  if (!got) co_return got.error();
  upstream::ManifestResponse& m = got.value();
  // Parse to reject junk before it is cached, and to fill a missing or generic media type.
  auto parsed = oci::ParseManifest(m.body, oci::IsManifestType(m.media_type) ? m.media_type : "");
  if (!parsed) {
    co_return MakeError(ErrorCode::kProtocol, "upstream manifest " + repo.str() + ":" + reference +
                                                  " is invalid: " + parsed.error().message);
  }
  std::string media_type = parsed.value().media_type;
  if (auto st = store_.PutManifest(m.digest, m.body, media_type); !st) {
    spdlog::warn("could not cache manifest {}: {}", m.digest.str(), st.error().ToString());
  }
  manifest_upstream_.Increment();
  co_return shim::ManifestResult{std::move(m.body), media_type, m.digest};
}

awaitable<Result<shim::ManifestResult>> PullThrough::GetManifest(const shim::RepoRef& repo,
                                                                 const std::string& reference,
                                                                 const std::vector<std::string>&) {
  auto ref = oci::ParseManifestRef(reference);
  if (!ref) co_return ref.error();
  if (ref.value().IsDigest()) {
    const Digest& d = *ref.value().digest;
    if (auto cached = store_.GetManifest(d)) {
      manifest_cache_.Increment();
      co_return shim::ManifestResult{std::move(cached->body), cached->media_type, d};
    }
  }
  auto ep = EndpointFor(repo.registry);
  if (!ep) co_return ep.error();
  std::string key = repo.str() + ":" + reference;
  auto tag = tags_.find(key);
  if (!ref.value().IsDigest() && tag != tags_.end() &&
      std::chrono::steady_clock::now() - tag->second.fetched < options_.tag_ttl) {
    if (auto cached = store_.GetManifest(tag->second.digest)) {
      manifest_cache_.Increment();
      co_return shim::ManifestResult{std::move(cached->body), cached->media_type,
                                     tag->second.digest};
    }
  }
  auto fetched = co_await FetchManifest(repo, ep.value(), reference);
  if (fetched) {
    if (!ref.value().IsDigest()) {
      tags_.insert_or_assign(key,
                             TagEntry{fetched.value().digest, std::chrono::steady_clock::now()});
    }
    co_return fetched;
  }
  // Never worse than no mirror: when upstream is down, a tag we resolved before still serves.
  tag = tags_.find(key);
  if (Transient(fetched.error()) && tag != tags_.end()) {
    if (auto cached = store_.GetManifest(tag->second.digest)) {
      spdlog::warn("upstream unavailable for {} ({}); serving the last known manifest {}", key,
                   fetched.error().message, tag->second.digest.str());
      manifest_stale_.Increment();
      co_return shim::ManifestResult{std::move(cached->body), cached->media_type,
                                     tag->second.digest};
    }
  }
  co_return fetched.error();
}

awaitable<Result<std::shared_ptr<shim::BlobReader>>> PullThrough::OpenBlob(
    const shim::RepoRef& repo, const Digest& digest) {
  // Stat, open and the in-flight lookup happen without suspending, so a fetch that completes
  // concurrently is seen either in the store or in inflight_, never neither.
  if (auto size = store_.Stat(digest)) {
    auto fd = store_.OpenBlob(digest);
    if (fd) {
      cache_hits_.Increment();
      co_return std::shared_ptr<shim::BlobReader>(
          std::make_shared<CachedReader>(fd.value(), *size));
    }
  }
  cache_misses_.Increment();
  std::shared_ptr<BlobFetch> fetch;
  if (auto it = inflight_.find(digest); it != inflight_.end()) {
    fetch = it->second;
    auto st = co_await fetch->WaitStarted();
    if (!st) co_return st.error();
    co_return std::shared_ptr<shim::BlobReader>(std::make_shared<InflightReader>(fetch));
  }
  auto ep = EndpointFor(repo.registry);
  if (!ep) co_return ep.error();
  FetchCounters counters{[this](uint64_t n) { upstream_bytes_.Increment(static_cast<double>(n)); },
                         [this](std::string_view result) {
                           fetches_.Add({{"result", std::string(result)}}).Increment();
                         }};
  fetch = std::make_shared<BlobFetch>(ioc_, pool_, store_, client_, ep.value(), repo.repository,
                                      digest, options_.fetch, std::move(counters));
  inflight_.emplace(digest, fetch);
  inflight_gauge_.Set(static_cast<double>(inflight_.size()));
  // A named callback, not a temporary: GCC 12 destroys lambda temporaries inside a co_await
  // expression twice.
  std::function<void()> on_done = [this, digest, raw = fetch.get()] {
    auto it = inflight_.find(digest);
    if (it != inflight_.end() && it->second.get() == raw) inflight_.erase(it);
    inflight_gauge_.Set(static_cast<double>(inflight_.size()));
  };
  auto st = co_await fetch->Start(std::move(on_done));
  if (!st) co_return st.error();
  co_return std::shared_ptr<shim::BlobReader>(std::make_shared<InflightReader>(fetch));
}

}  // namespace shoal::agent
