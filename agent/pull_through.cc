#include "agent/pull_through.h"

#include <unistd.h>

#include <spdlog/spdlog.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <nlohmann/json.hpp>

#include "agent/admin.h"
#include "agent/on_pool.h"
#include "agent/sleep.h"
#include "lib/core/content_hash.h"

#include "lib/oci/manifest.h"
#include "lib/oci/media_types.h"
#include "lib/oci/quote.h"
#include "lib/oci/reference.h"

namespace shoal::agent {
namespace asio = boost::asio;
using asio::awaitable;

namespace {

// A complete blob in the cache; in use (never evicted) while the reader lives. Unless this very
// file was verified before, its last byte (and a Range answer's last byte) waits for `check`.
class CachedReader : public shim::BlobReader {
 public:
  CachedReader(int fd, uint64_t size, std::shared_ptr<void> in_use,
               std::shared_ptr<CacheCheck> check)
      : fd_(fd), size_(size), in_use_(std::move(in_use)), check_(std::move(check)) {}
  ~CachedReader() override { ::close(fd_); }
  uint64_t size() const override { return size_; }
  int fd() const override { return fd_; }
  awaitable<Result<uint64_t>> WaitReadable(uint64_t offset) override {
    if (!check_) co_return size_;
    if (!check_->result && offset + 1 < size_) co_return size_ - 1;
    Status st = co_await check_->Wait();
    if (!st) co_return st.error();
    co_return size_;
  }
  awaitable<Status> WaitVerified() override {
    if (!check_) co_return Ok();
    co_return co_await check_->Wait();
  }
  std::string_view source() const override { return "cache"; }

 private:
  int fd_;
  uint64_t size_;
  std::shared_ptr<void> in_use_;
  std::shared_ptr<CacheCheck> check_;  // null: verified before
};

// A blob still arriving from upstream; in use (never evicted once committed) while it lives.
class InflightReader : public shim::BlobReader {
 public:
  InflightReader(std::shared_ptr<BlobFetch> fetch, std::shared_ptr<void> in_use)
      : fetch_(std::move(fetch)), in_use_(std::move(in_use)) {}
  uint64_t size() const override { return fetch_->size(); }
  int fd() const override { return fetch_->fd(); }
  awaitable<Result<uint64_t>> WaitReadable(uint64_t offset) override {
    co_return co_await fetch_->WaitReadable(offset);
  }
  std::string_view source() const override { return "upstream"; }

