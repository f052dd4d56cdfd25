#include "tracker/swarms/swarm_table.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

namespace shoal::tracker {
namespace {

constexpr size_t kNoSkip = std::numeric_limits<size_t>::max();

}  // namespace

SwarmTable::SwarmTable(SwarmTableOptions options, uint64_t seed)
    : options_(std::move(options)), rng_(seed) {
  options_.max_numwant = std::max<uint32_t>(options_.max_numwant, 1);
  options_.default_numwant = std::min(options_.default_numwant, options_.max_numwant);
  if (!(options_.seeder_weight > 0)) options_.seeder_weight = 1.0;
}

Result<AnnounceReply> SwarmTable::Announce(const AnnounceRequest& request, const PeerEndpoint& from,
                                           TimePoint now) {
  AnnounceReply reply;
  auto it = swarms_.find(request.info_hash);

  if (request.event == AnnounceEvent::kStopped) {
    if (it == swarms_.end()) return reply;
    Swarm& swarm = it->second;
    if (auto idx = swarm.index.find(from); idx != swarm.index.end()) {
      // Clients that stop right after finishing (aria2c --seed-time=0) never send `completed`.
      if (!idx->second.seeder && request.left == 0) ++swarm.downloaded;
      bool had_seeders = !swarm.seeders.empty();
      Release(Remove(swarm, idx->second));
      NoteSeeders(request.info_hash, swarm, had_seeders, now);
    }
    reply.counts = CountsOf(swarm);
    if (swarm.size() == 0) {
      swarms_.erase(it);
      --totals_.swarms;
    }
    return reply;
  }

  if (it == swarms_.end()) {
    if (swarms_.size() >= options_.limits.max_swarms) {
      return MakeError(ErrorCode::kUnavailable,
                       "tracker is full: it already tracks " + std::to_string(swarms_.size()) +
                           " swarms (max_swarms); not tracking " + request.info_hash.hex());
    }
    if (totals_.peers >= options_.limits.max_peers) {
      return MakeError(ErrorCode::kUnavailable,
                       "tracker is full: it already tracks " + std::to_string(totals_.peers) +
                           " peers (max_peers); not tracking " + request.info_hash.hex());
    }
    it = swarms_.emplace(request.info_hash, Swarm{}).first;
    ++totals_.swarms;
  }
  Swarm& swarm = it->second;
  const bool had_seeders = !swarm.seeders.empty();
  const bool seeder = request.left == 0;
  bool was_seeder = false;
  bool upload_only = false;
  auto found = swarm.index.find(from);
  const bool known = found != swarm.index.end();
  std::optional<Slot> self;  // where the announcing peer is now; none when it was not stored

  if (known) {
    Slot slot = found->second;
    self = slot;
    was_seeder = slot.seeder;
    Peer& peer = slot.seeder ? swarm.seeders[slot.pos] : swarm.leechers[slot.pos];
    peer.last_seen = now;
    peer.peer_id = request.peer_id;
    if (request.event == AnnounceEvent::kPaused) {
      peer.upload_only = true;
    } else if (request.event == AnnounceEvent::kStarted ||
               request.event == AnnounceEvent::kCompleted) {
      peer.upload_only = false;
    }
    upload_only = peer.upload_only;
    if (slot.seeder != seeder) self = Insert(swarm, Remove(swarm, slot), seeder);
  } else {
    bool full = swarm.size() >= options_.limits.max_peers_per_swarm ||
                totals_.peers >= options_.limits.max_peers;
    if (full) SweepSwarm(swarm, now);
    full = swarm.size() >= options_.limits.max_peers_per_swarm ||
           totals_.peers >= options_.limits.max_peers;
    upload_only = request.event == AnnounceEvent::kPaused;
    if (full) {
      reply.registered = false;
    } else {
      self = Insert(swarm, Peer{from, request.peer_id, now, upload_only, Intern(from)}, seeder);
    }
  }
  // A download is counted once per leecher-to-seeder change seen here, whether the client says
  // `completed` or just reports left=0; a `completed` from a peer not seen before counts too.
  if (known ? (!was_seeder && seeder) : request.event == AnnounceEvent::kCompleted)
    ++swarm.downloaded;
  NoteSeeders(request.info_hash, swarm, had_seeders, now);

  if (swarm.size() == 0) {
    // Only possible when the peer could not be stored; keep no empty swarm around.
    swarms_.erase(it);
    --totals_.swarms;
    return reply;
  }
  uint32_t numwant =
      std::min(request.numwant.value_or(options_.default_numwant), options_.max_numwant);
  reply.peers = SelectPeers(swarm, self, seeder || upload_only, numwant);
  reply.counts = CountsOf(swarm);
  return reply;
}

std::vector<PeerEndpoint> SwarmTable::SelectPeers(const Swarm& swarm,
                                                  const std::optional<Slot>& self,
                                                  bool leechers_only, uint32_t numwant) {
  std::vector<PeerEndpoint> out;
  out.reserve(numwant);
  size_t skip_seeder = self && self->seeder ? self->pos : kNoSkip;
  size_t skip_leecher = self && !self->seeder ? self->pos : kNoSkip;
  size_t seeders = swarm.seeders.size() - (skip_seeder != kNoSkip ? 1 : 0);
  size_t leechers = swarm.leechers.size() - (skip_leecher != kNoSkip ? 1 : 0);
  size_t n = numwant;

  if (leechers_only) {
    Sample(swarm.leechers, std::min(n, leechers), skip_leecher, out);
  } else if (seeders + leechers <= n) {
    Sample(swarm.seeders, seeders, skip_seeder, out);
    Sample(swarm.leechers, leechers, skip_leecher, out);
  } else {
    // The expected number of seeders is proportional to their weighted share of the swarm;
    // randomised rounding keeps the expectation exact when it is below one.
    double weighted = options_.seeder_weight * static_cast<double>(seeders);
    double expected =
        static_cast<double>(n) * weighted / (weighted + static_cast<double>(leechers));
    double whole = std::floor(expected);
    size_t take = static_cast<size_t>(whole);
    if (std::uniform_real_distribution<double>(0.0, 1.0)(rng_) < expected - whole) ++take;
    size_t min_take = n > leechers ? n - leechers : 0;
    take = std::clamp(take, min_take, std::min(n, seeders));
    Sample(swarm.seeders, take, skip_seeder, out);
    Sample(swarm.leechers, n - take, skip_leecher, out);
  }
  std::shuffle(out.begin(), out.end(), rng_);
  return out;
}

void SwarmTable::Sample(const std::vector<Peer>& from, size_t k, size_t skip,
                        std::vector<PeerEndpoint>& out) {
  size_t m = from.size() - (skip < from.size() ? 1 : 0);
  k = std::min(k, m);
  if (k == 0) return;
  // Index i of the virtual list without `skip` maps to from[i] or from[i + 1].
  auto at = [&](size_t i) -> const PeerEndpoint& {
    return from[skip != kNoSkip && i >= skip ? i + 1 : i].endpoint;
  };
  if (k == m) {
    for (size_t i = 0; i < m; ++i) out.push_back(at(i));
    return;
  }
  // Floyd's algorithm: k distinct indices with k random draws; the bitmap of what was chosen
  // costs m/8 bytes (2.5 KB for the largest swarm allowed by default).
  std::vector<uint64_t> chosen((m + 63) / 64, 0);
  auto take = [&](size_t i) {
    uint64_t bit = uint64_t{1} << (i % 64);
    if (chosen[i / 64] & bit) return false;
    chosen[i / 64] |= bit;
    return true;
  };
  for (size_t j = m - k; j < m; ++j) {
    size_t t = std::uniform_int_distribution<size_t>(0, j)(rng_);
    size_t pick = take(t) ? t : j;
    if (pick == j) take(j);
    out.push_back(at(pick));
  }
}

SwarmTable::Slot SwarmTable::Insert(Swarm& swarm, Peer peer, bool seeder) {
  std::vector<Peer>& list = seeder ? swarm.seeders : swarm.leechers;
  Slot slot{seeder, static_cast<uint32_t>(list.size())};
  swarm.index[peer.endpoint] = slot;
  list.push_back(std::move(peer));
  ++totals_.peers;
  if (seeder) ++totals_.seeders;
  return slot;
}

SwarmTable::Peer SwarmTable::Remove(Swarm& swarm, Slot slot) {
  std::vector<Peer>& list = slot.seeder ? swarm.seeders : swarm.leechers;
  Peer removed = std::move(list[slot.pos]);
  if (slot.pos + 1 != list.size()) {
    list[slot.pos] = std::move(list.back());
    swarm.index[list[slot.pos].endpoint].pos = slot.pos;
  }
  list.pop_back();
  swarm.index.erase(removed.endpoint);
  --totals_.peers;
  if (slot.seeder) --totals_.seeders;
  return removed;
}

SwarmTable::EndpointId SwarmTable::Intern(const PeerEndpoint& endpoint) {
  auto [it, fresh] = interned_.try_emplace(endpoint);
  if (fresh) {
    if (free_ids_.empty()) {
      it->second.id = static_cast<EndpointId>(endpoint_of_.size());
      endpoint_of_.push_back(endpoint);
    } else {
      it->second.id = free_ids_.back();
      free_ids_.pop_back();
      endpoint_of_[it->second.id] = endpoint;
    }
  }
  ++it->second.swarms;
  return it->second.id;
}

void SwarmTable::Release(const Peer& peer) {
  auto it = interned_.find(peer.endpoint);
  if (it == interned_.end() || --it->second.swarms > 0) return;
  free_ids_.push_back(it->second.id);
  interned_.erase(it);
}

size_t SwarmTable::SweepSwarm(Swarm& swarm, TimePoint now) {
  size_t dropped = 0;
  for (bool seeder : {true, false}) {
    std::vector<Peer>& list = seeder ? swarm.seeders : swarm.leechers;
    // Backwards, so the peer swapped into a freed slot has already been checked.
    for (size_t i = list.size(); i-- > 0;) {
      if (now - list[i].last_seen > options_.peer_ttl) {
        Release(Remove(swarm, Slot{seeder, static_cast<uint32_t>(i)}));
        ++dropped;
      }
    }
  }
  return dropped;
}

size_t SwarmTable::Sweep(TimePoint now) {
  size_t dropped = 0;
  for (auto it = swarms_.begin(); it != swarms_.end();) {
    bool had_seeders = !it->second.seeders.empty();
    dropped += SweepSwarm(it->second, now);
    NoteSeeders(it->first, it->second, had_seeders, now);
    if (it->second.size() == 0) {
      it = swarms_.erase(it);
      --totals_.swarms;
    } else {
      ++it;
    }
  }
  return dropped;
}

void SwarmTable::NoteSeeders(const InfoHash& info_hash, const Swarm& swarm, bool had_seeders,
                             TimePoint now) {
  if (!swarm.seeders.empty()) {
    if (!had_seeders) seeders_lost_.erase(info_hash);
  } else if (had_seeders && seeders_lost_.size() < options_.limits.max_swarms) {
    seeders_lost_.insert_or_assign(info_hash, now);
  }
}

std::optional<TimePoint> SwarmTable::SeedersLostAt(const InfoHash& info_hash) const {
  auto it = seeders_lost_.find(info_hash);
  if (it == seeders_lost_.end()) return std::nullopt;
  return it->second;
}

SwarmCounts SwarmTable::CountsOf(const Swarm& swarm) {
  return SwarmCounts{static_cast<uint32_t>(swarm.seeders.size()),
                     static_cast<uint32_t>(swarm.leechers.size()), swarm.downloaded};
}

SwarmCounts SwarmTable::Counts(const InfoHash& info_hash) const {
  auto it = swarms_.find(info_hash);
  return it == swarms_.end() ? SwarmCounts{} : CountsOf(it->second);
}

std::vector<SwarmSummary> SwarmTable::Largest(size_t limit) const {
  std::vector<const std::pair<const InfoHash, Swarm>*> all;
  all.reserve(swarms_.size());
  for (const auto& entry : swarms_) all.push_back(&entry);
  limit = std::min(limit, all.size());
  auto bigger = [](const auto* a, const auto* b) {
    if (a->second.size() != b->second.size()) return a->second.size() > b->second.size();
    return a->first < b->first;
  };
  std::partial_sort(all.begin(), all.begin() + static_cast<ptrdiff_t>(limit), all.end(), bigger);
  std::vector<SwarmSummary> out;
  out.reserve(limit);
  for (size_t i = 0; i < limit; ++i) out.push_back({all[i]->first, CountsOf(all[i]->second)});
  return out;
}

}  // namespace shoal::tracker
