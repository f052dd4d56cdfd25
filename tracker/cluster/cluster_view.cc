#include "tracker/cluster/cluster_view.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <unordered_map>
#include <vector>

#include "lib/oci/manifest.h"
#include "lib/oci/reference.h"
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
  uint32_t nodes_seen = 0;         // max seeders + leechers over the chunks
  uint32_t chunk0_seeders = 0;     // how far the blob's first chunk has spread
  uint64_t held_bytes = 0;         // sum over the ready chunks of seeders x chunk length
  // held_bytes beyond the bytes fetched upstream: what peers delivered to the seeders.
  uint64_t peer_bytes = 0;
  uint64_t peer_entries = 0;  // seeders + leechers summed over the chunks (what a scan reads)
};

SwarmSpread SpreadOf(const BlobSummary& b, const SwarmTable* swarms) {
  SwarmSpread s;
  if (!swarms || b.ready_info_hashes.empty()) return s;
  uint32_t min_seeders = UINT32_MAX;
  for (size_t i = 0; i < b.ready_info_hashes.size(); ++i) {
    const swarm::Sha1& h = b.ready_info_hashes[i];
    auto id = InfoHash::FromBytes(
        std::string_view(reinterpret_cast<const char*>(h.data()), h.size()));
    SwarmCounts c = id ? swarms->Counts(*id) : SwarmCounts{};
    min_seeders = std::min(min_seeders, c.complete);
    s.nodes_downloading = std::max(s.nodes_downloading, c.incomplete);
    s.nodes_seen = std::max(s.nodes_seen, c.complete + c.incomplete);
    s.peer_entries += uint64_t{c.complete} + c.incomplete;
    if (i == 0 && b.chunk0_ready) s.chunk0_seeders = c.complete;
    if (i < b.ready_lengths.size()) s.held_bytes += uint64_t{c.complete} * b.ready_lengths[i];
  }
  s.nodes_done = b.ready == b.chunks ? min_seeders : 0;
  s.peer_bytes = s.held_bytes > b.upstream_bytes ? s.held_bytes - b.upstream_bytes : 0;
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
            {"nodes_seen", s.nodes_seen},
            {"peer_bytes", s.peer_bytes},
            {"held_bytes", s.held_bytes},
            {"chunk0_seeders", s.chunk0_seeders}};
  j["ready_after_ms"] = b.completed ? json(Ms(*b.completed - b.created)) : json(nullptr);
  return j;
}

json LeaseJson(const LeaseSummary& l, TimePoint now) {
  return {{"digest", l.digest.str()}, {"chunk", l.chunk},          {"agent", l.agent},
          {"bytes", l.bytes},         {"length", l.length},        {"age_ms", Ms(now - l.granted)},
          {"expires_in_ms", Ms(l.expires - now)}};
}

// The job's least advanced nodes, failed first, then by the share done (done ones last, or left
// out without `with_done`), at most `limit`.
json LeastAdvanced(const PrefetchJobRecord& job, TimePoint now, size_t limit, bool with_done) {
  std::vector<const PrefetchNode*> nodes;
  nodes.reserve(job.nodes.size());
  for (const auto& n : job.nodes) {
    if (with_done || n.state != PrefetchNodeState::kDone) nodes.push_back(&n);
  }
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
  return list;
}

