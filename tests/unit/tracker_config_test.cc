// TrackerConfig: each replica's share of the cluster's upstream leases.

#include <doctest/doctest.h>

#include "tracker/config.h"

namespace shoal::tracker {
namespace {

TEST_CASE("tracker config: replicas share the max rounded down and the base rounded up") {
  TrackerConfig c;  // the defaults: 8 leases at first, up to 64
  CHECK(UpstreamLeasesPerReplica(c) == 64);
  CHECK(BaseUpstreamLeasesPerReplica(c) == 8);
  c.replicas = 3;
  CHECK(UpstreamLeasesPerReplica(c) == 21);
  CHECK(BaseUpstreamLeasesPerReplica(c) == 3);
  // The chart's 9 over 3 replicas: 3 each from the start, as before the base existed.
  c.max_upstream_fetchers = 9;
  CHECK(UpstreamLeasesPerReplica(c) == 3);
  CHECK(BaseUpstreamLeasesPerReplica(c) == 3);
  // A max below the base wins.
  c.replicas = 1;
  c.max_upstream_fetchers = 2;
  CHECK(BaseUpstreamLeasesPerReplica(c) == 2);
}

}  // namespace
}  // namespace shoal::tracker