 private:
  std::shared_ptr<BlobFetch> fetch_;
  std::shared_ptr<void> in_use_;
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
      verifier_(ioc, pool, store, metrics),
      pull_auth_(options_.pull_auth),
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
                              .Register(metrics)),
      pull_auth_results_(prometheus::BuildCounter()
                             .Name("shoal_shim_pull_auth_total")
                             .Help("Manifest, blob and listing requests of registries in pull_auth "
                                   "client or deny, by what was decided: public, challenge (401), "
                                   "verified (checked upstream now), cached (a recent verdict), "
                                   "stale (an old verdict while the upstream cannot be asked), "
                                   "refused, missing, not_in_repo, denied, error")
                             .Register(metrics)),
      pull_auth_checks_(prometheus::BuildCounter()
                            .Name("shoal_pull_auth_upstream_checks_total")
                            .Help("Access checks sent upstream for pull_auth, by whose "
                                  "credentials (anonymous or client) and the answer")
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
  if (Status st = co_await PutManifest(m.digest, m.body, media_type); !st) {
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
    // The cache is shared by every repository: a restricted repository is served a cached
    // manifest only when it is known to be one of its own (else the tracker or upstream says).
    const bool restricted = Restricted(repo);
    if (!restricted || pull_auth_.Contains(repo.str(), d)) {
      if (auto cached = store_.GetManifest(d)) {
        if (auto parsed = oci::ParseManifest(cached->body, cached->media_type))
          NoteSizes(parsed.value());
        if (restricted) NoteContents(repo, d, cached->body, cached->media_type);
        manifest_cache_.Increment();
        co_return shim::ManifestResult{std::move(cached->body), cached->media_type, d};
      }
    }
  }
  auto ep = EndpointFor(repo.registry);
  if (!ep) co_return ep.error();
  std::string key = repo.str() + ":" + reference;
  auto tag = tags_.find(key);
  if (!ref.value().IsDigest() && tag != tags_.end() &&
      std::chrono::steady_clock::now() - tag->second.fetched < options_.tag_ttl) {
    if (auto cached = store_.GetManifest(tag->second.digest)) {
      if (auto parsed = oci::ParseManifest(cached->body, cached->media_type))
        NoteSizes(parsed.value());
      NoteContents(repo, tag->second.digest, cached->body, cached->media_type);
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
    NoteContents(repo, fetched.value().digest, fetched.value().body, fetched.value().media_type);
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
      NoteContents(repo, tag->second.digest, cached->body, cached->media_type);
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
  // No replica has answered for a while: do not make every manifest wait for its connect
  // timeouts (a blackholed replica costs seconds); the probe brings the cache back.
  if (tracker.Unreachable(services_.options.tracker_grace)) {
    manifest_fallbacks_.Add({{"reason", "error"}}).Increment();
    co_return std::nullopt;
  }
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
    if (!answer && answer.error().code == ErrorCode::kTooManyRequests) {
      // A full tracker is alive: 2,500 nodes resolving one tag upstream at once is what its
      // manifest cache prevents. Ask again at its pace, within the same deadline.
      co_await SleepFor(std::min(TrackerRetryPause(answer.error()), left));
      continue;
    }
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
        bool verified = digest && ContentHash::Matches(digest.value(), m.body) &&
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
        if (Status st = co_await PutManifest(digest.value(), m.body, media_type); !st) {
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
          Status published =
              co_await tracker.PublishManifest(mref, m.lease_id, f.digest, f.media_type, f.body);
          if (!published) {
            spdlog::warn("manifest {}: could not publish to the tracker: {}", name,
                         published.error().message);
          }
        } else {
          // An upstream "not found" is worth telling the cluster: a thousand nodes asking for a
          // mistyped tag then cost one upstream request. Other failures may pass; not remembered.
          // (A named string: GCC 12 frees a temporary in a co_await expression twice.)
          std::string missing;
          if (fetched.error().code == ErrorCode::kNotFound)
            missing = oci::Printable(fetched.error().message);
          Status released = co_await tracker.ReleaseManifest(mref, m.lease_id, missing);
          if (!released) {
            spdlog::debug("manifest {}: lease release failed: {}", name, released.error().message);
          }
        }
        co_return std::optional<Result<shim::ManifestResult>>(std::move(fetched));
      }
      case TrackerManifest::Kind::kMissing: {
        manifest_tracker_.Increment();
        std::string message = m.missing + " (another node of this cluster got that from upstream " +
                              std::to_string(m.age.count()) + " ms ago; the tracker remembers it)";
        Error missing = MakeError(ErrorCode::kNotFound, std::move(message));
        co_return std::optional<Result<shim::ManifestResult>>(std::move(missing));
      }
      case TrackerManifest::Kind::kWait: {
        // Normally the tracker held the request; an immediate "wait" (its waiter cap) must not
        // make a busy loop.
        auto elapsed = Clock::now() - asked;
        if (elapsed < m.retry_after) {
          co_await SleepFor(
              std::chrono::duration_cast<std::chrono::milliseconds>(m.retry_after - elapsed));
        }
        break;
      }
    }
  }
}

bool PullThrough::Restricted(const shim::RepoRef& repo) const {
  if (options_.upstreams.PullAuthFor(repo.registry) == upstream::UpstreamMap::PullAuth::kNode)
    return false;
  return pull_auth_.Public(repo.str(), std::chrono::steady_clock::now()) != true;
}

void PullThrough::NoteContents(const shim::RepoRef& repo, const Digest& digest,
                               const std::string& body, const std::string& media_type) {
  if (options_.upstreams.PullAuthFor(repo.registry) == upstream::UpstreamMap::PullAuth::kNode)
    return;
  std::vector<Digest> digests{digest};
  if (auto parsed = oci::ParseManifest(body, oci::IsManifestType(media_type) ? media_type : "")) {
    const oci::Manifest& m = parsed.value();
    if (m.config) digests.push_back(m.config->digest);
    for (const auto& l : m.layers) digests.push_back(l.digest);
    for (const auto& child : m.manifests) digests.push_back(child.digest);
  }
  pull_auth_.NoteContents(repo.str(), digests);
}

void PullThrough::CountPullAuth(upstream::UpstreamMap::PullAuth mode, std::string_view result) {
  pull_auth_results_
      .Add({{"registry_mode", std::string(upstream::UpstreamMap::PullAuthName(mode))},
            {"result", std::string(result)}})
      .Increment();
}

awaitable<std::optional<shim::PullRefusal>> PullThrough::AuthorizePull(
    const shim::RepoRef& repo, const shim::PullTarget& target, std::string_view authorization) {
  using PullAuth = upstream::UpstreamMap::PullAuth;
  using Clock = std::chrono::steady_clock;
  const PullAuth mode = options_.upstreams.PullAuthFor(repo.registry);
  if (mode == PullAuth::kNode) co_return std::nullopt;
  auto ep = EndpointFor(repo.registry);
  if (!ep) co_return shim::PullRefusal{ep.error(), "NAME_UNKNOWN", false};
  const std::string key = repo.str();
  upstream::PullProbe probe;
  switch (target.kind) {
    case shim::PullTarget::Kind::kManifest:
      probe = {upstream::PullProbe::Kind::kManifest, target.reference};
      break;
    case shim::PullTarget::Kind::kBlob:
      probe = {upstream::PullProbe::Kind::kBlob, target.reference};
      break;
    case shim::PullTarget::Kind::kListing:
      probe = {upstream::PullProbe::Kind::kTags, ""};
      break;
  }
  auto count_check = [this](bool client, const Result<upstream::Access>& r) {
    std::string result = "error";
    if (r) {
      result = r.value() == upstream::Access::kGranted   ? "granted"
               : r.value() == upstream::Access::kRefused ? "refused"
                                                         : "missing";
    }
    pull_auth_checks_.Add({{"credentials", client ? "client" : "anonymous"}, {"result", result}})
        .Increment();
  };
  // The upstream could not answer a check and no earlier verdict stands: 503-class trouble.
  auto unanswered = [&](Error e, const std::string& about) {
    CountPullAuth(mode, "error");
    e.message = "cannot check " + about + ": " + e.message;
    return shim::PullRefusal{std::move(e), "UNKNOWN", false};
  };
  auto missing = [&](std::string why) {
    const char* code = target.kind == shim::PullTarget::Kind::kBlob       ? "BLOB_UNKNOWN"
                       : target.kind == shim::PullTarget::Kind::kManifest ? "MANIFEST_UNKNOWN"
                                                                          : "NAME_UNKNOWN";
    return shim::PullRefusal{MakeError(ErrorCode::kNotFound, std::move(why)), code, false};
  };
  const std::string what = target.kind == shim::PullTarget::Kind::kListing
                               ? "the tags of " + key
                               : key + (target.reference.find(':') != std::string::npos ? "@" : ":") +
                                     target.reference;

  // 1. May anonymous clients pull it? Then everyone may, as without shoal.
  std::optional<bool> is_public = pull_auth_.Public(key, Clock::now());
  if (!is_public) {
    const std::optional<upstream::BasicAuth> anonymous;
    auto anon = co_await client_.CheckPull(ep.value(), repo.repository, probe, anonymous);
    count_check(false, anon);
    if (!anon) {
      // Never worse than no mirror while the upstream cannot answer: the last verdict stands;
      // without one, the client gets the upstream's trouble (503) and tries the next host.
      is_public = pull_auth_.LastPublic(key);
      if (!is_public) co_return unanswered(anon.error(), "whether " + key + " is public");
    } else if (anon.value() == upstream::Access::kMissing) {
      is_public = false;  // not shown to be public; says nothing about the repository
    } else {
      is_public = anon.value() == upstream::Access::kGranted;
      pull_auth_.NotePublic(key, *is_public, Clock::now());
    }
  }
  if (*is_public) {
    CountPullAuth(mode, "public");
    co_return std::nullopt;
  }
  // 2. A private repository (or an object anonymous clients cannot see).
  if (mode == PullAuth::kDeny) {
    CountPullAuth(mode, "denied");
    co_return shim::PullRefusal{
        MakeError(ErrorCode::kNotFound,
                  "repository " + key + " is not served by this mirror: anonymous pulls of " +
                      what + " are refused upstream and registry " + repo.registry +
                      " has pull_auth deny; pull it from the registry with your own credentials"),
        "NAME_UNKNOWN", false};
  }
  std::optional<upstream::BasicAuth> creds = upstream::ParseBasicAuthorization(authorization);
  if (!creds) {
    CountPullAuth(mode, "challenge");
    co_return shim::PullRefusal{
        MakeError(ErrorCode::kUnauthorized,
                  "authentication required: " + what +
                      " is not public; present Basic credentials that the registry accepts for " +
                      key + " (pull_auth client)"),
        "UNAUTHORIZED", true};
  }
  const std::string cred = PullAuthCache::CredentialKey(*creds);
  std::optional<bool> granted = pull_auth_.Granted(cred, key, Clock::now());
  std::string_view how = "cached";
  if (!granted) {
    auto check = co_await client_.CheckPull(ep.value(), repo.repository, probe, creds);
    count_check(true, check);
    if (!check) {
      granted = pull_auth_.LastGranted(cred, key);
      how = "stale";
      if (!granted)
        co_return unanswered(check.error(), "the credentials presented for " + key);
    } else if (check.value() == upstream::Access::kMissing) {
      // Only a 200 grants: some registries answer 404 for what these credentials may not see.
      CountPullAuth(mode, "missing");
      co_return missing("the registry answered 404 for " + what + " with the credentials presented");
    } else {
      granted = check.value() == upstream::Access::kGranted;
      pull_auth_.NoteGranted(cred, key, *granted, Clock::now());
      how = "verified";
      if (*granted && target.kind == shim::PullTarget::Kind::kBlob) {
        if (auto d = Digest::Parse(target.reference)) pull_auth_.NoteContents(key, {d.value()});
      }
    }
  }
  if (!*granted) {
    CountPullAuth(mode, "refused");
    co_return shim::PullRefusal{
        MakeError(ErrorCode::kUnauthorized,
                  "the credentials presented cannot pull " + what + " (the registry refused them)"),
        "UNAUTHORIZED", true};
  }
  // 3. The blobs of a private repository are its images' blobs, not the node's whole cache.
  if (target.kind == shim::PullTarget::Kind::kBlob) {
    auto d = Digest::Parse(target.reference);
    if (!d || !pull_auth_.Contains(key, d.value())) {
      CountPullAuth(mode, "not_in_repo");
      co_return missing("blob " + target.reference + " is not part of any image of " + key +
                        " that this mirror resolved: blobs of a private repository are served "
                        "only as parts of its images (resolve the image's manifest here first)");
    }
  }
  CountPullAuth(mode, how);
  co_return std::nullopt;
}

awaitable<Status> PullThrough::PutManifest(const Digest& digest, const std::string& body,
                                           const std::string& media_type) {
  // Two fsyncs: on the pool, so that a slow disk holds this manifest, not every client.
  co_return co_await OnPool(pool_, [this, &digest, &body, &media_type] {
    return store_.PutManifest(digest, body, media_type);
  });
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

awaitable<Result<shim::ListingResult>> PullThrough::GetListing(const shim::RepoRef& repo,
                                                               const std::string& endpoint,
                                                               const std::string& query) {
  auto ep = EndpointFor(repo.registry);
  if (!ep) co_return ep.error();
  const std::string accept = endpoint.starts_with("referrers/") ? std::string(oci::kOciIndex)
                                                                : std::string("application/json");
  auto got = co_await client_.GetListing(ep.value(), repo.repository, endpoint, query, accept);
  if (!got) co_return got.error();
  upstream::ListingResponse& r = got.value();
  co_return shim::ListingResult{r.status,
                                std::move(r.body),
                                std::move(r.content_type),
                                std::move(r.link),
                                std::move(r.filters_applied),
                                std::move(r.error_code)};
}

awaitable<Result<std::shared_ptr<shim::BlobReader>>> PullThrough::OpenBlob(
    const shim::RepoRef& repo, const Digest& digest) {
  // Stat, open and the in-flight lookup happen without suspending, so a fetch that completes
  // concurrently is seen either in the store or in inflight_, never neither.
  if (auto size = store_.Stat(digest)) {
    // Marked in use before the open, so eviction cannot delete it between the two.
    std::shared_ptr<void> in_use = store_.MarkInUse(digest);
    auto fd = store_.OpenBlob(digest);
    if (fd) {
      cache_hits_.Increment();
      store_.Touch(digest);  // for LRU eviction
      std::shared_ptr<CacheCheck> check = verifier_.Check(digest, fd.value(), *size);
      co_return std::shared_ptr<shim::BlobReader>(
          std::make_shared<CachedReader>(fd.value(), *size, std::move(in_use), std::move(check)));
    }
  }
  cache_misses_.Increment();
  std::shared_ptr<BlobFetch> fetch;
  if (auto it = inflight_.find(digest); it != inflight_.end()) {
    fetch = it->second;
    auto st = co_await fetch->WaitStarted();
    if (!st) co_return st.error();
    std::shared_ptr<void> in_use = store_.MarkInUse(digest);
    co_return std::shared_ptr<shim::BlobReader>(
        std::make_shared<InflightReader>(fetch, std::move(in_use)));
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
    if (ok) {
      verifier_.NoteVerified(digest);  // hashed on its way in: no second pass when served
      Evict();                         // a new blob may have taken the cache over its budget
    }
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
  std::shared_ptr<void> in_use = store_.MarkInUse(digest);
  co_return std::shared_ptr<shim::BlobReader>(
      std::make_shared<InflightReader>(fetch, std::move(in_use)));
}

// --- Cache budget and pins ---

namespace {

nlohmann::json PinsJson(const std::vector<store::Pin>& pins) {
  nlohmann::json arr = nlohmann::json::array();
  for (const auto& p : pins) {
    nlohmann::json j = {{"owner", p.owner}, {"reason", p.reason}};
    if (p.expires) j["expires_ms"] = UnixMs(*p.expires);
    arr.push_back(j);
  }
  return arr;
}

}  // namespace

void PullThrough::RegisterCacheMetrics(prometheus::Registry& metrics) {
  cache_metrics_.bytes = &prometheus::BuildGauge()
                              .Name("shoal_cache_bytes")
                              .Help("Bytes of complete blobs in the cache")
                              .Register(metrics)
                              .Add({});
  cache_metrics_.budget_bytes = &prometheus::BuildGauge()
                                     .Name("shoal_cache_budget_bytes")
                                     .Help("The cache's disk budget (0: unlimited)")
                                     .Register(metrics)
                                     .Add({});
  cache_metrics_.pinned_bytes = &prometheus::BuildGauge()
                                     .Name("shoal_cache_pinned_bytes")
                                     .Help("Bytes of cached blobs held by an unexpired pin")
                                     .Register(metrics)
                                     .Add({});
  cache_metrics_.inflight_bytes = &prometheus::BuildGauge()
                                       .Name("shoal_cache_inflight_bytes")
                                       .Help(
                                           "Bytes reserved in the cache for blobs being "
                                           "downloaded (counted against the budget)")
                                       .Register(metrics)
                                       .Add({});
  cache_metrics_.layer_bytes = &prometheus::BuildGauge()
                                    .Name("shoal_cache_layer_bytes")
                                    .Help(
                                        "Bytes of extracted layers (the snapshotter's, on the "
                                        "cache's disk) counted in the cache budget")
                                    .Register(metrics)
                                    .Add({});
  cache_metrics_.evictions = &prometheus::BuildCounter()
                                  .Name("shoal_cache_evictions_total")
                                  .Help("Blobs evicted from the cache to keep it within budget")
                                  .Register(metrics)
                                  .Add({});
  UpdateCacheMetrics();
}

store::EvictReport PullThrough::Evict(std::optional<uint64_t> to) {
  store::EvictReport r = to ? store_.EvictTo(*to) : store_.Evict();
  if (!r.evicted.empty()) {
    spdlog::info("cache: evicted {} blobs ({} bytes) to fit the budget", r.evicted.size(),
                 r.freed_bytes);
    // The last-use index is saved with an fsync: on the pool, never on the network thread (a
    // busy disk held it for seconds, and every client with it).
    asio::post(pool_, [&store = store_] {
      if (auto st = store.Flush(); !st) spdlog::warn("cache index: {}", st.error().ToString());
    });
  }
  if (r.over_budget > 0) {
    spdlog::warn(
        "cache: {} bytes over budget; the rest is pinned, in use or extracted layers "
        "(the snapshotter's, {} bytes)",
        r.over_budget, store_.Stats().external_bytes);
  }
  UpdateCacheMetrics();
  return r;
}

void PullThrough::UpdateCacheMetrics() {
  if (!cache_metrics_.bytes) return;
  store::CacheStats s = store_.Stats();
  // Evictions happen in the store (to fit the budget after a commit, and to make room before a
  // blob is written); its count since Open feeds the counter.
  if (s.evictions > cache_metrics_.evictions_seen) {
    cache_metrics_.evictions->Increment(
        static_cast<double>(s.evictions - cache_metrics_.evictions_seen));
    cache_metrics_.evictions_seen = s.evictions;
  }
  cache_metrics_.inflight_bytes->Set(static_cast<double>(s.inflight_bytes));
  cache_metrics_.layer_bytes->Set(static_cast<double>(s.external_bytes));
  cache_metrics_.bytes->Set(static_cast<double>(s.bytes));
  cache_metrics_.budget_bytes->Set(static_cast<double>(s.budget));
  cache_metrics_.pinned_bytes->Set(static_cast<double>(s.pinned_bytes));
}

std::vector<Digest> ResolvedImage::Digests() const {
  std::vector<Digest> out = manifests;
  if (manifest.config) out.push_back(manifest.config->digest);
  for (const auto& l : manifest.layers) out.push_back(l.digest);
  return out;
}

awaitable<Result<ResolvedImage>> PullThrough::ResolveImage(const std::string& image,
                                                           const std::string& platform) {
  auto ref = oci::ParseImageRef(image);
  if (!ref) co_return ref.error();
  ResolvedImage out{shim::RepoRef{ref.value().registry, ref.value().repository}, {}, {}};
  if (auto st = CheckRegistry(out.repo); !st) co_return st.error();
  const std::string reference = ref.value().RefString();
  const std::vector<std::string> accept;
  auto top = co_await GetManifest(out.repo, reference, accept);
  if (!top) co_return top.error();
  out.manifests.push_back(top.value().digest);
  auto parsed = oci::ParseManifest(top.value().body, top.value().media_type);
  if (!parsed) co_return parsed.error();
  out.manifest = parsed.value();
  if (out.manifest.is_index) {
    std::optional<Digest> chosen;
    for (const auto& d : out.manifest.manifests) {
      if (d.platform && d.platform->os + "/" + d.platform->architecture == platform) {
        chosen = d.digest;
        break;
      }
    }
    if (!chosen) {
      co_return MakeError(ErrorCode::kNotFound, image + " has no manifest for " + platform);
    }
    const std::string child_ref = chosen->str();
    auto child = co_await GetManifest(out.repo, child_ref, accept);
    if (!child) co_return child.error();
    auto child_parsed = oci::ParseManifest(child.value().body, child.value().media_type);
    if (!child_parsed) co_return child_parsed.error();
    out.manifests.push_back(*chosen);
    out.manifest = child_parsed.value();
  }
  co_return out;
}

awaitable<Result<std::vector<Digest>>> PullThrough::PinImage(
    const std::string& image, const std::string& platform, bool pin, const std::string& owner,
    std::optional<std::chrono::seconds> ttl) {
  auto resolved = co_await ResolveImage(image, platform);
  if (!resolved) co_return resolved.error();
  std::vector<Digest> digests = resolved.value().Digests();
  if (Status st = co_await SetPins(digests, pin, owner, image, ttl); !st) co_return st.error();
  co_return digests;
}

awaitable<Status> PullThrough::SetPins(const std::vector<Digest>& digests, bool pin,
                                       const std::string& owner, const std::string& reason,
                                       std::optional<std::chrono::seconds> ttl) {
  co_return co_await OnPool(pool_, [&]() -> Status {
    for (const auto& d : digests) {
      if (pin) {
        if (auto st = store_.Pin(d, owner, reason, ttl); !st) return st;
      } else if (auto n = store_.Unpin(d, owner); !n) {
        return n.error();
      }
    }
    return Ok();
  });
}

awaitable<Status> PullThrough::FetchToCache(const shim::RepoRef& repo, const Digest& digest,
                                            const std::function<void(uint64_t)>& progress) {
  // Twice at most: a cached copy found corrupt on disk is dropped, and the second open fetches
  // the blob again.
  for (int attempt = 0;; ++attempt) {
    auto reader = co_await OpenBlob(repo, digest);
    if (!reader) co_return reader.error();
    const uint64_t size = reader.value()->size();
    const bool cached = reader.value()->source() == "cache";
    uint64_t done = 0;
    std::optional<Error> failed;
    while (done < size) {
      auto readable = co_await reader.value()->WaitReadable(done);
      if (!readable) {
        failed = readable.error();
        break;
      }
      done = readable.value();
      if (progress) progress(done);
    }
    if (!failed) break;
    if (!cached || attempt > 0 || failed->code != ErrorCode::kDigestMismatch) co_return *failed;
  }
  // Verified; the commit (fsync + rename) may still be running on the pool.
  while (!store_.Stat(digest)) {
    auto it = inflight_.find(digest);
    if (it == inflight_.end() || it->second->ended()) break;
    std::shared_ptr<BlobFetch> fetch = it->second;
    co_await fetch->changes().Wait(std::chrono::seconds(1));
  }
  if (!store_.Stat(digest)) {
    co_return MakeError(ErrorCode::kIo, "blob " + digest.str() + " was verified but not cached");
  }
  co_return Ok();
}

awaitable<shim::AdminReply> PullThrough::HandleAdmin(const std::string& method,
                                                     const std::string& target) {
  auto parsed = ParseAdminTarget(target);
  if (!parsed) co_return JsonReply(400, {{"error", "malformed query in " + target}});
  const AdminTarget& t = parsed.value();
  auto param = [&t](const std::string& key, std::string dflt = "") {
    return t.Param(key, std::move(dflt));
  };

  if (t.path == "/shoal/v1/cache" && method == "GET") {
    store::CacheStats s = store_.Stats();
    nlohmann::json entries = nlohmann::json::array();
    for (const auto& e : store_.List()) {
      entries.push_back({{"digest", e.digest.str()},
                         {"size", e.size},
                         {"last_use_ms", UnixMs(e.last_use)},
                         {"in_use", e.in_use || inflight_.count(e.digest) > 0},
                         {"pinned", !e.pins.empty()},
                         {"pins", PinsJson(e.pins)}});
    }
    co_return JsonReply(200, {{"bytes", s.bytes},
                              {"budget", s.budget},
                              {"snapshot_bytes", s.external_bytes},
                              {"pinned_bytes", s.pinned_bytes},
                              {"blobs", s.blobs},
                              {"evictions", s.evictions},
                              {"downloading", inflight_.size()},
                              {"entries", entries}});
  }
  if (t.path == "/shoal/v1/cache/pins" && method == "GET") {
    nlohmann::json pins = nlohmann::json::array();
    for (const auto& [digest, list] : store_.Pins()) {
      pins.push_back({{"digest", digest.str()},
                      {"cached", store_.Stat(digest).has_value()},
                      {"pins", PinsJson(list)}});
    }
    co_return JsonReply(200, {{"pins", pins}});
  }
  if (t.path == "/shoal/v1/cache/pins" && (method == "POST" || method == "DELETE")) {
    const bool pin = method == "POST";
    std::string owner = param("owner", pin ? "operator" : "");
    std::optional<std::chrono::seconds> ttl;
    if (std::string text = param("ttl"); !text.empty()) {
      try {
        size_t used = 0;
        long long secs = std::stoll(text, &used);
        if (used != text.size() || secs < 0) throw std::invalid_argument("ttl");
        ttl = std::chrono::seconds(secs);
      } catch (const std::exception&) {
        co_return JsonReply(400, {{"error", "ttl \"" + text + "\" is not a number of seconds"}});
      }
    }
    std::vector<Digest> digests;
    for (const auto& text : t.List("digest")) {
      auto d = Digest::Parse(text);
      if (!d) co_return ErrorReply(d.error());
      digests.push_back(d.value());
    }
    const std::string reason = param("reason");
    if (Status st = co_await SetPins(digests, pin, owner, reason, ttl); !st)
      co_return ErrorReply(st.error());
    if (std::string image = param("ref"); !image.empty()) {
      const std::string platform = param("platform", "linux/amd64");
      auto got = co_await PinImage(image, platform, pin, owner, ttl);
      if (!got) co_return ErrorReply(got.error());
      digests.insert(digests.end(), got.value().begin(), got.value().end());
    }
    if (digests.empty()) co_return JsonReply(400, {{"error", "give ref=IMAGE or digest=DIGEST"}});
    nlohmann::json list = nlohmann::json::array();
    for (const auto& d : digests) list.push_back(d.str());
    UpdateCacheMetrics();
    co_return JsonReply(200, {{pin ? "pinned" : "unpinned", list}, {"owner", owner}});
  }
  if (t.path == "/shoal/v1/cache/gc" && method == "POST") {
    std::optional<uint64_t> to;
    if (std::string text = param("to"); !text.empty()) {
      auto budget = store::ParseBudget(text, store_.root());
      if (!budget) co_return ErrorReply(budget.error());
      to = budget.value();
    }
    store::EvictReport r = Evict(to);
    nlohmann::json evicted = nlohmann::json::array();
    for (const auto& d : r.evicted) evicted.push_back(d.str());
    store::CacheStats s = store_.Stats();
    co_return JsonReply(200, {{"freed_bytes", r.freed_bytes},
                              {"evicted", evicted},
                              {"over_budget", r.over_budget},
                              {"bytes", s.bytes},
                              {"snapshot_bytes", s.external_bytes},
                              {"budget", s.budget}});
  }
  co_return JsonReply(404, {{"error", "no admin endpoint " + method + " " + t.path}});
}

}  // namespace shoal::agent
