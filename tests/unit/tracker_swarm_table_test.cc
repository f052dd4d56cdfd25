#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tracker/swarms/swarm_table.h"

#include "tests/support/why.h"

namespace shoal::tracker {
namespace {

using std::chrono::seconds;

const TimePoint kT0 = TimePoint() + std::chrono::hours(1);

InfoHash Hash(char c) { return *InfoHash::FromBytes(std::string(20, c)); }

// Peer n lives at 10.x.y.z:6881 (distinct addresses), or at 10.0.0.1:(1000 + n) when
// same_host is set.
PeerEndpoint Endpoint(int n, bool same_host = false) {
  if (same_host) return PeerEndpoint::FromV4({10, 0, 0, 1}, static_cast<uint16_t>(1000 + n));
  return PeerEndpoint::FromV4(
      {10, static_cast<uint8_t>(n >> 16), static_cast<uint8_t>(n >> 8), static_cast<uint8_t>(n)},
      6881);
}

AnnounceRequest Request(const InfoHash& ih, uint64_t left,
                        AnnounceEvent event = AnnounceEvent::kNone,
                        std::optional<uint32_t> numwant = std::nullopt) {
  AnnounceRequest r;
  r.info_hash = ih;
  r.peer_id = *PeerId::FromBytes("-XX0000-000000000000");
  r.port = 6881;
  r.left = left;
  r.event = event;
  r.numwant = numwant;
  return r;
}

AnnounceReply Must(Result<AnnounceReply> r) {
  REQUIRE_MESSAGE(r.has_value(), Why(r));
  return std::move(r.value());
}

bool HasDuplicates(std::vector<PeerEndpoint> peers) {
  std::sort(peers.begin(), peers.end());
  return std::adjacent_find(peers.begin(), peers.end()) != peers.end();
}

}  // namespace

TEST_CASE("tracker swarm: a peer is never handed itself, and two peers see each other") {
  SwarmTable table({}, 1);
  InfoHash ih = Hash('a');
  auto first = Must(table.Announce(Request(ih, 100, AnnounceEvent::kStarted), Endpoint(1), kT0));
  CHECK(first.peers.empty());
  CHECK(first.counts.incomplete == 1);
  auto second = Must(table.Announce(Request(ih, 0, AnnounceEvent::kStarted), Endpoint(2), kT0));
  REQUIRE(second.peers.size() == 1);
  CHECK(second.peers[0] == Endpoint(1));
  CHECK(second.counts.complete == 1);
  CHECK(second.counts.incomplete == 1);
  auto again = Must(table.Announce(Request(ih, 100), Endpoint(1), kT0));
  REQUIRE(again.peers.size() == 1);
  CHECK(again.peers[0] == Endpoint(2));
}

TEST_CASE("tracker swarm: peers are keyed by IP and port, so one host can run several") {
  SwarmTable table({}, 1);
  InfoHash ih = Hash('a');
  for (int i = 0; i < 5; ++i) Must(table.Announce(Request(ih, 1), Endpoint(i, true), kT0));
  CHECK(table.Counts(ih).incomplete == 5);
  auto r = Must(table.Announce(Request(ih, 1), Endpoint(0, true), kT0));
  CHECK(r.peers.size() == 4);
  CHECK(std::find(r.peers.begin(), r.peers.end(), Endpoint(0, true)) == r.peers.end());
  // A new peer_id from the same address is the same peer (a restarted client).
  AnnounceRequest restarted = Request(ih, 1);
  restarted.peer_id = *PeerId::FromBytes("-XX0000-restarted000");
  Must(table.Announce(restarted, Endpoint(0, true), kT0));
  CHECK(table.totals().peers == 5);
}

TEST_CASE("tracker swarm: numwant defaults to 50 and is capped at 200") {
  SwarmTable table({}, 7);
  InfoHash ih = Hash('b');
  for (int i = 0; i < 400; ++i) Must(table.Announce(Request(ih, 1), Endpoint(i), kT0));
  auto def = Must(table.Announce(Request(ih, 1), Endpoint(0), kT0));
  CHECK(def.peers.size() == 50);
  auto many = Must(table.Announce(Request(ih, 1, AnnounceEvent::kNone, 100000), Endpoint(0), kT0));
  CHECK(many.peers.size() == 200);
  CHECK_FALSE(HasDuplicates(many.peers));
  auto none = Must(table.Announce(Request(ih, 1, AnnounceEvent::kNone, 0), Endpoint(0), kT0));
  CHECK(none.peers.empty());
  auto few = Must(table.Announce(Request(ih, 1, AnnounceEvent::kNone, 3), Endpoint(0), kT0));
  CHECK(few.peers.size() == 3);
}

TEST_CASE("tracker swarm: a seeder gets leechers only") {
  SwarmTable table({}, 3);
  InfoHash ih = Hash('c');
  for (int i = 0; i < 10; ++i) Must(table.Announce(Request(ih, 0), Endpoint(i), kT0));
  for (int i = 10; i < 20; ++i) Must(table.Announce(Request(ih, 5), Endpoint(i), kT0));
  auto r = Must(table.Announce(Request(ih, 0), Endpoint(0), kT0));
  CHECK(r.peers.size() == 10);
  std::set<PeerEndpoint> leechers;
  for (int i = 10; i < 20; ++i) leechers.insert(Endpoint(i));
  for (const auto& p : r.peers) CHECK(leechers.count(p) == 1);
  CHECK(r.counts.complete == 10);
  CHECK(r.counts.incomplete == 10);
}

TEST_CASE("tracker swarm: a paused (upload-only) peer is counted incomplete and gets leechers") {
  SwarmTable table({}, 3);
  InfoHash ih = Hash('c');
  Must(table.Announce(Request(ih, 0), Endpoint(1), kT0));   // seeder
  Must(table.Announce(Request(ih, 10), Endpoint(2), kT0));  // leecher
  auto r = Must(table.Announce(Request(ih, 5, AnnounceEvent::kPaused), Endpoint(3), kT0));
  REQUIRE(r.peers.size() == 1);
  CHECK(r.peers[0] == Endpoint(2));
  CHECK(r.counts.incomplete == 2);
  // Still upload-only on its regular announces, until it starts again.
  CHECK(Must(table.Announce(Request(ih, 5), Endpoint(3), kT0)).peers.size() == 1);
  CHECK(Must(table.Announce(Request(ih, 5, AnnounceEvent::kStarted), Endpoint(3), kT0))
            .peers.size() == 2);
}

TEST_CASE("tracker swarm: small swarms are handed out whole") {
  SwarmTable table({}, 5);
  InfoHash ih = Hash('d');
  Must(table.Announce(Request(ih, 0), Endpoint(0), kT0));
  for (int i = 1; i <= 30; ++i) Must(table.Announce(Request(ih, 9), Endpoint(i), kT0));
  for (int i = 1; i <= 30; ++i) {
    auto r = Must(table.Announce(Request(ih, 9), Endpoint(i), kT0));
    CHECK(r.peers.size() == 30);
    CHECK(std::find(r.peers.begin(), r.peers.end(), Endpoint(0)) != r.peers.end());
  }
}

TEST_CASE("tracker swarm: one seeder among many leechers is not handed to every leecher") {
  SwarmTable table({}, 11);
  InfoHash ih = Hash('e');
  const int kLeechers = 2000;
  Must(table.Announce(Request(ih, 0), Endpoint(0), kT0));
  for (int i = 1; i <= kLeechers; ++i) Must(table.Announce(Request(ih, 9), Endpoint(i), kT0));
  int got_seeder = 0;
  std::map<PeerEndpoint, int> listed;
  for (int i = 1; i <= kLeechers; ++i) {
    auto r = Must(table.Announce(Request(ih, 9), Endpoint(i), kT0));
    REQUIRE(r.peers.size() == 50);
    CHECK_FALSE(HasDuplicates(r.peers));
    for (const auto& p : r.peers) ++listed[p];
    if (std::find(r.peers.begin(), r.peers.end(), Endpoint(0)) != r.peers.end()) ++got_seeder;
  }
  // Expected share: 50 * 4 / (4 + 1999), about 10%: the seeder is preferred (a leecher is
  // listed with probability 50/2000 = 2.5%) but not given to everyone.
  MESSAGE("leechers handed the seeder: " << got_seeder << " of " << kLeechers);
  CHECK(got_seeder > kLeechers * 5 / 100);
  CHECK(got_seeder < kLeechers * 15 / 100);
  // Load spreads over the leechers: each was listed about 50 times, none ignored or flooded.
  int least = INT32_MAX, most = 0;
  for (int i = 1; i <= kLeechers; ++i) {
    least = std::min(least, listed[Endpoint(i)]);
    most = std::max(most, listed[Endpoint(i)]);
  }
  MESSAGE("times a leecher was listed: min " << least << ", max " << most);
  CHECK(least >= 15);
  CHECK(most <= 100);
}

TEST_CASE("tracker swarm: a leecher gets a mix that prefers seeders but includes leechers") {
  SwarmTable table({}, 13);
  InfoHash ih = Hash('f');
  for (int i = 0; i < 100; ++i) Must(table.Announce(Request(ih, 0), Endpoint(i), kT0));
  for (int i = 100; i < 1100; ++i) Must(table.Announce(Request(ih, 9), Endpoint(i), kT0));
  size_t seeders = 0, total = 0;
  for (int i = 100; i < 300; ++i) {
    auto r = Must(table.Announce(Request(ih, 9), Endpoint(i), kT0));
    size_t s = std::count_if(r.peers.begin(), r.peers.end(),
                             [](const PeerEndpoint& p) { return p < Endpoint(100); });
    CHECK(s > 0);
    CHECK(s < r.peers.size());
    seeders += s;
    total += r.peers.size();
  }
  // Seeders are 1/11 of the swarm but 400/1400 = 29% of what leechers are given.
  double share = static_cast<double>(seeders) / static_cast<double>(total);
  CHECK(share > 0.24);
  CHECK(share < 0.34);
}

TEST_CASE("tracker swarm: stopped removes the peer and an emptied swarm") {
  SwarmTable table({}, 1);
  InfoHash ih = Hash('g');
  Must(table.Announce(Request(ih, 0), Endpoint(1), kT0));
  Must(table.Announce(Request(ih, 5), Endpoint(2), kT0));
  auto r = Must(table.Announce(Request(ih, 5, AnnounceEvent::kStopped), Endpoint(2), kT0));
  CHECK(r.peers.empty());
  CHECK(r.counts.incomplete == 0);
  CHECK(r.counts.complete == 1);
  Must(table.Announce(Request(ih, 0, AnnounceEvent::kStopped), Endpoint(1), kT0));
  CHECK(table.totals().swarms == 0);
  CHECK(table.totals().peers == 0);
  // Stopping in an unknown swarm creates nothing.
  Must(table.Announce(Request(Hash('z'), 0, AnnounceEvent::kStopped), Endpoint(1), kT0));
  CHECK(table.totals().swarms == 0);
}

TEST_CASE("tracker swarm: completed turns a leecher into a seeder and counts one download") {
  SwarmTable table({}, 1);
  InfoHash ih = Hash('h');
  Must(table.Announce(Request(ih, 5, AnnounceEvent::kStarted), Endpoint(1), kT0));
  auto r = Must(table.Announce(Request(ih, 0, AnnounceEvent::kCompleted), Endpoint(1), kT0));
  CHECK(r.counts.complete == 1);
  CHECK(r.counts.incomplete == 0);
  CHECK(r.counts.downloaded == 1);
  Must(table.Announce(Request(ih, 0, AnnounceEvent::kCompleted), Endpoint(1), kT0));
  CHECK(table.Counts(ih).downloaded == 1);
  CHECK(table.totals().seeders == 1);
  CHECK(table.Counts(Hash('q')).complete == 0);
  // Without a completed event: a regular announce with left=0, and a stop right after finishing.
  Must(table.Announce(Request(ih, 5), Endpoint(2), kT0));
  Must(table.Announce(Request(ih, 0), Endpoint(2), kT0));
  Must(table.Announce(Request(ih, 5), Endpoint(3), kT0));
  Must(table.Announce(Request(ih, 0, AnnounceEvent::kStopped), Endpoint(3), kT0));
  CHECK(table.Counts(ih).downloaded == 3);
  // A seeder that stops is not a download.
  Must(table.Announce(Request(ih, 0, AnnounceEvent::kStopped), Endpoint(2), kT0));
  CHECK(table.Counts(ih).downloaded == 3);
}

TEST_CASE("tracker swarm: silent peers expire after the ttl, announcing ones stay") {
  SwarmTableOptions options;
  options.peer_ttl = seconds(660);
  SwarmTable table(options, 1);
  InfoHash a = Hash('a'), b = Hash('b');
  Must(table.Announce(Request(a, 0), Endpoint(1), kT0));
  Must(table.Announce(Request(a, 5), Endpoint(2), kT0));
  Must(table.Announce(Request(b, 5), Endpoint(3), kT0));
  CHECK(table.Sweep(kT0 + seconds(660)) == 0);
  Must(table.Announce(Request(a, 5), Endpoint(2), kT0 + seconds(600)));
  CHECK(table.Sweep(kT0 + seconds(661)) == 2);
  CHECK(table.totals().swarms == 1);
  CHECK(table.totals().peers == 1);
  CHECK(table.totals().seeders == 0);
  CHECK(table.Counts(a).incomplete == 1);
  CHECK(table.Counts(b).incomplete == 0);
  CHECK(table.Sweep(kT0 + seconds(1261)) == 1);
  CHECK(table.totals().swarms == 0);
}

TEST_CASE("tracker swarm: memory limits refuse new swarms and stop storing peers") {
  SwarmTableOptions options;
  options.peer_ttl = seconds(100);
  options.limits.max_swarms = 2;
  options.limits.max_peers_per_swarm = 3;
  SwarmTable table(options, 1);
  Must(table.Announce(Request(Hash('a'), 1), Endpoint(1), kT0));
  Must(table.Announce(Request(Hash('b'), 1), Endpoint(1), kT0));
  auto refused = table.Announce(Request(Hash('c'), 1), Endpoint(1), kT0);
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.error().code == ErrorCode::kUnavailable);
  CHECK(refused.error().message.find("max_swarms") != std::string::npos);

