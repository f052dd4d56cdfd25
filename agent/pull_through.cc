#include "agent/pull_through.h"

#include <unistd.h>

#include <spdlog/spdlog.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "lib/core/sha256.h"

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
                         FetchServices& services, PullThroughOptions options,
                         prometheus::Registry& metrics)
    : ioc_(ioc),
      pool_(pool),
      store_(store),
      client_(services.client),
      services_(services),
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
      fetches_(prometheus::BuildCounter()
                   .Name("shoal_upstream_blob_fetches_total")
                   .Help("Blob fetches into the cache (from upstream and/or peers), by result")
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
                          .Add({})),
      manifest_tracker_(prometheus::BuildCounter()
                            .Name("shoal_manifest_requests_total")
                            .Help("Manifest resolutions, by where the answer came from")
                            .Register(metrics)
                            .Add({{"source", "tracker"}})),
      manifest_leases_(prometheus::BuildCounter()
                           .Name("shoal_manifest_tracker_leases_total")
                           .Help("Manifests this agent fetched upstream for the cluster under "
                                 "the tracker's lease")
                           .Register(metrics)
                           .Add({})),
      manifest_fallbacks_(prometheus::BuildCounter()
                              .Name("shoal_manifest_tracker_fallbacks_total")
                              .Help("Manifest resolutions that went straight upstream because "
                                    "the tracker failed, by reason")
                              .Register(metrics)) {}

Result<upstream::RegistryEndpoint> PullThrough::EndpointFor(const std::string& registry) const {
  return options_.upstreams.Resolve(registry);
}

Status PullThrough::CheckRegistry(const shim::RepoRef& repo) const {
  auto ep = EndpointFor(repo.registry);
  if (!ep) return ep.error();
  return Ok();
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
  NoteSizes(parsed.value());
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
      if (auto parsed = oci::ParseManifest(cached->body, cached->media_type)) NoteSizes(parsed.value());
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
      if (auto parsed = oci::ParseManifest(cached->body, cached->media_type)) NoteSizes(parsed.value());
      manifest_cache_.Increment();
      co_return shim::ManifestResult{std::move(cached->body), cached->media_type,
                                     tag->second.digest};
    }
  }
  // The cluster-wide cache first (one upstream request for N nodes), else upstream directly.
  std::optional<Digest> want;
  if (ref.value().IsDigest()) want = *ref.value().digest;
  std::chrono::milliseconds age{0};
  std::optional<Result<shim::ManifestResult>> via =
      co_await ViaTracker(repo, ep.value(), reference, want, age);
  if (!via) {
    auto direct = co_await FetchManifest(repo, ep.value(), reference);
    via = std::move(direct);
  }
  Result<shim::ManifestResult> fetched = std::move(*via);
  if (fetched) {
    if (!ref.value().IsDigest()) {
      // A resolution from the cache is as old as its upstream fetch, not as this answer.
      tags_.insert_or_assign(
          key, TagEntry{fetched.value().digest, std::chrono::steady_clock::now() - age});
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

awaitable<std::optional<Result<shim::ManifestResult>>> PullThrough::ViaTracker(
    const shim::RepoRef& repo, const upstream::RegistryEndpoint& ep, const std::string& reference,
    const std::optional<Digest>& want, std::chrono::milliseconds& age) {
  using Clock = std::chrono::steady_clock;
  if (services_.tracker == nullptr || !services_.tracker->enabled()) co_return std::nullopt;
  TrackerClient& tracker = *services_.tracker;
  const ManifestRef mref{repo.registry, repo.repository, reference};
  const std::string name = repo.str() + (want ? "@" : ":") + reference;
  const Clock::time_point deadline = Clock::now() + options_.tracker_manifest_wait;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      spdlog::warn("manifest {}: no answer from the cluster cache within {} ms; fetching upstream",
                   name, options_.tracker_manifest_wait.count());
      manifest_fallbacks_.Add({{"reason", "timeout"}}).Increment();
      co_return std::nullopt;
    }
    const auto asked = Clock::now();
    auto answer =
        co_await tracker.ResolveManifest(mref, std::min(left, std::chrono::milliseconds(5000)));
    if (!answer) {
      // Never worse than no mirror: a tracker that fails costs one upstream request.
      spdlog::warn("manifest {}: tracker failed ({}); fetching upstream", name,
                   answer.error().message);
      manifest_fallbacks_.Add({{"reason", "error"}}).Increment();
      co_return std::nullopt;
    }
    TrackerManifest& m = answer.value();
    switch (m.kind) {
      case TrackerManifest::Kind::kFound: {
        // A lying tracker must not poison this node: the bytes must hash to the digest (and to
        // the reference, for a digest). A tag -> digest answer itself can only be trusted.
        auto digest = Digest::Parse(m.digest);
        bool verified = digest && Sha256::Of(m.body) == digest.value() &&
                        (!want || *want == digest.value());
        auto parsed = oci::ParseManifest(
            m.body, oci::IsManifestType(m.media_type) ? m.media_type : std::string());
        if (!verified || !parsed) {
          spdlog::warn("manifest {}: the tracker's answer does not verify ({}); fetching upstream",
                       name, !verified ? "digest mismatch" : parsed.error().message);
          manifest_fallbacks_.Add({{"reason", "unverified"}}).Increment();
          co_return std::nullopt;
        }
        std::string media_type = parsed.value().media_type;
        NoteSizes(parsed.value());
        if (auto st = store_.PutManifest(digest.value(), m.body, media_type); !st) {
          spdlog::warn("could not cache manifest {}: {}", m.digest, st.error().ToString());
        }
        manifest_tracker_.Increment();
        age = m.age;
        co_return Result<shim::ManifestResult>(
            shim::ManifestResult{std::move(m.body), media_type, digest.value()});
      }
      case TrackerManifest::Kind::kFetch: {
        manifest_leases_.Increment();
        auto fetched = co_await FetchManifest(repo, ep, reference);
        if (fetched) {
          const shim::ManifestResult& f = fetched.value();
          Status published = co_await tracker.PublishManifest(mref, f.digest, f.media_type, f.body);
          if (!published) {
            spdlog::warn("manifest {}: could not publish to the tracker: {}", name,
                         published.error().message);
          }
        } else {
          Status released = co_await tracker.ReleaseManifest(mref);
          if (!released) {
            spdlog::debug("manifest {}: lease release failed: {}", name,
                          released.error().message);
          }
        }
        co_return std::optional<Result<shim::ManifestResult>>(std::move(fetched));
      }
      case TrackerManifest::Kind::kWait: {
        // Normally the tracker held the request; an immediate "wait" (its waiter cap) must not
        // make a busy loop.
        auto elapsed = Clock::now() - asked;
        if (elapsed < m.retry_after) {
          asio::steady_timer timer(ioc_);
          timer.expires_after(m.retry_after - elapsed);
          boost::system::error_code ec;
          co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
        }
        break;
      }
    }
  }
}

