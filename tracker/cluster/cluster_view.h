#pragma once
// The cluster as one tracker replica sees it, as the JSON document behind GET /v1/cluster (and the
// page at /ui, and `shoalctl status --cluster`, which merges every replica's): the replica and
// its share of the upstream cap, the upstream leases in flight, the blobs it owns with their
// chunks and swarms, prefetch jobs with per-node progress, and the agents that poll it. The
// format is documented in docs/api.md. Pure: callers pass the tables and "now".

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "tracker/blobs/blob_table.h"
#include "tracker/prefetch/prefetch_jobs.h"
#include "tracker/swarms/swarm_table.h"

namespace shoal::tracker {

// The route of the view; operators only (tracker/access.h).
inline constexpr std::string_view kClusterPath = "/v1/cluster";

// What the view reads. Every pointer must be valid for the call.
struct ClusterViewInput {
  std::string tracker_id;
  uint32_t replicas = 1;               // --replicas
  uint32_t upstream_cap_cluster = 0;   // --max-upstream-fetchers (the cluster's)
  const BlobTable* blobs = nullptr;
  size_t lease_waiters = 0;            // long-polls parked on the blob API
  const SwarmTable* swarms = nullptr;  // the chunk torrents' swarms
  const PrefetchJobs* prefetch = nullptr;
};

// Bounds on the document, so that it stays small at 2,500 nodes.
struct ClusterViewLimits {
  size_t blobs = 100;           // most recently used first
  size_t leases = 100;          // soonest to expire first
  size_t jobs = 20;             // running first, then the most recent ended ones
  size_t nodes_per_job = 50;    // the least advanced nodes of each job (counts cover all)
  size_t stale_agents = 100;    // agents that stopped polling, longest silent first
};

// The document (see docs/api.md, "GET /v1/cluster"). Times are milliseconds ago or durations.
nlohmann::json BuildClusterView(const ClusterViewInput& in, TimePoint now,
                                const ClusterViewLimits& limits = {});

}  // namespace shoal::tracker