  Must(table.Announce(Request(Hash('a'), 1), Endpoint(2), kT0));
  Must(table.Announce(Request(Hash('a'), 1), Endpoint(3), kT0 + seconds(50)));
  auto full = Must(table.Announce(Request(Hash('a'), 1), Endpoint(4), kT0 + seconds(60)));
  CHECK_FALSE(full.registered);
  CHECK(full.peers.size() == 3);  // still told about the others
  CHECK(table.Counts(Hash('a')).incomplete == 3);
  // Once silent peers are past their ttl, a full swarm makes room by dropping them.
  auto later = Must(table.Announce(Request(Hash('a'), 1), Endpoint(4), kT0 + seconds(101)));
  CHECK(later.registered);
  CHECK(table.Counts(Hash('a')).incomplete == 2);  // peers 3 and 4

  SwarmTableOptions tight;
  tight.limits.max_peers = 1;
  SwarmTable small(tight, 1);
  Must(small.Announce(Request(Hash('a'), 1), Endpoint(1), kT0));
  CHECK_FALSE(small.Announce(Request(Hash('b'), 1), Endpoint(2), kT0).has_value());
  CHECK(small.totals().swarms == 1);
}

TEST_CASE("tracker swarm: largest swarms come first on the status listing") {
  SwarmTable table({}, 1);
  for (int i = 0; i < 3; ++i) Must(table.Announce(Request(Hash('x'), 1), Endpoint(i), kT0));
  Must(table.Announce(Request(Hash('y'), 1), Endpoint(0), kT0));
  for (int i = 0; i < 2; ++i) Must(table.Announce(Request(Hash('z'), 0), Endpoint(i), kT0));
  auto top = table.Largest(2);
  REQUIRE(top.size() == 2);
  CHECK(top[0].info_hash == Hash('x'));
  CHECK(top[1].info_hash == Hash('z'));
  CHECK(top[1].counts.complete == 2);
  CHECK(table.Largest(10).size() == 3);
}