void PullThrough::NoteSizes(const oci::Manifest& manifest) {
  if (sizes_.size() > 100'000) sizes_.clear();
  auto note = [this](const oci::Descriptor& d) {
    if (d.size >= 0) sizes_.insert_or_assign(d.digest, static_cast<uint64_t>(d.size));
  };
  if (manifest.config) note(*manifest.config);
  for (const auto& d : manifest.layers) note(d);
}

awaitable<Result<uint64_t>> PullThrough::SizeOf(const shim::RepoRef& repo,
                                                const upstream::RegistryEndpoint& ep,
                                                const Digest& digest) {
  if (auto it = sizes_.find(digest); it != sizes_.end()) co_return it->second;
  if (services_.tracker != nullptr && services_.tracker->enabled()) {
    auto table = co_await services_.tracker->FindTable(digest);
    if (table) co_return table.value().layout.blob_size;
  }
  co_return co_await client_.StatBlob(ep, repo.repository, digest);
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
  std::function<void(bool)> on_end = [this, digest](bool ok) {
    auto it = inflight_.find(digest);
    std::string result = "ok";
    if (!ok) {
      bool mismatch = it != inflight_.end() && it->second->error() &&
                      it->second->error()->code == ErrorCode::kDigestMismatch;
      result = mismatch ? "digest_mismatch" : "error";
    }
    fetches_.Add({{"result", result}}).Increment();
    if (it != inflight_.end() && it->second->ended()) inflight_.erase(it);
    inflight_gauge_.Set(static_cast<double>(inflight_.size()));
  };
  fetch = std::make_shared<BlobFetch>(ioc_, pool_, store_, digest, std::move(on_end));
  inflight_.emplace(digest, fetch);
  inflight_gauge_.Set(static_cast<double>(inflight_.size()));
  auto size = co_await SizeOf(repo, ep.value(), digest);
  if (!size) {
    fetch->Fail(size.error());
    co_return size.error();
  }
  if (auto st = fetch->Open(size.value()); !st) co_return st.error();
  spdlog::info("fetching {} ({} bytes) for {}", digest.str(), size.value(), repo.str());
  BlobSource source{size.value(), repo.registry, repo.repository};
  asio::co_spawn(ioc_, RunChunkFetch(services_, fetch, ep.value(), std::move(source)),
                 asio::detached);
  co_return std::shared_ptr<shim::BlobReader>(std::make_shared<InflightReader>(fetch));
}

}  // namespace shoal::agent
