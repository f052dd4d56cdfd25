// shoal-sim's model of the agents' announce relay (tests/sim/relay_model.h): batches form while
// a request is in flight, owners are dealt by blob size, and an overloaded UDP tracker queues
// while batches grow instead.

#include <doctest/doctest.h>

#include <vector>

#include "tests/sim/relay_model.h"

namespace shoal::sim {
namespace {

RelayModelConfig OneReplica() {
  RelayModelConfig c;
  c.replicas = 1;
  c.batch_us = 90;
  c.announce_us = 2;
  c.udp_us = 15;
  c.rtt_s = 0.001;
  return c;
}

}  // namespace

TEST_CASE("sim relay model: announces that find a batch in flight leave together when it returns") {
  std::vector<SentAnnounce> in(5, SentAnnounce{0.0, 7, 0});
  auto loads = ModelRelay(in, {100}, OneReplica());
  REQUIRE(loads.size() == 1);
  const ReplicaLoad& l = loads[0];
  CHECK(l.announces == 5);
  CHECK(l.batches == 2);  // the first alone, the other four in the next
  CHECK(l.batch_max == 4);
  CHECK(l.batch_mean == doctest::Approx(2.5));
  CHECK(l.batch_p50 == 4);
  // The first is answered after one round trip and its batch's work; the others after two.
  CHECK(l.wait_p50_s == doctest::Approx(2 * 0.001 + (92 + 98) * 1e-6));
  CHECK(l.wait_max_s == doctest::Approx(2 * 0.001 + (92 + 98) * 1e-6));
  CHECK(l.core_s == doctest::Approx((92 + 98) * 1e-6));
  // UDP: five datagrams, one after another.
  CHECK(l.udp_core_s == doctest::Approx(5 * 15e-6));
  CHECK(l.udp_wait_max_s == doctest::Approx(0.001 + 5 * 15e-6));
}

TEST_CASE("sim relay model: the largest blob's owner is replica 0, the others are dealt by size") {
  // Blob sizes 10, 100, 50: blob 1 on replica 0, blob 2 on replica 1, blob 0 on replica 0 again.
  std::vector<SentAnnounce> in = {{0.0, 1, 0}, {0.1, 1, 1}, {0.2, 1, 2}, {0.3, 2, 2}};
  RelayModelConfig c = OneReplica();
  c.replicas = 2;
  auto loads = ModelRelay(in, {10, 100, 50}, c);
  REQUIRE(loads.size() == 2);
  CHECK(loads[0].announces == 2);
  CHECK(loads[1].announces == 2);
  CHECK(loads[0].batches == 2);  // 0.1 s apart: each alone
  CHECK(loads[0].batch_max == 1);
}

TEST_CASE("sim relay model: past a UDP tracker's capacity, datagrams queue while batches grow") {
  // 100 nodes, 1,000 announces each, evenly over one second: 100,000 a second, more than one
  // thread at 15 us a datagram serves (66,667).
  std::vector<SentAnnounce> in;
  for (uint32_t node = 0; node < 100; ++node) {
    for (int i = 0; i < 1000; ++i) in.push_back({(i + node / 100.0) / 1000.0, node, 0});
  }
  auto loads = ModelRelay(in, {100}, OneReplica());
  const ReplicaLoad& l = loads[0];
  CHECK(l.announces == 100'000);
  CHECK(l.udp_core_s == doctest::Approx(1.5));
  CHECK(l.udp_wait_max_s > 0.4);  // half a second behind by the end
  // The relays clock themselves: batches grow until the thread keeps up. It stays busy (smaller
  // batches whenever it has time), but every answer comes within a few round trips.
  CHECK(l.batch_mean > 5);
  CHECK(l.core_s < 1.1);
  CHECK(l.wait_max_s < 0.05);
  CHECK(l.span_s < 1.05);
}

}  // namespace shoal::sim