TEST_CASE("tracker swarm: a swarm whose seeders all stopped or expired has lost its seeders") {
  SwarmTable table({}, 1);
  InfoHash ih = Hash('s');
  CHECK_FALSE(table.LostSeeders(ih));  // never seen: a restarted tracker knows nothing
  Must(table.Announce(Request(ih, 100, AnnounceEvent::kStarted), Endpoint(1), kT0));
  CHECK_FALSE(table.LostSeeders(ih));  // a leecher only: nobody seeded it yet
  Must(table.Announce(Request(ih, 0, AnnounceEvent::kStarted), Endpoint(2), kT0));
  Must(table.Announce(Request(ih, 0, AnnounceEvent::kStarted), Endpoint(3), kT0));
  Must(table.Announce(Request(ih, 0, AnnounceEvent::kStopped), Endpoint(2), kT0));
  CHECK_FALSE(table.LostSeeders(ih));  // one seeder left
  Must(table.Announce(Request(ih, 0, AnnounceEvent::kStopped), Endpoint(3), kT0));
  CHECK(table.LostSeeders(ih));  // the leecher is still there, but nobody can serve it
  Must(table.Announce(Request(ih, 0, AnnounceEvent::kCompleted), Endpoint(1), kT0));
  CHECK_FALSE(table.LostSeeders(ih));  // seeded again

  // Expiry counts like a stop, also when the swarm goes away entirely.
  Must(table.Announce(Request(ih, 100, AnnounceEvent::kStopped), Endpoint(1), kT0));
  CHECK(table.LostSeeders(ih));
  InfoHash other = Hash('t');
  Must(table.Announce(Request(other, 0, AnnounceEvent::kStarted), Endpoint(4), kT0));
  CHECK(table.Sweep(kT0 + table.options().peer_ttl + seconds(1)) == 1);
  CHECK(table.totals().swarms == 0);
  CHECK(table.LostSeeders(other));
}

