#pragma once
// Prometheus metrics of the tracker, registered on the process's registry.

#include <array>
#include <string_view>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include "tracker/swarms/announce.h"
#include "tracker/swarms/swarm_table.h"

namespace shoal::tracker {

// References into a prometheus::Registry that outlives this struct. Thread-safe (atomics).
struct TrackerMetrics {
  std::array<prometheus::Counter*, 5> announces;  // shoal_tracker_announces_total{event}
  prometheus::Counter& rejected_invalid;  // shoal_tracker_announce_failures_total{reason=invalid}
  prometheus::Counter& rejected_full;     // ...{reason=full}
  prometheus::Counter& unregistered;      // shoal_tracker_unregistered_peers_total (swarm full)
  prometheus::Counter& scrapes;           // shoal_tracker_scrapes_total
  prometheus::Counter& expired_peers;     // shoal_tracker_expired_peers_total
  prometheus::Family<prometheus::Counter>& requests;  // shoal_tracker_http_requests_total
  prometheus::Gauge& swarms;                          // shoal_tracker_swarms
  prometheus::Gauge& peers;                           // shoal_tracker_peers
  prometheus::Gauge& seeders;                         // shoal_tracker_seeders
  prometheus::Gauge& connections;                     // shoal_tracker_http_connections
  prometheus::Counter& shed;  // shoal_tracker_http_connections_shed_total
  prometheus::Counter& batched_announces;  // shoal_tracker_batched_announces_total

  // Registers the families on registry.
  static TrackerMetrics Create(prometheus::Registry& registry);
  // Counts one accepted announce by its event.
  void CountAnnounce(AnnounceEvent event);
  // Counts one answered HTTP request by route name and status.
  void CountRequest(std::string_view route, unsigned status);
  // Sets the swarm/peer/seeder gauges.
  void SetTotals(const SwarmTotals& totals);
};

// Metrics of the blob API (chunk tables and upstream leases). Same ownership and thread-safety
// as TrackerMetrics.
struct BlobMetrics {
  prometheus::Counter& leases_granted;                // shoal_tracker_leases_granted_total
  prometheus::Counter& leases_expired;                // shoal_tracker_leases_expired_total
  prometheus::Counter& leases_released;               // shoal_tracker_leases_released_total
  prometheus::Counter& chunks_published;              // shoal_tracker_chunks_published_total
  prometheus::Counter& lease_waits;                   // shoal_tracker_lease_waits_total
  prometheus::Counter& publishes_refused;             // shoal_tracker_chunk_publishes_refused_total
  prometheus::Counter& bad_limited;                   // shoal_tracker_bad_reports_limited_total
  prometheus::Gauge& leases_active;                   // shoal_tracker_leases_active
  prometheus::Gauge& blobs;                           // shoal_tracker_blobs
  prometheus::Family<prometheus::Counter>& requests;  // shoal_tracker_blob_api_requests_total

  // Registers the families on registry.
  static BlobMetrics Create(prometheus::Registry& registry);
  // Counts one answered blob API request by route name and status.
  void CountRequest(std::string_view route, unsigned status);
};

}  // namespace shoal::tracker
