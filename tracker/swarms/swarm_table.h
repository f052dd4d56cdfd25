#pragma once
// The tracker's soft state: for each info-hash, the peers that announced it recently, keyed by
// (IP, port), split into seeders and leechers. Rebuilt from announces after a restart; nothing
// is persisted.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <random>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <absl/container/flat_hash_map.h>

#include "lib/core/error.h"
#include "tracker/swarms/announce.h"
#include "tracker/swarms/ids.h"

namespace shoal::tracker {

// Time as seen by the table. Callers pass "now" into every call, so tests control time.
using TrackerClock = std::chrono::steady_clock;
using TimePoint = TrackerClock::time_point;

// Memory bounds. A peer costs roughly 100-150 bytes, a swarm about 200 bytes plus its peers.
struct SwarmLimits {
  size_t max_swarms = 200'000;
  size_t max_peers_per_swarm = 20'000;
  size_t max_peers = 4'000'000;  // over all swarms
};

struct SwarmTableOptions {
  // A peer not heard from for this long is dropped: two announce intervals (with their jitter)
  // plus slack, so one lost announce does not drop it.
  std::chrono::seconds peer_ttl{2 * 330 + 60};
  // Peers returned when the client does not say (numwant absent), and the most ever returned.
  uint32_t default_numwant = 50;
  uint32_t max_numwant = 200;
  // How much more likely a given seeder is to be listed to a leecher than a given leecher. With
  // few seeders and many leechers, each leecher still gets a seeder only with probability about
  // numwant * weight / swarm size, so one seeder is not handed to every leecher at once.
  double seeder_weight = 4.0;
  SwarmLimits limits;
};

// Scrape counts of one swarm (BEP 48 names).
struct SwarmCounts {
  uint32_t complete = 0;    // seeders
  uint32_t incomplete = 0;  // leechers (including paused, upload-only peers)
  uint64_t downloaded = 0;  // leecher-to-seeder changes seen since the swarm appeared here
};

// What an announce gets back.
struct AnnounceReply {
  std::vector<PeerEndpoint> peers;  // never includes the announcing peer itself
  SwarmCounts counts;               // after this announce was applied
  bool registered = true;           // false when the swarm was full and the peer was not stored
};

// Totals over all swarms, kept up to date incrementally (O(1) to read).
struct SwarmTotals {
  size_t swarms = 0;
  size_t peers = 0;
  size_t seeders = 0;
};

// One line of the status page.
struct SwarmSummary {
  InfoHash info_hash;
  SwarmCounts counts;
};

// Not thread-safe: the tracker calls it only from its single io_context thread.
class SwarmTable {
 public:
  // seed feeds the peer-selection random generator (tests pass a fixed one).
  explicit SwarmTable(SwarmTableOptions options, uint64_t seed = std::random_device{}());

  // Applies one announce from the peer at `from` (the request's source address with the
  // announced port) and selects peers for it. `stopped` removes the peer and returns no peers.
  // A leecher gets a random mix of seeders (weighted by seeder_weight) and leechers; a seeder
  // or a paused (upload-only) peer gets leechers only. At most min(numwant, max_numwant) peers.
  // Errors: kUnavailable when a new swarm would exceed max_swarms (or max_peers).
  Result<AnnounceReply> Announce(const AnnounceRequest& request, const PeerEndpoint& from,
                                 TimePoint now);
  // Counts for scrape; all zero for an unknown info-hash.
  SwarmCounts Counts(const InfoHash& info_hash) const;
  // A peer endpoint's number: the same in every swarm while some swarm holds the endpoint, and
  // below endpoint_ids() (the numbers of endpoints that left every swarm are reused), so that
  // per-node tallies over many swarms index an array instead of hashing endpoints.
  using EndpointId = uint32_t;
  size_t endpoint_ids() const { return endpoint_of_.size(); }
  // The endpoint numbered id (< endpoint_ids(); one no swarm holds is stale).
  const PeerEndpoint& endpoint(EndpointId id) const { return endpoint_of_[id]; }
  // Calls fn(EndpointId, bool seeder, TimePoint last_seen) for every peer of the swarm (none for
  // an unknown info-hash), seeders first. O(peers); fn must not change the table.
  template <typename Fn>
  void ForEachPeer(const InfoHash& info_hash, Fn&& fn) const {
    auto it = swarms_.find(info_hash);
    if (it == swarms_.end()) return;
    for (const Peer& p : it->second.seeders) fn(p.id, true, p.last_seen);
    for (const Peer& p : it->second.leechers) fn(p.id, false, p.last_seen);
  }
  // Whether info_hash had a seeder here and every seeder has since stopped or expired (none
  // seeds it now). False for an info-hash never seeded since this table started, so a restarted
  // tracker never declares a chunk lost before its seeders re-announce. At most max_swarms
  // info-hashes are remembered.
  bool LostSeeders(const InfoHash& info_hash) const { return SeedersLostAt(info_hash).has_value(); }
  // When info_hash lost its last seeder (see LostSeeders); nullopt while it has one or never had.
  std::optional<TimePoint> SeedersLostAt(const InfoHash& info_hash) const;
  // Drops every peer silent for longer than peer_ttl, and swarms left empty. Returns how many
  // peers were dropped. O(peers); the server runs it periodically.
  size_t Sweep(TimePoint now);
  // Totals over all swarms.
  SwarmTotals totals() const { return totals_; }
  // Up to `limit` swarms with the most peers, largest first (for the status page).
  std::vector<SwarmSummary> Largest(size_t limit) const;
  const SwarmTableOptions& options() const { return options_; }

