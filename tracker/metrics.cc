#include "tracker/metrics.h"

#include <string>

namespace shoal::tracker {

TrackerMetrics TrackerMetrics::Create(prometheus::Registry& registry) {
  auto& announces = prometheus::BuildCounter()
                        .Name("shoal_tracker_announces_total")
                        .Help("Announces accepted, by event (none for periodic announces)")
                        .Register(registry);
  auto& failures = prometheus::BuildCounter()
                       .Name("shoal_tracker_announce_failures_total")
                       .Help("Announces answered with a failure reason, by why")
                       .Register(registry);
  auto& unregistered = prometheus::BuildCounter()
                           .Name("shoal_tracker_unregistered_peers_total")
                           .Help("Announces answered with peers but not stored: swarm full")
                           .Register(registry);
  auto& scrapes = prometheus::BuildCounter()
                      .Name("shoal_tracker_scrapes_total")
                      .Help("Scrape requests answered")
                      .Register(registry);
  auto& expired = prometheus::BuildCounter()
                      .Name("shoal_tracker_expired_peers_total")
                      .Help("Peers dropped because they stopped announcing")
                      .Register(registry);
  auto& requests = prometheus::BuildCounter()
                       .Name("shoal_tracker_http_requests_total")
                       .Help("HTTP requests answered, by route and status")
                       .Register(registry);
  auto& swarms = prometheus::BuildGauge()
                     .Name("shoal_tracker_swarms")
                     .Help("Swarms (info-hashes) with at least one live peer")
                     .Register(registry);
  auto& peers = prometheus::BuildGauge()
                    .Name("shoal_tracker_peers")
                    .Help("Live peers over all swarms")
                    .Register(registry);
  auto& seeders = prometheus::BuildGauge()
                      .Name("shoal_tracker_seeders")
                      .Help("Live seeders over all swarms")
                      .Register(registry);
  auto& connections = prometheus::BuildGauge()
                          .Name("shoal_tracker_http_connections")
                          .Help("Open HTTP connections")
                          .Register(registry);
  auto& shed = prometheus::BuildCounter()
                   .Name("shoal_tracker_http_connections_shed_total")
                   .Help("Connections refused at accept (503) because --max-connections were open")
                   .Register(registry);
  auto& batched = prometheus::BuildCounter()
                      .Name("shoal_tracker_batched_announces_total")
                      .Help("Announces that came in POST /v1/announces batches (each is also in "
                            "shoal_tracker_announces_total; the route's requests are the batches)")
                      .Register(registry);
  TrackerMetrics m{
      {},
      failures.Add({{"reason", "invalid"}}),
      failures.Add({{"reason", "full"}}),
      unregistered.Add({}),
      scrapes.Add({}),
      expired.Add({}),
      requests,
      swarms.Add({}),
      peers.Add({}),
      seeders.Add({}),
      connections.Add({}),
      shed.Add({}),
      batched.Add({}),
  };
  for (AnnounceEvent e : {AnnounceEvent::kNone, AnnounceEvent::kStarted, AnnounceEvent::kCompleted,
                          AnnounceEvent::kStopped, AnnounceEvent::kPaused}) {
    m.announces[static_cast<size_t>(e)] =
        &announces.Add({{"event", std::string(AnnounceEventName(e))}});
  }
  return m;
}

void TrackerMetrics::CountAnnounce(AnnounceEvent event) {
  announces[static_cast<size_t>(event)]->Increment();
}

void TrackerMetrics::CountRequest(std::string_view route, unsigned status) {
  requests.Add({{"route", std::string(route)}, {"code", std::to_string(status)}}).Increment();
}

void TrackerMetrics::SetTotals(const SwarmTotals& totals) {
  swarms.Set(static_cast<double>(totals.swarms));
  peers.Set(static_cast<double>(totals.peers));
  seeders.Set(static_cast<double>(totals.seeders));
}

BlobMetrics BlobMetrics::Create(prometheus::Registry& registry) {
  auto counter = [&](const char* name, const char* help) -> prometheus::Counter& {
    return prometheus::BuildCounter().Name(name).Help(help).Register(registry).Add({});
  };
  auto gauge = [&](const char* name, const char* help) -> prometheus::Gauge& {
    return prometheus::BuildGauge().Name(name).Help(help).Register(registry).Add({});
  };
  return BlobMetrics{
      counter("shoal_tracker_leases_granted_total", "Upstream leases granted (not renewals)"),
      counter("shoal_tracker_leases_expired_total",
              "Upstream leases that expired without being renewed, released or published"),
      counter("shoal_tracker_leases_released_total",
              "Upstream leases ended by their holder, or because the chunk was published"),
      counter("shoal_tracker_chunks_published_total", "Chunks that became ready (metainfo kept)"),
      counter("shoal_tracker_lease_waits_total",
              "Lease requests first answered with wait (long-polled or not)"),
      counter("shoal_tracker_chunk_publishes_refused_total",
              "Chunk publications refused (403): another agent holds the chunk's lease"),
      counter("shoal_tracker_bad_reports_limited_total",
              "Bad-chunk reports refused (429): over --bad-reports-per-minute for their source"),
      gauge("shoal_tracker_leases_active", "Upstream leases active now, over all blobs"),
      gauge("shoal_tracker_blobs", "Blob chunk tables kept"),
      prometheus::BuildCounter()
          .Name("shoal_tracker_blob_api_requests_total")
          .Help("Blob API requests answered, by route and status")
          .Register(registry),
  };
}

void BlobMetrics::CountRequest(std::string_view route, unsigned status) {
  requests.Add({{"route", std::string(route)}, {"code", std::to_string(status)}}).Increment();
}

}  // namespace shoal::tracker
