#pragma once
// The agent's implementation of the shim's Backend: a caching pull-through mirror. Cached blobs
// and manifests are served from the BlobStore; misses are fetched from the upstream registry
// once (concurrent requests for one blob share one BlobFetch) and cached after verification.

#include <utility>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>
#include <boost/asio/io_context.hpp>
#include <boost/asio/thread_pool.hpp>

#include "agent/blob_fetch.h"
#include "agent/cache_check.h"
#include "agent/chunk_fetcher.h"
#include "agent/pull_auth.h"
#include "lib/oci/manifest.h"
#include "lib/store/blob_store.h"
#include "lib/upstream/registry_client.h"
#include "lib/upstream/upstream_map.h"
#include "registry-shim/backend.h"
#include "registry-shim/server.h"

namespace shoal::agent {

struct PullThroughOptions {
  // Upstream endpoint per registry host ("docker.io" -> https://registry-1.docker.io) and the
  // policy for registries without an entry.
  upstream::UpstreamMap upstreams;
  // How long a tag -> digest resolution is trusted before asking upstream again.
  std::chrono::seconds tag_ttl{30};
  // With a tracker: how long to wait for another agent's upstream fetch of a manifest (through
  // the tracker's cluster-wide cache) before fetching it upstream ourselves. Longer than the
  // tracker's --manifest-lease-ttl-s (10 s), so a dead fetcher's lease passes to a waiter first.
  std::chrono::milliseconds tracker_manifest_wait{20'000};
  // Lifetimes and bounds of the pull_auth "client" verdicts.
  PullAuthOptions pull_auth;
};

// An image reference resolved to the manifests that make it up for one platform.
struct ResolvedImage {
  shim::RepoRef repo;
  // The manifest the reference names, then (for an index) the platform's manifest.
  std::vector<Digest> manifests;
  // The platform's image manifest: config and layers.
  oci::Manifest manifest;
  // The manifests, the config and the layers, in that order.
  std::vector<Digest> Digests() const;
};

// Network-thread only (see docs/architecture.md, threading model).
class PullThrough : public shim::Backend {
 public:
  // All references must outlive this object.
  PullThrough(boost::asio::io_context& ioc, boost::asio::thread_pool& pool, store::BlobStore& store,
              FetchServices& services, PullThroughOptions options, prometheus::Registry& metrics);

  boost::asio::awaitable<Result<shim::ManifestResult>> GetManifest(
      const shim::RepoRef& repo, const std::string& reference,
      const std::vector<std::string>& accept) override;
  boost::asio::awaitable<Result<std::shared_ptr<shim::BlobReader>>> OpenBlob(
      const shim::RepoRef& repo, const Digest& digest) override;

  // tags/list and referrers/<digest>, straight from upstream (not cached, no tracker).
  boost::asio::awaitable<Result<shim::ListingResult>> GetListing(
      const shim::RepoRef& repo, const std::string& endpoint, const std::string& query) override;

  // Refuses registries the upstream map does not serve (kRefused), before any other work.
  Status CheckRegistry(const shim::RepoRef& repo) const override;

  // The registry's pull_auth mode decides (docs/security.md, "Private images (built)"): "node"
  // serves everyone; otherwise a repository an anonymous upstream request cannot pull is
  // refused ("deny": 404 NAME_UNKNOWN) or served only to clients whose Basic credentials the
  // upstream accepts for it ("client": 401 with a Basic challenge otherwise), and its blobs only
  // when they belong to one of its images this agent resolved. Verdicts are cached (PullAuthCache).
  boost::asio::awaitable<std::optional<shim::PullRefusal>> AuthorizePull(
      const shim::RepoRef& repo, const shim::PullTarget& target,
      std::string_view authorization) override;

  // The upstream endpoint for a registry host, from the upstream map. Errors: kRefused for an
  // unmapped registry the policy does not serve (UpstreamMap::Resolve).
  Result<upstream::RegistryEndpoint> EndpointFor(const std::string& registry) const;
  // Blobs currently being fetched.
  size_t inflight() const { return inflight_.size(); }
  // Whether repo's manifests and blobs may be served without checking the client (its
  // registry's pull_auth is "node", or the repository is known to be public).
  bool ServesWithoutClientCheck(const shim::RepoRef& repo) const { return !Restricted(repo); }

  // Resolves an image reference (through the cache, else the tracker or upstream, like a pull)
  // to its manifest and, for an index, the manifest of `platform` ("os/arch"). Errors: a bad
  // reference (kInvalidArgument), an unserved registry, the manifests' resolution errors,
  // kNotFound when an index has no manifest for the platform.
  boost::asio::awaitable<Result<ResolvedImage>> ResolveImage(const std::string& image,
                                                             const std::string& platform);
  // Fetches a blob into the cache through OpenBlob (so the swarm and the tracker's leases work
  // as for any pull) and returns once it is committed. progress(bytes verified so far) is called
  // as the blob arrives. Errors: OpenBlob's, the fetch's (kDigestMismatch, kUnavailable...).
  boost::asio::awaitable<Status> FetchToCache(const shim::RepoRef& repo, const Digest& digest,
                                              const std::function<void(uint64_t)>& progress);

  // --- Cache budget and pins (docs/architecture.md, "Cache budget and pins") ---