// A job with its least advanced nodes, at most `limit`.
json JobJson(const PrefetchJobRecord& job, TimePoint now, size_t limit) {
  json j = PrefetchJobJson(job, now, false);
  j["age_ms"] = Ms(now - job.created);
  j["slowest_nodes"] = LeastAdvanced(job, now, limit, /*with_done=*/true);
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

// One platform manifest to show, with how it was reached.
struct ImageCandidate {
  Digest manifest;
  std::optional<Digest> index;   // the index it was reached from
  std::string platform;          // "os/architecture[/variant]" of that index entry
  std::vector<std::string> references;
  TimePoint stored;
  oci::Manifest parsed;
};

void AddReferences(std::vector<std::string>& to, const std::vector<std::string>& from) {
  for (const std::string& r : from) {
    if (std::find(to.begin(), to.end(), r) == to.end()) to.push_back(r);
  }
}

std::string PlatformName(const std::optional<oci::Platform>& p) {
  if (!p) return "";
  std::string s = p->os + "/" + p->architecture;
  if (!p->variant.empty()) s += "/" + p->variant;
  return s;
}

// The image manifests among the most recently used ones, an index standing for the platform
// manifests of it that are stored (the ones the cluster's nodes asked for). At most
// limits.images, most recent first; a manifest reached twice is shown once.
std::vector<ImageCandidate> RecentImages(const ManifestCache& cache,
                                         const ClusterViewLimits& limits) {
  std::vector<ImageCandidate> out;
  auto add = [&](ImageCandidate c) {
    for (ImageCandidate& seen : out) {
      if (seen.manifest == c.manifest) {
        AddReferences(seen.references, c.references);
        if (!seen.index && c.index) {
          seen.index = c.index;
          seen.platform = std::move(c.platform);
        }
        return;
      }
    }
    if (out.size() < limits.images) out.push_back(std::move(c));
  };
  for (const RecentManifest& r : cache.Recent(limits.manifests_scanned)) {
    if (out.size() >= limits.images) break;
    auto parsed = oci::ParseManifest(r.manifest->body, r.manifest->media_type);
    if (!parsed) continue;  // stored because it hashed right; not ours to judge further
    if (!parsed.value().is_index) {
      add({r.manifest->digest, std::nullopt, "", r.keys, r.stored, std::move(parsed.value())});
      continue;
    }
    for (const oci::Descriptor& d : parsed.value().manifests) {
      auto child = cache.Peek(d.digest);
      if (!child) continue;
      auto image = oci::ParseManifest(child->body, child->media_type);
      if (!image || image.value().is_index) continue;
      add({d.digest, r.manifest->digest, PlatformName(d.platform), r.keys, r.stored,
           std::move(image.value())});
    }
  }
  return out;
}

// The newest prefetch job naming each image reference (normalised: "registry/repository:tag").
std::map<std::string, const PrefetchJobRecord*> JobsByImage(const PrefetchJobs* jobs) {
  std::map<std::string, const PrefetchJobRecord*> by_image;
  if (!jobs) return by_image;
  for (const PrefetchJobRecord* job : jobs->List()) {
    for (const std::string& image : job->spec.images) {
      auto ref = oci::ParseImageRef(image);
      if (!ref) continue;
      auto [it, fresh] = by_image.try_emplace(ref.value().str(), job);
      if (!fresh && job->created > it->second->created) it->second = job;
    }
  }
  return by_image;
}

// A job's nodes that are not done, failed first, then the least advanced; at most limit.
json SlowestNodes(const PrefetchJobRecord& job, TimePoint now, size_t limit) {
  return LeastAdvanced(job, now, limit, /*with_done=*/false);
}

// The agents whose polls said where their swarm listens, by that endpoint (the most recently
// heard one when two claim it), so that a swarm peer is shown by its node's name.
using NodeNames = std::unordered_map<PeerEndpoint, const PrefetchAgent*>;

NodeNames NamesOf(const PrefetchJobs* jobs) {
  NodeNames names;
  if (!jobs) return names;
  for (const auto& entry : jobs->Agents()) {
    const PrefetchAgent& a = entry.second;
    if (!a.peer) continue;
    auto [it, fresh] = names.try_emplace(*a.peer, &a);
    if (!fresh && a.last_seen > it->second->last_seen) it->second = &a;
  }
  return names;
}

// One node's part of an image as its peer entries in the image's chunk swarms say.
struct NodePart {
  bool seen = false;
  uint32_t chunks_held = 0;   // chunks it seeds
  uint32_t blob_held = 0;     // of the blob being read, the chunks it seeds
  uint32_t blobs_done = 0;    // blobs it seeds every chunk of
  uint64_t bytes_held = 0;    // the lengths of the chunks it seeds
  TimePoint last_announce{};  // its newest announce of any of them
};

// Every node's part of an image, by swarm endpoint number, and the numbers seen.
struct NodeParts {
  std::vector<NodePart> by_id;
  std::vector<SwarmTable::EndpointId> seen;
};

// Every node's part of the image over its blobs known here (summaries), read from the swarms:
// O(peer entries of their ready chunks), an array index each.
NodeParts ReadNodeParts(const std::vector<const BlobSummary*>& summaries,
                        const SwarmTable& swarms) {
  NodeParts parts;
  parts.by_id.resize(swarms.endpoint_ids());
  for (const BlobSummary* b : summaries) {
    for (size_t i = 0; i < b->ready_info_hashes.size(); ++i) {
      const swarm::Sha1& h = b->ready_info_hashes[i];
      auto id =
          InfoHash::FromBytes(std::string_view(reinterpret_cast<const char*>(h.data()), h.size()));
      if (!id) continue;
      const uint64_t length = i < b->ready_lengths.size() ? b->ready_lengths[i] : 0;
      swarms.ForEachPeer(*id, [&](SwarmTable::EndpointId ep, bool seeder, TimePoint heard) {
        NodePart& p = parts.by_id[ep];
        if (!p.seen) {
          p.seen = true;
          parts.seen.push_back(ep);
        }
        if (seeder) {
          ++p.blob_held;
          p.bytes_held += length;
        }
        p.last_announce = std::max(p.last_announce, heard);
      });
    }
    for (SwarmTable::EndpointId ep : parts.seen) {
      NodePart& p = parts.by_id[ep];
      if (b->chunks > 0 && p.blob_held == b->chunks) ++p.blobs_done;
      p.chunks_held += p.blob_held;
      p.blob_held = 0;
    }
  }
  return parts;
}

// What the view says of the nodes of one image from their peer entries.
struct NodeFigures {
  uint32_t done = 0, seen = 0, stalled = 0;
  json slowest = json::array();  // at most limits.nodes_per_image, stalled first
};

// The image's nodes from their parts: done when they seed every chunk of every blob (all known
// here and ready), stalled when not done and their agent stopped polling or none of the image's
// chunks heard from them for in.announce_silence; the slowest are the stalled ones, then the
// least advanced.
NodeFigures FigureNodes(const NodeParts& parts, const SwarmTable& swarms, bool all_blobs_ready,
                        uint32_t chunks_total, uint64_t bytes_total, size_t blobs_total,
                        const NodeNames& names, const ClusterViewInput& in, TimePoint now,
                        size_t limit) {
  struct Row {
    const PeerEndpoint* ep;
    const NodePart* part;
    const PrefetchAgent* agent;
    std::string name;
    std::string why;  // empty unless stalled
  };
  NodeFigures f;
  f.seen = static_cast<uint32_t>(parts.seen.size());
  const auto agent_ttl = in.prefetch ? in.prefetch->options().agent_ttl : std::chrono::seconds(30);
  std::vector<Row> rows;
  for (SwarmTable::EndpointId id : parts.seen) {
    const NodePart& p = parts.by_id[id];
    if (all_blobs_ready && p.chunks_held == chunks_total) {
      ++f.done;
      continue;
    }
    const PeerEndpoint& ep = swarms.endpoint(id);
    Row r{&ep, &p, nullptr, "", ""};
    if (auto it = names.find(ep); it != names.end()) {
      r.agent = it->second;
      r.name = r.agent->node;
    } else {
      r.name = ep.ToString();
    }
    if (r.agent && now - r.agent->last_seen >= agent_ttl) {
      r.why = "its agent stopped polling " + std::to_string(Ms(now - r.agent->last_seen) / 1000) +
              " s ago";
    } else if (now - p.last_announce > in.announce_silence) {
      r.why = "no announce of the image's chunks for " +
              std::to_string(Ms(now - p.last_announce) / 1000) + " s";
    }
    if (!r.why.empty()) ++f.stalled;
    rows.push_back(std::move(r));
  }
  const size_t shown = std::min(limit, rows.size());
  std::partial_sort(rows.begin(), rows.begin() + static_cast<ptrdiff_t>(shown), rows.end(),
                    [](const Row& a, const Row& b) {
                      if (a.why.empty() != b.why.empty()) return !a.why.empty();
                      if (a.part->chunks_held != b.part->chunks_held)
                        return a.part->chunks_held < b.part->chunks_held;
                      return a.name < b.name;
                    });
  for (size_t i = 0; i < shown; ++i) {
    const Row& r = rows[i];
    f.slowest.push_back({{"node", r.name},
                         {"peer", r.ep->ToString()},
                         {"agent", r.agent ? r.agent->agent : ""},
                         {"state", r.why.empty() ? "running" : "stalled"},
                         {"chunks_held", r.part->chunks_held},
                         {"chunks_total", chunks_total},
                         {"bytes_done", r.part->bytes_held},
                         {"bytes_total", bytes_total},
                         {"blobs_done", r.part->blobs_done},
                         {"blobs_total", blobs_total},
                         {"silent_ms", Ms(now - r.part->last_announce)},
                         {"error", r.why}});
  }
  return f;
}

json ImageJson(const ImageCandidate& c, const ClusterViewInput& in, TimePoint now,
               const ClusterViewLimits& limits,
               const std::map<std::string, const PrefetchJobRecord*>& jobs, const NodeNames& names,
               uint64_t& peer_budget) {
  std::vector<std::pair<const oci::Descriptor*, const char*>> descriptors;
  if (c.parsed.config) descriptors.emplace_back(&*c.parsed.config, "config");
  for (const oci::Descriptor& l : c.parsed.layers) descriptors.emplace_back(&l, "layer");
  std::set<Digest> counted;  // a layer listed twice is one blob on a node
  uint64_t size = 0, upstream = 0, peers = 0, held = 0;
  size_t total = 0, known = 0, ready = 0;
  uint32_t done = UINT32_MAX, seen = 0;
  uint32_t chunks_known = 0;
  uint64_t bytes_known = 0, peer_entries = 0;
  std::vector<BlobSummary> summaries;  // of the blobs known here
  summaries.reserve(c.parsed.layers.size() + 1);
  TimePoint first = c.stored;
  json blobs = json::array();
  for (const auto& [d, kind] : descriptors) {
    if (!counted.insert(d->digest).second) continue;
    ++total;
    size += static_cast<uint64_t>(d->size);
    std::optional<BlobSummary> b = in.blobs ? in.blobs->Summary(d->digest) : std::nullopt;
    json entry = {{"digest", d->digest.str()}, {"kind", kind}, {"size", d->size},
                  {"known", b.has_value()}};
    if (!b) {
      done = 0;
      if (blobs.size() < limits.blobs_per_image) blobs.push_back(std::move(entry));
      continue;
    }
    SwarmSpread s = SpreadOf(*b, in.swarms);
    ++known;
    if (b->chunks > 0 && b->ready == b->chunks) ++ready;
    upstream += b->upstream_bytes;
    peers += s.peer_bytes;
    held += s.held_bytes;
    done = std::min(done, s.nodes_done);
    seen = std::max(seen, s.nodes_seen);
    first = std::min(first, b->created);
    chunks_known += b->chunks;
    bytes_known += static_cast<uint64_t>(d->size);
    peer_entries += s.peer_entries;
    if (blobs.size() < limits.blobs_per_image) {
      entry["chunks"] = b->chunks;
      entry["chunks_ready"] = b->ready;
      entry["upstream_bytes"] = b->upstream_bytes;
      entry["peer_bytes"] = s.peer_bytes;
      entry["held_bytes"] = s.held_bytes;
      entry["nodes_done"] = s.nodes_done;
      entry["nodes_seen"] = s.nodes_seen;
      entry["age_ms"] = Ms(now - b->created);
      entry["ready_after_ms"] = b->completed ? json(Ms(*b->completed - b->created)) : json(nullptr);
      blobs.push_back(std::move(entry));
    }
    summaries.push_back(std::move(*b));
  }
  const bool all_ready = total > 0 && ready == total;
  uint32_t nodes_done = all_ready ? done : 0;
  uint32_t in_progress = seen > nodes_done ? seen - nodes_done : 0;
  const bool complete = all_ready && nodes_done > 0 && in_progress == 0;
  // While it is not complete, and within the view's budget, each node's peer entries give exact
  // counts and the slowest nodes. (A complete image is not read: in_progress 0 means that every
  // chunk has the same seeders count and no leecher, which is every node seen done unless nodes
  // hold disjoint parts of it.)
  std::optional<NodeFigures> figures;
  if (!complete && in.swarms && peer_entries <= peer_budget) {
    peer_budget -= peer_entries;
    std::vector<const BlobSummary*> known_blobs;
    for (const BlobSummary& b : summaries) known_blobs.push_back(&b);
    figures = FigureNodes(ReadNodeParts(known_blobs, *in.swarms), *in.swarms, all_ready,
                          chunks_known, bytes_known, known, names, in, now, limits.nodes_per_image);
    nodes_done = figures->done;
    in_progress = figures->seen - figures->done;
    seen = figures->seen;
  }

  const PrefetchJobRecord* job = nullptr;
  for (const std::string& r : c.references) {
    auto it = jobs.find(r);
    if (it != jobs.end() && (!job || it->second->created > job->created)) job = it->second;
  }
  size_t failed = 0;
  if (job) {
    failed = std::count_if(job->nodes.begin(), job->nodes.end(), [](const PrefetchNode& n) {
      return n.state == PrefetchNodeState::kFailed;
    });
  } else if (figures) {
    failed = figures->stalled;
  }
  json slowest = json::array();
  if (job) {
    slowest = SlowestNodes(*job, now, limits.nodes_per_image);
  } else if (figures) {
    slowest = std::move(figures->slowest);
  }

  // The estimate: every node seen so far holding the whole image, at the rate of the last minute
  // (the average since the first activity until there are samples a second apart).
  const uint64_t target = uint64_t{seen} * size;
  const uint64_t remaining = target > held ? target - held : 0;
  const int64_t age = Ms(now - first);
  // A plain double (-1: none): GCC 12 warns about an optional<double> here (a false positive).
  double rate = -1;
  if (in.rates) rate = in.rates->Sample(c.manifest, held, now).value_or(-1);
  if (rate < 0 && age >= 1000) rate = static_cast<double>(held) * 1000.0 / static_cast<double>(age);
  json eta = nullptr;
  if (complete || (seen > 0 && remaining == 0)) {
    eta = 0;
  } else if (rate > 0 && seen > 0) {
    eta = static_cast<int64_t>(static_cast<double>(remaining) * 1000.0 / rate);
  }
  json j = {{"references", c.references},
            {"manifest", c.manifest.str()},
            {"index", c.index ? json(c.index->str()) : json(nullptr)},
            {"platform", c.platform.empty() ? json(nullptr) : json(c.platform)},
            {"size", size},
            {"blobs_total", total},
            {"blobs_known", known},
            {"blobs_ready", ready},
            {"upstream_bytes", upstream},
            {"peer_bytes", peers},
            {"held_bytes", held},
            {"nodes_done", nodes_done},
            {"nodes_in_progress", in_progress},
            {"nodes_failed", failed},
            {"nodes_exact", figures.has_value()},
            {"complete", complete},
            {"age_ms", age},
            {"rate_bytes_per_s", rate >= 0 ? json(static_cast<uint64_t>(rate)) : json(nullptr)},
            {"eta_ms", std::move(eta)},
            {"prefetch_job", job ? json(job->id) : json(nullptr)},
            {"slowest_nodes", std::move(slowest)},
            {"blobs", std::move(blobs)}};
  return j;
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
                        {"limit_this_replica", t.upstream_limit()},
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
  if (in.manifests) {
    json images = json::array();
    auto jobs = JobsByImage(in.prefetch);
    const NodeNames names = NamesOf(in.prefetch);
    uint64_t peer_budget = limits.peer_entries;
    for (const ImageCandidate& c : RecentImages(*in.manifests, limits)) {
      images.push_back(ImageJson(c, in, now, limits, jobs, names, peer_budget));
    }
    view["images"] = std::move(images);
  }
  if (in.prefetch) {
    view["prefetch_jobs"] = JobsJson(*in.prefetch, now, limits);
    view["agents"] = AgentsJson(*in.prefetch, now, limits);
  }
  return view;
}

std::optional<double> ImageRates::Sample(const Digest& image, uint64_t held, TimePoint now) {
  auto it = samples_.find(image);
  if (it == samples_.end()) {
    if (samples_.size() >= max_images_) {
      auto oldest = std::min_element(samples_.begin(), samples_.end(), [](const auto& a,
                                                                          const auto& b) {
        return a.second.back().first < b.second.back().first;
      });
      samples_.erase(oldest);
    }
    it = samples_.emplace(image, std::deque<std::pair<TimePoint, uint64_t>>{}).first;
  }
  auto& q = it->second;
  // One sample a second is enough (several pages may poll); the oldest kept is the newest one at
  // least a window old, so that rare polls still get a rate over the window.
  if (q.empty() || now - q.back().first >= std::chrono::seconds(1)) q.emplace_back(now, held);
  while (q.size() > 1 && now - q[1].first >= window_) q.pop_front();
  const auto span = now - q.front().first;
  if (span < std::chrono::seconds(1)) return std::nullopt;
  const double dt = std::chrono::duration<double>(span).count();
  const double moved = static_cast<double>(held) - static_cast<double>(q.front().second);
  return std::max(0.0, moved / dt);
}

}  // namespace shoal::tracker
