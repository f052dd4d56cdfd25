#pragma once
// The tracker's cluster-wide manifest cache: tag -> digest resolutions (with the time an agent
// fetched them from upstream; they expire after a TTL) and manifest bytes by digest (never expire,
// LRU-bounded by count and bytes). The tracker never talks to a registry: agents report what they
// fetched. Single-flight: when a reference is missing (or its tag expired), the first agent that
// asks gets a short fetch lease ("you fetch"); the others are told to wait until it publishes or
// its lease expires, so N agents resolving one tag cost about one upstream request. No network
// here; callers pass "now" into every call, so tests control time.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "lib/core/digest.h"
#include "tracker/swarms/swarm_table.h"

namespace shoal::tracker {

struct ManifestCacheOptions {
  std::chrono::milliseconds tag_ttl{30'000};    // a tag resolution is served this long
  std::chrono::milliseconds lease_ttl{10'000};  // a fetcher that does not publish by then loses it
  // An upstream "not found" is answered this long without asking upstream again (0: never).
  std::chrono::milliseconds missing_ttl{10'000};
  size_t max_manifests = 10'000;         // manifests kept (LRU beyond)
  uint64_t max_bytes = 256ull << 20;     // manifest bytes kept (LRU beyond)
  size_t max_tags = 100'000;             // tag resolutions kept
  size_t max_leases = 10'000;            // fetch leases at once; beyond, no single-flight
  size_t max_manifest_bytes = 4u << 20;  // a larger manifest is refused (OCI's own limit)
};

// A manifest as stored. Immutable once stored; shared with readers.
struct CachedManifest {
  Digest digest = Digest::FromSha256Hex(std::string(64, '0'));
  std::string media_type;
  std::string body;
};

// A stored manifest and how agents asked for it, for the cluster view (operators only: the keys
// name images, which may be private).
struct RecentManifest {
  std::shared_ptr<const CachedManifest> manifest;
  // The keys it was published or found under ("registry/repository:tag" or "...@digest"), most
  // recent first, at most kKeysPerManifest.
  std::vector<std::string> keys;
  TimePoint stored;     // when it was stored
  TimePoint last_used;  // its last publish or found resolve
};

// The answer to Resolve.
struct ManifestAnswer {
  enum class Kind {
    kFound,    // manifest (and, for a tag, its resolution) is known
    kFetch,    // the asker holds the fetch lease: fetch upstream, then Publish (or Release)
    kWait,     // another agent holds the lease; ask again by recheck_at or when woken
    kMissing,  // an agent found nothing upstream less than missing_ttl ago (`missing` says what)
  };
  Kind kind = Kind::kWait;
  std::shared_ptr<const CachedManifest> manifest;  // kFound
  std::chrono::milliseconds age{0};  // kFound for a tag, kMissing: since it was fetched
  std::string missing;               // kMissing: the upstream's answer, as the agent reported it
  std::chrono::milliseconds lease_ttl{0};  // kFetch
  std::string lease_id;    // kFetch: quoted by Publish and Release (empty: no lease was free)
  bool took_over = false;  // kFetch: another agent's lease had expired (it never published)
  TimePoint recheck_at = TimePoint::max();  // kWait: the lease's expiry
};

// Why Publish refused a manifest (the API answers 400 / 413 / 403).
enum class PublishErrc { kOk, kDigestMismatch, kTooLarge, kInvalid, kNotLeaseHolder };

// Sizes for gauges and the status page.
struct ManifestTotals {
  size_t manifests = 0;
  uint64_t bytes = 0;
  size_t tags = 0;
  size_t leases = 0;
  size_t missing = 0;  // references remembered as not found upstream
};

// Not thread-safe: the tracker calls it from its single network thread. `key` names what is
// resolved: "registry/repository:tag" for a tag, "registry/repository@sha256:..." for a digest
// (the caller builds it; ManifestKey does).
class ManifestCache {
 public:
  // seed feeds the lease ids (tests pass a fixed one).
  explicit ManifestCache(ManifestCacheOptions options, uint64_t seed = std::random_device{}())
      : options_(options), rng_(seed) {}

  // The key for a reference: "registry/repository:tag", or "...@digest" when digest_ref.
  static std::string ManifestKey(std::string_view registry, std::string_view repository,
                                 std::string_view reference, bool digest_ref);

  // A tag (digest == nullptr) or digest reference (digest set) for agent: kFound when fresh and
  // stored; else kFetch if nobody holds an unexpired lease on key (or agent itself does), else
  // kWait. Touches the manifest's LRU position when found.
  ManifestAnswer Resolve(const std::string& key, const Digest* digest, const std::string& agent,
                         TimePoint now);
  // Stores body (after checking sha256(body) == digest) with its media type, records
  // lease_key -> digest fetched now when is_tag, and ends the lease on lease_key (the tag's or
  // the digest reference's key). Only from the holder of that lease: agent and lease_id as
  // Resolve handed them out. Returns kOk or why it was refused.
  PublishErrc Publish(const Digest& digest, std::string media_type, std::string body,
                      const std::string& lease_key, bool is_tag, const std::string& agent,
                      const std::string& lease_id, TimePoint now);
  // Drops agent's lease lease_id on key (its upstream fetch failed), so the next asker
  // fetches. Returns whether a lease was dropped (false: not the holder).
  bool Release(const std::string& key, const std::string& agent, const std::string& lease_id);
  // Like Release, and remembers for missing_ttl that the upstream has no such manifest (the
  // agent's fetch got a 404; message is its text), so that a thousand nodes asking for a typo
  // cost one upstream request, not a thousand one after the other. A later Publish of key
  // forgets it. Returns whether a lease was dropped.
  bool ReleaseMissing(const std::string& key, const std::string& agent, const std::string& lease_id,
                      std::string message, TimePoint now);
  // The agent and id of the lease on key, if any (status page, tests).
  std::optional<std::pair<std::string, std::string>> LeaseOf(const std::string& key) const;
  // The stored manifest for digest, or nullptr.
  std::shared_ptr<const CachedManifest> Find(const Digest& digest);
  // The stored manifest for digest without touching its LRU position, or nullptr.
  std::shared_ptr<const CachedManifest> Peek(const Digest& digest) const;
  // Up to limit stored manifests, the most recently used first (the LRU order: resolves, publishes
  // and Find). O(limit).
  std::vector<RecentManifest> Recent(size_t limit) const;
  // Most keys remembered per manifest (RecentManifest::keys).
  static constexpr size_t kKeysPerManifest = 4;
  // Drops expired leases and expired tags; returns the number of leases that expired.
  size_t Sweep(TimePoint now);

  ManifestTotals totals() const;
  const ManifestCacheOptions& options() const { return options_; }

 private:
  struct Tag {
    Digest digest;
    TimePoint fetched;
  };
  struct Lease {
    std::string agent;
    std::string id;
    TimePoint expires;
  };
  struct Missing {
    std::string message;
    TimePoint fetched;
  };
  struct Entry {
    std::shared_ptr<const CachedManifest> manifest;
    std::list<Digest>::iterator lru;  // position in lru_ (front: most recent)
    std::vector<std::string> keys;    // most recent first, at most kKeysPerManifest
    TimePoint stored;
    TimePoint last_used;
  };
  std::string NewLeaseId();
  bool Holds(const std::string& key, const std::string& agent, const std::string& lease_id) const;
  // Stores manifest (or touches it when present) and notes key as used now.
  void Store(std::shared_ptr<const CachedManifest> manifest, const std::string& key, TimePoint now);
  // Records that entry was asked for under key at now.
  static void NoteUse(Entry& entry, const std::string& key, TimePoint now);
  void EvictOverBounds();

  ManifestCacheOptions options_;
  std::mt19937_64 rng_;
  std::unordered_map<Digest, Entry> manifests_;
  std::list<Digest> lru_;
  uint64_t bytes_ = 0;
  std::unordered_map<std::string, Tag> tags_;
  std::unordered_map<std::string, Lease> leases_;
  std::unordered_map<std::string, Missing> missing_;  // at most max_tags
};

}  // namespace shoal::tracker