  // Runs eviction down to the store's budget (or to `to` bytes) and counts what was evicted.
  store::EvictReport Evict(std::optional<uint64_t> to = std::nullopt);
  // Resolves an image reference (through the cache, else upstream) and pins (pin = true) or
  // unpins its manifest, the platform's manifest of an index, its config and its layers for
  // `owner`. Returns the digests concerned. Errors: the manifest's resolution errors.
  boost::asio::awaitable<Result<std::vector<Digest>>> PinImage(
      const std::string& image, const std::string& platform, bool pin, const std::string& owner,
      std::optional<std::chrono::seconds> ttl);
  // Pins (pin = true, with `reason` and `ttl`) or unpins `digests` for `owner` on the pool:
  // each change is persisted with an fsync, which must not hold the network thread. Errors: kIo.
  boost::asio::awaitable<Status> SetPins(const std::vector<Digest>& digests, bool pin,
                                         const std::string& owner, const std::string& reason,
                                         std::optional<std::chrono::seconds> ttl);
  // The cache admin API under /shoal/v1/cache (see registry-shim/server.h, AdminHandler).
  boost::asio::awaitable<shim::AdminReply> HandleAdmin(const std::string& method,
                                                       const std::string& target);
  // Registers the shoal_cache_* metrics; call once before serving.
  void RegisterCacheMetrics(prometheus::Registry& metrics);
  // Refreshes the shoal_cache_* gauges (called before /metrics is rendered).
  void UpdateCacheMetrics();

 private:
  // The shoal_cache_* metrics; null until RegisterCacheMetrics.
  struct CacheMetrics {
    prometheus::Gauge* bytes = nullptr;
    prometheus::Gauge* budget_bytes = nullptr;
    prometheus::Gauge* pinned_bytes = nullptr;
    prometheus::Gauge* inflight_bytes = nullptr;
    prometheus::Gauge* layer_bytes = nullptr;
    prometheus::Counter* evictions = nullptr;
    uint64_t evictions_seen = 0;  // the store's eviction count already added to `evictions`
  };
  CacheMetrics cache_metrics_;

 public:

 private:
  struct TagEntry {
    Digest digest;
    std::chrono::steady_clock::time_point fetched;
  };
  boost::asio::awaitable<Result<shim::ManifestResult>> FetchManifest(
      const shim::RepoRef& repo, const upstream::RegistryEndpoint& ep,
      const std::string& reference);
  // Resolves through the tracker's cluster-wide manifest cache: served from it (verified), or
  // fetched upstream by us under the tracker's lease and published. nullopt: go upstream
  // directly (no tracker, tracker errors, an answer that does not verify, or waited too long).
  // want: the digest a digest reference names. age: how old a tag resolution from the cache is.
  boost::asio::awaitable<std::optional<Result<shim::ManifestResult>>> ViaTracker(
      const shim::RepoRef& repo, const upstream::RegistryEndpoint& ep,
      const std::string& reference, const std::optional<Digest>& want,
      std::chrono::milliseconds& age);
  // Whether repo's manifests and blobs are served only to checked clients: its registry is not
  // in pull_auth "node" and it is not known to be public.
  bool Restricted(const shim::RepoRef& repo) const;
  // Records the manifest `digest` of repo (a resolved tag, a digest the upstream or tracker
  // served for repo, or a child of an index already recorded) and what it lists, for
  // AuthorizePull's blob rule. Nothing under pull_auth "node".
  void NoteContents(const shim::RepoRef& repo, const Digest& digest, const std::string& body,
                    const std::string& media_type);
  // Counts one AuthorizePull outcome in shoal_shim_pull_auth_total.
  void CountPullAuth(upstream::UpstreamMap::PullAuth mode, std::string_view result);
  // Remembers the sizes of the blobs a manifest lists, so a blob miss needs no upstream HEAD.
  void NoteSizes(const oci::Manifest& manifest);
  // store_.PutManifest on the pool (it fsyncs); the network thread goes on meanwhile.
  boost::asio::awaitable<Status> PutManifest(const Digest& digest, const std::string& body,
                                             const std::string& media_type);
  // The blob's size: from a manifest seen before, the tracker's table, or an upstream HEAD.
  boost::asio::awaitable<Result<uint64_t>> SizeOf(const shim::RepoRef& repo,
                                                  const upstream::RegistryEndpoint& ep,
                                                  const Digest& digest);

  boost::asio::io_context& ioc_;
  boost::asio::thread_pool& pool_;
  store::BlobStore& store_;
  upstream::RegistryClient& client_;
  FetchServices& services_;
  PullThroughOptions options_;
  std::unordered_map<Digest, uint64_t> sizes_;  // from manifests; bounded (cleared when full)
  std::unordered_map<Digest, std::shared_ptr<BlobFetch>> inflight_;
  std::map<std::string, TagEntry> tags_;  // "registry/repo:tag"
  CacheVerifier verifier_;                  // cached blobs are hashed again before served
  PullAuthCache pull_auth_;                 // pull_auth verdicts and repository contents

  prometheus::Counter& cache_hits_;
  prometheus::Counter& cache_misses_;
  prometheus::Family<prometheus::Counter>& fetches_;
  prometheus::Counter& manifest_upstream_;
  prometheus::Counter& manifest_cache_;
  prometheus::Counter& manifest_stale_;
  prometheus::Gauge& inflight_gauge_;
  prometheus::Counter& manifest_tracker_;  // shoal_manifest_requests_total{source="tracker"}
  prometheus::Counter& manifest_leases_;   // shoal_manifest_tracker_leases_total
  // shoal_manifest_tracker_fallbacks_total{reason}: error, timeout, unverified.
  prometheus::Family<prometheus::Counter>& manifest_fallbacks_;
  // shoal_shim_pull_auth_total{registry_mode,result}; shoal_pull_auth_upstream_checks_total{
  // credentials=anonymous|client,result=granted|refused|missing|error}.
  prometheus::Family<prometheus::Counter>& pull_auth_results_;
  prometheus::Family<prometheus::Counter>& pull_auth_checks_;
};

}  // namespace shoal::agent