 private:
  struct Peer {
    PeerEndpoint endpoint;
    PeerId peer_id;
    TimePoint last_seen;
    bool upload_only = false;  // announced `paused`: wants no more data
    EndpointId id = 0;         // endpoint's number (Intern)
  };
  // An endpoint's number and how many swarms hold it.
  struct Interned {
    EndpointId id = 0;
    uint32_t swarms = 0;
  };
  // Where a peer is: seeders_ or leechers_ of its swarm, at index pos.
  struct Slot {
    bool seeder = false;
    uint32_t pos = 0;
  };
  struct Swarm {
    std::vector<Peer> seeders;
    std::vector<Peer> leechers;
    // Open addressing (Abseil): one probe into a flat array where std::unordered_map chased a
    // bucket and a node, both cache misses once the tables hold millions of peers (session 33:
    // 25-30% more batched announces a second, and less memory a peer).
    absl::flat_hash_map<PeerEndpoint, Slot, std::hash<PeerEndpoint>> index;
    uint64_t downloaded = 0;
    size_t size() const { return seeders.size() + leechers.size(); }
  };

  // Appends the peer to the seeders or leechers of swarm; returns where it now is.
  Slot Insert(Swarm& swarm, Peer peer, bool seeder);
  // Removes the peer at slot by swapping the last one into its place; returns the removed peer.
  // Its endpoint stays numbered: Release it unless the peer goes back in (a seeder change).
  Peer Remove(Swarm& swarm, Slot slot);
  // The endpoint's number, held for one more swarm; Release gives that back.
  EndpointId Intern(const PeerEndpoint& endpoint);
  void Release(const Peer& peer);
  size_t SweepSwarm(Swarm& swarm, TimePoint now);
  // Records whether info_hash lost its last seeder, and when (had_seeders: it had one before the
  // change).
  void NoteSeeders(const InfoHash& info_hash, const Swarm& swarm, bool had_seeders, TimePoint now);
  // Appends up to k distinct random peers of `from` to out, skipping index `skip` (or none if
  // skip >= from.size()). O(k) expected.
  void Sample(const std::vector<Peer>& from, size_t k, size_t skip, std::vector<PeerEndpoint>& out);
  // Picks peers for the peer at `self` (absent when it could not be stored).
  std::vector<PeerEndpoint> SelectPeers(const Swarm& swarm, const std::optional<Slot>& self,
                                        bool leechers_only, uint32_t numwant);
  static SwarmCounts CountsOf(const Swarm& swarm);

  SwarmTableOptions options_;
  std::mt19937_64 rng_;
  std::unordered_map<InfoHash, Swarm> swarms_;
  std::unordered_map<InfoHash, TimePoint> seeders_lost_;  // had a seeder, have none since then
  SwarmTotals totals_;
  std::unordered_map<PeerEndpoint, Interned> interned_;  // every endpoint some swarm holds
  std::vector<PeerEndpoint> endpoint_of_;                // by EndpointId
  std::vector<EndpointId> free_ids_;                     // numbers no swarm holds
};

}  // namespace shoal::tracker