TEST_CASE(
    "tracker swarm: an endpoint has one number in every swarm, reused once it left them "
    "all") {
  SwarmTableOptions options;
  options.peer_ttl = seconds(100);
  SwarmTable table(options, 1);
  InfoHash a = Hash('a'), b = Hash('b');
  Must(table.Announce(Request(a, 5, AnnounceEvent::kStarted), Endpoint(1), kT0));
  Must(table.Announce(Request(a, 0, AnnounceEvent::kStarted), Endpoint(2), kT0));
  Must(table.Announce(Request(b, 5, AnnounceEvent::kStarted), Endpoint(1), kT0));
  auto peers = [&](const InfoHash& ih) {
    std::vector<std::pair<PeerEndpoint, bool>> out;
    table.ForEachPeer(ih, [&](SwarmTable::EndpointId id, bool seeder, TimePoint) {
      REQUIRE(id < table.endpoint_ids());
      out.emplace_back(table.endpoint(id), seeder);
    });
    return out;
  };
  // Seeders first; endpoint 1 is the same number in both swarms.
  CHECK(peers(a) ==
        std::vector<std::pair<PeerEndpoint, bool>>{{Endpoint(2), true}, {Endpoint(1), false}});
  CHECK(peers(b) == std::vector<std::pair<PeerEndpoint, bool>>{{Endpoint(1), false}});
  CHECK(table.endpoint_ids() == 2);
  CHECK(peers(Hash('z')).empty());
  auto number = [&](const InfoHash& ih) {
    std::vector<SwarmTable::EndpointId> ids;
    table.ForEachPeer(ih, [&](SwarmTable::EndpointId id, bool, TimePoint) { ids.push_back(id); });
    return ids;
  };
  const std::vector<SwarmTable::EndpointId> one = number(b);
  CHECK(number(a).back() == one.at(0));
  // Becoming a seeder keeps the number; leaving one swarm keeps it for the other.
  Must(table.Announce(Request(a, 0, AnnounceEvent::kCompleted), Endpoint(1), kT0));
  CHECK(number(a).back() == one.at(0));
  Must(table.Announce(Request(a, 0, AnnounceEvent::kStopped), Endpoint(1), kT0));
  CHECK(number(b) == one);
  // Once endpoint 2 expired from every swarm, a new endpoint takes its number.
  Must(table.Announce(Request(b, 5), Endpoint(1), kT0 + seconds(90)));
  CHECK(table.Sweep(kT0 + seconds(150)) == 1);
  Must(table.Announce(Request(b, 5), Endpoint(3), kT0 + seconds(150)));
  CHECK(table.endpoint_ids() == 2);
  CHECK(peers(b) ==
        std::vector<std::pair<PeerEndpoint, bool>>{{Endpoint(1), false}, {Endpoint(3), false}});
}

}  // namespace shoal::tracker
