#include "tracker/cluster/cluster_view.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "tracker/prefetch/prefetch_api.h"

namespace shoal::tracker {
namespace {

using json = nlohmann::json;

int64_t Ms(std::chrono::steady_clock::duration d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
}

// Seeders and leechers of one blob over its ready chunks' swarms. Agents seed whole blobs, so
// the fewest seeders of any chunk is the nodes that have it (strictly, an upper bound: the
// tracker does not know which seeders are the same node).
struct SwarmSpread {
  uint32_t nodes_done = 0;         // min seeders over the chunks (0 unless every chunk is ready)
  uint32_t nodes_downloading = 0;  // max leechers over the chunks
  uint32_t chunk0_seeders = 0;     // how far the blob's first chunk has spread
};

SwarmSpread SpreadOf(const BlobSummary& b, const SwarmTable* swarms) {
  SwarmSpread s;
  if (!swarms || b.ready_info_hashes.empty()) return s;
  uint32_t min_seeders = UINT32_MAX;
  bool first = true;
  for (const swarm::Sha1& h : b.ready_info_hashes) {
    auto id = InfoHash::FromBytes(
        std::string_view(reinterpret_cast<const char*>(h.data()), h.size()));
    SwarmCounts c = id ? swarms->Counts(*id) : SwarmCounts{};
    min_seeders = std::min(min_seeders, c.complete);
    s.nodes_downloading = std::max(s.nodes_downloading, c.incomplete);
    if (first && b.chunk0_ready) s.chunk0_seeders = c.complete;
    first = false;
  }
  s.nodes_done = b.ready == b.chunks ? min_seeders : 0;
  return s;
}

json BlobJson(const BlobSummary& b, const SwarmTable* swarms, TimePoint now) {
  SwarmSpread s = SpreadOf(b, swarms);
  json j = {{"digest", b.digest.str()},
            {"registry", b.source.registry},
            {"repository", b.source.repository},
            {"size", b.source.size},
            {"chunks", b.chunks},
            {"chunks_ready", b.ready},
            {"leases", b.leases},
            {"upstream_bytes", b.upstream_bytes},
            {"age_ms", Ms(now - b.created)},
            {"nodes_done", s.nodes_done},
            {"nodes_downloading", s.nodes_downloading},
            {"chunk0_seeders", s.chunk0_seeders}};
  j["ready_after_ms"] = b.completed ? json(Ms(*b.completed - b.created)) : json(nullptr);
  return j;
}

json LeaseJson(const LeaseSummary& l, TimePoint now) {
  return {{"digest", l.digest.str()}, {"chunk", l.chunk},          {"agent", l.agent},
          {"bytes", l.bytes},         {"length", l.length},        {"age_ms", Ms(now - l.granted)},
          {"expires_in_ms", Ms(l.expires - now)}};
}

// A job with its least advanced nodes (failed first, then by the share done), at most `limit`.
json JobJson(const PrefetchJobRecord& job, TimePoint now, size_t limit) {
  json j = PrefetchJobJson(job, now, false);
  j["age_ms"] = Ms(now - job.created);
  std::vector<const PrefetchNode*> nodes;
  nodes.reserve(job.nodes.size());
  for (const auto& n : job.nodes) nodes.push_back(&n);
  auto rank = [](const PrefetchNode* n) {
    if (n->state == PrefetchNodeState::kFailed) return -1.0;
    if (n->state == PrefetchNodeState::kDone) return 2.0;
    return n->bytes_total ? static_cast<double>(n->bytes_done) / n->bytes_total : 0.0;
  };
  size_t shown = std::min(limit, nodes.size());
  std::partial_sort(nodes.begin(), nodes.begin() + shown, nodes.end(),
                    [&](const PrefetchNode* a, const PrefetchNode* b) {
                      double ra = rank(a), rb = rank(b);
                      return ra != rb ? ra < rb : a->node < b->node;
                    });
  json list = json::array();
  for (size_t i = 0; i < shown; ++i) list.push_back(PrefetchNodeJson(*nodes[i], now));
  j["slowest_nodes"] = std::move(list);
  return j;
}

json JobsJson(const PrefetchJobs& jobs, TimePoint now, const ClusterViewLimits& limits) {
  std::vector<const PrefetchJobRecord*> all = jobs.List();
  // Running jobs first, then ended ones, each newest first.
  std::stable_sort(all.begin(), all.end(),
                   [](const PrefetchJobRecord* a, const PrefetchJobRecord* b) {
                     if (a->ended.has_value() != b->ended.has_value()) return !a->ended;
                     return a->created > b->created;
                   });
  json list = json::array();
  for (size_t i = 0; i < all.size() && i < limits.jobs; ++i) {
    list.push_back(JobJson(*all[i], now, limits.nodes_per_job));
  }
  return list;
}

json AgentsJson(const PrefetchJobs& jobs, TimePoint now, const ClusterViewLimits& limits) {
  const auto ttl = jobs.options().agent_ttl;
  size_t live = 0;
  std::vector<const PrefetchAgent*> stale;
  for (const auto& [node, a] : jobs.Agents()) {
    if (now - a.last_seen < ttl) {
      ++live;
    } else {
      stale.push_back(&a);
    }
  }
  std::sort(stale.begin(), stale.end(), [](const PrefetchAgent* a, const PrefetchAgent* b) {
    return a->last_seen != b->last_seen ? a->last_seen < b->last_seen : a->node < b->node;
  });
  json list = json::array();
  for (size_t i = 0; i < stale.size() && i < limits.stale_agents; ++i) {
    list.push_back({{"node", stale[i]->node},
                    {"agent", stale[i]->agent},
                    {"silent_ms", Ms(now - stale[i]->last_seen)}});
  }
  return {{"live", live},
          {"stale", stale.size()},
          {"stale_after_ms", Ms(ttl)},
          {"stale_agents", std::move(list)}};
}

}  // namespace

json BuildClusterView(const ClusterViewInput& in, TimePoint now,
                      const ClusterViewLimits& limits) {
  json view = {{"tracker_id", in.tracker_id}, {"replicas", in.replicas}};
  if (in.blobs) {
    const BlobTable& t = *in.blobs;
    BlobTotals totals = t.totals();
    json leases = json::array();
    for (const LeaseSummary& l : t.ActiveLeases(limits.leases)) leases.push_back(LeaseJson(l, now));
    view["upstream"] = {{"leases_active", totals.leases},
                        {"cap_this_replica", t.options().max_upstream_fetchers},
                        {"cap_cluster", in.upstream_cap_cluster},
                        {"bytes_total", totals.upstream_bytes},
                        {"lease_waiters", in.lease_waiters},
                        {"leases", std::move(leases)}};
    json blobs = json::array();
    for (const BlobSummary& b : t.RecentBlobs(limits.blobs)) {
      blobs.push_back(BlobJson(b, in.swarms, now));
    }
    view["blobs"] = {{"count", totals.blobs},
                     {"chunks", totals.chunks},
                     {"chunks_ready", totals.ready},
                     {"recent", std::move(blobs)}};
  }
  if (in.swarms) {
    SwarmTotals s = in.swarms->totals();
    view["swarms"] = {{"count", s.swarms}, {"peers", s.peers}};
  }
  if (in.prefetch) {
    view["prefetch_jobs"] = JobsJson(*in.prefetch, now, limits);
    view["agents"] = AgentsJson(*in.prefetch, now, limits);
  }
  return view;
}

}  // namespace shoal::tracker
