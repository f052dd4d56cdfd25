// shoal-sim end to end on tiny cases whose answer is known: the real BlobTable schedules, the
// simulated agents fetch from upstream and from each other, the times follow the link rates.

#include <doctest/doctest.h>

#include <algorithm>
#include <vector>

#include "tests/sim/sim.h"

namespace shoal::sim {
namespace {

// Links of 80 Mbit/s = 10 MB/s with no framing overhead and (almost) no latency.
SimConfig Tiny(size_t nodes, std::vector<uint64_t> blobs) {
  SimConfig c;
  c.nodes = nodes;
  c.node_mbit = 80;
  c.upstream_mbit = 80;
  c.wire_efficiency = 1;
  c.blobs = std::move(blobs);
  c.table = TrackerDefaults();
  c.rtt_s = 1e-6;
  c.registry_latency_s = 0;
  c.connect_rtts = 0;
  c.client_start_s = 0;
  c.quantum_s = 1e-4;
  return c;
}

TEST_CASE("sim run: one node, one chunk: the upstream link's time") {
  const uint64_t size = 1 << 20;  // one 1 MiB chunk (the tracker's first chunk)
  SimResult r = RunSim(Tiny(1, {size}));
  REQUIRE(r.completion_s.size() == 1);
  REQUIRE(r.layouts.at(0).chunks == 1);
  CHECK(r.completion_s[0] == doctest::Approx(size / 10e6).epsilon(0.01));
  CHECK(r.upstream_bytes == doctest::Approx(size));
  CHECK(r.leases_granted == 1);
}

TEST_CASE("sim run: two nodes, one chunk: upstream to one, then node to node") {
  // Store and forward per chunk: the leaseholder has it after size/U, publishes it, and the
  // other node takes it from its peer at B: 2 x size / 10 MB/s in all.
  const uint64_t size = 1 << 20;
  SimResult r = RunSim(Tiny(2, {size}));
  std::vector<double> t = r.completion_s;
  std::sort(t.begin(), t.end());
  CHECK(t[0] == doctest::Approx(size / 10e6).epsilon(0.01));
  CHECK(t[1] == doctest::Approx(2 * size / 10e6).epsilon(0.02));
  CHECK(r.upstream_bytes == doctest::Approx(size));  // fetched upstream once
  CHECK(r.peer_bytes == doctest::Approx(size));
  CHECK(r.calls.requests.at("publish") == 1);
}

TEST_CASE("sim run: a blob of many chunks is fetched upstream once and reaches every node") {
  SimConfig c = Tiny(5, {40ull << 20, 3ull << 20});
  c.node_mbit = 160;  // B = 2U
  SimResult r = RunSim(c);
  double S = static_cast<double>((40ull << 20) + (3ull << 20));
  CHECK(r.upstream_bytes == doctest::Approx(S));
  CHECK(r.peer_bytes == doctest::Approx(4 * S));
  uint32_t chunks = 0;
  for (const auto& l : r.layouts) chunks += l.chunks;
  CHECK(r.leases_granted == chunks);
  CHECK(r.leases_expired == 0);
  // Never faster than the upstream link, and here within a few chunks of it.
  const double bound = S / 10e6;
  for (double t : r.completion_s) {
    CHECK(t >= bound * 0.999);
    CHECK(t <= bound * 1.5);
  }
}

TEST_CASE("sim run: a ready watcher that waits between polls asks less and still completes") {
  SimConfig c = Tiny(5, {40ull << 20, 3ull << 20});
  c.node_mbit = 160;
  const double S = static_cast<double>((40ull << 20) + (3ull << 20));
  c.ready_interval_s = 0;
  SimResult eager = RunSim(c);
  c.ready_interval_s = 0.5;
  SimResult patient = RunSim(c);
  REQUIRE(eager.calls.requests.count("ready") == 1);
  REQUIRE(patient.calls.requests.count("ready") == 1);
  CHECK(patient.calls.requests.at("ready") < eager.calls.requests.at("ready"));
  CHECK(patient.upstream_bytes == doctest::Approx(S));
  CHECK(patient.peer_bytes == doctest::Approx(4 * S));
  REQUIRE(patient.completion_s.size() == c.nodes);
  // At most one interval later per node than polling at once, here a few chunks' time.
  for (size_t n = 0; n < c.nodes; ++n) {
    CHECK(patient.completion_s[n] <= eager.completion_s[n] + 1.0);
  }
}

TEST_CASE("sim run: background streams take ready chunks out of order, and every node completes") {
  SimConfig c = Tiny(5, {40ull << 20, 3ull << 20});
  c.node_mbit = 160;
  c.range_streams = 4;
  c.head_streams = 1;  // one stream in order, three asking for the rarest ready chunk
  c.background = SimConfig::Background::kRarest;
  SimResult r = RunSim(c);
  const double S = static_cast<double>((40ull << 20) + (3ull << 20));
  CHECK(r.upstream_bytes == doctest::Approx(S));
  CHECK(r.peer_bytes == doctest::Approx(4 * S));
  CHECK(r.calls.requests.count("rarest") == 1);
  CHECK(r.calls.requests.at("rarest") > 0);
  CHECK(r.leases_expired == 0);
  for (size_t n = 0; n < c.nodes; ++n) {
    CHECK(r.completion_s[n] >= S / 10e6 * 0.999);
    // The in-order prefix reaches half of the largest blob no later than the node completes.
    CHECK(r.prefix50_s[n] > 0);
    CHECK(r.prefix50_s[n] <= r.completion_s[n]);
  }
  // Without background streams nobody asks for the rarest chunk.
  c.head_streams = -1;
  CHECK(RunSim(c).calls.requests.count("rarest") == 0);
}

TEST_CASE(
    "sim run: an upstream reserve keeps a leaseholder's upstream flow from its peers' share") {
  // B = U: a leaseholder's upstream flow shares its downlink with the peer flows it takes at
  // the same time. Held to half of the downlink while it fetches upstream, the peers leave the
  // upstream flow more, and the upstream link finishes no later.
  SimConfig c = Tiny(8, {48ull << 20});
  c.range_streams = 4;
  c.head_streams = 1;
  SimResult plain = RunSim(c);
  c.upstream_reserve = 0.5;
  SimResult reserved = RunSim(c);
  const double S = static_cast<double>(48ull << 20);
  CHECK(reserved.upstream_bytes == doctest::Approx(S));
  CHECK(reserved.upstream_busy_end_s <= plain.upstream_busy_end_s);
  for (double t : reserved.completion_s) CHECK(t >= S / 10e6 * 0.999);
}

TEST_CASE(
    "sim run: with two peers per chunk no node ever has more than two connections on a chunk") {
  // The neighbour model: each announce names one peer (P/2), a full peer refuses, seeders drop
  // each other. Every node still completes, from upstream once and from its neighbours.
  SimConfig c = Tiny(10, {24ull << 20, 3ull << 20});
  c.node_mbit = 160;
  c.peers_per_chunk = 2;
  SimResult r = RunSim(c);
  const double S = static_cast<double>((24ull << 20) + (3ull << 20));
  CHECK(r.max_chunk_connections == 2);
  CHECK(r.connections > 0);
  CHECK(r.redundant_closed > 0);
  CHECK(r.upstream_bytes == doctest::Approx(S));
  CHECK(r.peer_bytes == doctest::Approx(9 * S));
  CHECK(r.calls.requests.at("seed-announce") > 0);
  for (double t : r.completion_s) CHECK(t >= S / 10e6 * 0.999);
  // The same seed gives the same run.
  CHECK(RunSim(c).completion_s == r.completion_s);
}

}  // namespace
}  // namespace shoal::sim
