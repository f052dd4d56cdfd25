#pragma once
// The cluster as one tracker replica sees it, as the JSON document behind GET /v1/cluster (and the
// page at /ui, and `shoalctl status --cluster`, which merges every replica's): the replica and
// its share of the upstream cap, the upstream leases in flight, the blobs it owns with their
// chunks and swarms, the images recently resolved through its manifest cache with their progress,
// prefetch jobs with per-node progress, and the agents that poll it. The format is documented in
// docs/api.md. Pure but for ImageRates: callers pass the tables and "now".

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

#include <nlohmann/json.hpp>

#include "lib/core/digest.h"
#include "tracker/blobs/blob_table.h"
#include "tracker/manifests/manifest_cache.h"
#include "tracker/prefetch/prefetch_jobs.h"
#include "tracker/swarms/swarm_table.h"

namespace shoal::tracker {

// The route of the view; operators only (tracker/access.h).
inline constexpr std::string_view kClusterPath = "/v1/cluster";

// Each shown image's recent progress samples, kept between requests so that the view estimates
// the time left from the rate of the last minute. Bounded: at most max_images images (the least
// recently sampled one goes) and the samples of the last window. Not thread-safe (the tracker's
// one thread).
class ImageRates {
 public:
  explicit ImageRates(std::chrono::milliseconds window = std::chrono::seconds(60),
                      size_t max_images = 64)
      : window_(window), max_images_(max_images) {}
  // Records that image's nodes held `held` bytes at now; returns the rate in bytes per second over
  // the samples of the last window, or nullopt while they span less than a second.
  std::optional<double> Sample(const Digest& image, uint64_t held, TimePoint now);
  size_t size() const { return samples_.size(); }

 private:
  std::chrono::milliseconds window_;
  size_t max_images_;
  std::unordered_map<Digest, std::deque<std::pair<TimePoint, uint64_t>>> samples_;
};

// What the view reads. Every pointer must be valid for the call; a null one leaves its part out.
struct ClusterViewInput {
  std::string tracker_id;
  uint32_t replicas = 1;               // --replicas
  uint32_t upstream_cap_cluster = 0;   // --max-upstream-fetchers (the cluster's)
  const BlobTable* blobs = nullptr;
  size_t lease_waiters = 0;            // long-polls parked on the blob API
  const SwarmTable* swarms = nullptr;  // the chunk torrents' swarms
  const PrefetchJobs* prefetch = nullptr;
  const ManifestCache* manifests = nullptr;  // the images (with blobs: their progress)
  ImageRates* rates = nullptr;  // without it, estimates use the average rate since the start
  // A node not heard from on any chunk of an image for longer than this missed an announce (the
  // longest announce interval handed out, plus slack): it is stalled if it lacks some of it.
  std::chrono::milliseconds announce_silence{std::chrono::seconds(360)};
};

// Bounds on the document, so that it stays small at 2,500 nodes.
struct ClusterViewLimits {
  size_t blobs = 100;           // most recently used first
  size_t leases = 100;          // soonest to expire first
  size_t jobs = 20;             // running first, then the most recent ended ones
  size_t nodes_per_job = 50;    // the least advanced nodes of each job (counts cover all)
  size_t stale_agents = 100;    // agents that stopped polling, longest silent first
  size_t images = 10;           // most recently resolved first (one per platform manifest)
  size_t manifests_scanned = 40;  // recent manifests looked at to find them
  size_t blobs_per_image = 64;  // each image's blobs listed, config then layers (figures cover all)
  size_t nodes_per_image = 10;  // each image's slowest nodes
  // Peer entries read in all to know each node's part of the images being pulled (most recent
  // image first; about 20 ns each); an image that would go beyond gets its figures from swarm
  // counts only. 1,000,000 is 2,500 nodes on an image of 400 chunks.
  uint64_t peer_entries = 1'000'000;
};

// The document (see docs/api.md, "GET /v1/cluster"). Times are milliseconds ago or durations.
nlohmann::json BuildClusterView(const ClusterViewInput& in, TimePoint now,
                                const ClusterViewLimits& limits = {});

}  // namespace shoal::tracker
